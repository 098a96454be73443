"""TeamModuleBase: what every team-training LightningModule shares (MADPO, MAGRPO family, IAC/MAAC, MARLHF).

Top to bottom:

* the team: :meth:`TeamModuleBase.init_team` loads the agents (``self.team``, an
  :class:`~comlrl_lightning.agents.AgentTeam`), registers their distinct models in ``self.models`` and builds the
  generation engine of ``args.generation_backend`` (docs/engines.md);
* what callbacks call (the ``TeamModule`` protocol of :mod:`comlrl_lightning.protocols`): the sampling settings,
  :meth:`~TeamModuleBase.evaluate`, the oracle of training rollouts, the evaluation settings of ``validate``;
* ``validate`` / ``test`` (``comlrl-lightning validate --config X``): the data module's ``eval_items`` (the first
  ``args.eval_num_samples``) scored with the task reward, logged as ``val/...`` / ``test/...``; ``predict`` is refused;
* the engine: told after every agent optimizer step that the agent's weights changed, closed at the end of the run
  (a non-HF engine); the strategy and the launch are checked before the first collective
  (:func:`~comlrl_lightning.strategies.preflight`);
* one optimizer per agent (the ``optimizer`` factory, e.g. a LightningCLI ``optimizer:`` entry, else
  :func:`default_adamw` at ``args.agent_learning_rate``), optionally one ``lr_scheduler`` per agent optimizer;
* rollout windows and streams (the RL trainers), agent export (``output_dir/agent_{i}/``).

Four concerns live in mixins of their own, each with its tests:

* :class:`~comlrl_lightning.modules.placement.MemberPlacement`: each member on its device under
  ``parallel_training="mp"`` (docs/architecture.md, "Devices");
* :class:`~comlrl_lightning.modules.threaded_updates.ThreadedUpdates`: the agents' updates at the same time
  (``agent_overlap``), Lightning's backward hooks and optimizer steps kept on the main thread;
* :class:`~comlrl_lightning.modules.gradient_averaging.OwnGradientAveraging`: under DDP, each optimizer's gradients
  averaged over the ranks at its own step, without DDP's gradient hooks (docs/scaling.md, "Strategies");
* :class:`~comlrl_lightning.modules.checkpoint_state.CheckpointState`: counters, per-rank state and logging gates
  in the checkpoint, sealed by :mod:`~comlrl_lightning.modules.checkpoint_seal`.

Optimization is manual (``automatic_optimization = False``); ``trainer.global_step`` counts every optimizer step of
every agent (and of every critic).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from comlrl_lightning.agents import AgentTeam, build_agents
from comlrl_lightning.config import CONFIG_CLASSES
from comlrl_lightning.config.secrets import redact_secrets
from comlrl_lightning.data.sources import PREDICT_REFUSED
from comlrl_lightning.distributed import rank_seed, world
from comlrl_lightning.engines import build_engine
from comlrl_lightning.evaluation import balanced_evaluation, evaluate_team
from comlrl_lightning.generation import SamplingSettings, SamplingStream
from comlrl_lightning.modules.checkpoint_state import CheckpointState
from comlrl_lightning.modules.gradient_averaging import OwnGradientAveraging
from comlrl_lightning.modules.placement import MemberPlacement
from comlrl_lightning.modules.threaded_updates import ThreadedUpdates
from comlrl_lightning.multiturn.tree import rollout_window, update_windows
from comlrl_lightning.strategies import preflight

# Every module saves its ``args`` config object among its hyper-parameters, and Lightning's fit(ckpt_path=...)
# loads checkpoints with ``weights_only=True``: the config classes are allow-listed once, here.
torch.serialization.add_safe_globals(list(CONFIG_CLASSES))


def save_redacted_hyperparameters(module: L.LightningModule, ignore: Sequence[str] = (), frame: Any = None) -> None:
    """``module.save_hyperparameters(ignore=...)`` of the ``__init__`` arguments seen from ``frame`` (default: the
    caller's), secrets redacted (:func:`~comlrl_lightning.config.secrets.redact_secrets`): ``hparams.yaml``,
    loggers and every checkpoint never hold an API key, a header value, a URL query or an extra-body string.
    Every module of the package saves its hyper-parameters through this function."""
    if frame is None:
        current = inspect.currentframe()
        frame = current.f_back if current is not None else None
    module.save_hyperparameters(ignore=list(ignore), frame=frame)
    module.save_hyperparameters(redact_secrets(dict(module.hparams)))


class TeamModuleBase(MemberPlacement, ThreadedUpdates, OwnGradientAveraging, CheckpointState):
    """Base of the team modules; subclasses set ``self.args`` then call :meth:`init_team` in ``__init__``.

    The constructor arguments every team module takes:
        agent_model: one hub id / local path / ``embedded:tiny`` for homogeneous agents.
        agents: a list of ids, paths or model objects (overrides ``agent_model``).
        tokenizer: one tokenizer or one per agent (required with model objects).
        model_config: load kwargs (``dtype``, ``attn_implementation``, ``model_kwargs``, ``special_tokens``).
        lora: peft LoraConfig kwargs; one frozen base shared by all agents, one adapter per agent.
        args: the method's config dataclass (``num_agents``, ``agent_learning_rate``, sampling options, ...).
        optimizer: optimizer factory per agent (default AdamW with ``args.agent_learning_rate``).
        lr_scheduler: optional scheduler factory per agent optimizer.
    """

    args: Any

    def save_redacted_hyperparameters(self, ignore: Sequence[str] = ()) -> None:
        """:func:`save_redacted_hyperparameters` of the caller's ``__init__`` arguments."""
        frame = inspect.currentframe()
        save_redacted_hyperparameters(self, ignore, frame.f_back if frame is not None else None)

    def init_team(self, agent_model: str | None, agents: Sequence[Any] | None, tokenizer: Any,
                  model_config: dict | None, lora: dict | None, optimizer: OptimizerCallable | None = None,
                  lr_scheduler: LRSchedulerCallable | None = None) -> None:
        """Load the agents, keep the optimizer/scheduler factories, zero the progress counters."""
        self.automatic_optimization = False
        self.team: AgentTeam = build_agents(
            agent_model=agent_model if agents is None else None, agents=agents, num_agents=self.args.num_agents,
            tokenizer=tokenizer, model_config=model_config, lora=lora,
        )
        n = self.team.num_agents
        if n != self.args.num_agents:
            raise ValueError(f"args.num_agents={self.args.num_agents} but {n} agents were given. Set num_agents={n}.")
        self.models = nn.ModuleList(self.team.unique_models())
        a = self.args
        self.team.engine = build_engine(self.team, a.generation_backend, a.vllm_kwargs, a.agent_overlap)
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.env_step = 0
        self.updates_seen = 0
        self.generation_kwargs: dict = {}  # the facades' ``train(**kwargs)``, forwarded to every generate call
        self.evaluation_settings = (12345, 1)  # (seed, samples_per_item) of validate/test: use_evaluation_settings
        self._rank_seeded = False  # rank_rollout_seed
        #: Reward oracle of *training* rollouts only; None = the data module's task oracle. MARLHF's reward
        #: callbacks set a learned reward through :meth:`use_train_oracle`; evaluation never reads it.
        self.train_oracle: Any = None

    # --- small interface used by callbacks ---------------------------------------------------------------
    def sampling_settings(self) -> SamplingSettings:
        a = self.args
        return SamplingSettings(a.max_new_tokens, a.temperature, a.top_p, a.top_k, dict(self.generation_kwargs or {}))

    def use_train_oracle(self, oracle: Any) -> None:
        """Score training rollouts with ``oracle`` from now on (None: the data module's task reward)."""
        self.train_oracle = oracle

    def training_oracle(self, task: Any) -> Any:
        """The oracle of training rollouts: the one set by :meth:`use_train_oracle`, else ``task.oracle``."""
        return self.train_oracle if self.train_oracle is not None else task.oracle

    @torch.no_grad()
    def evaluate(self, items: Sequence[dict], task: Any, seed: int = 12345, samples_per_item: int = 1) -> dict:
        """Single-turn task-reward evaluation of ``items`` (:func:`~comlrl_lightning.evaluation.evaluate_team`):
        ``samples_per_item`` joint responses per item from fresh streams seeded with ``seed``, ``eval_batch_size``
        items generated together, scored with ``task.oracle`` (never the training oracle). Sharded agents (FSDP2):
        a balanced round on every rank (:func:`~comlrl_lightning.evaluation.balanced_evaluation`)."""
        return balanced_evaluation(self, lambda: evaluate_team(
            self.team, list(items), task.formatters, task.oracle, self.sampling_settings(), seed, samples_per_item,
            batch_size=self.args.eval_batch_size), self.evaluation_where())

    def evaluation_where(self) -> str:
        """How an evaluation names itself in a ``RankFailure`` (the update it evaluates)."""
        return f"Evaluation at update {getattr(self, 'updates_seen', 0)}"

    def use_evaluation_settings(self, seed: int = 12345, samples_per_item: int = 1) -> None:
        """Evaluate ``validate`` / ``test`` with ``samples_per_item`` samples per item from streams seeded ``seed``.
        :class:`~comlrl_lightning.callbacks.TaskRewardEvaluation` hands its own in ``setup`` (so that ``validate``
        reproduces the ``after`` number of ``fit``) and the defaults back in ``teardown``."""
        self.evaluation_settings = (int(seed), int(samples_per_item))

    # --- validate / test: evaluate the team on eval_dataset with the task reward ---------------------------
    def _evaluate_step(self, items: list, prefix: str) -> dict:
        items = list(items)[: self.args.eval_num_samples]
        seed, samples = self.evaluation_settings
        metrics = self.evaluate(items, self.trainer.datamodule, seed=seed, samples_per_item=samples)
        out = {prefix + k.removeprefix("eval/"): float(v) for k, v in metrics.items()}
        for k, v in out.items():
            self.log(k, v, batch_size=len(items), prog_bar=k.endswith("/reward_mean") and "turn_" not in k)
        return out

    def validation_step(self, batch: list, batch_idx: int) -> dict:
        """Task-reward evaluation of the team on the eval items (``val/reward_mean``, ...)."""
        return self._evaluate_step(batch, "val/")

    def test_step(self, batch: list, batch_idx: int) -> dict:
        """As :meth:`validation_step`, logged under ``test/``."""
        return self._evaluate_step(batch, "test/")

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError(PREDICT_REFUSED)

    def trainable_modules(self) -> list[nn.Module]:
        """Modules put in train mode at fit start (the agents' models; subclasses add critics)."""
        return list(self.team.unique_models())

    def on_fit_start(self) -> None:
        for m in self.trainable_modules():
            m.train()

    # --- the generation engine (docs/engines.md) -----------------------------------------------------------
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Agent i's optimizer is about to step: its weights change, so the engine must re-read them before its
        next generation (optimizers after the agents', e.g. critics, change nothing the engine serves)."""
        self.average_before_step(optimizer)
        engine = self.team.engine
        if engine is None or self._trainer is None:
            return
        index = next((i for i, opt in enumerate(self.trainer.optimizers) if opt is optimizer), None)
        agents = None if index is None else [index] if index < self.team.num_agents else []
        if agents == []:
            return
        try:
            engine.sync(agents)
        except Exception as exc:
            who = "every agent" if agents is None else f"agent {index}"
            raise RuntimeError(f"The {type(engine).__name__}'s weight sync of {who} failed before optimizer step "
                               f"{self.trainer.global_step + 1} ({type(exc).__name__}: {exc}); the run stops rather "
                               "than sample with stale weights (docs/engines.md, \"Verification\").") from exc

    def configure_callbacks(self) -> list:
        """A non-HF engine's shutdown hooks (teardown, exceptions, Ctrl-C; nothing with the HF engine) and the lock of
        the round-file folder (:class:`~comlrl_lightning.modules.run_lock.RunFolderLock`).

        Lightning calls this hook first in ``fit`` / ``validate`` / ``test``, before it initializes the process
        group: the strategy and the launch are checked here (:func:`~comlrl_lightning.strategies.preflight`), so a
        refused strategy or a process count that disagrees with ``devices`` / ``num_nodes`` is an error on every
        process instead of a hang."""
        if self._trainer is not None:
            preflight(self._trainer, self)
        from comlrl_lightning.modules.run_lock import RunFolderLock  # one run per round-file folder

        engine = self.team.engine
        if engine is None or getattr(engine, "name", "hf") == "hf":  # engines of tests may have no name
            return [RunFolderLock()]
        return [EngineShutdown(engine), RunFolderLock()]

    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy`` (FSDP2): shard every trained member (agents, critics) layer
        by layer on the data-parallel mesh (:func:`~comlrl_lightning.sharding.shard_team`, docs/scaling.md
        "FSDP2"); nothing under any other strategy. Lightning calls it after ``setup``, before the optimizers."""
        from comlrl_lightning.sharding import shard_team

        shard_team(self)

    # --- optimizers --------------------------------------------------------------------------------------
    def agent_parameters(self, i: int) -> list[nn.Parameter]:
        """What agent i's optimizer trains (its weights or LoRA adapter)."""
        return list(self.team.parameters_of(i))

    def extra_optimizers(self) -> list[torch.optim.Optimizer]:
        """Optimizers after the agents' (e.g. critics); none by default."""
        return []

    def configure_optimizers(self):
        """One optimizer per agent (``optimizer`` factory, else :func:`default_adamw` at ``agent_learning_rate``), then
        :meth:`extra_optimizers`; with an ``lr_scheduler`` factory, one scheduler per agent optimizer, named
        ``lr-agent{i}`` (the key ``LearningRateMonitor`` logs it under)."""
        optimizers, schedulers = [], []
        for i in range(self.team.num_agents):
            params = self.agent_parameters(i)
            if not params:
                raise ValueError(f"Agent {i} has no trainable parameters.")
            opt = (self.optimizer_factory(params) if self.optimizer_factory is not None
                   else default_adamw(params, self.args.agent_learning_rate))
            optimizers.append(opt)
            if self.scheduler_factory is not None:
                schedulers.append({"scheduler": self.scheduler_factory(opt), "name": f"lr-agent{i}"})
        optimizers += self.extra_optimizers()
        return (optimizers, schedulers) if schedulers else optimizers

    def optimizer_list(self) -> list:
        """``self.optimizers()`` as a list (Lightning unwraps a single optimizer)."""
        opts = self.optimizers()
        return opts if isinstance(opts, list) else [opts]

    def scheduler_list(self) -> list:
        """``self.lr_schedulers()`` as a list (empty without an ``lr_scheduler`` factory)."""
        schedulers = self.lr_schedulers()
        if schedulers is None:
            return []
        return schedulers if isinstance(schedulers, list) else [schedulers]

    def step_scheduler(self, agent: int) -> None:
        """Step agent ``agent``'s scheduler, if there is one (after each of its optimizer steps)."""
        schedulers = self.scheduler_list()
        if agent < len(schedulers):
            schedulers[agent].step()

    # --- rollouts (the MAGRPO family and IAC/MAAC) -----------------------------------------------------------
    def max_samples_per_item(self) -> int | None:
        """The most samples one task item gives each agent's buffer (the RL trainers, which roll out task items
        into ``self.rollout_buffers``), or None for a module that does not."""
        return None

    def items_per_step(self) -> int:
        """Task items per training step: the batch size of the task data module's loader. 1 without rollouts; the
        RL trainers: ``generation_batch_size``, or the update window from empty buffers (docs/multiturn.md §2.11)."""
        most = self.max_samples_per_item()
        if most is None:
            return 1
        if self.args.generation_batch_size is not None:
            return int(self.args.generation_batch_size)
        size = self.args.rollout_buffer_size
        return rollout_window([0] * self.team.num_agents, size, most, size)

    def update_windows(self, batch: Sequence) -> Iterator[list]:
        """The groups of ``batch``'s items rolled out together (:func:`~comlrl_lightning.multiturn.tree.update_windows`
        over ``self.rollout_buffers``; the whole batch with a fixed ``generation_batch_size``)."""
        a = self.args
        return update_windows(batch, lambda: [len(b) for b in self.rollout_buffers], a.rollout_buffer_size,
                              self.max_samples_per_item(), whole=a.generation_batch_size is not None)

    def updates_in_batch(self, batch: Any) -> int:
        """By how much one training batch advances ``updates_seen`` (1; the RL trainers: one per task item)."""
        return 1

    def rollout_streams(self, seed: int) -> list[SamplingStream]:
        """One rollout stream per agent, agent i's seeded ``seed * 1_000_003 + 7919 * i + 17``."""
        return [SamplingStream(seed * 1_000_003 + 7919 * i + 17) for i in range(self.team.num_agents)]

    def rank_rollout_seed(self) -> int | None:
        """At the first ``setup`` on rank r > 0: ``rank_seed(args.seed, r)``, the seed of that rank's rollout
        streams and shuffling (docs/scaling.md); None on rank 0 and at every later call."""
        first = not self._rank_seeded
        self._rank_seeded = True
        rank = world(self._trainer)[0] if self._trainer is not None else 0
        return rank_seed(self.args.seed, rank) if first and rank > 0 else None

    def save_agents(self, output_dir: str) -> list[str]:
        """Write ``output_dir/agent_{i}/`` per agent (model + tokenizer, or the LoRA adapter)."""
        return self.team.save(output_dir)


class EngineShutdown(L.Callback):
    """Closes a generation engine when the run ends, fails or is interrupted (Lightning calls ``on_exception``
    for KeyboardInterrupt too, before it exits), so no engine process or shared memory outlives the run."""

    def __init__(self, engine: Any):
        self.engine = engine

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.engine.close()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.engine.close()


def default_adamw(params: list, lr: float) -> torch.optim.AdamW:
    """AdamW at ``lr`` with torch's defaults, fused where torch has a fused kernel for every parameter's device and
    dtype (CPU and CUDA floating point since torch 2.4), else torch's own choice (foreach or single-tensor). The fused
    kernel computes the same update up to float rounding (tests/modules/test_lean_update.py) and takes 2-3x less time
    per step on CPU (docs/architecture.md, "The update"). A user's ``optimizer`` factory replaces it."""
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16,
                                                                   torch.float64) for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=True) if fused else torch.optim.AdamW(params, lr=lr)
