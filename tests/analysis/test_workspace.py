"""The work dir of uploads and exports (analysis/session/workspace.py)."""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import subprocess
import time

import pytest

from analysis import Workspace
from analysis.session import workspace as workspace_module
from analysis.session.workspace import EXPORTS, UPLOADS, claim_run_dir
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


def test_a_sweep_deletes_a_failed_upload_s_leftovers_in_gradio_s_cache_and_nothing_else(tmp_path):
    """Gradio keeps a part not named "files", or a body cut off, as a tmp* file at the top of its cache, and never
    deletes it: 21 such uploads held the 2 GB bound for everyone until a restart."""
    cache = tmp_path / "gradio"
    (cache / "0a1b").mkdir(parents=True)
    kept = cache / "0a1b" / "photo.png"  # an upload Gradio answered: its own to delete
    leftover, fresh, other = cache / "tmpab12", cache / "tmpcd34", cache / "notes.txt"
    for path, size in ((kept, 100), (leftover, 1000), (fresh, 10), (other, 1)):
        path.write_bytes(b"x" * size)
    past = time.time() - 120
    for path in (kept, leftover, other):
        os.utime(path, (past, past))
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, counted=[cache])
    assert workspace.sweep() == 1 and not leftover.exists()
    assert kept.exists() and fresh.exists() and other.exists() and workspace.used_bytes() == 111


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
    (cache / "0f").mkdir(parents=True)
    (cache / "0f" / "upload.png").write_bytes(b"x" * 600)
    workspace = Workspace(tmp_path / "work", max_bytes=1000, max_age_s=60, counted=[cache])
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


def test_the_count_is_kept_as_it_changes_not_walked_per_write(tmp_path, monkeypatch):
    """Every upload walked every file of the work dir under a lock (30,000 small files: uploads 21× slower). The
    folders are walked when the workspace is made and by a sweep; writes, removals and held room change the count."""
    cache = tmp_path / "gradio"
    cache.mkdir()
    (cache / "old.png").write_bytes(b"x" * 50)
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, counted=[cache])
    walks = []
    real = workspace_module._folder_files
    monkeypatch.setattr(workspace_module, "_folder_files", lambda folder: walks.append(folder) or real(folder))
    entry = workspace.add("alice", EXPORTS, {"a.json": b"x" * 100})
    workspace.reserve(300, "alice")(True)  # an upload of 300 bytes declared, stored in Gradio's cache
    workspace.reserve(200, "alice")(False)  # one refused by Gradio: nothing stays charged
    assert workspace.used_bytes() == 450 and workspace.visitor_bytes("alice") == 400 and walks == []
    workspace.remove(entry)
    assert workspace.used_bytes() == 350 and workspace.visitor_bytes("alice") == 300 and walks == []
    (cache / "new.png").write_bytes(b"x" * 280)  # what the stored upload really took
    workspace.sweep()
    assert workspace.used_bytes() == 330 and walks == [cache]  # the sweep walks the cache (and the entries: none)
    assert workspace.visitor_bytes("alice") == 300  # kept as long as Gradio keeps the upload


def test_a_stored_upload_is_charged_by_the_files_it_added_each_once(tmp_path):
    """Each upload was charged its declared length, though Gradio keeps identical files once: the same file
    uploaded again filled the count (and the visitor's share) with bytes that were never on disk."""
    cache = tmp_path / "gradio"
    (cache / "0f").mkdir(parents=True)
    walked, new = cache / "0f" / "seen.png", cache / "0f" / "new.png"
    walked.write_bytes(b"x" * 400)
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, counted=[cache], share_bytes=1000)
    new.write_bytes(b"y" * 250)  # what an upload of 300 bytes declared stored
    workspace.reserve(300, "alice")(True, [str(new)])
    workspace.reserve(300, "alice")(True, [str(new)])  # the same file again: in place, nothing added
    workspace.reserve(500, "bob")(True, [str(walked)])  # a file the walk counted already
    workspace.reserve(100, "bob")(True, [str(cache / "gone.png")])  # one deleted meanwhile
    assert workspace.visitor_bytes("alice") == 250 and workspace.visitor_bytes("bob") == 0
    assert workspace.used_bytes() == 650
    workspace.reserve(700, "carol")(True)  # an answer that names no files: its declared length
    assert workspace.visitor_bytes("carol") == 700 and workspace.used_bytes() == 1350
    workspace.sweep()
    assert workspace.used_bytes() == 650 and workspace.visitor_bytes("alice") == 250


