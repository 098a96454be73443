"""TaskRewardEvaluation: sample the current policies on eval items and score with the task reward only.

Runs before every ``eval_interval``-th update (update 0 included, as upstream) and once at the end of
training. Logs ``eval/reward_mean``, ``eval/turn_{t}/reward_mean``, ``eval/turn_{t}/expected_return`` and,
single-turn, ``eval/agent{i}/completions/mean_length`` (characters). Multi-turn modules evaluate every turn
through their own single-path rollout (spec multiturn.md §10.2).
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from comlrl_lightning.callbacks.logging_utils import log_metrics
from comlrl_lightning.data.tasks import format_prompts
from comlrl_lightning.generation import SamplingStream
from comlrl_lightning.preferences import sample_team


def evaluate_team(team, items, formatters, oracle, settings, stream_seed: int, num_samples: int = 1) -> dict:
    """Mean task reward of ``num_samples`` sampled joint responses per item (fresh, seeded streams)."""
    if not items:
        return {}
    prompts = format_prompts(items, formatters)
    streams = [SamplingStream(stream_seed + 7919 * i) for i in range(team.num_agents)]
    samples = sample_team(team, prompts, num_samples, settings, streams)
    rewards, lengths = [], [[] for _ in range(team.num_agents)]
    for k, item in enumerate(items):
        for j in range(num_samples):
            texts = [samples[a].texts[k][j] for a in range(team.num_agents)]
            for a, t in enumerate(texts):
                lengths[a].append(len(t))
            processed, _ = oracle.score([p[k] for p in prompts], texts, item, f"eval {k}")
            rewards.append(processed)
    mean = sum(rewards) / len(rewards)
    out = {"eval/reward_mean": mean, "eval/turn_1/reward_mean": mean, "eval/turn_1/expected_return": mean}
    for a in range(team.num_agents):
        out[f"eval/agent{a}/completions/mean_length"] = sum(lengths[a]) / len(lengths[a])
    return out


class TaskRewardEvaluation(L.Callback):
    """Evaluate with the task reward (never a learned reward).

    Args:
        eval_interval: evaluate before every k-th update (0 = only at the end); None = ``args.eval_interval``.
        eval_num_samples: eval items used (the first ones); None = ``args.eval_num_samples``.
        samples_per_item: sampled joint responses per item (more = less noisy estimate).
        seed: base seed of the evaluation streams; every evaluation uses the same seeds so that runs and
            evaluations are comparable.
        final: also evaluate at the end of training.
    """

    def __init__(self, eval_interval: int | None = None, eval_num_samples: int | None = None,
                 samples_per_item: int = 1, seed: int = 12345, final: bool = True):
        self.eval_interval = eval_interval
        self.eval_num_samples = eval_num_samples
        self.samples_per_item = samples_per_item
        self.seed = seed
        self.final = final
        self.history: list[tuple[int, dict]] = []

    def _run(self, trainer: L.Trainer, pl_module: L.LightningModule, label: str) -> dict:
        dm = trainer.datamodule
        args = pl_module.args
        n = args.eval_num_samples if self.eval_num_samples is None else self.eval_num_samples
        items = list(dm.eval_items[:n])
        if not items:
            return {}
        metrics = self._evaluate(pl_module, dm, items)
        self.history.append((pl_module.updates_seen, metrics))
        log_metrics(trainer, metrics)
        rank_zero_info(f"[eval {label}] update {pl_module.updates_seen}: task reward "
                       f"{metrics['eval/reward_mean']:.4f}")
        return metrics

    def _evaluate(self, pl_module, dm, items) -> dict:
        """Single-turn: :func:`evaluate_team`. Multi-turn (``args.num_turns > 1``): the module's own
        single-path rollout (``evaluate_turns`` for MAGRPO, ``evaluate`` for actor-critic), still scored with
        the data module's task oracle; ``eval/reward_mean`` is then the mean immediate reward over all turns."""
        turns = int(getattr(pl_module.args, "num_turns", 1) or 1)
        if turns > 1 and hasattr(pl_module, "evaluate_turns"):
            transition = getattr(dm, "external_transition", None)
            metrics = pl_module.evaluate_turns(items, dm.formatters, dm.oracle, transition,
                                               samples_per_item=self.samples_per_item, seed=self.seed,
                                               prompt_field=getattr(dm, "prompt_field", "prompt"))
        elif turns > 1 and hasattr(pl_module, "evaluate"):
            metrics = pl_module.evaluate(items, seed=self.seed)
        else:
            return evaluate_team(pl_module.team, items, dm.formatters, dm.oracle, pl_module.sampling_settings(),
                                 self.seed, self.samples_per_item)
        per_turn = [metrics[f"eval/turn_{t}/reward_mean"] for t in range(1, turns + 1)
                    if f"eval/turn_{t}/reward_mean" in metrics]
        metrics = dict(metrics)
        metrics["eval/reward_mean"] = sum(per_turn) / len(per_turn)
        return metrics

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        interval = pl_module.args.eval_interval if self.eval_interval is None else self.eval_interval
        if interval > 0 and pl_module.updates_seen % interval == 0:
            self._run(trainer, pl_module, "periodic")

    def on_train_end(self, trainer, pl_module) -> None:
        if self.final:
            self._run(trainer, pl_module, "final")
