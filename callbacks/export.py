"""ExportAgents: write what a run trained into the run's own folder when training ends.

``<run>/agents/agent_{i}/`` (from_pretrained-loadable, with a model card ``README.md`` and a
``generation_config.json`` that records the sampling settings used in training) and, when the run fitted one,
``<run>/reward_model/`` (written by the reward model's ``save_reward_model``). ``<run>`` is the logger's versioned
folder (``trainer.log_dir``, e.g. ``outputs/madpo_tiny/lightning_logs/version_3``), where the CLI
also saves ``config.yaml``; so runs never overwrite each other.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.modules.reward_model import JointRewardModel
from comlrl_lightning.protocols import TeamModule
from comlrl_lightning.reward_model import LearnedRewardOracle


def run_folder(trainer: L.Trainer) -> Path:
    """The run's versioned folder: ``trainer.log_dir`` (the first logger's), else ``default_root_dir``."""
    return Path(trainer.log_dir or trainer.default_root_dir)


def _plain(value: Any) -> Any:
    """YAML-safe plain types (dataclasses to dicts, unknown objects to their repr)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return getattr(value, "__qualname__", None) or repr(value)


def _args_dict(pl_module: TeamModule) -> dict:
    from comlrl_lightning.config import redact_secrets

    return _plain(redact_secrets(pl_module.args)) if pl_module.args is not None else {}


def _name_of(obj: Any) -> str:
    if obj is None:
        return "-"
    if isinstance(obj, str):
        return obj
    module = getattr(obj, "__module__", None)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    return f"{module}.{name}" if module else name


def model_card(pl_module: TeamModule, trainer: L.Trainer, agent: int, agents_dir: Path, run: Path) -> str:
    """The ``README.md`` of ``agent_{i}/``: algorithm, config, data, reward, metrics, how to load."""
    dm = trainer.datamodule
    hp = dict(dm.hparams) if dm is not None else {}
    config = run / "config.yaml"
    if config.exists():  # the CLI's saved config names the data as the user wrote it
        data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
        hp = {**(data.get("init_args") or {}), **hp}
    oracle = getattr(dm, "oracle", None)
    reward = _name_of(getattr(oracle, "reward_func", None) or hp.get("reward_func"))
    learned = getattr(pl_module, "train_oracle", None) is not None
    metrics = {k: float(v) for k, v in sorted(trainer.callback_metrics.items())
               if k.startswith(("eval/", "round/")) and getattr(v, "numel", lambda: 1)() == 1}
    lines = [
        f"# agent_{agent} — {type(pl_module).__name__}",
        "",
        f"Trained with comlrl-lightning (`{type(pl_module).__module__}.{type(pl_module).__name__}`), "
        f"agent {agent} of {pl_module.team.num_agents}, {pl_module.updates_seen} updates "
        f"({trainer.current_epoch} epochs).",
        "",
        "## Data",
        f"- train_dataset: `{_name_of(hp.get('train_dataset'))}`",
        f"- eval_dataset: `{_name_of(hp.get('eval_dataset'))}`",
        f"- data module: `{type(dm).__name__ if dm is not None else '-'}`",
        "",
        "## Reward",
        f"- task reward: `{reward}`" + (" (training used a learned reward model; see `../../reward_model/`)"
                                         if learned else ""),
        "",
        "## Metrics at the end of training",
        *([f"- `{k}`: {v:.4g}" for k, v in metrics.items()] or ["- (no eval/* or round/* metric was logged)"]),
        "",
        "## Config (`args`)",
        "```yaml",
        yaml.safe_dump(_args_dict(pl_module), sort_keys=False).rstrip(),
        "```",
        f"The full run config: `{config}`" if config.exists() else "",
        "",
        "## How to load",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        f"model = AutoModelForCausalLM.from_pretrained({str(agents_dir / f'agent_{agent}')!r})",
        f"tokenizer = AutoTokenizer.from_pretrained({str(agents_dir / f'agent_{agent}')!r})",
        "```",
        "Evaluate the whole team on the eval set with the task reward:",
        "```bash",
        f"comlrl-lightning validate --config {config if config.exists() else '<the run config>'} "
        f"--model.init_args.agent_model={agents_dir}",
        "```",
        "",
    ]
    return "\n".join(lines)


def record_sampling(folder: Path, pl_module: L.LightningModule) -> None:
    """Write the training sampling settings into ``folder/generation_config.json`` (merged with what is there)."""
    path = folder / "generation_config.json"
    cfg = json.loads(path.read_text()) if path.exists() else {}
    s = pl_module.sampling_settings()
    cfg.update({"do_sample": True, "max_new_tokens": s.max_new_tokens, "temperature": s.temperature,
                "top_p": s.top_p})
    cfg["top_k"] = s.top_k if s.top_k is not None else 0  # training passes 0 (no top-k filtering) for None
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def fitted_reward_model(pl_module: L.LightningModule) -> JointRewardModel | None:
    """The reward model a run fitted: the module itself, or the learned reward a team module trained on (MARLHF's
    training oracle); None when there is none."""
    if isinstance(pl_module, JointRewardModel):
        return pl_module
    oracle = getattr(pl_module, "train_oracle", None)  # set by a reward-model callback (use_train_oracle)
    if isinstance(oracle, LearnedRewardOracle) and isinstance(oracle.reward_model, JointRewardModel):
        return oracle.reward_model
    return None


class ExportAgents(L.Callback):
    """Save the trained team (and a fitted reward model) under the run's folder at the end of training.

    Args:
        output_dir: where ``agent_{i}/`` go; None (default) = ``<run>/agents`` with ``<run>`` the logger's
            versioned folder (``trainer.log_dir``), so each run keeps its own agents.
        save_reward_model: also write the reward model the run fitted (MARLHF's learned reward, or the
            module itself when it is a ``JointRewardModel``) to ``<run>/reward_model``.
    """

    def __init__(self, output_dir: str | None = None, save_reward_model: bool = True):
        self.output_dir = output_dir
        self.save_reward_model = save_reward_model
        self.exported: dict[str, str] = {}

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from comlrl_lightning.sharding import save_team, team_is_sharded

        sharded = team_is_sharded(pl_module)  # FSDP2: every rank takes part in gathering the agents
        if not trainer.is_global_zero and not sharded:
            return
        run = run_folder(trainer)
        if isinstance(pl_module, TeamModule):
            agents_dir = Path(self.output_dir) if self.output_dir is not None else run / "agents"
            paths = save_team(pl_module, str(agents_dir)) if sharded else pl_module.save_agents(str(agents_dir))
            if not trainer.is_global_zero:
                return
            for i, p in enumerate(paths):
                record_sampling(Path(p), pl_module)
                (Path(p) / "README.md").write_text(model_card(pl_module, trainer, i, agents_dir, run))
            self.exported["agents"] = str(agents_dir)
            rank_zero_info(f"Saved {len(paths)} agents under {agents_dir}")
        if self.save_reward_model:
            reward_model = fitted_reward_model(pl_module)
            if reward_model is not None:
                folder = reward_model.save_reward_model(run / "reward_model")
                self.exported["reward_model"] = str(folder)
                rank_zero_info(f"Saved the reward model under {folder}")
