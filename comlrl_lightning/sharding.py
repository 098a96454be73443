"""FSDP2 for the team modules: which submodules to shard, the data-parallel mesh, generation with sharded weights
(docs/scaling.md, "FSDP2").

Under Lightning's ``ModelParallelStrategy`` the modules' ``configure_model`` calls :func:`shard_team`: every trained
member (each agent's model, IAC/MAAC's critics and value heads) is sharded with torch's ``fully_shard`` on the
``data_parallel`` dimension of the strategy's device mesh, layer by layer: each transformer block (the classes a
Hugging Face model lists in ``_no_split_modules``) is one FSDP unit, then the member itself (embeddings, final norm,
head). Each member is its own FSDP root, so a backward through agent i reduce-scatters agent i's gradients only, at
its own step: one optimizer per agent, the update order, clipping (``clip_grad_norm_`` reduces the norm of the
``DTensor`` shards over the mesh) and accumulation stay as they are.

Generation: a sharded layer gathers its weights at each forward and frees them after, so a ``generate`` call would
run one collective per layer per new token, and two ranks whose completions stop at different lengths would wait
for each other forever. :func:`gathered` unshards a whole member once, keeps it whole through the call, and reshards
it after: :func:`shard_team` puts it around each sharded model's ``generate`` (one all-gather per layer per call;
ranks must still call ``generate`` of an agent the same number of times, which the per-rank batches of equal size
give).

MARLHF's learned reward model is fitted whole on each rank, then sharded for scoring (:func:`shard_reward_model`).

Checks (:func:`mesh_problem`): the strategy's mesh must be data-parallel only, and its sizes must multiply to the
world size; ``"auto"`` sizes become ``(world size, 1)``.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


def fsdp_available() -> bool:
    """True when this torch has FSDP2 (``torch.distributed.fsdp.fully_shard``, torch >= 2.6)."""
    try:
        from torch.distributed.fsdp import FSDPModule, fully_shard  # noqa: F401
    except ImportError:
        return False
    return True


def is_sharded(module: nn.Module) -> bool:
    """True when ``module`` (or one of its submodules) was sharded by ``fully_shard``."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in module.modules())


def block_classes(module: nn.Module) -> set[str]:
    """Class names of the transformer blocks of ``module``: every ``_no_split_modules`` entry of the Hugging Face
    models inside it (e.g. ``{"Qwen2DecoderLayer"}``); empty for a module without one."""
    names: set[str] = set()
    for m in module.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return names


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The submodules of ``module`` that become FSDP units of their own, outermost first and in module order: each
    transformer block (:func:`block_classes`), not nested in another; then ``module`` itself is the last unit."""
    blocks = block_classes(module)
    units: list[nn.Module] = []
    inside: set[int] = set()
    for m in module.modules():
        if m is module or id(m) in inside:
            continue
        if type(m).__name__ in blocks:
            units.append(m)
            inside.update(id(s) for s in m.modules())
    return units


def mesh_problem(data_parallel_size: Any, tensor_parallel_size: Any, world_size: int) -> str | None:
    """Why a ``ModelParallelStrategy`` with these sizes cannot run a team module on ``world_size`` processes, else
    None. ``"auto"`` is read as :func:`resolve_mesh` reads it."""
    dp, tp = resolve_mesh(data_parallel_size, tensor_parallel_size, world_size)
    if tp != 1:
        return (f"ModelParallelStrategy(tensor_parallel_size={tensor_parallel_size!r}) asks for tensor parallelism, "
                "which the team modules do not build: they shard each agent over the data-parallel ranks only "
                f"(FSDP2). Use ModelParallelStrategy(data_parallel_size={world_size}, tensor_parallel_size=1) or "
                "leave both sizes at \"auto\". See docs/scaling.md, \"FSDP2\".")
    if dp * tp != world_size:
        return (f"ModelParallelStrategy(data_parallel_size={data_parallel_size!r}, tensor_parallel_size="
                f"{tensor_parallel_size!r}) makes a mesh of {dp} x {tp} = {dp * tp} process(es), but the trainer runs "
                f"{world_size} (devices x num_nodes): the mesh must cover every process. Use "
                f"data_parallel_size={world_size}, tensor_parallel_size=1 (or \"auto\" for both).")
    return None


def resolve_mesh(data_parallel_size: Any, tensor_parallel_size: Any, world_size: int) -> tuple[int, int]:
    """``(data_parallel_size, tensor_parallel_size)`` with ``"auto"`` resolved for the team modules: no tensor
    parallelism (``tp = 1``), and the data-parallel size fills the world (``world_size // tp``). (Lightning's own
    ``"auto"`` would make every GPU of a node a tensor-parallel rank.) A size that is not a whole number >= 1 is a
    ``ValueError``."""
    def whole(name: str, value: Any) -> int | None:
        if value == "auto":
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ModelParallelStrategy({name}={value!r}): expected \"auto\" or a whole number >= 1.")
        return value

    dp, tp = whole("data_parallel_size", data_parallel_size), whole("tensor_parallel_size", tensor_parallel_size)
    tp = 1 if tp is None else tp
    return (max(1, world_size // tp) if dp is None else dp), tp


@contextlib.contextmanager
def gathered(module: nn.Module) -> Iterator[nn.Module]:
    """Every FSDP unit of ``module`` unsharded (its whole weights on this rank) for the duration, then resharded.

    A collective (one all-gather per unit): every rank enters it for the same module at the same point. Inside,
    forwards run no collective, so ranks may run different numbers of them (``generate`` stopping at different
    lengths). The units' ``reshard_after_forward`` settings are restored on exit."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    settings = []
    for m in units:
        groups = m._get_fsdp_state()._fsdp_param_groups  # noqa: SLF001 - FSDP2 has no public getter of the flag
        settings.append(bool(groups[0]._reshard_after_forward) if groups else True)  # noqa: SLF001
    try:
        for m in units:
            m.set_reshard_after_forward(False, recurse=False)
            m.unshard()
        yield module
    finally:
        for m, setting in zip(units, settings):
            m.reshard()
            m.set_reshard_after_forward(setting, recurse=False)


