"""AtomicCheckpointIO (issue 31 item 3): a save that fails or is killed midway leaves the previous checkpoint under
the target's name, complete, and no partial file there; a normal save round-trips; the facades write through it
unless the user brings a CheckpointIO of their own (docs/guide.md §1.1)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import cpu_trainer_kwargs
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

from comlrl_lightning import checkpoint_io
from comlrl_lightning.checkpoint_io import AtomicCheckpointIO, with_atomic_checkpoint_io

ROOT = Path(__file__).resolve().parents[2]


def _checkpoint(value: float) -> dict:
    return {"state_dict": {"w": torch.full((64, 64), value)}, "global_step": int(value)}


def _partial_then(error: BaseException):
    """A torch.save that writes the first 100 bytes of the real file, then fails with ``error``."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        real(obj, f, *args, **kwargs)
        f.seek(100)
        f.truncate()
        raise error

    return save


def test_a_save_round_trips_and_replaces_the_previous_file(tmp_path):
    io, path = AtomicCheckpointIO(), tmp_path / "sub" / "step=1.ckpt"
    io.save_checkpoint(_checkpoint(1.0), path)
    io.save_checkpoint(_checkpoint(2.0), path)
    loaded = io.load_checkpoint(path)
    assert torch.equal(loaded["state_dict"]["w"], torch.full((64, 64), 2.0)) and loaded["global_step"] == 2
    assert sorted(p.name for p in path.parent.iterdir()) == ["step=1.ckpt"]  # no temporary left
    io.save_checkpoint(_checkpoint(3.0), f"file://{tmp_path / 'url.ckpt'}")
    assert io.load_checkpoint(tmp_path / "url.ckpt")["global_step"] == 3


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_a_save_failing_midway_leaves_the_previous_checkpoint_and_no_partial_file(tmp_path, monkeypatch, error):
    io, path = AtomicCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint(_checkpoint(1.0), path)
    before = path.read_bytes()
    monkeypatch.setattr(checkpoint_io.torch, "save", _partial_then(error))
    with pytest.raises(type(error)):
        io.save_checkpoint(_checkpoint(2.0), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]  # the partial temporary was deleted
    with pytest.raises(type(error)):
        io.save_checkpoint(_checkpoint(2.0), tmp_path / "new.ckpt")
    assert not (tmp_path / "new.ckpt").exists()


KILLED_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from comlrl_lightning import checkpoint_io
    io, path = checkpoint_io.AtomicCheckpointIO(), sys.argv[1]
    io.save_checkpoint({"w": torch.full((256, 256), 1.0)}, path)
    real = torch.save
    def dying_save(obj, f, *a, **k):
        real(obj, f, *a, **k)
        f.seek(1000)
        f.truncate()
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # killed inside the write of the second save
    checkpoint_io.torch.save = dying_save
    io.save_checkpoint({"w": torch.full((256, 256), 2.0)}, path)
""")


def test_a_save_killed_by_sigkill_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "step=7.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(path)], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert torch.equal(torch.load(path, weights_only=True)["w"], torch.full((256, 256), 1.0))
    leftovers = [p.name for p in tmp_path.iterdir() if p != path]
    assert len(leftovers) == 1 and leftovers[0].startswith(".step=7.ckpt.") and leftovers[0].endswith(".tmp")
    assert sorted(p.name for p in tmp_path.glob("*.ckpt")) == ["step=7.ckpt"]  # resume lookups see no partial file


def test_with_atomic_checkpoint_io_keeps_the_users_choice():
    (added,) = with_atomic_checkpoint_io(None)
    assert isinstance(added, AtomicCheckpointIO)
    own = TorchCheckpointIO()
    assert with_atomic_checkpoint_io([own]) == [own]
    assert with_atomic_checkpoint_io(own) is own
    kept, added = with_atomic_checkpoint_io(["bf16-mixed"])
    assert kept == "bf16-mixed" and isinstance(added, AtomicCheckpointIO)
    assert with_atomic_checkpoint_io(None, strategy="xla") is None

    class OwnIO:  # a strategy object carrying its own writer
        _checkpoint_io = own

    assert with_atomic_checkpoint_io(None, strategy=OwnIO()) is None


def test_a_facade_fit_writes_its_checkpoints_through_the_plugin(tiny_model_dir, tmp_path, monkeypatch):
    from comlrl_lightning.config.magrpo import MAGRPOConfig
    from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
    from comlrl_lightning.trainers.magrpo import MAGRPOTrainer

    saved = []
    real = AtomicCheckpointIO.save_checkpoint

    def recording(self, checkpoint, path, storage_options=None):
        saved.append(Path(path).name)
        return real(self, checkpoint, path, storage_options)

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", recording)
    args = MAGRPOConfig(num_generations=2, max_new_tokens=3, num_train_epochs=1, eval_interval=0, eval_num_samples=1,
                        rollout_buffer_size=2, seed=0)
    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread")]

    def facade(**kwargs):
        return MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=items, reward_func=cooperative_reward,
                             formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs(
                                 enable_checkpointing=True, default_root_dir=str(tmp_path), **kwargs),
                             callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), filename="{step}",
                                                        every_n_train_steps=1, save_top_k=-1)])

    t = facade()
    assert isinstance(t.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    t.train()
    written = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert written and sorted(set(saved)) == written, (saved, written)
    assert isinstance(facade(plugins=[TorchCheckpointIO()]).trainer.strategy.checkpoint_io, TorchCheckpointIO)


def _cli_trainer(overrides: list[str]):
    """The trainer the CLI builds for configs/madpo/tiny.yaml with ``overrides`` (no fit)."""
    import importlib

    from comlrl_lightning.cli import CLI_MODULES, _make_cli_class

    for module in CLI_MODULES:
        importlib.import_module(module)
    cli_cls, L = _make_cli_class(want_help=False)
    cli_cls.secrets = cli_cls.parser_cls.secrets = set()
    config = Path(__file__).resolve().parents[2] / "configs" / "madpo" / "tiny.yaml"
    cli = cli_cls(L.LightningModule, L.LightningDataModule, subclass_mode_model=True, subclass_mode_data=True,
                  auto_configure_optimizers=False, parser_class=cli_cls.parser_cls, save_config_callback=None,
                  run=False, args=["--config", str(config), "--trainer.accelerator=cpu", *overrides])
    return cli.trainer


def test_the_cli_writes_checkpoints_through_the_plugin_unless_the_config_names_one(tmp_path):
    trainer = _cli_trainer([f"--trainer.default_root_dir={tmp_path}"])
    assert type(trainer.strategy.checkpoint_io) is checkpoint_io.AtomicCheckpointIO
    trainer = _cli_trainer([f"--trainer.default_root_dir={tmp_path}",
                            "--trainer.plugins=lightning.pytorch.plugins.io.TorchCheckpointIO"])
    assert type(trainer.strategy.checkpoint_io) is TorchCheckpointIO
