"""TeamModuleBase: what every team-training LightningModule shares (MADPO, MAGRPO family, IAC/MAAC, MARLHF).

* the team: :meth:`TeamModuleBase.init_team` loads the agents (``self.team``, an
  :class:`~comlrl_lightning.agents.AgentTeam`) and registers their distinct models in ``self.models``;
* one optimizer per agent, from the injectable ``optimizer`` factory (a LightningCLI ``optimizer:`` entry
  such as ``{class_path: torch.optim.SGD, init_args: {lr: 0.05}}``) or AdamW with ``args.agent_learning_rate``,
  and optionally one ``lr_scheduler`` per agent optimizer; subclasses add parameters to an agent's optimizer
  (:meth:`agent_parameters`) or extra optimizers after the agents' (:meth:`extra_optimizers`);
* the sampling settings the collection and evaluation callbacks read (:meth:`sampling_settings`);
* progress counters ``env_step`` and ``updates_seen``, saved in the checkpoint under ``comlrl_progress``
  (plain types: checkpoints are loaded ``weights_only``); subclasses extend :meth:`progress_state`;
* agent export (:meth:`save_agents`): ``output_dir/agent_{i}/`` per agent;
* the generation engine of ``args.generation_backend`` (``team.engine``, docs/engines.md; the HF engine with
  ``args.agent_overlap``, docs/architecture.md "Devices"): told after every agent
  optimizer step that the agent's weights changed (the engine applies it before its next generation) and after a
  checkpoint restore; a non-HF engine is closed at the end of fit/validate/test, on exceptions and on Ctrl-C;
* multi-process runs (docs/scaling.md, "Strategies"): under DDP every backward runs without DDP's gradient hooks
  and each optimizer's gradients are averaged over the ranks at its own step (:meth:`averages_own_gradients`), so
  ``strategy="ddp"`` needs no unused-parameter search; strategies the modules cannot run and launches whose
  process counts disagree with ``devices`` / ``num_nodes`` are refused before the first collective
  (:func:`~comlrl_lightning.strategies.preflight`);
* ``validate`` / ``test`` (``comlrl-lightning validate --config X``): the data module's ``eval_items`` (its
  ``val_dataloader``; the first ``args.eval_num_samples``), scored with the task reward through :meth:`evaluate`,
  logged as ``val/...`` / ``test/...`` (e.g. ``val/reward_mean``); ``predict`` is refused with a message;
* the rest of the ``TeamModule`` protocol of :mod:`comlrl_lightning.protocols` that callbacks call:
  :meth:`evaluate` (single-turn task-reward evaluation; multi-turn modules override it) and
  :meth:`use_train_oracle` (the reward of training rollouts, e.g. MARLHF's learned reward).

Optimization is manual (``automatic_optimization = False``); ``trainer.global_step`` counts every
optimizer step of every agent (and of every critic).
"""

from __future__ import annotations

import functools
import inspect
import random
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from comlrl_lightning.agents import AgentTeam, build_agents
from comlrl_lightning.config import CONFIG_CLASSES
from comlrl_lightning.config.secrets import redact_secrets
from comlrl_lightning.data.tasks import PREDICT_REFUSED
from comlrl_lightning.devices import (
    common_device,
    device_of,
    draws_random_numbers,
    normalize_agent_overlap,
    resolve_devices,
    update_groups,
)
from comlrl_lightning.distributed import average_gradients, gather_objects, per_rank_entry, rank_seed, world
from comlrl_lightning.engines import build_engine
from comlrl_lightning.evaluation import evaluate_team
from comlrl_lightning.files import state_digest
from comlrl_lightning.generation import SamplingSettings, SamplingStream
from comlrl_lightning.multiturn.tree import rollout_window, update_windows
from comlrl_lightning.overlap import MainThread, run_jobs
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


CHECKPOINT_DIGEST_KEY = "comlrl_digest"