def _gathered_generate(module: nn.Module, key: int, generate: Any, *args: Any, **kwargs: Any) -> Any:
    # gathered whole, the forwards need no collective: transformers' per-token sync of FSDP models is off, so a
    # rank whose completions stop early neither waits for the others nor draws extra random numbers (as DDP)
    kwargs.setdefault("synced_gpus", False)
    return _gathered_call(module, key, generate, *args, **kwargs)


def _gathered_call(module: nn.Module, key: int, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` with ``module`` gathered whole for the call, announced as balanced collective
    ``key`` first."""
    from comlrl_lightning.distributed import announce_balanced

    announce_balanced(key)  # a rank that has finished its share of a round joins this call (gather_round)
    with gathered(module):
        return fn(*args, **kwargs)


def _join_generate(ref: Any) -> None:
    """Take part in another rank's gathered call (``generate``, a reward model's ``score``) of the member ``ref()``
    without running it: gather it, free it."""
    module = ref()
    if module is None:
        raise RuntimeError("Another rank calls a sharded model (an agent's generate or a reward model's score) that "
                           "this rank no longer holds.")
    with gathered(module):
        pass


def shard_member(member: nn.Module, mesh: Any, generates: bool = True) -> nn.Module:
    """``fully_shard`` each unit of :func:`shard_units`, then ``member`` itself, on ``mesh``; a member with a
    ``generate`` method gets it wrapped in :func:`gathered` (unless ``generates`` is False: a frozen reference only
    runs forwards, each rank as many as the others). Idempotent (a sharded member is returned as is)."""
    from torch.distributed.fsdp import fully_shard

    from comlrl_lightning.distributed import register_balanced

    if is_sharded(member):
        return member
    # a peft model's forward and generate both enter its inner transformers model, which must be the FSDP root
    root = member.get_base_model() if callable(getattr(member, "get_base_model", None)) else member
    for unit in shard_units(root):
        fully_shard(unit, mesh=mesh)
    fully_shard(root, mesh=mesh)
    if not generates:  # FSDP keeps a root whole after forward for the backward that follows; a reference has none
        root.set_reshard_after_forward(True, recurse=False)
    if generates and callable(getattr(member, "generate", None)):
        # an instance attribute: generation code calls ``model.generate`` unchanged; a balanced collective, so a
        # rank of a collection round with fewer items joins the others' calls (distributed.gather_round)
        key = register_balanced(functools.partial(_join_generate, weakref.ref(member)))
        object.__setattr__(member, "generate", functools.partial(_gathered_generate, member, key, member.generate))
    if callable(getattr(member, "save_pretrained", None)):
        object.__setattr__(member, "save_pretrained",
                           functools.partial(_guarded_save_pretrained, member.save_pretrained))
    return member


def _guarded_save_pretrained(save_pretrained: Any, *args: Any, **kwargs: Any) -> Any:
    """A sharded model saves the whole state dict it is given (:func:`save_team`); without one, each rank holds
    shards only, and gathering them needs every rank: refused rather than hang or write a partial model."""
    if kwargs.get("state_dict") is None:
        raise ValueError("This agent is sharded (ModelParallelStrategy, FSDP2): its weights are split across the "
                         "ranks, so it cannot be saved from one rank. Call comlrl_lightning.sharding.save_team(module, "
                         "output_dir) on every rank (it gathers each agent and rank 0 writes ordinary "
                         "from_pretrained folders); see docs/scaling.md, \"FSDP2\".")
    return save_pretrained(*args, **kwargs)


def shard_team(module: Any) -> int:
    """Shard the trained members of team module ``module`` (``module.trainable_modules()``: every distinct agent
    model, then critics and value heads), then its frozen references (:func:`frozen_members`), on the
    ``data_parallel`` mesh of Lightning's ``ModelParallelStrategy``; nothing under another strategy. Returns the
    number of members sharded (0 when nothing was done).

    LoRA agents: the shared base is one member, sharded once with every adapter in it (each adapter keeps its own
    optimizer). A reference has no optimizer; its forwards (the KL at rollout time) gather each block as the agents'
    training forwards do, and every rank runs as many of them as the others (per-rank batches of equal size).
    The vLLM engine (``generation_backend="vllm"``) is told the agents are sharded
    (``VLLMEngine.use_sharded_weights``): it gathers their whole weights, or LoRA adapters, at each push.
    Refused (``ValueError``): ``parallel_training="mp"``, a ``generation_backend`` whose engine cannot gather sharded
    weights, ``reference_devices`` with a reference to shard and ``reward_model_device`` (the mesh places them)."""
    trainer = getattr(module, "_trainer", None)
    if _model_parallel(trainer) is None:
        return 0
    a = module.args
    if getattr(a, "parallel_training", "none") == "mp":
        raise ValueError("parallel_training='mp' places agents on devices inside one process; with "
                         "ModelParallelStrategy (FSDP2) every process holds a shard of every agent. Use "
                         "parallel_training='none'.")
    backend = getattr(a, "generation_backend", "hf")
    engine = getattr(getattr(module, "team", None), "engine", None)
    if backend != "hf" and not callable(getattr(engine, "use_sharded_weights", None)):
        raise ValueError(f"generation_backend={backend!r} with ModelParallelStrategy (FSDP2) is not supported: its "
                         f"engine ({type(engine).__name__}) cannot gather the sharded agents' weights at its syncs. "
                         "Use generation_backend='hf' or 'vllm'.")
    frozen = frozen_members(module)
    devices = getattr(a, "reference_devices", None)
    if frozen and devices not in (None, "auto"):
        raise ValueError(f"reference_devices={devices!r} with ModelParallelStrategy (FSDP2): the frozen references "
                         "are sharded over the ranks like the agents, so the mesh places them. Leave "
                         "reference_devices unset (or \"auto\"); see docs/scaling.md, \"FSDP2\".")
    device = getattr(a, "reward_model_device", None)
    if device is not None:
        raise ValueError(f"reward_model_device={device!r} with ModelParallelStrategy (FSDP2): the learned reward "
                         "model is sharded over the ranks like the agents, so the mesh places it. Leave "
                         "reward_model_device unset; see docs/scaling.md, \"FSDP2\".")
    dp_mesh = data_parallel_mesh(trainer)
    members = list({id(m): m for m in module.trainable_modules()}.values())
    for member in members:
        if any(p.requires_grad for p in member.parameters()):
            shard_member(member, dp_mesh)
    for member in frozen:
        shard_member(member, dp_mesh, generates=False)
    if backend != "hf":  # the vLLM engine gathers each agent's weights (or adapter) whole at its pushes
        engine.use_sharded_weights()
    return len(members) + len(frozen)


def _model_parallel(trainer: Any) -> Any | None:
    """``trainer``'s strategy when it is Lightning's ``ModelParallelStrategy`` (or a subclass), else None."""
    strategy = getattr(trainer, "strategy", None) if trainer is not None else None
    if strategy is None or "ModelParallelStrategy" not in {c.__name__ for c in type(strategy).__mro__}:
        return None
    return strategy


def data_parallel_mesh(trainer: Any) -> Any | None:
    """The ``data_parallel`` mesh of ``trainer``'s ``ModelParallelStrategy`` (its whole mesh when it names no such
    dimension); None without a trainer or under any other strategy."""
    strategy = _model_parallel(trainer)
    if strategy is None:
        return None
    mesh = strategy.device_mesh
    return mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh


def shard_reward_model(model: Any, trainer: Any) -> bool:
    """Under ``trainer``'s ``ModelParallelStrategy``: shard the backbone of a fitted
    :class:`~comlrl_lightning.modules.reward_model.JointRewardModel` (MARLHF's learned reward) as a frozen member on
    the data-parallel mesh (:func:`shard_member`, ``generates=False``; its scalar heads, a few hundred numbers, stay
    whole), and make ``model.score`` a balanced collective: each call gathers the backbone whole once (one
    all-gather per block) and runs its forwards with no collective. Ranks call ``score`` as often as each other in
    the RL stage (per-rank batches of equal size); in a collection round, where a rank may score fewer joint
    responses, a rank that is done joins the others' calls (:func:`~comlrl_lightning.distributed.gather_round`).
    Returns True when sharded; nothing under another strategy (False). Every rank calls it for the same model."""
    from comlrl_lightning.distributed import register_balanced

    mesh = data_parallel_mesh(trainer)
    if mesh is None or is_sharded(model.backbone):
        return False
    backbone = model.backbone
    shard_member(backbone, mesh, generates=False)
    key = register_balanced(functools.partial(_join_generate, weakref.ref(backbone)))
    object.__setattr__(model, "score", functools.partial(_gathered_call, backbone, key, model.score))
    return True


def frozen_members(module: Any) -> list[nn.Module]:
    """The distinct frozen reference models of team module ``module`` that hold weights of their own: the copies of
    ``module.reference`` (:class:`~comlrl_lightning.reference.ReferencePolicies`, MAGRPO family and IAC/MAAC with
    the reference KL on). LoRA agents have none (their reference is the shared base with the adapter disabled,
    sharded with the agents); MADPO is reference-free."""
    reference = getattr(module, "reference", None)
    models = getattr(reference, "models", None) or []
    return list({id(m): m for m in models if m is not None}.values())


def local_numel(params: Any) -> int:
    """Elements this rank holds of ``params`` (a ``DTensor``'s local shard, a plain tensor whole)."""
    total = 0
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel()
    return total


def full_state_dict(member: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict of a (possibly sharded) member, on CPU. Sharded: a collective (every rank calls it), and
    only rank 0 receives the tensors (the other ranks get an empty dict: rank 0 writes exported agents)."""
    if not is_sharded(member):
        return member.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(member, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def gathered_state_dict(member: nn.Module, keep: Any = None) -> dict[str, torch.Tensor]:
    """The whole state dict of a (possibly sharded) member on *every* rank, on CPU, for the entries whose name
    ``keep(name)`` accepts (all when None). Sharded entries are gathered one at a time (one all-gather each, in
    state-dict order; a tied weight listed twice is gathered once), so the peak beyond the shards is one whole
    tensor on the device. A collective for a sharded member: every rank calls it with the same ``keep``. (The vLLM
    engine's weight push under FSDP2; :func:`full_state_dict` gives rank 0 only.)"""
    out: dict[str, torch.Tensor] = {}
    done: dict[tuple, torch.Tensor] = {}
    for name, value in member.state_dict().items():
        if keep is not None and not keep(name):
            continue
        local = value.to_local() if hasattr(value, "to_local") else value
        key = (local.data_ptr(), tuple(value.shape), local.dtype)
        if key not in done:
            whole = value.full_tensor() if hasattr(value, "full_tensor") else value
            done[key] = whole.detach().to("cpu").contiguous()
        out[name] = done[key]
    return out


def team_is_sharded(module: Any) -> bool:
    """True when team module ``module`` has an agent sharded by :func:`shard_team`."""
    team = getattr(module, "team", None)
    return team is not None and any(is_sharded(m) for m in team.unique_models())


def plain_class_name(model: nn.Module) -> str:
    """The class ``fully_shard`` derived ``type(model)`` from (``FSDPQwen2ForCausalLM`` -> ``Qwen2ForCausalLM``)."""
    from torch.distributed.fsdp import FSDPModule

    for cls in type(model).__mro__:
        if cls is not FSDPModule and not issubclass(cls, FSDPModule):
            return cls.__name__
    return type(model).__name__


def save_team(module: Any, output_dir: str, critics: bool = True) -> list[str]:
    """Write ``output_dir/agent_{i}/`` per agent as ordinary ``from_pretrained`` folders (model + tokenizer, or the
    LoRA adapter + tokenizer, as ``AgentTeam.save``), from sharded agents; IAC/MAAC's value heads and critics go
    where ``save_agents`` puts them under DDP (``agent_{i}/value_head.pt``, ``agent_{i}/critic/``, MAAC's
    ``critic/``). Every rank must call it: each member's whole state dict is gathered (a collective), rank 0
    writes, then every rank waits at a barrier. Returns the agents' folders on every rank. Without sharded agents it
    is ``module.save_agents(output_dir)`` on rank 0. ``critics=False``: the agents only (the history comparator's
    snapshots, ``AgentTeam.save``'s layout)."""
    import json
    import os
    from pathlib import Path

    import torch.distributed as dist

    team = module.team
    group = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if group else 0
    if not any(is_sharded(m) for m in team.unique_models()):
        paths = (module.save_agents(output_dir) if critics else module.team.save(output_dir)) if rank == 0 else []
    else:
        states = [full_state_dict(m) for m in team.unique_models()]  # the collectives, on every rank
        extras = _gather_extras(module) if critics else {"value_heads": [], "critics": []}
        paths = []
        if rank == 0:
            by_id = {id(m): s for m, s in zip(team.unique_models(), states)}
            out = Path(output_dir)
            out.mkdir(parents=True, exist_ok=True)
            for i, (model, tok, adapter) in enumerate(zip(team.models, team.tokenizers, team.adapters)):
                target = out / f"agent_{i}"
                if adapter is not None:  # peft picks the adapter's weights out of the whole state dict
                    model.save_pretrained(str(target), selected_adapters=[adapter], state_dict=by_id[id(model)])
                    sub = target / adapter  # a non-default adapter goes to a subfolder: flatten it (AgentTeam.save)
                    if sub.is_dir():
                        for f in sub.iterdir():
                            os.replace(f, target / f.name)
                        sub.rmdir()
                else:
                    model.save_pretrained(str(target), state_dict=_plain_names(model, by_id[id(model)]))
                config = target / "config.json"
                if config.is_file():  # save_pretrained names the sharded class (FSDPQwen2ForCausalLM)
                    data = json.loads(config.read_text())
                    data["architectures"] = [plain_class_name(model)]
                    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
                tok.save_pretrained(str(target))
                paths.append(str(target))
            if critics:
                _write_extras(module, out, extras)
    if group:
        dist.barrier()
        paths = [os.path.join(output_dir, f"agent_{i}") for i in range(team.num_agents)]
    return paths


def _gather_extras(module: Any) -> dict[str, list[dict[str, torch.Tensor]]]:
    """The whole state dicts of IAC's value heads and IAC/MAAC's critics (a collective per sharded one; rank 0
    receives them), in the order ``ActorCriticModule.save_agents`` writes them."""
    return {"value_heads": [full_state_dict(h) for h in getattr(module, "value_heads", None) or []],
            "critics": [full_state_dict(c) for c in getattr(module, "critics", None) or []]}


def _write_extras(module: Any, out: Any, extras: dict[str, list[dict[str, torch.Tensor]]]) -> None:
    """Rank 0: the layout of ``ActorCriticModule.save_agents`` from gathered state dicts: ``agent_{i}/value_head.pt``
    (IAC's value heads), ``agent_{k}/critic/`` (IAC's separate critics) or ``critic/`` (MAAC): the critic's model as a
    ``from_pretrained`` folder and its ``value_head.pt``."""
    def part(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    for i, state in enumerate(extras["value_heads"]):
        torch.save(state, out / f"agent_{i}" / "value_head.pt")
    for k, (critic, state) in enumerate(zip(getattr(module, "critics", None) or [], extras["critics"])):
        target = out / "critic" if getattr(module, "is_maac", False) else out / f"agent_{k}" / "critic"
        target.mkdir(parents=True, exist_ok=True)
        critic.model.save_pretrained(str(target), state_dict=_plain_names(critic.model, part(state, "model.")))
        torch.save(part(state, "value_head."), target / "value_head.pt")


def _plain_names(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the names a plain ``save_pretrained`` writes: a tied weight (``lm_head`` tied to the
    embeddings), which the gathered state dict repeats, appears once, as under DDP."""
    names = {n for n, _ in model.named_parameters()} | {n for n, _ in model.named_buffers()}
    return {k: v for k, v in state.items() if k in names}
