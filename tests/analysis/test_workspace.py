"""The work dir of uploads and exports (analysis/session/workspace.py)."""

from __future__ import annotations

import os
import time

import pytest

from analysis import Workspace
from analysis.session.workspace import EXPORTS, UPLOADS
from tests.loops import run_coroutine


def files_under(folder) -> list:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_entries_are_named_by_the_workspace_and_reached_by_their_session_only(tmp_path):
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60)
    source = tmp_path / "upload.bin"
    source.write_bytes(b"w" * 100)
    entry = workspace.add("alice", UPLOADS, {"checkpoint.json": b"{}", "checkpoint.safetensors": source})
    assert entry.parent.parent.parent == tmp_path / "work" and len(entry.name) == 32
    assert sorted(p.name for p in entry.iterdir()) == ["checkpoint.json", "checkpoint.safetensors"]
    assert workspace.open("alice", UPLOADS, entry.name) == entry
    for session, entry_id in (("bob", entry.name), (None, entry.name), ("alice", "../" + entry.name),
                              ("alice", "0" * 31)):
        with pytest.raises(ValueError, match="this upload is no longer on the server"):
            workspace.open(session, UPLOADS, entry_id)
    with pytest.raises(ValueError, match=r"not a plain file name: '\.\./x'"):
        workspace.add("alice", EXPORTS, {"../x": b""})
    assert workspace.used_bytes() == 102


def test_a_write_past_the_byte_bound_is_refused_before_anything_is_written(tmp_path):
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60)
    workspace.add("alice", EXPORTS, {"a.json": b"x" * 600})
    with pytest.raises(ValueError, match=r"the server keeps at most 0\.0 MB of uploads and exports and holds 0\.0 MB "
                                         r"now, too much for 0\.0 MB more: try again later \(files are deleted 1 min"):
        workspace.add("bob", EXPORTS, {"b.json": b"x" * 500})
    assert [p.name for p in files_under(tmp_path / "work")] == ["a.json"]


def test_a_sweep_deletes_what_was_not_used_for_max_age(tmp_path):
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60)
    old, used = (workspace.add("alice", UPLOADS, {"checkpoint.json": b"{}"}) for _ in range(2))
    stray = tmp_path / "work" / "checkpoints" / "0f" / "left.json"  # an older layout's file, at an entry's depth
    stray.parent.mkdir(parents=True)
    stray.write_text("{}")
    past = time.time() - 120
    for path in (old, used, stray):
        os.utime(path, (past, past))
    workspace.open("alice", UPLOADS, used.name)  # opening renews it
    assert workspace.sweep() == 2 and not old.exists() and not stray.exists() and used.exists()
    assert workspace.sweep(now=time.time() + 61) == 1 and list((tmp_path / "work").iterdir()) == []


def test_the_lifespan_sweeps_as_the_server_starts(tmp_path):
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60)
    entry = workspace.add("alice", UPLOADS, {"checkpoint.json": b"{}"})
    os.utime(entry, (0, 0))

    async def start_and_stop():
        async with workspace.lifespan(every_s=3600)(None):
            return entry.exists()

    assert run_coroutine(start_and_stop()) is False


def test_counted_folders_and_room_held_for_other_writers_share_the_byte_bound(tmp_path):
    """Gradio's upload cache had no byte limit (40 posts of 2 × 30 MB filled 2.5 GB in 12 s): the work dir's bound
    covered only the app's own files. Files of a counted folder count against it, and so does room held for a write
    in progress there, until it is let go."""
    cache = tmp_path / "gradio"
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60, counted=[cache])
    (cache / "0f").mkdir(parents=True)
    (cache / "0f" / "upload.png").write_bytes(b"x" * 600)
    assert workspace.used_bytes() == 600
    with pytest.raises(ValueError, match="the server keeps at most"):
        workspace.add("alice", EXPORTS, {"a.json": b"x" * 401})
    release = workspace.reserve(300)
    with pytest.raises(ValueError, match="the server keeps at most"):  # 600 held + 300 reserved + 101
        workspace.reserve(101)
    with pytest.raises(ValueError, match="the server keeps at most"):
        workspace.add("alice", EXPORTS, {"a.json": b"x" * 101})
    workspace.add("alice", EXPORTS, {"a.json": b"x" * 100})
    release()
    workspace.reserve(300)()  # room again once let go
    assert [p.name for p in files_under(tmp_path / "work")] == ["a.json"]
    assert files_under(cache) == [cache / "0f" / "upload.png"]  # the counted folder is never written or swept here
    assert workspace.sweep(now=time.time() + 61) == 1 and files_under(cache) == [cache / "0f" / "upload.png"]