def _sealed_parts(module: L.LightningModule, checkpoint: dict, datamodule_key: str | None) -> dict:
    """What the checkpoint digest covers: the weights, the callbacks' and the data module's state, our counters, every
    rank's rollout buffers and streams, the logging gates. Sharded weights (FSDP2) are not: each rank holds its own
    shards, which Lightning writes as a distributed checkpoint outside the file the digest lives in."""
    from comlrl_lightning.sharding import is_sharded

    ours = ("callbacks", "comlrl_progress", "comlrl_rank_states", "comlrl_logging_gates")
    keys = ours if is_sharded(module) else ("state_dict", *ours)
    parts = {k: checkpoint.get(k) for k in keys}
    if datamodule_key is not None:
        parts["datamodule"] = checkpoint.get(datamodule_key)
    return parts


def seal_checkpoint(module: L.LightningModule, checkpoint: dict) -> None:
    """Store one sha256 digest per part of :func:`_sealed_parts` under ``checkpoint["comlrl_digest"]`` (called
    last in ``on_save_checkpoint``, when Lightning has put the weights and every other state into ``checkpoint``)."""
    trainer = module._trainer
    dm = getattr(trainer, "datamodule", None) if trainer is not None else None
    key = type(dm).__qualname__ if dm is not None else None
    parts = _sealed_parts(module, checkpoint, key)
    checkpoint[CHECKPOINT_DIGEST_KEY] = {"datamodule_key": key,
                                         "sha256": {name: state_digest(v) for name, v in parts.items()}}


def verify_checkpoint(module: L.LightningModule, checkpoint: dict) -> None:
    """Raise ``ValueError`` naming the file when the checkpoint no longer matches the digests written with it
    (flipped tensor bytes, edited state). Checkpoints without digests (written by other code) are accepted."""
    sealed = checkpoint.get(CHECKPOINT_DIGEST_KEY)
    if not isinstance(sealed, dict) or not isinstance(sealed.get("sha256"), dict):
        return
    parts = _sealed_parts(module, checkpoint, sealed.get("datamodule_key"))
    bad = [name for name, digest in sealed["sha256"].items() if state_digest(parts.get(name)) != digest]
    if bad:
        trainer = module._trainer
        path = getattr(trainer, "ckpt_path", None) if trainer is not None else None
        raise ValueError(
            f"Checkpoint {path or '(given to load_from_checkpoint)'} is corrupt: its {', '.join(bad)} do not match "
            "the sha256 digest written with it (the file was modified or damaged after saving). Resume from "
            "another checkpoint.")


def warn_unresumable_position(checkpoint: dict, path: Any = None) -> None:
    """Warn when ``checkpoint`` was taken inside an epoch but holds no position of the train loader (written before
    the loaders were resumable, or by a data module whose loader is not): the resumed epoch would start again from
    its first batch, and the run would not continue as the uninterrupted one (docs/guide.md §1.1)."""
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    batches = (fit.get("epoch_loop.batch_progress") or {}).get("current") or {}
    epoch = (fit.get("epoch_progress") or {}).get("current") or {}
    inside = (batches.get("ready", 0) > 0 and not fit.get("epoch_loop.batch_progress", {}).get("is_last_batch")
              and epoch.get("started") != epoch.get("processed"))
    if inside and not (fit.get("state_dict") or {}).get("combined_loader"):
        warnings.warn(
            f"Checkpoint {path or '(given)'} was taken {batches.get('ready')} batches into an epoch, but it holds no "
            "position of the train dataloader: the resumed epoch starts again from its first batch, so the run will "
            "not continue as the uninterrupted one. Resume from an end-of-epoch checkpoint (ModelCheckpoint("
            "every_n_epochs=1, save_on_train_epoch_end=True)), or from a mid-epoch checkpoint written by this "
            "version with the package's data modules.", stacklevel=2)