def test_a_visitor_past_their_share_is_refused_naming_it_and_others_are_not(tmp_path):
    """One anonymous client filled the shared 2 GB bound in ≈ 2 s; then everyone's uploads and exports got 507."""
    workspace = Workspace(tmp_path / "work", max_bytes=2000, max_age_s=60, share_bytes=500)
    workspace.add("tab-1", EXPORTS, {"a.json": b"x" * 200}, visitor="mallory")
    release = workspace.reserve(250, "mallory")
    share = (r"each visitor may keep at most 0\.0 MB of uploads and exports on the server, and you hold 0\.0 MB now, "
             r"too much for 0\.0 MB more")
    with pytest.raises(ValueError, match=share):
        workspace.add("tab-2", EXPORTS, {"b.json": b"x" * 51}, visitor="mallory")  # another tab, the same visitor
    with pytest.raises(ValueError, match=share):
        workspace.reserve(51, "mallory")
    release(True)
    with pytest.raises(ValueError, match=share):  # the stored upload stays charged
        workspace.reserve(51, "mallory")
    workspace.add("tab-3", EXPORTS, {"c.json": b"x" * 500}, visitor="alice")
    workspace.reserve(400, "bob")(True)
    assert workspace.visitor_bytes("mallory") == 450 and workspace.visitor_bytes("alice") == 500
    assert workspace.add("tab-4", UPLOADS, {"d.json": b"x" * 10}).parent.parent.exists()  # no visitor: its session


def test_the_visitors_at_one_address_are_refused_past_its_ceiling_and_others_are_not(tmp_path):
    """A visitor is a token now, and one address can be given many: their shares together stop at the address's
    ceiling (uploads held, stored and exported alike), and what one of them lets go is room again."""
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60, share_bytes=600, address_bytes=1000)
    first = workspace.add("tab-1", EXPORTS, {"a.json": b"x" * 500}, visitor="t:1", address="10.0.0.66")
    workspace.reserve(300, "t:2", "10.0.0.66")(True)  # an upload stored
    release = workspace.reserve(150, "t:3", "10.0.0.66")  # one arriving
    ceiling = (r"the visitors at one network address may keep at most 0\.0 MB of uploads and exports on the server "
               r"together, and yours hold 0\.0 MB now, too much for 0\.0 MB more")
    with pytest.raises(ValueError, match=ceiling):
        workspace.add("tab-4", EXPORTS, {"b.json": b"x" * 51}, visitor="t:4", address="10.0.0.66")
    with pytest.raises(ValueError, match=ceiling):
        workspace.reserve(51, "t:1", "10.0.0.66")
    release(False)  # refused by Gradio: its room is free again
    workspace.add("tab-4", EXPORTS, {"b.json": b"x" * 200}, visitor="t:4", address="10.0.0.66")
    workspace.reserve(600, "t:5", "10.0.0.7")(True)  # another address: its own ceiling
    workspace.remove(first)
    workspace.reserve(500, "t:6", "10.0.0.66")(True)  # t:1's 500 bytes went: 300 + 200 + 500 = the ceiling
    assert [workspace.visitor_bytes(f"t:{n}") for n in range(1, 7)] == [0, 300, 0, 200, 600, 500]
    with pytest.raises(ValueError, match=ceiling):
        workspace.reserve(1, "t:1", "10.0.0.66")
    workspace.reserve(1, "t:1")(True)  # naming no address: its share only (a direct call)


