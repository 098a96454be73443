"""What a team module checks before Lightning starts its processes talking: the strategy and the launch
(docs/scaling.md, "Strategies" and "Launching").

* :func:`check_strategy`: the strategies the team modules cannot run are refused with the route that works.
  DeepSpeed (Lightning's ``DeepSpeedStrategy`` takes one optimizer; the modules keep one per agent) and FSDP1
  (``strategy="fsdp"``: manual optimization under ``FSDPStrategy`` is an open Lightning bug, Lightning-AI/
  pytorch-lightning#19685). ``ModelParallelStrategy`` (FSDP2) runs the team modules, which shard their agents in
  ``configure_model`` (:mod:`comlrl_lightning.sharding`): a module without ``configure_model`` is refused, and so are a
  mesh that does not cover the world size, tensor parallelism and ``agent_overlap="on"``; ``"auto"`` mesh sizes are
  resolved to a data-parallel mesh over every process.
* :func:`check_launch`: the process counts SLURM (``SLURM_NTASKS``, ``SLURM_NTASKS_PER_NODE``, ``SLURM_NNODES``)
  or torchrun (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) started, against the trainer's ``devices`` and ``num_nodes``.
  A mismatch makes some ranks wait for processes that never come (Lightning-AI/pytorch-lightning#20391, #19883);
  here it is an error naming both values and the fix, raised by every process the same way, before the first
  collective.

:func:`preflight` runs both; :meth:`~comlrl_lightning.modules.base.TeamModuleBase.configure_callbacks` calls it,
the first module hook Lightning runs in ``fit`` / ``validate`` / ``test`` (before it initializes the process
group).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

#: What every refusal points to (docs/scaling.md, "Strategies").
ROUTES = (
    "What works: strategy=\"ddp\" (every rank holds every agent; each agent's gradients are averaged at its own "
    "step); LoRA agents on one shared frozen base (lora=..., one adapter and one optimizer per agent), which fits "
    "several agents on one GPU; or, for full agents that do not fit on one device, FSDP2: "
    "strategy=ModelParallelStrategy() (lightning.pytorch.strategies), which shards every agent over the ranks. "
    "See docs/scaling.md, \"Strategies\".")


def _class_names(obj: Any) -> set[str]:
    return {c.__name__ for c in type(obj).__mro__}


def strategy_refusal(strategy: Any, module: Any = None, world_size: int | None = None) -> str | None:
    """Why ``strategy`` (a Lightning strategy object) cannot run a team module, else None. Classes are matched by
    name along the MRO, so the check needs neither DeepSpeed nor a GPU, and subclasses are caught too. With
    ``world_size`` (devices x num_nodes), a ``ModelParallelStrategy``'s mesh is checked against it
    (:func:`~comlrl_lightning.sharding.mesh_problem`)."""
    names = _class_names(strategy)
    if "DeepSpeedStrategy" in names:
        return (f"strategy={type(strategy).__name__} (DeepSpeed) is not supported: the team modules drive one "
                "optimizer per agent by hand (manual optimization), and Lightning's DeepSpeedStrategy accepts a "
                f"single optimizer (\"DeepSpeed currently only supports single optimizer\"). {ROUTES}")
    if "FSDPStrategy" in names:
        return (f"strategy={type(strategy).__name__} (strategy=\"fsdp\", FSDP1) is not supported: FSDP1 with "
                "manual optimization, which the team modules use (one optimizer per agent), is an open Lightning "
                f"bug (Lightning-AI/pytorch-lightning#19685). {ROUTES}")
    if "ModelParallelStrategy" not in names:
        return None
    if module is not None and not _overrides_configure_model(module):
        return (f"strategy={type(strategy).__name__} (FSDP2) needs the module to shard its models in "
                f"configure_model(), which {type(module).__name__} does not implement. {ROUTES}")
    from comlrl_lightning.sharding import fsdp_available, mesh_problem

    if not fsdp_available():
        import torch

        return (f"strategy={type(strategy).__name__} (FSDP2) needs torch.distributed.fsdp.fully_shard "
                f"(torch >= 2.6); this torch is {torch.__version__}. Upgrade torch, or use strategy=\"ddp\".")
    overlap = getattr(getattr(module, "args", None), "agent_overlap", "auto")
    if str(overlap).lower() in ("on", "true"):
        return (f"agent_overlap={overlap!r} with strategy={type(strategy).__name__} (FSDP2): every rank must gather "
                "the agents' shards in the same order, which agents generating or updating at the same time in "
                "threads do not give. Use agent_overlap='auto' or 'off'.")
    if world_size is not None:
        return mesh_problem(getattr(strategy, "_data_parallel_size", "auto"),
                            getattr(strategy, "_tensor_parallel_size", "auto"), int(world_size))
    return None


def resolve_model_parallel(strategy: Any, world_size: int) -> None:
    """Give a ``ModelParallelStrategy`` with ``"auto"`` sizes the team modules' mesh: data-parallel over every
    process, no tensor parallelism (:func:`~comlrl_lightning.sharding.resolve_mesh`). Lightning's own ``"auto"``
    would make the processes of a node tensor-parallel ranks, which would all read the same batches."""
    if "ModelParallelStrategy" not in _class_names(strategy):
        return
    from comlrl_lightning.sharding import resolve_mesh

    dp, tp = resolve_mesh(getattr(strategy, "_data_parallel_size", "auto"),
                          getattr(strategy, "_tensor_parallel_size", "auto"), world_size)
    strategy._data_parallel_size, strategy._tensor_parallel_size = dp, tp


def _overrides_configure_model(module: Any) -> bool:
    import lightning as L

    return type(module).configure_model is not L.LightningModule.configure_model


def check_strategy(strategy: Any, module: Any = None, world_size: int | None = None) -> None:
    """Raise ``ValueError`` with :func:`strategy_refusal`'s message when there is one."""
    reason = strategy_refusal(strategy, module, world_size)
    if reason is not None:
        raise ValueError(reason)