def refuse_round_end_position(checkpoint: dict, trainer: Any, path: Any = None) -> None:
    """Refuse a checkpoint of a run with round callbacks (``round_stage``, docs/preference.md §4.6) taken after the
    last batch of an epoch but before its end (``ModelCheckpoint(every_n_train_steps=...)`` saves in
    ``on_train_batch_end``): Lightning resumes it in the next epoch without running the epoch's end, where the round
    callbacks collect the next round's pairs and write the round's snapshot, so the run could not continue as the
    uninterrupted one."""
    if trainer is None or not any(isinstance(getattr(cb, "round_stage", None), int) for cb in trainer.callbacks):
        return
    fit = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    batches = fit.get("epoch_loop.batch_progress") or {}
    epoch = (fit.get("epoch_progress") or {}).get("current") or {}
    if batches.get("is_last_batch") and epoch.get("started", 0) != epoch.get("processed", 0):
        raise ValueError(
            f"Checkpoint {path or '(given)'} was taken after the last batch of epoch {epoch.get('processed', 0)} but "
            "before the epoch's end, where the round callbacks collect the next round's pairs and write the round's "
            "snapshot: resuming it would skip that work. Resume from the checkpoint written at that epoch's end "
            "(ModelCheckpoint(every_n_epochs=1, save_on_train_epoch_end=True)) or from an earlier checkpoint.")


