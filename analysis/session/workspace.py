"""Where the app keeps the files people bring and take away.

A :class:`Workspace` holds uploaded checkpoints and query exports as ``root/<session>/<kind>/<entry>/<file>``, and
every part of those names is made here: the session folder is a digest of the session's id, the entry a random id,
the file names are the caller's constants (plain ASCII, checked). So nothing a card, an upload or a request says
ever names a path, and a session reaches only its own entries (:meth:`Workspace.open`). The workspace is bounded in
bytes, checked before anything is written (:meth:`Workspace.add`), and in time: entries unused for ``max_age_s`` are
deleted by :meth:`Workspace.sweep`, which runs before every write and, while a server runs, on a schedule
(:meth:`Workspace.lifespan`). The byte bound can cover folders that others write too (Gradio's cache of uploads
and downloads): their files count, and a writer there holds room first (:meth:`Workspace.reserve`).
"""

from __future__ import annotations

import asyncio
import contextlib
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

__all__ = ["EXPORTS", "UPLOADS", "Workspace"]

UPLOADS, EXPORTS = "uploads", "exports"  # the kinds of entries the app keeps
_ENTRY_ID = re.compile(r"[0-9a-f]{32}")  # what secrets.token_hex(16) makes
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # the names add() writes: plain ASCII, no leading dot


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.1f} MB"


def _folder_bytes(folder: Path) -> int:
    """Bytes held by the files under ``folder`` now (none if it does not exist; a file deleted meanwhile counts 0)."""
    total = 0
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file():
                total += path.stat().st_size
    return total


class Workspace:
    """Per-session folders of uploaded checkpoints and exports, bounded in bytes and in time.

    Args:
        root (str or Path): the folder (created on the first write).
        max_bytes (int): most bytes the files of all entries, and of the ``counted`` folders, may hold together.
        max_age_s (float): an entry not written or opened for longer than this, in seconds, is deleted by
            :meth:`sweep`.
        counted (Iterable[str or Path]): other folders whose files count against ``max_bytes`` (Gradio's cache),
            written by others, who hold room first (:meth:`reserve`); never written or swept here, and not inside
            ``root``. Default: none

    Sessions are strings (Gradio's session hash); ``None`` is the one session of callers that have none (a direct
    Python call). Thread-safe.
    """

    def __init__(self, root: str | Path, max_bytes: int, max_age_s: float, counted: Iterable[str | Path] = ()) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.max_age_s = float(max_age_s)
        self.counted = tuple(Path(folder) for folder in counted)
        self._lock = threading.Lock()  # held by every write, open and sweep
        self._reserved = 0  # bytes held by reserve() for writes in progress elsewhere
        self._reserved_lock = threading.Lock()

    def _session_dir(self, session: str | None) -> Path:
        return self.root / hashlib.sha256((session or "").encode()).hexdigest()[:32]

    def used_bytes(self) -> int:
        """Bytes held by the files under :attr:`root` and the ``counted`` folders now."""
        return sum(_folder_bytes(folder) for folder in (self.root, *self.counted))

    def _make_room(self, size: int) -> None:
        """Sweep, then check that ``size`` more bytes fit beside what is held and reserved (call with the lock)."""
        self._sweep(time.time())
        used = self.used_bytes() + self._reserved
        if used + size > self.max_bytes:
            raise ValueError(f"the server keeps at most {_mb(self.max_bytes)} of uploads and exports and holds "
                             f"{_mb(used)} now, too much for {_mb(size)} more: try again later (files are deleted "
                             f"{self.max_age_s / 60:.0f} min after their last use)")

    def reserve(self, size: int) -> Callable[[], None]:
        """Hold ``size`` bytes of the bound for files another writer is about to put in a ``counted`` folder (an
        upload Gradio is receiving), after sweeping expired entries, so that writers at the same time cannot
        together pass the bound. While the files are written they count twice (held and on disk): the bound errs on
        the safe side.

        Returns:
            Callable[[], None]: lets go of the room once the writer is done (its files, if any, count from then);
            call it once.

        Raises:
            ValueError: no room for ``size`` bytes (the message of :meth:`add`).
        """
        with self._lock:
            self._make_room(size)
            with self._reserved_lock:
                self._reserved += size

        def release() -> None:
            with self._reserved_lock:
                self._reserved -= size
        return release

    def add(self, session: str | None, kind: str, files: Mapping[str, bytes | str | os.PathLike]) -> Path:
        """Store ``files`` as a new entry of ``session``, after sweeping expired entries.

        Args:
            session (str or None): the session the entry belongs to.
            kind (str): :data:`UPLOADS` or :data:`EXPORTS`.
            files (Mapping[str, bytes | str | PathLike]): file name → contents, or the path of a file to copy. The
                names are the caller's constants (ASCII letters, digits, ``.``, ``_``, ``-``; at most 128).

        Returns:
            Path: the entry's folder, holding exactly ``files``.

        Raises:
            ValueError: the files would take the workspace (its entries, the ``counted`` folders and the room
                reserved) past ``max_bytes`` (nothing is written; the message gives the limit and what is held), or a
                name that is not a plain file name (a bug in the caller).
        """
        for name in files:
            if not _FILE_NAME.fullmatch(name):
                raise ValueError(f"not a plain file name: {name!r}")
        size = sum(len(data) if isinstance(data, bytes) else os.stat(data).st_size for data in files.values())
        with self._lock:
            self._make_room(size)
            entry = self._session_dir(session) / kind / secrets.token_hex(16)
            entry.mkdir(parents=True)
            try:
                for name, data in files.items():
                    if isinstance(data, bytes):
                        (entry / name).write_bytes(data)
                    else:
                        shutil.copyfile(data, entry / name)
            except BaseException:
                shutil.rmtree(entry, ignore_errors=True)
                raise
        return entry

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
            shutil.rmtree(entry, ignore_errors=True)

    def sweep(self, now: float | None = None) -> int:
        """Delete the entries unused for more than ``max_age_s`` and the session folders left empty as long.

        Args:
            now (float, optional): the time to age entries against, in seconds since the epoch. Default: now

        Returns:
            int: how many entries were deleted.
        """
        with self._lock:
            return self._sweep(time.time() if now is None else now)

    def _sweep(self, now: float) -> int:
        removed = 0
        for entry in self.root.glob("*/*/*"):  # entries, or anything else left at their depth
            with contextlib.suppress(OSError):  # gone meanwhile, or not removable: the next sweep tries again
                if now - entry.lstat().st_mtime > self.max_age_s:
                    shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
                    removed += 1
        for folder in (*self.root.glob("*/*"), *self.root.glob("*")):  # session and kind folders left empty
            with contextlib.suppress(OSError):  # not empty, or gone
                if now - folder.stat().st_mtime > self.max_age_s:  # not one another add() has just made
                    folder.rmdir()
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
