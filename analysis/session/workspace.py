"""Where the app keeps the files people bring and take away.

A :class:`Workspace` holds uploaded checkpoints and query exports as ``root/<session>/<kind>/<entry>/<file>``, and
every part of those names is made here: the session folder is a digest of the session's id, the entry a random id,
the file names are the caller's constants (plain ASCII, checked). So nothing a card, an upload or a request says
ever names a path, and a session reaches only its own entries (:meth:`Workspace.open`). The workspace is bounded in
bytes, checked before anything is written (:meth:`Workspace.add`), and in time: entries unused for ``max_age_s`` are
deleted by :meth:`Workspace.sweep`, which runs on a schedule while a server runs (:meth:`Workspace.lifespan`), and
before a write that would not fit. The byte bound can cover folders that others write too (Gradio's cache of
uploads and downloads): their files count, and a writer there holds room first (:meth:`Workspace.reserve`).

The bytes held are counted as they change (each write, removal and held room), not by walking the folders per
request: the folders are walked when the workspace is made and by each sweep. Each visitor (a string the server
gives: :func:`server.visitor`) also has a share of the bound (``share_bytes``), so that one visitor cannot fill it
for everyone, and all visitors at one network address (:func:`server.address`) a ceiling (``address_bytes``), so
that one address cannot make itself visitors without end. An entry is written under a temporary name and renamed
once complete, and a full disk leaves nothing behind (:meth:`Workspace.add`). A server's files live in a run folder
of its own (:func:`claim_run_dir`), locked while it runs; the run folders of servers that ended, cleanly or not, are
deleted when the next one starts.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import hashlib
import os
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["EXPORTS", "UPLOADS", "Workspace", "claim_run_dir"]

UPLOADS, EXPORTS = "uploads", "exports"  # the kinds of entries the app keeps
_ENTRY_ID = re.compile(r"[0-9a-f]{32}")  # what secrets.token_hex(16) makes
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the names add() writes: plain ASCII, no leading dot
_PARTIAL = ".part-"  # an entry being written: renamed to its id once complete (swept like an entry if left)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
RUN_PREFIX = "run-"  # a server's run folder in the work dir (claim_run_dir)
# What servers wrote straight into the work dir before run folders (deleted when a server starts, claim_run_dir):
# sessions/ and gradio/ (the sessions and Gradio's cache, be3fbd1 to 1072acc), a folder per session named by its
# digest (1792aac), checkpoints/ and exports/ (cfac41a)
_OLDER_LAYOUT = re.compile(r"sessions|gradio|checkpoints|exports|[0-9a-f]{32}")
_LOCK_SUFFIX = ".lock"  # a run folder's lock: a file of its name and this suffix, beside it
_held_runs: dict[Path, int] = {}  # run folders this process holds → the open descriptor of their lock


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.1f} MB"


def _folder_files(folder: Path) -> dict[Path, int]:
    """The files under ``folder`` now → their bytes (none if it does not exist; a file deleted meanwhile counts 0)."""
    files = {}
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                files[path] = path.stat().st_size
    return files


def _folder_bytes(folder: Path) -> int:
    """Bytes held by the files under ``folder`` now (:func:`_folder_files`)."""
    return sum(_folder_files(folder).values())


def claim_run_dir(work_dir: str | Path, name: str) -> Path:
    """This process's run folder ``work_dir/name`` (created if needed), locked for as long as the process lives (the
    lock is the file ``name.lock`` beside it), after deleting the run folders of processes that ended: their lock
    is free, as the kernel lets go of it however the process ended, ``kill -9`` included. Folders of runs still
    going are left alone; a run folder with no lock (its process never claimed it, only wrote Gradio's cache there)
    goes once the process its name gives has ended. The folders servers wrote before run folders, straight into
    ``work_dir`` (``sessions/``, ``gradio/``, …: :data:`_OLDER_LAYOUT`), are deleted too; anything else, and a
    symbolic link of any name, is left alone (nothing outside ``work_dir`` is followed). Claiming a folder this
    process holds again changes nothing.

    Args:
        work_dir (str or Path): the folder that holds the run folders.
        name (str): this run's folder, :data:`RUN_PREFIX` then a name unique to the process.

    Returns:
        Path: the run folder.

    Raises:
        ValueError: ``name`` is not a run folder's name (a bug in the caller), or another process holds it.
        OSError: the work dir cannot be written.
    """
    if not name.startswith(RUN_PREFIX) or not _FILE_NAME.fullmatch(name):
        raise ValueError(f"not a run folder's name: {name!r}")
    work_dir = Path(work_dir)
    run = work_dir / name
    if run in _held_runs:
        return run
    work_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(work_dir / (name + _LOCK_SUFFIX), os.O_RDWR | os.O_CREAT, 0o600)
    if not _lock(descriptor):
        os.close(descriptor)
        raise ValueError(f"the run folder {name} is held by another process")
    _held_runs[run] = descriptor
    run.mkdir(exist_ok=True)
    for other in work_dir.glob(RUN_PREFIX + "*"):
        lock = other.with_name(other.name.removesuffix(_LOCK_SUFFIX) + _LOCK_SUFFIX)
        other = lock.with_name(lock.name.removesuffix(_LOCK_SUFFIX))
        if other in _held_runs:
            continue
        with contextlib.suppress(OSError):
            if not lock.exists():  # never claimed (a process that only imported Gradio): gone with its process
                if not _process_alive(other.name):
                    shutil.rmtree(other, ignore_errors=True)
                continue
            probe = os.open(lock, os.O_RDWR)
            try:
                if _lock(probe):  # nobody holds it: what an ended process left
                    shutil.rmtree(other, ignore_errors=True)
                    lock.unlink()
            finally:
                os.close(probe)
    for older in work_dir.iterdir():
        with contextlib.suppress(OSError):  # gone meanwhile, or not removable: the next start tries again
            if _OLDER_LAYOUT.fullmatch(older.name) and older.is_dir() and not older.is_symlink():
                shutil.rmtree(older)
    return run


def _process_alive(run_name: str) -> bool:
    """Whether the process a run folder's name gives (``run-<pid>-…``) is running; True if the name gives none."""
    pid = run_name.removeprefix(RUN_PREFIX).split("-")[0]
    if not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:  # someone else's process
        return True
    return True


def _lock(descriptor: int) -> bool:
    """Take the exclusive lock of an open file without waiting; False if another open file holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): every run folder counts as held, none is deleted
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class Workspace:
    """Per-session folders of uploaded checkpoints and exports, bounded in bytes (in all and per visitor) and in time.

    Args:
        root (str or Path): the folder (created on the first write).
        max_bytes (int): most bytes the files of all entries, and of the ``counted`` folders, may hold together.
        max_age_s (float): an entry not written or opened for longer than this, in seconds, is deleted by
            :meth:`sweep`.
        counted (Iterable[str or Path]): other folders whose files count against ``max_bytes`` (Gradio's cache),
            written by others, who hold room first (:meth:`reserve`); never written or swept here, and not inside
            ``root``. Default: none
        share_bytes (int, optional): most bytes one visitor's entries, room held and what its uploads of the last
            ``max_age_s`` added on disk may hold together. Default: None (``max_bytes``)
        address_bytes (int, optional): most bytes the visitors charged at one address may hold together, counted
            as for ``share_bytes``. Default: None (no ceiling but the bound)

    Sessions are strings (Gradio's session hash); ``None`` is the one session of callers that have none (a direct
    Python call). A visitor is who the server says sent a request (:func:`server.visitor`); a write that names
    none is charged to its session; a write that names no address has no ceiling but the share. Thread-safe.
    """

    def __init__(self, root: str | Path, max_bytes: int, max_age_s: float, counted: Iterable[str | Path] = (),
                 share_bytes: int | None = None, address_bytes: int | None = None) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self.counted = tuple(Path(folder) for folder in counted)
        self.share_bytes = self.max_bytes if share_bytes is None else int(share_bytes)
        self.address_bytes = None if address_bytes is None else int(address_bytes)
        self._lock = threading.Lock()  # held by every write, open, sweep and change of the counts
        self._entries: dict[Path, tuple[str, int]] = {}  # entry folder → (its visitor, its bytes)
        self._entry_bytes = 0  # their sum
        self._counted_paths: set[Path] = set()  # the counted folders' files at the last walk and stored since
        self._counted_bytes = 0  # … their bytes (or, for uploads whose files were not named, the bytes declared)
        self._stored: collections.deque = collections.deque()  # (time, visitor, bytes) uploads added there
        self._reserved: collections.Counter = collections.Counter()  # visitor → bytes held by reserve()
        self._charged: collections.Counter = collections.Counter()  # visitor → its entries' and stored uploads' bytes
        self._at_address: dict[str, set[str]] = {}  # address → the visitors charged there that may hold bytes
        self._recount()

    def _session_dir(self, session: str | None) -> Path:
        return self.root / hashlib.sha256((session or "").encode()).hexdigest()[:32]

    def _recount(self) -> None:
        """Walk the folders once: the entries on disk and the counted folders' bytes (call with the lock, or alone)."""
        known = {entry: self._entries.get(entry, ("", 0))[0] for entry in self.root.glob("*/*/*")}
        for visitor, size in self._entries.values():
            self._charged[visitor] -= size
        self._entries = {entry: (visitor, _folder_bytes(entry)) for entry, visitor in known.items()}
        self._entry_bytes = sum(size for _, size in self._entries.values())
        for visitor, size in self._entries.values():
            self._charged[visitor] += size
        counted = {path: size for folder in self.counted for path, size in _folder_files(folder).items()}
        self._counted_paths, self._counted_bytes = set(counted), sum(counted.values())

    def used_bytes(self) -> int:
        """Bytes held by the files under :attr:`root` and the ``counted`` folders, as counted: each entry as written,
        the counted folders as walked by the last sweep plus what the uploads stored there since added."""
        with self._lock:
            return self._entry_bytes + self._counted_bytes

    def visitor_bytes(self, visitor: str) -> int:
        """Bytes charged to ``visitor`` now: its entries, room held and what its uploads of the last ``max_age_s``
        added on disk."""
        with self._lock:
            return self._visitor_bytes(visitor, time.time())

    def _visitor_bytes(self, visitor: str, now: float) -> int:
        while self._stored and now - self._stored[0][0] > self.max_age_s:
            _, owner, size = self._stored.popleft()
            self._charged[owner] -= size
        return self._charged[visitor] + self._reserved[visitor]

    def _address_bytes(self, address: str, visitor: str, now: float) -> int:
        """Bytes charged to the visitors at ``address``, ``visitor`` now counted among them; those that hold
        nothing are forgotten there (call with the lock)."""
        visitors = self._at_address.setdefault(address, set())
        visitors.add(visitor)
        held = {other: self._visitor_bytes(other, now) for other in visitors}
        visitors.intersection_update(other for other, size in held.items() if size or other == visitor)
        return sum(held.values())

    def _make_room(self, size: int, visitor: str, address: str | None) -> None:
        """Check that ``size`` more bytes fit in ``visitor``'s share, in ``address``'s ceiling and beside what is
        held and reserved, sweeping first if they do not (call with the lock)."""
        now = time.time()
        mine = self._visitor_bytes(visitor, now)
        ours = self._address_bytes(address, visitor, now) if address and self.address_bytes is not None else None
        if ours is not None and ours + size > self.address_bytes:
            raise ValueError(f"the visitors at one network address may keep at most {_mb(self.address_bytes)} of "
                             f"uploads and exports on the server together, and yours hold {_mb(ours)} now, too much "
                             f"for {_mb(size)} more: try again later (files are deleted "
                             f"{self.max_age_s / 60:.0f} min after their last use)")
        if mine + size > self.share_bytes:
            raise ValueError(f"each visitor may keep at most {_mb(self.share_bytes)} of uploads and exports on the "
                             f"server, and you hold {_mb(mine)} now, too much for {_mb(size)} more: try again later "
                             f"(files are deleted {self.max_age_s / 60:.0f} min after their last use)")
        held = self._entry_bytes + self._counted_bytes + sum(self._reserved.values())
        if held + size > self.max_bytes:
            self._sweep(now)
            held = self._entry_bytes + self._counted_bytes + sum(self._reserved.values())
        if held + size > self.max_bytes:
            raise ValueError(f"the server keeps at most {_mb(self.max_bytes)} of uploads and exports and holds "
                             f"{_mb(held)} now, too much for {_mb(size)} more: try again later (files are deleted "
                             f"{self.max_age_s / 60:.0f} min after their last use)")

    def reserve(self, size: int, visitor: str = "", address: str | None = None) -> Callable[..., None]:
        """Hold ``size`` bytes of the bound, of ``visitor``'s share and of ``address``'s ceiling for files another
        writer is about to put in a ``counted`` folder (an upload Gradio is receiving), so that writers at the same
        time cannot together pass any of them: a request whose declared size does not fit is refused before its body
        is read.

        Returns:
            Callable[[bool, Iterable[str or PathLike] or None, int or None], None]: ``release(stored, files=None,
            arrived=None)`` lets go of
            the room once the writer is done; call it once, with ``stored`` True if the files were stored. Then what
            they added on disk stays charged to ``visitor`` for ``max_age_s`` (how long they are kept) and to the
            bound until the next sweep counts them: each of ``files`` (the paths written) by its size on disk, but
            none that is counted already (stored before, by anyone, or seen by the last sweep: Gradio keeps
            identical contents once, in a folder named by their hash, so the same file uploaded again adds nothing);
            without ``files`` (None or empty), the bytes that ``arrived`` (at most ``size``; None: ``size``).

        Raises:
            ValueError: no room for ``size`` bytes in ``visitor``'s share (the message names the share), in
                ``address``'s ceiling (the message names it) or in the bound (the message of :meth:`add`).
        """
        with self._lock:
            self._make_room(size, visitor, address)
            self._reserved[visitor] += size

        def release(stored: bool = False, files: Iterable[str | os.PathLike] | None = None,
                    arrived: int | None = None) -> None:
            with self._lock:
                self._reserved[visitor] -= size
                if not self._reserved[visitor]:
                    del self._reserved[visitor]
                if stored:
                    added = self._count_new(files) if files else size if arrived is None else min(arrived, size)
                    self._counted_bytes += added
                    self._stored.append((time.time(), visitor, added))
                    self._charged[visitor] += added
        return release

    def _count_new(self, files: Iterable[str | os.PathLike]) -> int:
        """Add the ``files`` not counted yet to the counted paths; their bytes on disk (call with the lock)."""
        added = 0
        for path in map(Path, files):
            if path in self._counted_paths:
                continue
            with contextlib.suppress(OSError):  # gone already: it adds nothing
                added += path.stat().st_size
                self._counted_paths.add(path)
        return added

    def add(self, session: str | None, kind: str, files: Mapping[str, bytes | str | os.PathLike],
            visitor: str | None = None, address: str | None = None) -> Path:
        """Store ``files`` as a new entry of ``session``: written in a folder of a temporary name, renamed to the
        entry's once complete.

        Args:
            session (str or None): the session the entry belongs to.
            kind (str): :data:`UPLOADS` or :data:`EXPORTS`.
            files (Mapping[str, bytes | str | PathLike]): file name → contents, or the path of a file to copy. The
                names are the caller's constants (ASCII letters, digits, ``.``, ``_``, ``-``; at most 128).
            visitor (str, optional): whose share the entry counts against. Default: the session
            address (str, optional): the network address whose ceiling it counts against too. Default: None (none)

        Returns:
            Path: the entry's folder, holding exactly ``files``.

        Raises:
            ValueError: the files would take ``visitor`` past its share or ``address`` past its ceiling (the
                message names which), or the
                workspace (its entries, the ``counted`` folders and the room reserved) past ``max_bytes`` (the
                message gives the limit and what is held); the disk is full (nothing is left of the entry); or a
                name that is not a plain file name (a bug in the caller).
        """
        for name in files:
            if not _FILE_NAME.fullmatch(name):
                raise ValueError(f"not a plain file name: {name!r}")
        visitor = session or "" if visitor is None else visitor
        size = sum(len(data) if isinstance(data, bytes) else os.stat(data).st_size for data in files.values())
        with self._lock:
            self._make_room(size, visitor, address)
            entry_id = secrets.token_hex(16)
            folder = self._session_dir(session) / kind
            partial = folder / (_PARTIAL + entry_id)
            try:
                partial.mkdir(parents=True)
                for name, data in files.items():
                    if isinstance(data, bytes):
                        (partial / name).write_bytes(data)
                    else:
                        shutil.copyfile(data, partial / name)
                partial.rename(folder / entry_id)
            except BaseException as err:
                shutil.rmtree(partial, ignore_errors=True)
                if isinstance(err, OSError) and err.errno in _DISK_FULL:
                    raise ValueError("the server's disk is full: nothing was stored; try again later") from None
                raise
            self._entries[folder / entry_id] = (visitor, size)
            self._entry_bytes += size
            self._charged[visitor] += size
        return folder / entry_id

    def open(self, session: str | None, kind: str, entry_id: str) -> Path:
        """The folder of ``session``'s entry ``entry_id`` (the name of a folder :meth:`add` returned), its last use
        renewed so that :meth:`sweep` keeps it.

        Raises:
            ValueError: ``entry_id`` is not an id :meth:`add` makes, or ``session`` has no such entry (it never had,
                or the entry was swept).
        """
        entry = self._session_dir(session) / kind / entry_id
        with self._lock:
            if not _ENTRY_ID.fullmatch(entry_id) or not entry.is_dir():
                raise ValueError(f"this {kind.removesuffix('s')} is no longer on the server (files are kept for the "
                                 f"session that made them, {self.max_age_s / 60:.0f} min after their last use): "
                                 "make it again")
            os.utime(entry)
        return entry

    def remove(self, entry: Path) -> None:
        """Delete an entry folder :meth:`add` returned (and nothing outside :attr:`root`)."""
        if Path(entry).resolve().is_relative_to(self.root.resolve()):
            with self._lock:
                shutil.rmtree(entry, ignore_errors=True)
                self._forget(Path(entry))

    def _forget(self, entry: Path) -> None:
        visitor, size = self._entries.pop(entry, ("", 0))
        self._entry_bytes -= size
        self._charged[visitor] -= size

    def sweep(self, now: float | None = None) -> int:
        """Delete the entries unused for more than ``max_age_s`` and the session folders left empty as long, and the
        leftovers of failed uploads at the top of the counted folders (``tmp*`` files as old), then count what the
        folders hold (the counted folders' other files, written by others, are counted, never deleted).

        Args:
            now (float, optional): the time to age entries against, in seconds since the epoch. Default: now

        Returns:
            int: how many entries were deleted.
        """
        with self._lock:
            removed = self._sweep(time.time() if now is None else now)
            self._recount()
            return removed

    def _sweep(self, now: float) -> int:
        removed = 0
        for entry in self.root.glob("*/*/*"):  # entries, or anything else left at their depth
            with contextlib.suppress(OSError):  # gone meanwhile, or not removable: the next sweep tries again
                if now - entry.lstat().st_mtime > self.max_age_s:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    self._forget(entry)
                    removed += 1
        for folder in (*self.root.glob("*/*"), *self.root.glob("*")):  # session and kind folders left empty
            with contextlib.suppress(OSError):  # not empty, or gone
                if now - folder.stat().st_mtime > self.max_age_s:  # not one another add() has just made
                    folder.rmdir()
        for leftover in (path for folder in self.counted for path in folder.glob("tmp*")):
            # Gradio receives an upload's parts into temporary files at the top of its cache and moves away only
            # the files it answers: a part not named "files", or a body cut off, stays there, never deleted by it
            with contextlib.suppress(OSError):
                stale = now - leftover.lstat().st_mtime > self.max_age_s
                if stale and leftover.is_file() and not leftover.is_symlink():
                    leftover.unlink()
                    removed += 1
        return removed

    def lifespan(self, every_s: float) -> Callable[[Any], contextlib.AbstractAsyncContextManager]:
        """An ASGI lifespan (what FastAPI's ``lifespan=`` takes) that sweeps once as the server starts, then every
        ``every_s`` seconds until it stops."""
        @contextlib.asynccontextmanager
        async def sweeping(app: Any):
            self.sweep()

            async def loop() -> None:
                while True:
                    await asyncio.sleep(every_s)
                    await asyncio.to_thread(self.sweep)

            task = asyncio.create_task(loop())
            try:
                yield
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return sweeping