class TeamModuleBase(L.LightningModule):
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
        self.team.engine = build_engine(self.team, getattr(self.args, "generation_backend", "hf"),
                                        getattr(self.args, "vllm_kwargs", None),
                                        getattr(self.args, "agent_overlap", "auto"))
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self.env_step = 0
        self.updates_seen = 0
        self._averaged_optimizer: Any = None  # the optimizer clip_gradients averaged over the ranks (DDP)
        #: Reward oracle of *training* rollouts only; None = the data module's task oracle. MARLHF's reward
        #: callbacks set a learned reward through :meth:`use_train_oracle`; evaluation never reads it.
        self.train_oracle: Any = None

    # --- small interface used by callbacks ---------------------------------------------------------------
    def sampling_settings(self) -> SamplingSettings:
        a = self.args
        return SamplingSettings(a.max_new_tokens, a.temperature, a.top_p, a.top_k,
                                dict(getattr(self, "generation_kwargs", None) or {}))

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
        items generated together, scored with ``task.oracle`` (never the training oracle)."""
        return evaluate_team(self.team, list(items), task.formatters, task.oracle, self.sampling_settings(), seed,
                             samples_per_item, batch_size=getattr(self.args, "eval_batch_size", None))

    # --- validate / test: evaluate the team on eval_dataset with the task reward ---------------------------
    def _eval_settings(self) -> tuple[int, int]:
        """(seed, samples_per_item) of the run's task-reward evaluation callback when there is one (so that
        ``validate`` reproduces the ``after`` number of ``fit``), else (12345, 1)."""
        for cb in self.trainer.callbacks:
            if hasattr(cb, "samples_per_item") and hasattr(cb, "before_after"):
                return int(cb.seed), int(cb.samples_per_item)
        return 12345, 1

    def _evaluate_step(self, items: list, prefix: str) -> dict:
        items = list(items)[: self.args.eval_num_samples]
        seed, samples = self._eval_settings()
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

    # --- devices (parallel_training="mp"; docs/architecture.md, "Devices") -----------------------------------
    def to(self, *args: Any, **kwargs: Any) -> TeamModuleBase:
        """``nn.Module.to``, after which each member goes back to its own device under
        ``parallel_training="mp"`` (Lightning moves the whole module to its root device at setup)."""
        out = super().to(*args, **kwargs)
        self.place_members()
        return out

    def member_placement(self) -> list[tuple[nn.Module, torch.device]]:
        """(module, device) pairs of :meth:`place_members`: agent i's model on ``agent_devices[i]``; subclasses
        add critics and value heads. Empty unless ``parallel_training="mp"``."""
        a = getattr(self, "args", None)
        if getattr(a, "parallel_training", "none") != "mp" or "team" not in vars(self):
            return []
        devices = resolve_devices(a.agent_devices, self.team.num_agents, "agent_devices")
        if self.team.uses_lora and common_device(devices) is None:
            raise ValueError(f"agent_devices={a.agent_devices!r} puts LoRA agents on different devices, but they are "
                             "adapters of one shared base model, which lives on one device. Give one device "
                             "(agent_devices='cuda:0'), or load full-model agents (no lora) to spread them.")
        return list(zip(self.team.models, devices))

    def place_members(self) -> None:
        """Move each member to its device (:meth:`member_placement`). ``parallel_training="mp"`` places members
        inside one process; it cannot be combined with a strategy that runs several processes."""
        placement = self.member_placement()
        if not placement:
            return
        processes = self._trainer.world_size if self._trainer is not None else 1
        if processes > 1:
            raise ValueError(f"parallel_training='mp' places the agents on agent_devices={self.args.agent_devices!r} "
                             f"inside one process, but the trainer runs {processes} processes "
                             f"({type(self.trainer.strategy).__name__}). Use parallel_training='none' with a "
                             "multi-process strategy (each process then holds the whole team), or devices=1.")
        for module, device in placement:
            module.to(device)

    def agent_device(self, i: int) -> torch.device:
        """The device of agent i's model (the module's device when it has no parameters)."""
        return device_of(self.team.models[i], self.device)

    # --- the generation engine (docs/engines.md) -----------------------------------------------------------
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Agent i's optimizer is about to step: its weights change, so the engine must re-read them before its
        next generation (optimizers after the agents', e.g. critics, change nothing the engine serves)."""
        self._average_before_step(optimizer)
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
        if engine is None or getattr(engine, "name", "hf") == "hf":
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

    # --- DDP: each optimizer's gradients averaged at its own step (docs/scaling.md, "Strategies") ------------
    def averages_own_gradients(self) -> bool:
        """True when the fit runs under a DDP wrapper (any ``DDPStrategy``, ``strategy="ddp"`` included). Then
        :meth:`manual_backward` runs every backward under the wrapper's ``no_sync()`` (DDP's hooks, which expect
        every parameter of the module in each backward, stay idle) and each optimizer's gradients are averaged over
        the ranks just before its step (:meth:`on_before_optimizer_step`) or its gradient clipping
        (:meth:`clip_gradients`), by :func:`~comlrl_lightning.distributed.average_gradients`: one all-reduce per
        agent step (per bucket of 16M elements), over that agent's parameters only, so every rank steps the same
        weights without DDP's unused-parameter search. Gradient accumulation reduces once per step."""
        trainer = self._trainer
        return trainer is not None and isinstance(trainer.strategy.model, DistributedDataParallel)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``manual_backward``; under DDP without DDP's gradient sync (:meth:`averages_own_gradients`)."""
        if not self.averages_own_gradients():
            super().manual_backward(loss, *args, **kwargs)
            return
        with self.trainer.strategy.model.no_sync():
            super().manual_backward(loss, *args, **kwargs)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's ``clip_gradients``, on the gradients averaged over the ranks (:meth:`averages_own_gradients`):
        the norm is the global one, as under DDP."""
        raw = getattr(optimizer, "_optimizer", optimizer)
        if self.averages_own_gradients():
            self._average_gradients(raw)
            self._averaged_optimizer = raw
        super().clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                               gradient_clip_algorithm=gradient_clip_algorithm)

    def _average_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients unless :meth:`clip_gradients` did since its last step."""
        averaged, self._averaged_optimizer = self._averaged_optimizer, None
        if averaged is optimizer or not self.averages_own_gradients():
            return
        self._average_gradients(optimizer)
        scaler = getattr(self.trainer.strategy.precision_plugin, "scaler", None)
        if scaler is not None:  # 16-mixed: unscale_ looked for inf/nan in this rank's gradients; every rank must
            import torch.distributed as dist  # agree to skip the step, as DDP's (reduced) gradients would

            state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
            for found in state.get("found_inf_per_device", {}).values():
                dist.all_reduce(found, op=dist.ReduceOp.MAX)

    def _average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        params = list({id(p): p for group in optimizer.param_groups for p in group["params"]
                       if p.requires_grad}.values())
        average_gradients(params, self.trainer.world_size)

    # --- the agents' updates at the same time (agent_overlap; docs/architecture.md "Devices") --------------
    def overlap_blocker(self) -> str | None:
        """Why this fit runs the agents' updates one after another whatever ``agent_overlap`` says, else None:
        several processes (DDP's gradient hooks serve one backward at a time), a strategy other than Lightning's
        single-device one or one with its own ``backward``, a gradient scaler (one scaler for every agent, updated
        after each step, would depend on the steps' timing), or a trained module whose forward draws random numbers
        (dropout: two threads would share the global generator)."""
        trainer = self._trainer
        if trainer is None:
            return "no trainer is attached"
        if trainer.world_size > 1:
            return f"the trainer runs {trainer.world_size} processes"
        strategy = trainer.strategy
        if not isinstance(strategy, SingleDeviceStrategy) or type(strategy).backward is not Strategy.backward:
            return f"the strategy is {type(strategy).__name__}, not Lightning's SingleDeviceStrategy"
        if getattr(strategy.precision_plugin, "scaler", None) is not None:
            return "the precision plugin scales gradients (16-mixed)"
        if any(draws_random_numbers(m) for m in self.trainable_modules()):
            return "a trained model has dropout (its forward draws from the global RNG)"
        return None

    def update_worker_groups(self, agents: Sequence[int], members: Sequence[Sequence[nn.Module]] | None = None
                             ) -> list[list[int]]:
        """Positions in ``agents`` grouped into the workers of :meth:`run_agent_updates`: one group (in order) with
        ``agent_overlap="off"``, for a single agent, or when :meth:`overlap_blocker` names a reason (told once, with
        "on"); else :func:`~comlrl_lightning.devices.update_groups` of ``members`` (``members[j]``: the modules the
        job of ``agents[j]`` touches; default: that agent's model)."""
        agents = list(agents)
        if members is None:
            members = [[self.team.models[a]] for a in agents]
        mode = normalize_agent_overlap(getattr(self.args, "agent_overlap", "auto"))
        if mode == "off" or len(agents) < 2:
            return [list(range(len(agents)))]
        blocker = self.overlap_blocker()
        if blocker is None:
            return update_groups(members, mode)
        if mode == "on" and not getattr(self, "_told_overlap_blocker", False):
            self._told_overlap_blocker = True
            warnings.warn(f"agent_overlap='on': the agents' updates run one after another because {blocker} "
                          "(docs/architecture.md, \"Devices\"). Generation still overlaps.", stacklevel=3)
        return [list(range(len(agents)))]

    def run_agent_updates(self, agents: Sequence[int], job: Callable[[int, MainThread], Any],
                          members: Sequence[Sequence[nn.Module]] | None = None,
                          groups: Sequence[Sequence[int]] | None = None) -> list[Any]:
        """``job(agent, main)`` for each of ``agents``; the results in that order.

        The jobs run in the workers of :meth:`update_worker_groups` (or ``groups``, computed by it before), the
        workers at the same time, one thread each (:func:`~comlrl_lightning.overlap.run_jobs`). A job does its
        tensor work itself and hands Lightning's part to ``main``: :meth:`agent_backward` and :meth:`agent_step`.
        Each job's own work keeps its order and the agents share no parameters or RNG, so the weights equal the
        agent-after-agent run."""
        agents = list(agents)
        if groups is None:
            groups = self.update_worker_groups(agents, members)
        jobs = [functools.partial(job, a) for a in agents]
        return run_jobs(jobs, groups, [self.agent_device(a) for a in agents], name="agent-update")

    def agent_backward(self, loss: torch.Tensor, main: MainThread) -> None:
        """``manual_backward(loss)`` from a job of :meth:`run_agent_updates`: in a worker, the backward itself runs
        there and Lightning's hooks before and after it (strategy, precision plugin, ``on_before_backward`` /
        ``on_after_backward``) on the main thread, in the order ``Strategy.backward`` calls them."""
        if main.inline:
            self.manual_backward(loss)
            return
        loss = main.call(self._before_backward, loss)
        self.trainer.strategy.precision_plugin.backward(loss, self, None)
        main.call(self._after_backward, loss)

    def _before_backward(self, loss: torch.Tensor) -> torch.Tensor:
        strategy = self.trainer.strategy
        strategy.pre_backward(loss)
        return strategy.precision_plugin.pre_backward(loss, self)

    def _after_backward(self, loss: torch.Tensor) -> None:
        strategy = self.trainer.strategy
        strategy.post_backward(strategy.precision_plugin.post_backward(loss, self))

    def agent_step(self, optimizer: Any, main: MainThread, scheduler_of: int | None = None) -> None:
        """``optimizer.step()`` (Lightning's: it counts ``global_step`` and runs ``on_before_optimizer_step``), then
        the scheduler of agent ``scheduler_of`` if given, on the main thread."""
        main.call(self._step, optimizer, scheduler_of)

    def _step(self, optimizer: Any, scheduler_of: int | None) -> None:
        optimizer.step()
        if scheduler_of is not None:
            self.step_scheduler(scheduler_of)

    # --- progress and export -----------------------------------------------------------------------------
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

    #: Attributes holding a ``logging_steps`` gate (the progress of the last log, or None), saved in the checkpoint
    #: (``comlrl_logging_gates``) so that a run resumed mid-epoch logs at the steps the uninterrupted run logs at.
    LOGGING_GATES = ("_last_logged_step", "_last_logged_progress", "_last_logged_env_step")

    def progress_state(self) -> dict[str, Any]:
        """Counters saved in the checkpoint (plain types only)."""
        return {"env_step": self.env_step, "updates_seen": self.updates_seen}

    def load_progress_state(self, state: dict[str, Any]) -> None:
        self.env_step = int(state.get("env_step", 0))
        self.updates_seen = int(state.get("updates_seen", 0))

    def logging_gates(self) -> dict[str, int | None]:
        """The :attr:`LOGGING_GATES` this module has, by name (plain types)."""
        return {name: getattr(self, name) for name in self.LOGGING_GATES if hasattr(self, name)}

    def load_logging_gates(self, gates: dict[str, Any]) -> None:
        for name, value in gates.items():
            if name in self.LOGGING_GATES:
                setattr(self, name, None if value is None else int(value))

    def rank_state(self) -> dict[str, Any]:
        """What differs between the ranks of a multi-process run (the rollout streams, for instance; plain types).
        Saved per rank: :meth:`on_save_checkpoint` gathers it from every rank (docs/scaling.md)."""
        return {}

    def load_rank_state(self, state: dict[str, Any]) -> None:
        """Restore this rank's entry of :meth:`rank_state` (applied after :meth:`load_progress_state`)."""

    # --- rollout randomness (the MAGRPO family and IAC/MAAC) ---------------------------------------------------
    def rollout_streams(self, seed: int) -> list[SamplingStream]:
        """One rollout stream per agent, agent i's seeded ``seed * 1_000_003 + 7919 * i + 17``."""
        return [SamplingStream(seed * 1_000_003 + 7919 * i + 17) for i in range(self.team.num_agents)]

    def rank_rollout_seed(self) -> int | None:
        """At the first ``setup`` on rank r > 0: ``rank_seed(args.seed, r)``, the seed of that rank's rollout
        streams and shuffling (docs/scaling.md); None on rank 0 and at every later call."""
        first = not getattr(self, "_rank_seeded", False)
        self._rank_seeded = True
        rank = world(self._trainer)[0] if self._trainer is not None else 0
        return rank_seed(self.args.seed, rank) if first and rank > 0 else None

    @staticmethod
    def random_state(streams: Sequence[SamplingStream], rng: random.Random) -> dict[str, Any]:
        """The state of rollout ``streams`` and a shuffling ``rng`` (for :meth:`rank_state`)."""
        return {"streams": [s.state_dict() for s in streams], "shuffle_rng": list(rng.getstate())}

    @staticmethod
    def load_random_state(state: dict[str, Any], streams: Sequence[SamplingStream], rng: random.Random) -> None:
        """Restore what :meth:`random_state` saved (keys absent from ``state`` are left as they are)."""
        for s, stream_state in zip(streams, state.get("streams", [])):
            s.load_state_dict(stream_state)
        if "shuffle_rng" in state:
            version, internal, gauss = state["shuffle_rng"]
            rng.setstate((version, tuple(internal), gauss))

    def team_identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed by this module: its class, team size and layout."""
        return {"module": type(self).__name__, "num_agents": self.team.num_agents, "lora": self.team.uses_lora}

    def check_team_identity(self, checkpoint: dict) -> None:
        """Refuse a checkpoint of another trainer family, team size or layout (full models against LoRA), naming
        what differs, before Lightning loads its weights (whose own error lists parameter names)."""
        saved = checkpoint.get("comlrl_identity")
        if not isinstance(saved, dict):
            return  # written by other code, or before identities were saved
        mine = self.team_identity()
        diffs = [f"{key}: checkpoint {saved[key]!r}, this run {mine[key]!r}" for key in mine
                 if key in saved and saved[key] != mine[key]]
        if diffs:
            path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
            raise ValueError(f"Checkpoint {path or '(given)'} belongs to another run ({'; '.join(diffs)}). Resume it "
                             "with the trainer, agent count and LoRA setting it was written with, or start a new "
                             "run.")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["comlrl_identity"] = self.team_identity()
        checkpoint["comlrl_progress"] = self.progress_state()
        checkpoint["comlrl_logging_gates"] = self.logging_gates()
        trainer = self._trainer
        own = self.rank_state()
        if own:  # every rank dumps the checkpoint (Lightning), so the gather is met by all; rank 0 writes it
            checkpoint["comlrl_rank_states"] = gather_objects(own, world(trainer)[1] if trainer is not None else 1)
        seal_checkpoint(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self.check_team_identity(checkpoint)
        verify_checkpoint(self, checkpoint)
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        warn_unresumable_position(checkpoint, path)
        refuse_round_end_position(checkpoint, self._trainer, path)
        self.load_progress_state(checkpoint.get("comlrl_progress", {}))
        self.load_logging_gates(checkpoint.get("comlrl_logging_gates", {}))
        if self.team.engine is not None:  # the restored weights replace the ones the engine holds
            self.team.engine.sync(None)
        rank, world_size = world(self._trainer) if self._trainer is not None else (0, 1)
        states = checkpoint.get("comlrl_rank_states")
        if states is None and world_size == 1:  # a checkpoint of a single process from before per-rank states
            return
        if states is not None or self.rank_state():
            own = per_rank_entry(states if states is not None else [None], rank, world_size, type(self).__name__)
            if own:
                self.load_rank_state(own)

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
    dtype (CPU and CUDA floating point since torch 2.4), else torch's own choice (foreach or single-tensor).

    The fused kernel computes the same update up to float rounding (tests/modules/test_lean_update.py) and takes
    2-3x less time per step on CPU (docs/architecture.md, "The update"). A user's ``optimizer`` factory replaces it.
    """
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype in (torch.float32, torch.float16, torch.bfloat16,
                                                                   torch.float64) for p in params)
    return torch.optim.AdamW(params, lr=lr, fused=True) if fused else torch.optim.AdamW(params, lr=lr)
