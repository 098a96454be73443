"""With ``generation_backend="vllm"`` the rollouts come from vLLM and training stays in torch (docs/engines.md):
the learning test of single-turn MAGRPO must still raise the task reward, and an engine that dies mid-fit stops
the fit with an error naming it, after which resuming from the last checkpoint finishes the run. Skipped without
vLLM.
"""

from __future__ import annotations

import os
import signal

import pytest

pytest.importorskip("vllm")

import lightning as L  # noqa: E402
import psutil  # noqa: E402
from conftest import cpu_trainer_kwargs  # noqa: E402
from learning_seed import LEARNING_SEED  # noqa: E402

from comlrl_lightning.callbacks.evaluation import evaluate_team  # noqa: E402
from comlrl_lightning.config.magrpo import MAGRPOConfig  # noqa: E402
from comlrl_lightning.data.sources import load_task_items  # noqa: E402
from comlrl_lightning.engines.vllm import EngineError, VLLMEngine  # noqa: E402
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward  # noqa: E402
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SMALL_KV = {"kv_cache_memory_bytes": 32 * 2**20}


def _magrpo(model_dir, items, reward_func=cooperative_reward, trainer_kwargs=None, **kw):
    base = {"num_train_epochs": 1, "num_generations": 8, "num_turns": 1, "max_new_tokens": 16, "temperature": 1.0,
            "top_p": 1.0, "top_k": None, "agent_learning_rate": 1e-2, "rollout_buffer_size": 1, "eval_interval": 0,
            "eval_num_samples": 0, "logging_steps": 1, "seed": LEARNING_SEED, "generation_backend": "vllm",
            "vllm_kwargs": SMALL_KV}
    base.update(kw)
    return MAGRPOTrainer(agent_model=model_dir, train_dataset=items, reward_func=reward_func, formatters=FORMATTERS,
                         args=MAGRPOConfig(**base), trainer_kwargs=trainer_kwargs or cpu_trainer_kwargs())


def test_single_turn_magrpo_learns_with_vllm_rollouts(vllm_model_dir):
    tr = _magrpo(vllm_model_dir, load_task_items("builtin:cooperative")[:20])
    assert isinstance(tr.module.team.engine, VLLMEngine)
    dm = tr.datamodule
    eval_items = load_task_items("builtin:cooperative_eval")

    def evaluate():  # sampled through the team's engine (vLLM, with the trained weights), fixed evaluation seeds
        return evaluate_team(tr.team, eval_items, dm.formatters, dm.oracle, tr.module.sampling_settings(), 12345,
                             8)["eval/reward_mean"]

    before = evaluate()
    tr.train()
    after = evaluate()
    print(f"single-turn MAGRPO with vLLM rollouts, seed {LEARNING_SEED}: {before:.3f} -> {after:.3f}")
    # Measured on this model, seeds 0-9: with vLLM rollouts gains +0.32 to +0.62 (mean +0.51); the same job with HF
    # rollouts +0.53 to +0.63 (mean +0.59) (docs/engines.md, "Learning with vLLM rollouts"). The 0.2 bar is ~5
    # standard errors of the 64-sample evaluation mean above zero and 0.12 below the smallest measured gain.
    assert after - before > 0.2, (before, after)


def _engine_core_pids() -> list[int]:
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "EngineCore" in p.name() or "EngineCore" in " ".join(p.cmdline())]


@pytest.mark.skipif(os.environ.get("COMLRL_VLLM_DEATH_TEST") != "1",
                    reason="hung once in a fresh-clone CI run (no engine process left, pytest waiting); run it with "
                           "COMLRL_VLLM_DEATH_TEST=1 until that hang is found (docs/engines.md, Faults)")
def test_engine_death_stops_the_fit_and_resume_finishes_it(vllm_model_dir, tmp_path):
    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
    short = dict(num_generations=2, max_new_tokens=4, num_train_epochs=2)
    ckpts = tmp_path / "ckpt"

    def trainer_kwargs():
        return cpu_trainer_kwargs(default_root_dir=str(tmp_path), enable_checkpointing=True, callbacks=[
            L.pytorch.callbacks.ModelCheckpoint(dirpath=str(ckpts), every_n_train_steps=1, save_top_k=-1)])

    calls = []

    def killing_reward(*args, **kwargs):  # the engine core dies after the third scored batch
        calls.append(1)
        if len(calls) == 3:
            for pid in _engine_core_pids():
                os.kill(pid, signal.SIGKILL)
        return cooperative_reward(*args, **kwargs)

    tr = _magrpo(vllm_model_dir, items, reward_func=killing_reward, trainer_kwargs=trainer_kwargs(), **short)
    engine = tr.module.team.engine
    with pytest.raises(EngineError, match=r"The vLLM engine for .* died .* Resume the run from its last checkpoint"):
        tr.train()
    assert not engine.started  # closed by the failing fit
    saved = sorted(ckpts.glob("*.ckpt"), key=os.path.getmtime)
    assert saved, "no checkpoint was written before the engine died"
    stopped_at = tr.trainer.global_step

    resumed = _magrpo(vllm_model_dir, items, trainer_kwargs=trainer_kwargs(), **short)
    resumed.train(ckpt_path=str(saved[-1]))
    full = _magrpo(vllm_model_dir, items, generation_backend="hf", **short)  # the uninterrupted run's step count
    full.train()
    assert 0 < stopped_at < full.trainer.global_step
    assert resumed.trainer.global_step == full.trainer.global_step
    assert not resumed.module.team.engine.started
    assert _engine_core_pids() == []
