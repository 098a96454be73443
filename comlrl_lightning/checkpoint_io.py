"""AtomicCheckpointIO: a ``.ckpt`` file is either the previous complete checkpoint or the new complete one, never a
truncated one (a run killed while Lightning saves, e.g. by ``kill -9`` or the OOM killer, leaves a resumable newest
checkpoint). The facades use it by default (docs/guide.md §1.1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from fsspec.utils import get_protocol
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from comlrl_lightning.files import write_atomic


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's ``TorchCheckpointIO`` whose local saves are atomic and durable.

    The checkpoint is written to a temporary file in the target's folder (``.<name>.<random>.tmp``, which no
    ``*.ckpt`` pattern matches), flushed and fsynced, then renamed over the target (``os.replace``) and the folder
    fsynced. A save that fails or is killed midway leaves the previous file under the target's name untouched; a
    failed save deletes its temporary (a killed one cannot: the hidden ``.tmp`` file stays). Remote paths
    (``s3://``, ...) go to Lightning's own writer. Loading and removal are Lightning's.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if get_protocol(str(path)) != "file":
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError(
                f"Trainer.save_checkpoint(..., storage_options={storage_options!r}): {type(self).__name__} writes "
                "local files and takes no storage_options; call it without them."
            )
        local = os.fspath(path)
        target = Path(local[len("file://"):] if local.startswith("file://") else local).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(target, lambda f: torch.save(checkpoint, f))


def with_atomic_checkpoint_io(plugins: Any = None, strategy: Any = None, accelerator: Any = None) -> Any:
    """``plugins`` for ``lightning.Trainer`` with an :class:`AtomicCheckpointIO` added, unless the user chose how
    checkpoints are written: a ``CheckpointIO`` among ``plugins``, a strategy object that carries its own, or XLA
    (TPU), whose strategy writes through ``XLACheckpointIO``. Other plugins given (precision, environment) are kept."""
    from lightning.fabric.plugins import CheckpointIO

    given = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if any(isinstance(p, CheckpointIO) for p in given) or getattr(strategy, "_checkpoint_io", None) is not None:
        return plugins
    if "xla" in str(strategy).lower() or str(accelerator).lower() == "tpu" or "XLA" in type(strategy).__name__:
        return plugins
    return [*given, AtomicCheckpointIO()]