def _tasks_per_node(value: str) -> list[int]:
    """SLURM's ``SLURM_NTASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` syntax, e.g. ``"4"``, ``"2(x3)"`` or
    ``"2(x2),1"``: the task count of every node."""
    counts: list[int] = []
    for part in value.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if m is None:
            raise ValueError(f"SLURM_NTASKS_PER_NODE={value!r} is not SLURM's task-count syntax (e.g. '4' or '2(x3)').")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _int(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} in the environment is not a whole number.") from None


def launch_mismatches(devices: int, num_nodes: int, environ: Mapping[str, str] | None = None) -> list[str]:
    """Every disagreement between the trainer's ``devices`` (processes per node) and ``num_nodes`` and what the
    launcher in ``environ`` (default ``os.environ``) started; each message names both values and the fix.

    * SLURM (``SLURM_NTASKS`` set, and not an interactive ``salloc`` shell, job name ``bash`` or ``interactive``,
      where Lightning ignores SLURM too): ``SLURM_NTASKS_PER_NODE`` (every node's count) must equal ``devices``,
      ``SLURM_NNODES`` must equal ``num_nodes``, ``SLURM_NTASKS`` must equal ``devices * num_nodes``.
    * torchrun or any launcher that sets them: ``LOCAL_WORLD_SIZE`` must equal ``devices`` and ``WORLD_SIZE``
      ``devices * num_nodes``.
    """
    env = os.environ if environ is None else environ
    devices, num_nodes = int(devices), int(num_nodes)
    total = devices * num_nodes
    out = []
    slurm = "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")
    if slurm:
        per_node = env.get("SLURM_NTASKS_PER_NODE")
        if per_node:
            counts = sorted(set(_tasks_per_node(per_node)))
            if counts != [devices]:
                fix = (f"set devices={counts[0]} or launch with --ntasks-per-node={devices}" if len(counts) == 1 else
                       f"give every node the same number of tasks (--ntasks-per-node={devices})")
                out.append(f"SLURM starts {per_node} task(s) per node (SLURM_NTASKS_PER_NODE={per_node}) but the "
                           f"trainer has devices={devices} (processes per node): {fix}.")
        nnodes = _int(env, "SLURM_NNODES")
        if nnodes is not None and nnodes != num_nodes:
            out.append(f"SLURM allocated SLURM_NNODES={nnodes} node(s) but the trainer has num_nodes={num_nodes}: set "
                       f"num_nodes={nnodes} or launch with --nodes={num_nodes}.")
        ntasks = _int(env, "SLURM_NTASKS")
        if ntasks is not None and ntasks != total:
            out.append(f"SLURM starts SLURM_NTASKS={ntasks} process(es) in all but the trainer expects devices x "
                       f"num_nodes = {devices} x {num_nodes} = {total}: launch with --nodes={num_nodes} "
                       f"--ntasks-per-node={devices} (one task per device), or set devices and num_nodes to match.")
    local = _int(env, "LOCAL_WORLD_SIZE")
    if local is not None and local != devices:
        out.append(f"The launcher started LOCAL_WORLD_SIZE={local} process(es) on this node but the trainer has "
                   f"devices={devices}: set devices={local} or launch with torchrun --nproc-per-node={devices}.")
    world_size = _int(env, "WORLD_SIZE")
    if world_size is not None and world_size != total:
        out.append(f"The launcher started WORLD_SIZE={world_size} process(es) in all but the trainer expects devices "
                   f"x num_nodes = {devices} x {num_nodes} = {total}: set num_nodes to the number of nodes and "
                   "devices to the processes per node, or launch with torchrun "
                   f"--nnodes={num_nodes} --nproc-per-node={devices}.")
    return out


