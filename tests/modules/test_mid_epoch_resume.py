"""Resume from a mid-epoch checkpoint (``ModelCheckpoint(every_n_train_steps=...)``) equals the uninterrupted run
(issue 31 item 3, issue 25 "Bad input and faults"): the task and pair loaders resume at the batch after the
checkpoint, so the weights, the counters and every logged metric after it are the uninterrupted run's."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import cpu_trainer_kwargs
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger

from comlrl_lightning.config import IACConfig, MAACConfig, MADPOConfig, MADPOIterConfig
from comlrl_lightning.config.magrpo import CentralizedMAGRPOConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
from comlrl_lightning.trainers.madpo import MADPOIterTrainer
from comlrl_lightning.trainers.preference import MADPOTrainer
from comlrl_lightning.trainers.reinforce import CentralizedMAGRPOTrainer, MAGRPOTrainer

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps")]
COMMON = {"max_new_tokens": 4, "temperature": 1.0, "top_p": 1.0, "top_k": None, "agent_learning_rate": 1e-2,
          "eval_interval": 0, "eval_num_samples": 1, "num_train_epochs": 2, "seed": 3}


class Recorder(Logger):
    """Every ``log_metrics`` call, in order."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    name, version, experiment = "recorder", 0, None

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, {k: float(v) for k, v in metrics.items() if k != "epoch"}))

    def log_hyperparams(self, *args, **kwargs):
        pass


def _magrpo(model_dir, turns=1):
    args = MAGRPOConfig(num_generations=2, rollout_buffer_size=2, num_turns=turns, logging_steps=3, **COMMON)
    return dict(cls=MAGRPOTrainer, args=args, shuffle=True,
                extra={"external_transition": plain_transition} if turns > 1 else {})


FAMILIES = {
    "magrpo-1turn": lambda: _magrpo(None, 1),
    "magrpo-2turn": lambda: _magrpo(None, 2),
    "iac": lambda: dict(cls=IACTrainer, args=IACConfig(rollout_buffer_size=2, critic_learning_rate=1e-2, logging_steps=3, **{
        k: v for k, v in COMMON.items() if k != "top_k"}), shuffle=True, extra={}),
    "maac": lambda: dict(cls=MAACTrainer, args=MAACConfig(rollout_buffer_size=2, critic_learning_rate=1e-2, logging_steps=3, **{
        k: v for k, v in COMMON.items() if k != "top_k"}), shuffle=True, extra={}),
    "magrpo-centralized": lambda: dict(cls=CentralizedMAGRPOTrainer, args=CentralizedMAGRPOConfig(
        num_generations=2, rollout_buffer_size=2, logging_steps=3, **COMMON), shuffle=True, extra={}),
    "madpo-iter": lambda: dict(cls=MADPOIterTrainer, args=MADPOIterConfig(
        num_iterations=2, preference_num_candidates=3, preference_pairs_per_sample=2, train_batch_size=2,
        logging_steps=6, **{**{k: v for k, v in COMMON.items() if k != "num_train_epochs"}, "max_new_tokens": 6}),
        shuffle=False, extra={}),
    "madpo": lambda: dict(cls=MADPOTrainer, args=MADPOConfig(
        preference_num_candidates=3, preference_pairs_per_sample=2, train_batch_size=2, logging_steps=6, **{
            **COMMON, "max_new_tokens": 6}), shuffle=False, extra={}),
}


def build(family: str, model_dir: str, **trainer_kwargs):
    spec = FAMILIES[family]()
    logger = Recorder()
    t = spec["cls"](agent_model=model_dir, train_dataset=ITEMS, reward_func=cooperative_reward, formatters=FORMATTERS,
                    args=spec["args"], trainer_kwargs=cpu_trainer_kwargs(logger=logger, **trainer_kwargs),
                    **spec["extra"])
    if spec["shuffle"] and hasattr(t.datamodule, "shuffle"):
        t.datamodule.shuffle = True
    return t, logger


def loader_state(path) -> dict:
    (state,) = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    return state


def mid_epoch_checkpoints(folder, batches_per_epoch: int) -> list:
    """One checkpoint inside each epoch (the first one after the epoch's first batch), oldest first."""
    found = {}
    for path in sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns):
        s = loader_state(path)
        if 0 < s["batches"] < batches_per_epoch:
            found.setdefault(s["epoch"], path)
    return [found[e] for e in sorted(found)]


def weights(t) -> list[torch.Tensor]:
    return [p.detach().clone() for p in t.module.parameters()]


