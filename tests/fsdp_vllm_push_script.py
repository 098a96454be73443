"""The vLLM engine's weight pushes under FSDP2 against strategy="ddp", with vLLM itself replaced at its boundary, on
2 CPU processes (gloo); run by tests/test_fsdp_vllm_push.py (no vLLM needed).

Usage: ``fsdp_vllm_push_script.py OUT MODEL FIT [FIT ...]``, FIT among ``magrpo`` (2 full agents), ``magrpo_lora``
(2 LoRA agents on one base; without vLLM installed, a stand-in for its ``LoRARequest``) and ``madpo_one`` (MADPOIter, 2 rounds on 1 item: rank 1 collects nothing and joins rank 0's gathers).
The engine is :class:`~comlrl_lightning.engines.vllm.VLLMEngine` with two methods replaced: ``_launch`` gives each
server a stand-in ``LLM`` that records every weight folder vLLM would load (the start folder, each full reload, each
new adapter folder as it is served), and ``_serve`` generates with the HF engine. Each FIT runs with
``strategy="ddp"`` then ``ModelParallelStrategy()`` from the same seed; each rank writes ``OUT/rank{r}.pt``: per fit
and run, the pushed state dicts in order (label, tensors), the engine's gathers (seconds, bytes), whether the team was
sharded and the global step.
"""
import dataclasses
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from safetensors.torch import load_file

import comlrl_lightning.modules.base as module_base
from comlrl_lightning.config import MADPOIterConfig, MAGRPOConfig
from comlrl_lightning.engines import HFEngine
from comlrl_lightning.engines.vllm import VLLMEngine
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.sharding import team_is_sharded

if importlib.util.find_spec("vllm") is None:  # the adapter push names its folder with vllm's LoRARequest
    @dataclasses.dataclass
    class LoRARequest:
        lora_name: str
        lora_int_id: int
        lora_path: str

    for name in ("vllm", "vllm.lora", "vllm.lora.request"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm.lora.request"].LoRARequest = LoRARequest


class StandInLLM:
    """What the engine calls on ``vllm.LLM`` for weight pushes, recording the weights it would load."""

    def __init__(self, engine: "RecordingEngine", label: str):
        self.engine, self.label = engine, label
        self.llm_engine = self

    def collective_rpc(self, method: str, kwargs: dict) -> list:
        self.engine.pushed.append((f"{self.label} reload", load_file(Path(kwargs["weights_path"]) / "model.safetensors")))
        return [0]

    def reset_prefix_cache(self) -> None:
        pass

    def remove_lora(self, lora_id: int) -> None:
        pass


class RecordingEngine(VLLMEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.pushed: list[tuple[str, dict]] = []
        self.served_adapters: set[str] = set()

    def _launch(self, server) -> None:
        self.pushed.append((f"{server.label} start", load_file(Path(server.folder) / "model.safetensors")))
        server.llm = StandInLLM(self, server.label)

    def _call(self, server, fn, *args, **kwargs):
        return fn(*args, **kwargs)

    def _serve(self, requests, settings, adapter_of):
        for r in requests:  # vLLM reads a new adapter folder when it first serves it
            request = adapter_of(self.server_of[r.agent_index], r.agent_index)
            if request is not None and request.lora_path not in self.served_adapters:
                self.served_adapters.add(request.lora_path)
                self.pushed.append((f"adapter {r.agent_index}",
                                    load_file(Path(request.lora_path) / "adapter_model.safetensors")))
        return HFEngine(self.team).sample_many(requests, settings)

    def close(self) -> None:
        for server in self.servers:
            server.llm = None
        super().close()


def build_engine(team, backend="hf", vllm_kwargs=None, agent_overlap="auto"):
    return RecordingEngine(team, vllm_kwargs) if backend == "vllm" else original(team, backend, vllm_kwargs,
                                                                                 agent_overlap)


original = module_base.build_engine
module_base.build_engine = build_engine  # the modules build their engine through this name

out_dir, model_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=0, eval_num_samples=0, seed=0, generation_backend="vllm")
common = dict(agent_model=model_dir, reward_func=cooperative_reward, formatters=FORMATTERS)


def build(name: str, strategy):
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=out_dir, logger=False)
    if name in ("magrpo", "magrpo_lora"):
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        args = MAGRPOConfig(num_generations=2, train_batch_size=1, rollout_buffer_size=1, **sampling)
        lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]} if name == "magrpo_lora" else None
        return MAGRPOTrainer(args=args, trainer_kwargs=tk, lora=lora, train_dataset=items, **common)
    if name == "madpo_one":
        from comlrl_lightning.trainers.madpo import MADPOIterTrainer

        args = MADPOIterConfig(num_iterations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                               train_batch_size=1, **{**sampling, "max_new_tokens": 6})
        return MADPOIterTrainer(args=args, evaluation=False, trainer_kwargs=tk, eval_dataset=None,
                                train_dataset=items[:1], **common)
    raise ValueError(f"unknown fit {name!r}")


record, rank = {}, 0
for name in names:
    for run in ("ddp", "fsdp2"):
        torch.manual_seed(0)
        tr = build(name, "ddp" if run == "ddp" else ModelParallelStrategy())
        engine = tr.module.team.engine
        tr.train()
        rank = tr.trainer.global_rank
        record[f"{name}/{run}"] = {"pushed": engine.pushed, "gathers": list(engine.gathers), "sharded": engine.sharded
                                   and team_is_sharded(tr.module), "global_step": tr.trainer.global_step}
torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
