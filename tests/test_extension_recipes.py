"""The two recipes of docs/architecture.md, built only from the extension points that page documents:
a toy comparator (an object with ``sample`` and an optional ``prepare``) handed to the round data, and a
toy RL backend (a ``TeamModuleBase`` subclass) that trains on a ``TaskDataModule`` and works with the
evaluation and export callbacks unchanged."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from conftest import cpu_trainer_kwargs
from iterative_helpers import iter_args, task_items

from comlrl_lightning.callbacks import (
    ComparatorRefresh,
    ExportAgents,
    IterativePreferenceCollection,
    ReplaySelection,
    TaskRewardEvaluation,
)
from comlrl_lightning.config import MAGRPOConfig, register_config_classes
from comlrl_lightning.data.madpo import IterativePreferenceDataModule
from comlrl_lightning.data.sources import format_prompts
from comlrl_lightning.data.task import TaskDataModule
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.generation import Samples, SamplingStream
from comlrl_lightning.logprobs import build_scoring_batch, sequence_logps
from comlrl_lightning.modules import MADPOModule
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.preferences import sample_team
from comlrl_lightning.protocols import Comparator, TaskSource, TeamModule, check_protocol

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


class EchoComparator:
    """Answers every prompt with fixed text (a floor every policy should beat)."""

    def __init__(self, text: str = ""):
        self.text = text
        self.rounds = []

    def prepare(self, round_index):
        self.rounds.append(round_index)

    def sample(self, prompts_per_agent, num_candidates, items):
        return [Samples(prompt_ids=[[0] for _ in prompts], completion_ids=[[[]] * num_candidates for _ in prompts],
                        texts=[[self.text] * num_candidates for _ in prompts]) for prompts in prompts_per_agent]


def test_recipe_add_a_comparator(tiny_model_dir, tmp_path):
    comp = EchoComparator("")
    check_protocol(comp, Comparator, "recipe", "comparator", "EchoComparator")
    module = MADPOModule(agent_model=str(tiny_model_dir), args=iter_args(num_iterations=2))
    dm = IterativePreferenceDataModule(train_dataset=task_items(4), eval_dataset=None, reward_func=cooperative_reward,
                                       formatters=FORMATTERS, num_agents=2, comparator=comp)
    collection = IterativePreferenceCollection()
    trainer = L.Trainer(callbacks=[ComparatorRefresh(), collection, ReplaySelection()], max_epochs=2,
                        reload_dataloaders_every_n_epochs=1, **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    trainer.fit(module, datamodule=dm)
    assert comp.rounds == [0, 1]
    assert [h["round/index"] for h in collection.history] == [0, 1]
    assert all(h["round/num_pairs"] > 0 for h in collection.history)  # the policy's answers beat empty text
    assert inspect.getsource(EchoComparator).strip() in DOC.read_text()  # the page shows exactly this code


class BestOfKImitation(TeamModuleBase):
    """Sample K joint answers per task item, imitate the best one (negative log-likelihood step)."""

    def __init__(self, agent_model, args, k: int = 4):
        super().__init__()
        self.args = args
        self.k = k
        self.init_team(agent_model, None, None, None, None)
        self.streams = [SamplingStream(100 + i) for i in range(self.team.num_agents)]

    def setup(self, stage):
        self.task = self.trainer.datamodule  # bound once, checked like every shipped module binds its task
        check_protocol(self.task, TaskSource, "BestOfKImitation", "data module", "TaskDataModule")

    def training_step(self, batch, batch_idx):
        oracle = self.training_oracle(self.task)
        for index, item in batch:
            prompts = format_prompts([item], self.task.formatters, offset=index)
            samples = sample_team(self.team, prompts, self.k, self.sampling_settings(), self.streams)
            rewards = [oracle.score([p[0] for p in prompts], [samples[a].texts[0][j] for a in range(len(samples))],
                                    item, index)[0] for j in range(self.k)]
            best = max(range(self.k), key=rewards.__getitem__)
            for a, opt in enumerate(self.optimizer_list()):
                tok = self.team.tokenizers[a]
                rows = build_scoring_batch([samples[a].prompt_ids[0]], [samples[a].completion_ids[0][best]],
                                           tok.pad_token_id, drop_last=False)
                with self.team.activate(a) as model:
                    loss = -sequence_logps(model, {k: v.to(self.device) for k, v in rows.items()}).mean()
                opt.zero_grad()
                self.manual_backward(loss)
                opt.step()
            self.updates_seen += 1
            self.env_step += 1
            self.log("train/best_reward", max(rewards), batch_size=1)


def test_recipe_add_an_rl_backend(tiny_model_dir, tmp_path):
    args = MAGRPOConfig(num_agents=2, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None,
                        agent_learning_rate=1e-2, eval_interval=0, eval_num_samples=2)
    module = BestOfKImitation(str(tiny_model_dir), args)
    check_protocol(module, TeamModule, "recipe", "module", "BestOfKImitation")
    dm = TaskDataModule(train_dataset=task_items(3), eval_dataset=task_items(2), reward_func=cooperative_reward,
                        formatters=FORMATTERS, num_agents=2)
    before = [p.detach().clone() for p in module.team.parameters_of(0)]
    evaluation = TaskRewardEvaluation(eval_interval=0)
    trainer = L.Trainer(callbacks=[evaluation, ExportAgents(str(tmp_path / "agents"))], max_epochs=1,
                        **cpu_trainer_kwargs(default_root_dir=str(tmp_path)))
    trainer.fit(module, datamodule=dm)
    after = list(module.team.parameters_of(0))
    assert any(not torch.equal(b, a) for b, a in zip(before, after))
    assert module.updates_seen == 3
    assert "eval/reward_mean" in evaluation.history[-1][1]
    assert (tmp_path / "agents" / "agent_1" / "config.json").is_file()
    assert inspect.getsource(BestOfKImitation).strip() in DOC.read_text()  # the page shows exactly this code


@dataclass
class BestOfKConfig(MAGRPOConfig):
    """MAGRPO's options plus the number of joint answers to sample per item."""

    k: int = 4
    """Joint answers sampled per task item."""

register_config_classes(BestOfKConfig)


def test_recipe_a_backend_with_its_own_config(tmp_path):
    cfg = BestOfKConfig(num_agents=2, k=8)
    assert yaml.safe_load(yaml.dump({"args": cfg}))["args"]["k"] == 8  # hparams.yaml holds a plain mapping
    torch.save({"hyper_parameters": {"args": cfg}}, tmp_path / "c.ckpt")
    loaded = torch.load(tmp_path / "c.ckpt", weights_only=True)["hyper_parameters"]["args"]  # what resume does
    assert loaded == cfg and loaded.k == 8
    block = inspect.getsource(BestOfKConfig).strip() + "\n\nregister_config_classes(BestOfKConfig)"
    assert block in DOC.read_text()  # the page shows exactly this code


@dataclass
class UnregisteredConfig(MAGRPOConfig):
    k: int = 4


def test_an_unregistered_config_is_refused_by_weights_only_loading(tmp_path):
    """The registration step is needed: without it, resume's weights_only load refuses the class."""
    torch.save({"args": UnregisteredConfig(num_agents=2)}, tmp_path / "c.ckpt")
    with pytest.raises(Exception, match="weights_only|Unsupported global"):
        torch.load(tmp_path / "c.ckpt", weights_only=True)