def test_an_entry_is_written_under_a_temporary_name_and_a_full_disk_leaves_nothing(tmp_path, monkeypatch):
    """Disk full gave a bare 500 and left zero-length files behind."""
    workspace = Workspace(tmp_path / "work", max_bytes=10_000, max_age_s=60)
    source = tmp_path / "weights.bin"
    source.write_bytes(b"w" * 100)
    written_in = []
    real_copy = shutil.copyfile

    def copy(src, dst):
        written_in.append(os.path.basename(os.path.dirname(dst)))
        return real_copy(src, dst)

    monkeypatch.setattr(shutil, "copyfile", copy)
    entry = workspace.add("alice", UPLOADS, {"checkpoint.json": b"{}", "checkpoint.safetensors": source})
    assert written_in == [".part-" + entry.name] and sorted(p.name for p in entry.iterdir()) == [
        "checkpoint.json", "checkpoint.safetensors"]

    def full(src, dst):
        open(dst, "wb").close()  # what a full disk leaves: a file of zero length
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shutil, "copyfile", full)
    with pytest.raises(ValueError, match=r"^the server's disk is full: nothing was stored; try again later$"):
        workspace.add("alice", UPLOADS, {"checkpoint.json": b"{}", "checkpoint.safetensors": source})
    assert files_under(tmp_path / "work") == sorted(entry.iterdir()) and workspace.used_bytes() == 102


def _ended_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def test_run_folders_of_ended_processes_are_deleted_when_the_next_starts(tmp_path):
    """After a kill -9 and restart the previous process's Gradio cache (1.8 GB) was never deleted and kept counting;
    a partial 60 MiB upload stayed forever. A run folder is locked while its process lives; the kernel lets go of
    the lock however the process ended, so the next start deletes what it left."""
    ended = tmp_path / "run-ended"
    (ended / "gradio" / "0f").mkdir(parents=True)
    (tmp_path / "run-ended.lock").touch()
    (ended / "gradio" / "0f" / "part.safetensors").write_bytes(b"x" * 100)  # an upload cut off by the kill
    (tmp_path / "run-live").mkdir()
    held = os.open(tmp_path / "run-live.lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's lock (another open file: the same test)
    (tmp_path / "notes").mkdir()  # not a run folder (someone else's): left alone
    ended_pid = _ended_pid()
    (tmp_path / f"run-{ended_pid}-0" / "gradio").mkdir(parents=True)  # never claimed, its process ended
    (tmp_path / f"run-{os.getpid()}-1" / "gradio").mkdir(parents=True)  # never claimed, its process runs
    try:
        run = claim_run_dir(tmp_path, "run-mine")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", f"run-{os.getpid()}-1", "run-live",
                                                               "run-live.lock", "run-mine", "run-mine.lock"]
        assert claim_run_dir(tmp_path, "run-mine") == run == tmp_path / "run-mine"  # held already: unchanged
        os.close(held)  # the live process ends
        claim_run_dir(tmp_path, "run-next")
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes", f"run-{os.getpid()}-1", "run-mine",
                                                               "run-mine.lock", "run-next", "run-next.lock"]
    finally:
        for path in (tmp_path / "run-mine", tmp_path / "run-next"):
            os.close(workspace_module._held_runs.pop(path))
    with pytest.raises(ValueError, match="not a run folder's name"):
        claim_run_dir(tmp_path, "../run-x")


def test_the_folders_of_the_layout_before_run_folders_are_deleted_when_a_server_starts(tmp_path):
    """sessions/ and gradio/, written straight into the work dir before run folders, were never swept and kept
    their uploads on disk for good. They go at the next start; a symbolic link of their name is not followed, and
    what the app never wrote stays."""
    work = tmp_path / "convnn-explorer"
    old_files = {work / "sessions" / ("a" * 32) / "uploads" / ("b" * 32) / "checkpoint.safetensors": 300,
                 work / "gradio" / ("c" * 64) / "photo.jpg": 200, work / ("d" * 32) / "exports" / "e" / "q.json": 10}
    for path, size in old_files.items():
        path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * size)
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "data.bin").write_bytes(b"y" * 50)
    (work / "checkpoints").symlink_to(outside, target_is_directory=True)  # a link: not followed, left alone
    (work / "exports").write_text("a file, not a folder this app wrote")
    (work / "notes").mkdir()
    try:
        claim_run_dir(work, "run-mine")
        assert sorted(p.name for p in work.iterdir()) == ["checkpoints", "exports", "notes", "run-mine",
                                                          "run-mine.lock"]
        assert files_under(outside) == [outside / "keep" / "data.bin"] and (work / "checkpoints").is_symlink()
    finally:
        os.close(workspace_module._held_runs.pop(work / "run-mine"))
