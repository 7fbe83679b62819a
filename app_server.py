"""How the explorer is served: its work dir (:func:`default_workspace`) and Gradio's launch with the limits of
:mod:`app_limits`, the visitor middleware (:class:`server.Visitors`), the request-size middleware
(:class:`server.RequestSizeLimit`) and, when asked, the MCP tools (:mod:`app_mcp`). ``app.py`` builds the page and
calls :func:`launch`.

Gradio's private parts this module touches are listed in :data:`GRADIO_PRIVATE` (``tests/server/test_gradio_private.py``
checks each on the installed Gradio; ``requirements.txt`` pins Gradio to the minor versions it passed on).
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Iterable

import app_limits as limits  # sets GRADIO_TEMP_DIR: before Gradio, whose MCP module reads it at import

# isort: split
import gradio as gr
from gradio.route_utils import API_PREFIX
from gradio.utils import get_upload_folder
from starlette.middleware import Middleware

import analysis as an
import app_mcp
from app_api import EXAMPLES_DIR, WEB_DIR
from server import FairTurns, QueueDoor, RequestSizeLimit, Visitors, trusted_networks

__all__ = ["GRADIO_PRIVATE", "default_workspace", "launch", "listen_problem"]

GRADIO_PRIVATE = {
    "utils.get_upload_folder": "the folder of Gradio's cache of uploads and downloads (GRADIO_TEMP_DIR)",
    "route_utils.API_PREFIX": "the prefix of Gradio's routes (/gradio_api): the upload route's path",
}


def default_workspace() -> an.Workspace:
    """The uploads and exports of this process, in its run folder WORK_DIR/RUN_DIR_NAME/sessions (claimed and locked
    here; the run folders of processes that ended are deleted: :func:`analysis.claim_run_dir`): at most
    MAX_WORK_DIR_MB together with Gradio's cache (``GRADIO_TEMP_DIR``, in the run folder unless set), of which
    VISITOR_SHARE_MB per visitor and ADDRESS_SHARE_MB per network address, each FILE_MAX_AGE_S after its last use
    (:mod:`app_limits`).

    Raises:
        OSError: the work dir cannot be written.
    """
    run = an.claim_run_dir(limits.WORK_DIR, limits.RUN_DIR_NAME)
    return an.Workspace(run / "sessions", limits.MAX_WORK_DIR_MB * 2**20, limits.FILE_MAX_AGE_S,
                        counted=[get_upload_folder()], share_bytes=limits.VISITOR_SHARE_MB * 2**20,
                        address_bytes=limits.ADDRESS_SHARE_MB * 2**20)


def listen_problem(host: str, port: int) -> str | None:
    """Why ``host``:``port`` cannot be listened on, in one line for the command line, or None if it can: tried as
    Gradio's launch tries it (a socket bound with ``SO_REUSEADDR``, then closed), before the models are loaded.
    A port another server holds is "taken"; a port outside 1–65535, a host name that does not resolve or an address
    of another machine is said as such."""
    if not 1 <= port <= 65535:
        return f"Port {port} is not a port: choose one from 1 to 65535 with --port N or PORT=N."
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            return (f"Port {port} of {host} is taken (another server, or this app already running): choose another "
                    f"with --port N or PORT=N.")
        return f"Cannot listen on {host} port {port} ({err.strerror or err}): check --host."
    return None


def launch(demo: gr.Blocks, port: int, prevent_thread_lock: bool = False, workspace: an.Workspace | None = None,
           max_upload_mb: int = limits.MAX_UPLOAD_MB, mcp_schema: dict[str, dict] | None = None,
           host: str = limits.DEFAULT_HOST, trusted_proxies: Iterable[str] = ()) -> tuple:
    """Serve ``demo`` on ``host``:``port``: the examples folder is served, the work dir never (exports reach the page
    through Gradio's cache); the page's link up to :data:`analysis.MAX_LINK_BYTES` (a longer one is sent to the page
    without it: :class:`server.RequestSizeLimit`); files up to ``max_upload_mb``, request bodies up to that plus
    REQUEST_SLACK_MB, uploads within ``workspace``'s byte budget (default: the one on WORK_DIR), which is swept every
    FILE_SWEEP_S while the server runs. Each request's visitor is decided by :class:`server.Visitors` (tokens minted
    MINT_BURST at once and MINT_PER_HOUR an hour per address), its address from ``X-Forwarded-For`` only when it comes
    from one of ``trusted_proxies``: uvicorn's own reading of that header (``FORWARDED_ALLOW_IPS``, 127.0.0.1 by
    default) is turned off, so a local client cannot name an address. With ``mcp_schema``
    (:meth:`app_api.ExplorerAPI.tool_schema`), Gradio's MCP server also offers the documented API (the ``gr.api``
    endpoints) as MCP tools at ``/gradio_api/mcp/`` (:mod:`app_mcp`: images as data URIs, kept in the work dir; answers
    in JSON); their calls go through the same queue and admission.

    Args:
        host (str): the address to listen on (``0.0.0.0``: every interface). Default: DEFAULT_HOST, 127.0.0.1
        trusted_proxies (Iterable[str]): addresses or networks of reverse proxies (:func:`server.trusted_networks`).
            Default: none

    Returns:
        tuple: what :meth:`gradio.Blocks.launch` returns (the app, its local URL, its share URL).

    Raises:
        ValueError: a trusted proxy that is not an address or a network.
    """
    workspace = workspace or default_workspace()
    visitors = Middleware(Visitors, mint_burst=limits.MINT_BURST, mint_per_hour=limits.MINT_PER_HOUR,
                          trusted_proxies=trusted_networks(trusted_proxies))
    size_limit = Middleware(RequestSizeLimit, max_bytes=(max_upload_mb + limits.REQUEST_SLACK_MB) * 2**20,
                            workspace=workspace, upload_paths=[f"{API_PREFIX}/upload"], page_paths=["/"])
    turns = FairTurns.of(demo)
    door = [Middleware(QueueDoor, turns=turns)] if turns is not None else []
    app_kwargs = {"middleware": [visitors, *door, size_limit],  # Visitors first: the others read who it records
                  "lifespan": workspace.lifespan(limits.FILE_SWEEP_S)}
    os.environ["FORWARDED_ALLOW_IPS"] = ""  # read by the uvicorn.Config that Gradio's launch makes: trust no peer
    with app_mcp.serving(mcp_schema or {}):
        return demo.launch(server_name=host, server_port=port, prevent_thread_lock=prevent_thread_lock,
                           allowed_paths=[str(EXAMPLES_DIR)], quiet=prevent_thread_lock, app_kwargs=app_kwargs,
                           max_file_size=f"{max_upload_mb}mb", state_session_capacity=limits.MAX_SESSIONS,
                           max_threads=limits.MAX_THREADS, css_paths=[WEB_DIR / "page.css"],
                           js=(WEB_DIR / "page.js").read_text(encoding="utf-8"), mcp_server=mcp_schema is not None)
