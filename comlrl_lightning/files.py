"""Atomic file writes for the per-round files (replay shards, reward distributions) and the digests that let a
run notice an edited round file or checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Write ``path`` through ``write(file)`` so that a crash never leaves a half-written file.

    ``write`` fills a temp file in the same directory (``.<name>.<random>.tmp``); it is flushed, fsynced and
    renamed over ``path`` (``os.replace``), and the directory is fsynced so that the rename itself is durable
    (POSIX; skipped where a directory cannot be opened, e.g. Windows). A ``write`` that raises leaves ``path`` as it
    was and removes the temp file (a killed process cannot: the hidden temp file stays).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` with :func:`write_atomic`."""
    return write_atomic(path, lambda f: f.write(text.encode("utf-8")))


def json_digest(value: Any) -> str:
    """sha256 (hex) of ``value``'s compact JSON (``ensure_ascii=False``, no NaN): the digest a round file carries."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Feed a nested state (dicts, lists, tensors, numbers, strings) into hash ``h``, deterministically."""
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(value.shape)}:".encode())
        if t.numel():
            h.update(memoryview(t.view(torch.uint8).numpy()))
    elif isinstance(value, dict) or hasattr(value, "items"):
        items = sorted(dict(value).items(), key=lambda kv: str(kv[0]))
        h.update(f"D{len(items)}:".encode())
        for k, v in items:
            h.update(f"{k!s}=".encode())
            _feed(h, v)
    elif isinstance(value, (list, tuple)):
        h.update(f"L{len(value)}:".encode())
        for v in value:
            _feed(h, v)
    else:
        h.update(f"{type(value).__name__}:{value!r};".encode())


def state_digest(value: Any) -> str:
    """sha256 (hex) of a nested checkpoint state: tensor dtypes, shapes and bytes, keys and plain values."""
    h = hashlib.sha256()
    _feed(h, value)
    return h.hexdigest()


def replace_dir(new: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Put the folder ``new`` in place of ``target`` so that a crash at any moment leaves the old or the new folder
    at ``target``, never none and never a mix: a plain rename when ``target`` does not exist; else, on Linux, one
    ``renameat2(RENAME_EXCHANGE)`` swaps the two atomically and the old folder (now at ``new``) is deleted. Where the
    exchange is unavailable, ``target`` is renamed to ``.<name>.old.<pid>`` first, ``new`` renamed into place, then
    the old one deleted; :func:`recover_dirs` puts an old folder back if a crash fell between the two renames."""
    new, target = Path(new), Path(target)
    if not target.exists():
        os.rename(new, target)
    elif _exchange(new, target):
        shutil.rmtree(new)
    else:
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old)
    fsync_dir(target.parent)
    return target


def recover_dirs(folder: str | os.PathLike[str]) -> list[str]:
    """Undo what a crash left of :func:`replace_dir` in ``folder``: an ``.<name>.old.*`` folder goes back to ``<name>``
    when that is missing (the crash fell between the fallback's two renames), else it is deleted; returns the names
    restored."""
    restored = []
    for old in sorted(Path(folder).glob(".*.old.*")):
        name = old.name[1:].rsplit(".old.", 1)[0]
        target = old.with_name(name)
        if old.is_dir() and not target.exists():
            os.rename(old, target)
            restored.append(name)
        elif old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    return restored


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange the paths ``a`` and ``b`` (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False where the
    call or the flag is unavailable (another OS, an old kernel, a filesystem without it)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    fn = getattr(libc, "renameat2", None)
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return fn(at_fdcwd, os.fsencode(str(a)), at_fdcwd, os.fsencode(str(b)), rename_exchange) == 0


def fsync_dir(folder: Path) -> None:
    """fsync a directory (its entries' renames become durable); a no-op where a directory cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class FolderInUseError(RuntimeError):
    """Another live run holds the folder's :class:`RunLock`."""


class RunLock:
    """One run per folder: an exclusive ``flock`` on ``.<folder name>.lock`` next to the folder (so that the folder
    itself holds only the run's files), held from :meth:`acquire` to :meth:`release` or the process's end (the kernel
    releases the lock of a process that dies, even by SIGKILL, so a killed run never blocks the next one). The file
    names the holder for the message a second run gets: pid, host, start time and program (never the command line,
    which may hold keys). No lock where ``fcntl`` is missing (Windows)."""

    def __init__(self, folder: str | os.PathLike[str], what: str, option: str):
        self.folder, self.what, self.option = Path(folder), what, option
        self.fd: int | None = None

    @property
    def path(self) -> Path:
        return self.folder.absolute().parent / f".{self.folder.absolute().name}.lock"

    def acquire(self) -> None:
        if self.fd is not None:
            return
        try:
            import fcntl
        except ImportError:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.path
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "unknown"
            os.close(fd)
            raise FolderInUseError(
                f"The {self.what} folder {self.folder} is in use by another run that is still alive ({holder}); two "
                f"runs writing one folder overwrite each other's files. Give this run its own default_root_dir (or "
                f"{self.option}), or wait until that run ends.") from None
        import datetime
        import socket

        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "program": Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"}  # no arguments: keys
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        os.close(fd)  # closing the descriptor releases the flock; the file stays (deleting it would race a newcomer)

    def __del__(self) -> None:
        self.release()
