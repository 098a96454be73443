"""Atomic file writes for the per-round files (replay shards, reward distributions) and the digests that let a
run notice an edited round file or checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` so that a crash never leaves a half-written file.

    The text goes to a temp file in the same directory, is fsynced, renamed over ``path``
    (``os.replace``), and the directory is fsynced so that the rename itself is durable (POSIX; skipped
    where a directory cannot be opened, e.g. Windows).
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return path
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)
    return path


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