@pytest.fixture(scope="module", params=list(FAMILIES))
def runs(request, tiny_model_dir, tmp_path_factory):
    family = request.param
    root = tmp_path_factory.mktemp(family)
    full, full_log = build(family, tiny_model_dir, default_root_dir=str(root / "full"))
    full.train()
    ckpt = ModelCheckpoint(dirpath=str(root / "ckpt"), filename="{epoch}-{step}", every_n_train_steps=1,
                           save_top_k=-1)
    saving, _ = build(family, tiny_model_dir, enable_checkpointing=True, default_root_dir=str(root / "saving"),
                      callbacks=[ckpt])
    saving.train()
    batches = full.trainer.num_training_batches
    resumed = []
    # the iterative trainer resumes where its round files are, as a user does (its checkpoint names them)
    folder = root / ("saving" if family == "madpo-iter" else "resumed")
    for path in mid_epoch_checkpoints(root / "ckpt", batches):
        t, log = build(family, tiny_model_dir, default_root_dir=str(folder))
        t.train(ckpt_path=str(path))
        resumed.append((path, t, log))
    return {"family": family, "full": full, "full_log": full_log, "saving": saving, "resumed": resumed,
            "batches": batches, "tiny_model_dir": tiny_model_dir}


def test_checkpoints_inside_both_epochs_were_taken(runs):
    assert runs["batches"] >= 3, "the job must have several batches per epoch"
    assert len(runs["resumed"]) == 2, [str(p) for p, _, _ in runs["resumed"]]


def test_resumed_weights_and_counters_equal_the_uninterrupted_run(runs):
    full = runs["full"]
    assert all(torch.equal(a, b) for a, b in zip(weights(full), weights(runs["saving"])))  # determinism itself
    for path, t, _ in runs["resumed"]:
        for (name, a), b in zip(full.module.named_parameters(), t.module.parameters()):
            assert torch.equal(a, b), f"{runs['family']} resumed from {path.name}: {name} differs by " \
                                      f"{(a - b).abs().max().item():.3g}"
        assert t.trainer.global_step == full.trainer.global_step
        assert t.module.env_step == full.module.env_step
        assert t.module.updates_seen == full.module.updates_seen


def test_resumed_run_logs_what_the_uninterrupted_run_logged_after_the_checkpoint(runs):
    full_rows = runs["full_log"].rows
    for path, _, log in runs["resumed"]:
        assert log.rows, f"the run resumed from {path.name} logged nothing"
        tail = full_rows[len(full_rows) - len(log.rows):]
        assert log.rows == tail, f"{runs['family']} resumed from {path.name}: first rows {log.rows[:2]} " \
                                 f"!= {tail[:2]}"


def test_rounds_refuse_a_checkpoint_before_a_rounds_end_and_warn_without_a_loader_position(tiny_model_dir, tmp_path):
    """MADPOIter: a checkpoint after a round's last batch but before the round's end (where the next round is
    collected) is refused, naming the checkpoint to use; a mid-round one warns unless it holds the pair loader's
    position (docs/guide.md §1.1)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from iterative_helpers import iter_args, make_trainer

    args = iter_args(num_iterations=2, train_batch_size=2)
    ckpt = ModelCheckpoint(dirpath=str(tmp_path / "ckpt"), filename="{epoch}-{step}", every_n_train_steps=1,
                           save_top_k=-1)
    make_trainer(tiny_model_dir, tmp_path, args=args, num_items=2, callbacks=[ckpt],
                 trainer_kwargs={"enable_checkpointing": True}).train()
    states = {p: torch.load(p, weights_only=False)["loops"]["fit_loop"] for p in (tmp_path / "ckpt").glob("*.ckpt")}
    round_end = [p for p, s in states.items() if s["epoch_loop.batch_progress"]["is_last_batch"]
                 and s["epoch_progress"]["current"]["processed"] == 0]
    inside = [p for p, s in states.items() if not s["epoch_loop.batch_progress"]["is_last_batch"]
              and s["epoch_progress"]["current"]["processed"] == 0]
    assert round_end and inside
    with pytest.raises(ValueError, match=r"last batch of epoch 0 but before the epoch's end.*save_on_train_epoch_end"):
        make_trainer(tiny_model_dir, tmp_path, args=args, num_items=2).train(ckpt_path=str(round_end[0]))
    positioned = bool(states[inside[0]]["state_dict"].get("combined_loader"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(tiny_model_dir, tmp_path, args=args, num_items=2).train(ckpt_path=str(inside[0]))
    assert any("holds no position" in str(w.message) for w in caught) != positioned


@pytest.mark.parametrize("part", ["comlrl_rank_states", "comlrl_logging_gates"])
def test_an_edited_rank_state_or_logging_gate_is_refused(runs, part, tmp_path):
    """The checkpoint digest covers every rank's buffers and streams and the logging gates (docs/guide.md §1.1)."""
    path = runs["resumed"][0][0]
    ckpt = torch.load(path, weights_only=False)
    if part not in ckpt:
        pytest.skip(f"{runs['family']} keeps no {part}")
    if part == "comlrl_logging_gates":
        ckpt[part] = {name: (value + 1 if isinstance(value, int) else value) for name, value in ckpt[part].items()}
        assert ckpt[part], "the family must have logging gates for the test to mean anything"
    else:
        ckpt[part] = [dict(state, edited=True) for state in ckpt[part]]
    edited = tmp_path / "edited.ckpt"
    torch.save(ckpt, edited)
    t, _ = build(runs["family"], runs["tiny_model_dir"], default_root_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=f"corrupt.*{part}"):
        t.train(ckpt_path=str(edited))
