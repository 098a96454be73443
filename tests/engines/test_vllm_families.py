"""Every trainer family fits with ``generation_backend="vllm"`` (docs/engines.md), in an environment with vLLM
(``tools/install_vllm_env.sh --test``); skipped without it.

One fit per family on the vLLM-servable tiny model (head size 32), LoRA agents (one engine, one adapter per agent,
so one engine start per fit). Each fit checks that the team's engine is the vLLM engine, that it really served
generations (its call counter), that training stepped, and that the engine is closed afterwards. MADPO and
single-turn MAGRPO are in test_vllm_engine.py.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from conftest import cpu_trainer_kwargs  # noqa: E402

from comlrl_lightning.engines.vllm import VLLMEngine  # noqa: E402
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward  # noqa: E402
from comlrl_lightning.multiturn.transitions import plain_transition  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
SMALL_KV = {"kv_cache_memory_bytes": 32 * 2**20}
LORA = {"r": 8, "lora_alpha": 16}
SAMPLING = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2,
                eval_interval=0, eval_num_samples=0, seed=0, generation_backend="vllm", vllm_kwargs=SMALL_KV)
PREFERENCE = dict(preference_num_candidates=4, preference_pairs_per_sample=2)
MARLHF = dict(num_generations=2, rollout_buffer_size=1, reward_learning_rate=1e-3, reward_train_batch_size=4,
              reward_num_train_epochs=1, **PREFERENCE)
AC = dict(num_generations=1, rollout_buffer_size=2, train_batch_size=2, critic_learning_rate=1e-2)


def _build(family: str, model_dir: str, root) -> object:
    from comlrl_lightning.config import IACConfig, MAACConfig, MADPOIterConfig, MAGRPOConfig
    from comlrl_lightning.config.marlhf import MARLHFConfig, MARLHFIterConfig
    from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer
    from comlrl_lightning.trainers.madpo import MADPOIterTrainer
    from comlrl_lightning.trainers.marlhf import MARLHFIterTrainer, MARLHFTrainer
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    common = dict(agent_model=model_dir, train_dataset=ITEMS, reward_func=cooperative_reward, formatters=FORMATTERS,
                  lora=LORA, trainer_kwargs=cpu_trainer_kwargs(default_root_dir=str(root)))
    if family == "madpo_iter":  # the history comparator's LoRA snapshots are served by the learner's engine
        args = MADPOIterConfig(num_iterations=2, train_batch_size=4, comparator_policy="history", **PREFERENCE,
                               **SAMPLING)
        return MADPOIterTrainer(eval_dataset=None, args=args, evaluation=False, **common)
    if family == "marlhf":
        return MARLHFTrainer(args=MARLHFConfig(num_train_epochs=1, **MARLHF, **SAMPLING), evaluation=False, **common)
    if family == "marlhf_iter":
        return MARLHFIterTrainer(args=MARLHFIterConfig(num_iterations=2, num_train_epochs=1, **MARLHF, **SAMPLING),
                                 evaluation=False, **common)
    if family == "magrpo_2turn":
        args = MAGRPOConfig(num_train_epochs=1, num_turns=2, num_generations=2, rollout_buffer_size=1, **SAMPLING)
        return MAGRPOTrainer(args=args, external_transition=plain_transition, **common)
    if family in ("iac", "maac"):
        cls, cfg = (IACTrainer, IACConfig) if family == "iac" else (MAACTrainer, MAACConfig)
        return cls(args=cfg(num_train_epochs=1, num_turns=2, **AC, **SAMPLING), external_transition=plain_transition,
                   **common)
    raise AssertionError(family)


class _Counting:
    """Counts the calls an engine serves (proof that the fit sampled through vLLM, not around it)."""

    def __init__(self, engine: VLLMEngine):
        self.calls = 0
        inner = engine.sample_many

        def counted(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        engine.sample_many = counted


@pytest.mark.parametrize("family", ["madpo_iter", "marlhf", "marlhf_iter", "magrpo_2turn", "iac", "maac"])
def test_family_fits_with_vllm(vllm_model_dir, tmp_path, family, monkeypatch):
    from comlrl_lightning.engines.vllm import AdapterSnapshotEngine

    snapshot_calls = []
    serve = AdapterSnapshotEngine.sample_many
    monkeypatch.setattr(AdapterSnapshotEngine, "sample_many",
                        lambda self, *a, **k: snapshot_calls.append(self.adapter_dirs) or serve(self, *a, **k))
    tr = _build(family, vllm_model_dir, tmp_path)
    engine = tr.module.team.engine
    assert isinstance(engine, VLLMEngine)
    counter = _Counting(engine)
    tr.train()
    assert tr.trainer.global_step > 0
    assert counter.calls > 0
    assert not engine.started  # closed at the end of fit
    if family == "madpo_iter":  # one comparator call per round, each on that round's snapshot folders
        assert len(snapshot_calls) == 2 and all("policy_checkpoints" in d for dirs in snapshot_calls for d in dirs)


def test_model_comparator_is_served_by_a_vllm_engine_of_its_own(vllm_model_dir, tmp_path, monkeypatch):
    """``comparator_policy="model"`` with vLLM learners: the comparator model gets its own vLLM engine (the
    learner's settings), which samples the comparator side and is shut down when the fit ends."""
    from comlrl_lightning.config import MADPOIterConfig
    from comlrl_lightning.trainers.madpo import MADPOIterTrainer

    made, counters = [], []
    engine_for = VLLMEngine.engine_for

    def counted_engine_for(self, team):
        made.append(engine_for(self, team))
        counters.append(_Counting(made[-1]))
        return made[-1]

    monkeypatch.setattr(VLLMEngine, "engine_for", counted_engine_for)
    args = MADPOIterConfig(num_iterations=1, train_batch_size=4, comparator_policy="model",
                           comparator_model_name=vllm_model_dir, **PREFERENCE, **SAMPLING)
    tr = MADPOIterTrainer(agent_model=vllm_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                          formatters=FORMATTERS, lora=LORA, eval_dataset=None, args=args, evaluation=False,
                          trainer_kwargs=cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    learner = _Counting(tr.module.team.engine)
    tr.train()
    (comparator_engine,) = made
    assert not comparator_engine.lora and comparator_engine.team is not tr.module.team
    assert learner.calls > 0 and counters[0].calls > 0 and tr.trainer.global_step > 0
    assert not comparator_engine.started and not tr.module.team.engine.started  # both shut down
    assert tr.collection.history[0]["round/num_pairs"] > 0
