"""What one visitor can cost the explorer, bounded before work starts (``app.py`` applies these; the README's
"Limits" table says where each is enforced).

A queue of at most MAX_QUEUED_EVENTS waiting events; the slow views (attribution, the equivalence demo, every model's
spectrum) in a group of their own that computes SLOW_CONCURRENCY at a time, dropped runs included
(:class:`server.SlowRuns`), and admits one request per visitor and MAX_SLOW_WAITING waiting in all
(:class:`server.Admission`); a request body of at most the upload cap (``--max-upload-mb``) plus REQUEST_SLACK_MB;
uploads and exports in a per-session work dir of at most MAX_WORK_DIR_MB together with Gradio's own cache of uploads
and downloads, which lives in it (all deleted FILE_MAX_AGE_S after their last use), VISITOR_SHARE_MB of it per
visitor and ADDRESS_SHARE_MB per network address; visitor tokens minted at most MINT_BURST at once and MINT_PER_HOUR
an hour per address (:class:`server.Visitors`); the analysis caches within
``--cache-mb`` (``$CONVNN_CACHE_MB``); Gradio's per-session state to MAX_SESSIONS sessions.

Importing this module sets ``GRADIO_TEMP_DIR`` (unless it is set): ``app.py`` imports it before Gradio, whose MCP
module reads it at import.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

WORK_DIR = Path(tempfile.gettempdir()) / "convnn-explorer"  # the run folders of the servers on this machine
RUN_DIR_NAME = f"run-{os.getpid()}-{secrets.token_hex(4)}"  # this process's: all it stores, sessions/ (uploads and
#   exports, one folder per session) and gradio/ (Gradio's cache, MCP images included), locked while it runs; those
#   of ended processes are deleted when a server starts (analysis.claim_run_dir, app_server.default_workspace)
# Gradio's cache of uploads and downloads goes inside the run folder, so that one byte budget covers it and a crash
# cannot leak it (set GRADIO_TEMP_DIR before starting the app to put it elsewhere: it is counted wherever it is).
os.environ.setdefault("GRADIO_TEMP_DIR", str(WORK_DIR / RUN_DIR_NAME / "gradio"))

DEFAULT_HOST = "127.0.0.1"  # the address the server listens on (--host): this machine only
DEFAULT_PORT = 7860
MAX_UPLOAD_MB = 100  # larger uploaded files are refused before they are stored (--max-upload-mb); ViT-B/16 int8: 87 MB
REQUEST_SLACK_MB = 10  # one request's body may be this much above the upload cap: a checkpoint's card, form fields
MAX_WORK_DIR_MB = 2048  # all sessions' stored uploads and exports and Gradio's cache of uploads and downloads
#                         together (≈ 40 checkpoints of the largest size); an upload past it is refused (507)
VISITOR_SHARE_MB = 256  # of MAX_WORK_DIR_MB, what one visitor's uploads (in Gradio's cache and stored) and exports
#                          may hold: one checkpoint of the largest size, as uploaded and as stored (2 × 110 MB)
ADDRESS_SHARE_MB = 4 * VISITOR_SHARE_MB  # of MAX_WORK_DIR_MB, what all visitors at one network address may hold
#   together: half of it, so that one address minting many visitor tokens leaves the other half to everyone else
#   (8 shares would be all of MAX_WORK_DIR_MB, no ceiling at all); a class behind one NAT shares it
MINT_BURST = 200  # visitor tokens one network address may be given at once (server.Visitors): a class of 30 behind
#                   one NAT is 30, or 60 with a phone each; the rest covers private windows and a server restart
MINT_PER_HOUR = 200  # … and regains this many an hour; past its budget, an address's requests without a token are
#                      one visitor, "a:<address>"
FILE_MAX_AGE_S = 3600  # stored uploads, exports and Gradio's cached files go this long after their last use
FILE_SWEEP_S = 600  # how often the work dir and Gradio's cache are swept for them
MAX_QUEUED_EVENTS = 1024  # events waiting in the queue, all visitors together; the next is refused ("Queue is full")
MAX_WAITING_PER_VISITOR = 16  # events one visitor may have waiting, all groups together (server.FairTurns): a page's
#                               action queues one event at a time (its refreshes are a chain); one client flooding the
#                               queue holds 16 places, not all of them
MAX_WAITING_PER_ADDRESS = 96  # … and the visitors at one network address together (server.address): a class of 30
#                               behind one NAT, each with a few waiting, fits; tokens minted at one address do not
#                               multiply a client's places past it, and it takes 11 addresses to fill the queue
FAST_CONCURRENCY = 2  # runs of one event at a time (per event; the model's lock serialises their forward passes)
SLOW_GROUP = "slow"  # the concurrency group of the views that take seconds: attribution, the equivalence demo
SLOW_CONCURRENCY = 3  # slow runs computing at a time, all sessions together, dropped ones until they stop, one per
#                       visitor, a free place to the address holding fewest, two at most (server.SlowRuns): a run that
#                       computes for minutes (an occlusion of a heavy model: 188 s on a core) leaves two to the rest;
#                       their cores are shared as every pass's are (server.ComputeShares). Memory: an attribution
#                       holds at most ≈ 0.8 GB of activations (its batches are bounded), an equivalence demo's
#                       attention side at most 2 GB (analysis.views.equivalence.ATTENTION_DEMO_MAX_BYTES; 0.55 GB on
#                       a CIFAR model's first layer, where ties were ranked in 9 GB before), so three fit
MAX_SLOW_WAITING = 8  # slow runs waiting, all sessions together; the next is refused, so the slow views never hold
#                       more than this of the queue's MAX_QUEUED_EVENTS places (and a session holds one at a time)
MAX_SLOW_WAITING_PER_ADDRESS = 6  # … of them, one network address's: tokens minted there cannot take every place
#                                   and get everyone else refused (a class behind one NAT shares it)
MAX_THREADS = 16  # worker threads running handlers (Gradio's max_threads, 40 by default): a handler waiting for a
#                    model's lock holds one, so one visitor's requests on a slow model must not take them all (with 6,
#                    a hostile visitor's four held most of them); idle ones cost no memory beyond their stacks, as
#                    the malloc arenas are capped (MALLOC_ARENAS)
VIEW_THREADS = 1  # torch's threads per computation (--threads): a view on one core, so the cores serve several
#                  visitors' views at once and the OS shares them out by thread; one visitor's heavy model then takes
#                  one core, not every core from everyone else (a single user on many cores may ask for more)
MALLOC_ARENAS = 2  # glibc malloc arenas (by default up to 8 per core, one per allocating thread, rarely returned)
MAX_SESSIONS = 32  # sessions whose state Gradio keeps (each holds its last outputs, ≈ 0.3 MB of figure JSON); the
#                    least recently used goes first (its uploads stay reachable: they are found by its session id)
