"""MADPOModule: reference-free joint DPO over a team of agents, one optimizer per agent (manual).

Per batch of B pairs, each agent runs ONE forward over its 2B rows (winners then losers), the log-probs are
stacked into ``[num_agents, B]`` and :func:`~comlrl_lightning.losses.madpo_loss` gives the per-pair joint
loss. With separate agent parameters (distinct models, or distinct LoRA adapters on one base) a single
backward of the joint loss gives every agent the gradient of the spec's "others detached" loss.
When agents share parameters (one model object passed for several agents) the module follows the spec
step by step instead: a detached pass for all margins, then per agent a graded pass, backward and step.
Under ``agent_overlap`` (docs/architecture.md "Devices") the agents' forwards, and their shares of the joint
backward, run in one worker per group (:meth:`MADPOModule._split_backward`), with the same gradients.

``trainer.global_step`` counts every optimizer step of every agent (num_agents per update). The module
also tracks ``env_step`` (environment_steps_per_pair per trained pair, docs/preference.md §7.4) and ``updates_seen``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from comlrl_lightning.config import MADPOConfig, MADPOIterConfig
from comlrl_lightning.distributed import world
from comlrl_lightning.logging_utils import StepMetrics
from comlrl_lightning.logprobs import sequence_logps
from comlrl_lightning.losses import madpo_loss, madpo_loss_detached_others
from comlrl_lightning.metrics import mean_across_ranks
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.protocols import PairSink, check_protocol
from comlrl_lightning.tiny import TINY_MODEL_NAME


class MADPOModule(TeamModuleBase):
    """Multi-agent DPO (docs/preference.md §7).

    Args as :class:`~comlrl_lightning.modules.base.TeamModuleBase`, with ``args`` a
    :class:`~comlrl_lightning.config.MADPOConfig` (dpo_beta, agent_learning_rate, ...). The schedulers step
    after each optimizer step.
    """

    def __init__(self, agent_model: str | None = TINY_MODEL_NAME, agents: Sequence[Any] | None = None,
                 tokenizer: Any = None, model_config: dict | None = None, lora: dict | None = None,
                 args: MADPOConfig | MADPOIterConfig | None = None, optimizer: OptimizerCallable | None = None,
                 lr_scheduler: LRSchedulerCallable | None = None):
        super().__init__()
        self.args: MADPOConfig | MADPOIterConfig = args if args is not None else MADPOConfig()
        self.save_redacted_hyperparameters(ignore=["agents", "tokenizer", "optimizer", "lr_scheduler"])
        self.init_team(agent_model, agents, tokenizer, model_config, lora, optimizer, lr_scheduler)
        self.round_index = 0
        self._accum = 0
        self._last_logged_progress: int | None = None  # the logging_steps gate
        self.step_metrics = StepMetrics([
            "train/loss", "train/accuracy", "turn_1/reward_mean", "turn_1/expected_return", "env_step", "round",
            *(f"train/agent{i}/{q}" for i in range(self.team.num_agents)
              for q in ("rewards/margins", "logps/chosen", "logps/rejected"))])
        self.task: PairSink | None = None  # the data module, bound in setup

    def setup(self, stage: str) -> None:
        dm = self.trainer.datamodule
        if dm is not None and stage == "fit":  # training reads its pairs (the progress bar's count)
            check_protocol(dm, PairSink, type(self).__name__, "data module", "PreferenceDataModule")
        self.task = dm

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        # A round without training pairs serves one placeholder batch (an empty dataloader would end fit).
        if isinstance(batch, dict) and batch.get("empty_round"):
            return -1
        return None

    # --- optimization ------------------------------------------------------------------------------------
    def _agent_logps(self, batch: dict, i: int, grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        rows = {k: v.to(self.agent_device(i)) for k, v in batch["agents"][i].items()}
        with torch.set_grad_enabled(grad), self.team.activate(i) as model:
            logps = sequence_logps(model, rows)
        b = rows["input_ids"].shape[0] // 2
        logps = logps.to(self.device)  # the agents' devices may differ (parallel_training="mp")
        return logps[:b], logps[b:]

    def _check_finite(self, loss: torch.Tensor, batch: dict) -> None:
        bad = ~torch.isfinite(loss.detach())
        if bad.any():
            idx = batch["pair_index"][bad.cpu()].tolist()
            raise FloatingPointError(
                f"MADPO loss is not finite for pair(s) {idx} of the current pair set (loss values "
                f"{loss.detach()[bad].tolist()}). Check those pairs' texts and the learning rate."
            )

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        optimizers = self.optimizer_list()
        n = self.team.num_agents
        accumulate = self.args.gradient_accumulation_steps
        beta = self.args.dpo_beta
        if self.team.shares_parameters():
            loss, stats = self._sequential_step(batch, optimizers, beta)
        else:
            agents = list(range(n))
            groups = self.update_worker_groups(agents)
            logps = self.run_agent_updates(agents, lambda i, main: self._agent_logps(batch, i), groups=groups)
            winner = torch.stack([w for w, _ in logps])
            loser = torch.stack([lo for _, lo in logps])
            per_pair, stats = madpo_loss(winner, loser, beta)
            self._check_finite(per_pair, batch)
            loss = per_pair.mean()
            if len(groups) < 2:
                self.manual_backward(loss / accumulate)
            else:
                self._split_backward(logps, beta, accumulate, groups)
            self._accum += 1
            if self._accum >= accumulate:
                self._step_all(optimizers)
        self._after_update(batch, loss, stats)
        return loss.detach()

    def _split_backward(self, logps: list[tuple[torch.Tensor, torch.Tensor]], beta: float, accumulate: int,
                        groups: Sequence[Sequence[int]]) -> None:
        """The joint backward of :meth:`training_step`, one agent per worker (``agent_overlap``): the gradient of
        ``mean(madpo_loss) / accumulate`` with respect to every agent's (winner, loser) log-probs is taken on the
        training thread from detached copies (the same operations as the joint graph, so the same values), then each
        worker back-propagates its agent's share through its own graph. The agents' graphs are disjoint, so every
        parameter gets exactly the gradient of the joint backward. Lightning's backward hooks run around it, on the
        training thread, once, with the joint loss."""
        leaves = [(w.detach().requires_grad_(), lo.detach().requires_grad_()) for w, lo in logps]
        per_pair, _ = madpo_loss(torch.stack([w for w, _ in leaves]), torch.stack([lo for _, lo in leaves]), beta)
        total = self._before_backward(per_pair.mean() / accumulate)
        grads = torch.autograd.grad(total, [t for pair in leaves for t in pair])

        def back(i: int, main: Any) -> None:
            torch.autograd.backward(list(logps[i]), [grads[2 * i], grads[2 * i + 1]])

        self.run_agent_updates(list(range(len(logps))), back, groups=groups)
        self._after_backward(total)

    def on_train_epoch_end(self) -> None:
        # gradients accumulated over the epoch's last (incomplete) group are applied, not carried over
        if self._accum > 0:
            self._step_all(self.optimizer_list())

    def _step_all(self, optimizers: list) -> None:
        for opt in optimizers:
            if self.args.gradient_clip_val is not None:
                self.clip_gradients(opt, gradient_clip_val=self.args.gradient_clip_val, gradient_clip_algorithm="norm")
            opt.step()
            opt.zero_grad(set_to_none=True)
        for s in self.scheduler_list():
            s.step()
        self._accum = 0

    def _sequential_step(self, batch: dict, optimizers: list, beta: float):
        """docs/preference.md §7.1 literally: detached margins of all agents, then per agent a graded pass and a
        step."""
        n = self.team.num_agents
        with torch.no_grad():
            det = [self._agent_logps(batch, i, grad=False) for i in range(n)]
        winner = torch.stack([w for w, _ in det])
        loser = torch.stack([lo for _, lo in det])
        per_pair, stats = madpo_loss(winner, loser, beta)
        self._check_finite(per_pair, batch)
        for i, opt in enumerate(optimizers):
            opt.zero_grad(set_to_none=True)
            w_i, l_i = self._agent_logps(batch, i)
            w = winner.clone()
            lo = loser.clone()
            w = torch.cat([w[:i], w_i.unsqueeze(0), w[i + 1:]])
            lo = torch.cat([lo[:i], l_i.unsqueeze(0), lo[i + 1:]])
            loss_i = madpo_loss_detached_others(w, lo, beta, i)
            if not torch.isfinite(loss_i):
                self._check_finite(loss_i.reshape(1).expand(len(batch["pair_index"])), batch)
            self.manual_backward(loss_i)
            if self.args.gradient_clip_val is not None:
                self.clip_gradients(opt, gradient_clip_val=self.args.gradient_clip_val, gradient_clip_algorithm="norm")
            opt.step()
        return per_pair.mean(), stats

    def _after_update(self, batch: dict, loss: torch.Tensor, stats: dict) -> None:
        bsz = int(batch["pair_index"].numel())
        self.updates_seen += 1
        if self.args.use_environment_step:
            self.env_step += self.args.environment_steps_per_pair * bsz
        beta = self.args.dpo_beta
        metrics = {
            "train/loss": loss.detach(),
            "train/accuracy": stats["accuracy"],
            "turn_1/reward_mean": batch["candidate_reward_mean"].mean(),
            "turn_1/expected_return": batch["candidate_reward_mean"].mean(),
            "env_step": float(self.env_step),
            "round": float(self.round_index),
        }
        for i in range(self.team.num_agents):
            metrics[f"train/agent{i}/rewards/margins"] = beta * stats["agent_margins"][i]
            metrics[f"train/agent{i}/logps/chosen"] = stats["chosen_logps"][i]
            metrics[f"train/agent{i}/logps/rejected"] = stats["rejected_logps"][i]
        if self._log_gate_passes():
            # under DDP, the means over every rank's batch (torchmetrics; docs/scaling.md, section 3)
            metrics = mean_across_ranks({k: float(v) for k, v in metrics.items()}, bsz, world(self._trainer)[1],
                                        self.device, keep=("env_step", "round"))
        else:
            metrics = None  # nothing is written at this step (a metric object: no stale repeat, see StepMetrics)
        self.step_metrics.log_to(self, metrics)
        self.log("loss", loss.detach(), prog_bar=True, batch_size=bsz, logger=False)
        if self.task is not None:
            self.log("pairs", float(len(self.task.pairs)), prog_bar=True, batch_size=bsz, logger=False)

    def _log_gate_passes(self) -> bool:
        """CoMLRL's ``logging_steps`` gate (docs/coming-from-comlrl.md): the first log passes, later ones need
        ``logging_steps`` env steps since the last one (updates instead when ``use_environment_step`` is off,
        where CoMLRL's frozen env_step would never log again)."""
        progress = self.env_step if self.args.use_environment_step else self.updates_seen
        last = self._last_logged_progress
        if last is not None and progress - last < self.args.logging_steps:
            return False
        self._last_logged_progress = progress
        return True

    # --- checkpoint ----------------------------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self.round_index = self.current_epoch // max(1, self.args.num_train_epochs)

    def progress_state(self) -> dict[str, Any]:
        return {**super().progress_state(), "round_index": self.round_index}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        super().load_progress_state(state)
        self.round_index = int(state.get("round_index", 0))