def check_launch(devices: int, num_nodes: int, environ: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` listing every :func:`launch_mismatches` entry (nothing when the counts agree)."""
    problems = launch_mismatches(devices, num_nodes, environ)
    if problems:
        raise ValueError("The launch does not match the trainer, so some processes would wait forever for ranks "
                         "that never start. " + " ".join(problems) + " See docs/scaling.md, \"Launching\".")


def uneven_rollout_refusal(module: Any, world_size: int) -> str | None:
    """Why ``module`` cannot train on ``world_size`` processes, or None.

    ``early_termination_threshold`` with ``num_turns > 1``: a rollout tree (MAGRPO family) or episode (IAC/MAAC)
    stops early where its own rewards pass the threshold, so ranks that train on different prompts end their trees
    at different depths and run different numbers of agent updates. Each update averages that agent's gradients
    over the ranks (one collective), so the ranks would fall out of step: a hang until the process-group timeout,
    or, for agents of the same shape, gradients of different agents averaged together."""
    args = getattr(module, "args", None)
    threshold = getattr(args, "early_termination_threshold", None)
    if world_size <= 1 or threshold is None or int(getattr(args, "num_turns", 1) or 1) <= 1:
        return None
    return (f"early_termination_threshold={threshold!r} with num_turns={args.num_turns} on {world_size} processes "
            "is not supported: each rank stops its own rollout trees early on its own rewards, so the ranks would "
            "run different numbers of agent updates and wait for each other forever. Set early_termination_threshold "
            "to null (None; trees then have every turn on every rank), or train on one process. See "
            "docs/scaling.md, \"Strategies\".")


def preflight(trainer: Any, module: Any = None) -> None:
    """:func:`check_strategy` of ``trainer.strategy``, then :func:`check_launch` of ``trainer.num_devices`` /
    ``trainer.num_nodes`` when the trainer expects several processes or torchrun started this one
    (``TORCHELASTIC_RUN_ID``). A single-process trainer is not checked otherwise: ``srun`` may start independent
    single-device runs on purpose, and Lightning's own launcher leaves ``WORLD_SIZE`` in its process's
    environment after a multi-process fit. A ``ModelParallelStrategy``'s mesh is checked against devices x num_nodes,
    then its ``"auto"`` sizes are resolved (:func:`resolve_model_parallel`). Training with multi-turn early
    termination on several processes is refused (:func:`uneven_rollout_refusal`); ``validate`` / ``test`` run it
    (an evaluation is a balanced round, docs/scaling.md, "FSDP2")."""
    devices, num_nodes = int(trainer.num_devices), int(trainer.num_nodes)
    check_strategy(trainer.strategy, module, devices * num_nodes)
    state = getattr(trainer, "state", None)
    if getattr(getattr(state, "fn", None), "value", "fit") == "fit":  # validate/test: evaluation is balanced
        reason = uneven_rollout_refusal(module, devices * num_nodes)
        if reason is not None:
            raise ValueError(reason)
    resolve_model_parallel(trainer.strategy, devices * num_nodes)
    if devices * num_nodes > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        check_launch(devices, num_nodes)
