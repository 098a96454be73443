"""Comparator sources for the iterative trainers (docs/preference.md §5.1–5.3, §5.6; docs/decisions.md, decisions 5 and
7).

A comparator source answers ``sample(prompts, num_candidates, items) -> list[Samples]`` (one per agent,
``prompts[a][k]`` = agent a's prompt for item k; only ``.texts`` is read by pairing): the ``Comparator`` protocol of
:mod:`comlrl_lightning.protocols`. Local sources also take part in the round lifecycle: ``setup(trainer, pl_module)``
once per fit (they take the learner's team, its sampling settings, their seed and, for ``history``, the run's
snapshot folder; they keep no module), ``prepare(round_index)`` before a round's collection, ``release()`` once the
round's pairs exist, and ``state_dict()`` / ``load_state_dict`` (plain types) for their sampling streams.

* ``current``: the live agents, sampled in the comparator's own seeded streams (one per agent), so its
  samples differ from the agents' and the agents' streams are never advanced by it.
* ``current_copy``: a frozen deep copy of the current weights on ``comparator_devices``, rebuilt per round,
  only when those devices differ from the agents' (or ``always_copy=True``); otherwise the live agents. A team
  on a non-HF engine (vLLM) is never copied: its engine serves the current weights, which no optimizer step
  changes during a collection phase.
* ``model``: ``comparator_model_name`` (every role) or ``comparator_agents`` (per role), loaded once; served by an
  engine of the learner's backend (:func:`served_like`), closed by :meth:`LocalComparator.close`.
* ``history``: the policy snapshot k rounds back (:func:`history_snapshot_dir`), loaded when it changes; LoRA
  snapshots of a team on the vLLM engine are served by that engine instead (:func:`served_snapshot`).
* ``api``: an HTTP endpoint (:class:`~comlrl_lightning.comparators.api.APIComparator`).

:func:`build_comparator` builds the source of a config: the class of its ``comparator_policy`` (:data:`SOURCES`,
one per name of :data:`~comlrl_lightning.config.iterative.POLICIES`), made by its ``from_config``, wrapped in a
:class:`~comlrl_lightning.comparators.centralized.CentralizedComparator` for centralized generation.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from comlrl_lightning.agents import AgentTeam, build_agents, load_tokenizer
from comlrl_lightning.comparators.api import APIComparator
from comlrl_lightning.comparators.centralized import CentralizedComparator
from comlrl_lightning.config.iterative import POLICIES, POLICY_CHOICES_MESSAGE
from comlrl_lightning.devices import device_of
from comlrl_lightning.devices import resolve_devices as _resolve_devices
from comlrl_lightning.distributed import rank_seed
from comlrl_lightning.engines import engine_of
from comlrl_lightning.engines.verify import EngineSyncError, check_comparator_samples, engine_weight_version
from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream
from comlrl_lightning.preferences import sample_team
from comlrl_lightning.rounds import output_dir

__all__ = [
    "APIComparator",
    "CurrentComparator",
    "CurrentCopyComparator",
    "HistoryComparator",
    "ModelComparator",
    "SOURCES",
    "build_comparator",
    "comparator_seed",
    "history_snapshot_dir",
]


def comparator_seed(seed: int) -> int:
    """docs/preference.md §5.2: the comparator stream seed is ``-seed`` (1 when ``seed`` is 0)."""
    return -int(seed) if seed else 1


def _stream_state(stream: SamplingStream) -> list[int]:
    return stream.generator.get_state().tolist()


def _set_stream_state(stream: SamplingStream, state: Sequence[int]) -> None:
    stream.generator.set_state(torch.tensor(list(state), dtype=torch.uint8))


def resolve_devices(spec: Any, num_agents: int, default: Sequence[torch.device]) -> list[torch.device]:
    """``comparator_devices``: None (= ``default``, the agents' devices), one device, or one per agent."""
    return _resolve_devices(spec, num_agents, "comparator_devices") or list(default)


def _freeze(team: AgentTeam, devices: Sequence[torch.device]) -> AgentTeam:
    moved: dict[int, torch.nn.Module] = {}
    for m, d in zip(team.models, devices):
        if id(m) not in moved:
            m.to(d)
            m.eval()
            m.requires_grad_(False)
            moved[id(m)] = m
    return team


def _engine_maker(live: AgentTeam) -> Any:
    """The live team's engine's ``engine_for`` (the vLLM engine: it makes engines for comparator teams), or None
    (the HF engine, which samples any team's own models)."""
    return getattr(engine_of(live), "engine_for", None)


def served_like(live: AgentTeam, team: AgentTeam) -> AgentTeam:
    """Give the comparator team ``team`` an engine of the live team's backend and settings, when that engine can
    make one (:func:`_engine_maker`; docs/engines.md "Comparators"); with the HF engine ``team`` keeps the default
    (HF ``generate`` on its own models)."""
    make = _engine_maker(live)
    if make is not None:
        team.engine = make(team)
    return team


def _close_own_engine(team: AgentTeam | None, live: AgentTeam | None) -> None:
    """Close ``team``'s engine unless it is the live team's (a comparator never closes the learner's engine)."""
    engine = getattr(team, "engine", None)
    if engine is not None and engine is not getattr(live, "engine", None):
        engine.close()


class LocalComparator:
    """Base of the local sources: per-agent comparator streams and the learner's sampling settings.

    Args:
        seed: base seed of the comparator streams (None: ``comparator_seed(args.seed)``); agent i's stream
            is seeded with ``rank_seed(base, rank) + 1_000_003 * i`` (``base`` itself on rank 0).

    :meth:`setup` takes what the source needs from the run: ``live``, the learner's team (what ``current`` samples
    and ``current_copy`` copies; the other policies take the agents' devices and engine from it), and ``settings``,
    the learner's sampling settings, which every policy samples with.
    """

    policy = "local"

    def __init__(self, seed: int | None = None):
        self.seed = seed
        self.streams: list[SamplingStream] | None = None
        self._pending_state: dict | None = None
        self.live: AgentTeam | None = None
        self.settings: SamplingSettings | None = None
        self.round_index = 0

    @classmethod
    def from_config(cls, cfg: Any, model_config: dict | None = None) -> LocalComparator:
        """The source of an iterative config's comparator options (:func:`build_comparator`)."""
        return cls()

    def setup(self, trainer: Any, pl_module: Any) -> None:
        """Once per fit: the learner's team and sampling settings; the streams (first fit only) from the seed and the
        rank. The module itself is not kept."""
        self.live, self.settings = pl_module.team, pl_module.sampling_settings()
        if self.streams is None:
            base = comparator_seed(pl_module.args.seed) if self.seed is None else int(self.seed)
            base = rank_seed(base, getattr(trainer, "global_rank", 0))  # each rank its own streams (docs/scaling.md)
            self.streams = [SamplingStream(base + 1_000_003 * i) for i in range(self.live.num_agents)]
        if self._pending_state is not None:
            self.load_state_dict(self._pending_state)

    def prepare(self, round_index: int) -> None:
        """Make the comparator ready for round ``round_index`` (default: nothing to do but remember the round)."""
        self.round_index = round_index

    def release(self) -> None:
        """Free what ``prepare`` built (default: nothing)."""

    def close(self) -> None:
        """End of the run (ComparatorRefresh calls it on teardown and on exceptions): free everything, including
        what is kept across rounds (default: nothing)."""

    def team(self) -> AgentTeam:
        return self.live

    def sample(self, prompts: Sequence[Sequence[str]], num_candidates: int,
               items: Sequence[dict] | None = None) -> list[Samples]:
        if self.streams is None:
            raise RuntimeError(f"{type(self).__name__}.setup(trainer, pl_module) must run before sampling.")
        out = sample_team(self.team(), prompts, num_candidates, self.settings, self.streams)
        for agent, samples in enumerate(out):
            self.verify(agent, samples)
        return out

    def sample_agent(self, agent_index: int, prompts: Sequence[str], num_candidates: int,
                     items: Sequence[dict] | None = None) -> Samples:
        """Samples of one comparator slot only (used by centralized comparator generation)."""
        if self.streams is None:
            raise RuntimeError(f"{type(self).__name__}.setup(trainer, pl_module) must run before sampling.")
        out = engine_of(self.team()).sample(agent_index, list(prompts), num_candidates, self.settings,
                                            self.streams[agent_index])
        self.verify(agent_index, out)
        return out

    def expected_weights(self, agent: int) -> dict[str, Any]:
        """What samples of slot ``agent`` must come from (:func:`check_comparator_samples`): the live agent's weight
        version (the live agents and copies of them; subclasses with other weights override it)."""
        return {"version": engine_weight_version(engine_of(self.live), agent)}

    def verify(self, agent: int, samples: Samples) -> None:
        """Stop the run when ``samples`` were not drawn from the weights this comparator stands for (docs/engines.md,
        "Verification")."""
        check_comparator_samples(self.policy, agent, samples, self.round_index, **self.expected_weights(agent))

    def state_dict(self) -> dict:
        return {"policy": self.policy, "streams": [_stream_state(s) for s in self.streams or []]}

    def load_state_dict(self, state: dict) -> None:
        if self.streams is None:  # restored before setup: apply once the streams exist
            self._pending_state = state
            return
        saved = state.get("streams", [])
        if len(saved) != len(self.streams):
            raise ValueError(f"comparator state has {len(saved)} streams; this run has {len(self.streams)} agents.")
        for s, st in zip(self.streams, saved):
            _set_stream_state(s, st)
        self._pending_state = None


class CurrentComparator(LocalComparator):
    """The live agents in the comparator's own streams (``comparator_policy='current'``)."""

    policy = "current"


class CurrentCopyComparator(LocalComparator):
    """A frozen copy of the current agents on ``devices`` for one collection phase (``current_copy``).

    The copy is made in :meth:`prepare` and dropped in :meth:`release`. When the comparator devices equal
    the agents' devices no copy is made and the live agents are used (like ``current``), unless
    ``always_copy`` is set.
    """

    policy = "current_copy"

    def __init__(self, devices: Any = None, always_copy: bool = False, seed: int | None = None):
        super().__init__(seed)
        self.devices = devices
        self.always_copy = always_copy
        self.copy: AgentTeam | None = None

    @classmethod
    def from_config(cls, cfg: Any, model_config: dict | None = None) -> CurrentCopyComparator:
        return cls(devices=cfg.comparator_devices)

    def prepare(self, round_index: int) -> None:
        self.round_index = round_index
        live = self.live
        agent_devices = [device_of(m) for m in live.models]
        devices = resolve_devices(self.devices, live.num_agents, agent_devices)
        self.release()
        if devices == agent_devices and not self.always_copy:
            return
        if _engine_maker(live) is not None:
            return  # a vLLM team: its engine serves the current weights, unchanged while the round is collected
        copies: dict[int, torch.nn.Module] = {}
        for m in live.models:
            if id(m) not in copies:
                copies[id(m)] = copy.deepcopy(m)
        team = AgentTeam([copies[id(m)] for m in live.models], live.tokenizers, list(live.adapters), list(live.names))
        # the copy's engine reports the live versions it copied, so a copy kept past an update is caught (verify)
        engine_of(team).applied = [engine_weight_version(engine_of(live), a) or 0 for a in range(live.num_agents)]
        self.copy = _freeze(team, devices)

    def release(self) -> None:
        self.copy = None

    def close(self) -> None:
        self.release()

    def team(self) -> AgentTeam:
        if self.copy is None and self.always_copy:  # called mid-round without a prepared copy
            self.prepare(-1)
        return self.copy if self.copy is not None else self.live


class ModelComparator(LocalComparator):
    """Fixed comparator models (``comparator_policy='model'``), loaded once and kept for the run.

    Args:
        sources: one id/path/model object per agent (``comparator_agents``), or one for every role
            (``comparator_model_name``).
        tokenizer: tokenizer(s) for model objects (default: the agents' tokenizers).
        model_config: ``from_pretrained`` kwargs.
        devices: ``comparator_devices`` (default: the agents' devices).
    """

    policy = "model"

    def __init__(self, sources: Any, tokenizer: Any = None, model_config: dict | None = None, devices: Any = None,
                 seed: int | None = None):
        super().__init__(seed)
        self.sources = sources
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.devices = devices
        self.loaded: AgentTeam | None = None

    @classmethod
    def from_config(cls, cfg: Any, model_config: dict | None = None) -> ModelComparator:
        if (cfg.comparator_agents is not None and len(cfg.comparator_agents) == 1
                and getattr(cfg, "comparator_generation_mode", "decentralized") == "centralized"):
            # one comparator model writes for every role: it fills every slot (the centralized slot included)
            return cls(list(cfg.comparator_agents) * cfg.num_agents, model_config=model_config,
                       devices=cfg.comparator_devices)
        sources = cfg.comparator_agents if cfg.comparator_agents is not None else cfg.comparator_model_name
        return cls(sources, model_config=model_config, devices=cfg.comparator_devices)

    def prepare(self, round_index: int) -> None:
        self.round_index = round_index
        if self.loaded is not None:
            return
        live = self.live
        n = live.num_agents
        sources = [self.sources] * n if isinstance(self.sources, (str, torch.nn.Module)) else list(self.sources)
        if len(sources) != n:
            raise ValueError(f"comparator_agents has {len(sources)} entries; the run has {n} agents.")
        tok = self.tokenizer
        if tok is None and not all(isinstance(s, str) for s in sources):
            tok = list(live.tokenizers)
        devices = resolve_devices(self.devices, n, [device_of(m) for m in live.models])
        unique = list(dict.fromkeys(sources)) if all(isinstance(s, str) for s in sources) else sources
        if tok is None and len(unique) < n and len(set(map(str, devices))) == 1:
            # a frozen comparator: one loaded copy per distinct source serves every slot that names it (e.g. the
            # centralized comparator from comparator_model_name loads one model, not num_agents copies)
            once = build_agents(agents=unique, num_agents=len(unique), model_config=self.model_config)
            by_source = {src: (once.models[i], once.tokenizers[i]) for i, src in enumerate(unique)}
            team = build_agents(agents=[by_source[s][0] for s in sources], num_agents=n,
                                tokenizer=[by_source[s][1] for s in sources])
            team.names = list(sources)
        else:
            team = build_agents(agents=sources, num_agents=n, tokenizer=tok, model_config=self.model_config)
        self.loaded = served_like(live, _freeze(team, devices))

    def close(self) -> None:
        _close_own_engine(self.loaded, self.live)
        self.loaded = None

    def team(self) -> AgentTeam:
        if self.loaded is None:
            self.prepare(-1)
        return self.loaded

    def expected_weights(self, agent: int) -> dict[str, Any]:
        """A fixed model: its engine never receives a weight update (version 0)."""
        return {"version": 0}


def history_snapshot_dir(root: str | Path, round_index: int, k: int, num_agents: int) -> Path:
    """The snapshot that round ``round_index`` compares against (docs/decisions.md, decision 5, docs/preference.md §5.3
    with the fix).

    ``iteration_{s:04d}`` is the policy after round s, i.e. at the start of round s + 1. Round t uses the
    policy as it was k rounds ago, at the start of round t - k: snapshot ``s = t - k - 1``, or the newest
    complete earlier one; ``initial`` when t - k <= 0 or nothing complete exists. So k=1 is the policy
    at the start of the previous round (one round behind), never the current weights.
    """
    root = Path(root)
    for s in range(round_index - k - 1, -1, -1):
        d = root / f"iteration_{s:04d}"
        if all((d / f"agent_{i}").is_dir() for i in range(num_agents)):
            return d
    return root / "initial"


def load_snapshot(directory: Path, num_agents: int, model_config: dict | None = None) -> AgentTeam:
    """Load ``directory/agent_{i}`` (full model, or a LoRA adapter on its base) as an :class:`AgentTeam`."""
    missing = [str(directory / f"agent_{i}") for i in range(num_agents) if not (directory / f"agent_{i}").is_dir()]
    if missing:
        raise FileNotFoundError(f"Missing comparator history checkpoint agent directories: {missing}.")
    models, toks = [], []
    for i in range(num_agents):
        d = directory / f"agent_{i}"
        if (d / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM

            models.append(AutoPeftModelForCausalLM.from_pretrained(str(d)))
        else:
            from comlrl_lightning.agents import load_model

            models.append(load_model(str(d), model_config))
        toks.append(load_tokenizer(str(d)))
    return AgentTeam(models, toks, names=[str(directory / f"agent_{i}") for i in range(num_agents)])


def served_snapshot(team: AgentTeam, directory: Path) -> AgentTeam | None:
    """The snapshot ``directory/agent_{i}`` of a LoRA team, served by the team's own engine without loading it
    into torch, when that engine can (the vLLM engine: ``snapshot_engine``, docs/engines.md "Comparators");
    None otherwise. The returned team lends the live team's models and tokenizers only for prompt encoding
    (same base, same tokenizers); its engine samples the snapshot's adapters."""
    serve = getattr(engine_of(team), "snapshot_engine", None)
    dirs = [directory / f"agent_{i}" for i in range(team.num_agents)]
    if serve is None or not all((d / "adapter_config.json").is_file() for d in dirs):
        return None
    engine = serve(dirs)  # None when the engine does not serve LoRA agents
    if engine is None:
        return None
    return AgentTeam(list(team.models), list(team.tokenizers), list(team.adapters), [str(d) for d in dirs],
                     engine=engine)


class HistoryComparator(LocalComparator):
    """The policy k rounds back, from the snapshots HistoryCheckpoint writes (``comparator_policy='history'``).

    Args:
        root: the snapshot folder (``policy_checkpoint_dir``; default ``<default_root_dir>/policy_checkpoints``).
        k: look-back in rounds (``comparator_history_k``, default 1).
        devices: ``comparator_devices`` (default: the agents' devices).
    """

    policy = "history"

    def __init__(self, root: str | None = None, k: int | None = None, devices: Any = None,
                 model_config: dict | None = None, seed: int | None = None):
        super().__init__(seed)
        self.root = root
        self.k = k
        self.devices = devices
        self.model_config = model_config
        self.loaded: AgentTeam | None = None
        self.loaded_from: Path | None = None
        self.round_index = 0

    @classmethod
    def from_config(cls, cfg: Any, model_config: dict | None = None) -> HistoryComparator:
        return cls(cfg.policy_checkpoint_dir, cfg.comparator_history_k, devices=cfg.comparator_devices,
                   model_config=model_config)

    def setup(self, trainer: Any, pl_module: Any) -> None:
        """As every local source, plus the snapshot folder (``policy_checkpoint_dir``, else the run folder's
        ``policy_checkpoints``) and ``k`` (``comparator_history_k``, else 1), from the module's ``args``."""
        super().setup(trainer, pl_module)
        args = pl_module.args
        self.root = str(output_dir(trainer, self.root or getattr(args, "policy_checkpoint_dir", None),
                                   "policy_checkpoints"))
        if self.k is None:
            self.k = getattr(args, "comparator_history_k", None) or 1

    def prepare(self, round_index: int) -> None:
        self.round_index = round_index
        n = self.live.num_agents
        target = history_snapshot_dir(self.root, round_index, self.k, n)
        if self.loaded is not None and target == self.loaded_from:
            return
        self.release()
        served = served_snapshot(self.live, target)
        if served is not None:
            self.loaded, self.loaded_from = served, target
            return
        team = load_snapshot(target, n, self.model_config)
        devices = resolve_devices(self.devices, n, [device_of(m) for m in self.live.models])
        self.loaded, self.loaded_from = _freeze(team, devices), target

    def release(self) -> None:
        _close_own_engine(self.loaded, self.live)
        self.loaded = None
        self.loaded_from = None

    def close(self) -> None:
        self.release()

    def team(self) -> AgentTeam:
        if self.loaded is None:
            self.prepare(self.round_index)
        return self.loaded

    def expected_weights(self, agent: int) -> dict[str, Any]:
        """The snapshot folder picked for the round (:func:`history_snapshot_dir`); an engine serving saved
        adapters reports the folder it read (``Samples.source``), a snapshot loaded into torch is checked by the
        folder it was loaded from. Version 0: snapshots never receive weight updates."""
        picked = history_snapshot_dir(self.root, self.round_index, self.k, self.live.num_agents)
        if self.loaded_from is not None and Path(self.loaded_from) != picked:
            raise EngineSyncError(
                f"The 'history' comparator serves the snapshot {self.loaded_from} in round {self.round_index}, but "
                f"the round compares against {picked} (comparator_history_k={self.k}): the comparator was not "
                "prepared for this round (docs/engines.md, \"Verification\").")
        return {"version": 0, "source": str(picked / f"agent_{agent}")}


#: ``comparator_policy`` -> the source class (its ``policy``), one per name of
#: :data:`~comlrl_lightning.config.iterative.POLICIES` (tests/callbacks/test_iterative_comparators.py checks it).
SOURCES: dict[str, type] = {cls.policy: cls for cls in (CurrentComparator, CurrentCopyComparator, ModelComparator,
                                                         HistoryComparator, APIComparator)}


def build_comparator(cfg: Any, model_config: dict | None = None, adapter: Any = None) -> Any:
    """The comparator source for an iterative config (``comparator_policy``, ``comparator_generation_mode``
    and their options); ``adapter`` is the centralized prompt builder/parser (default: the tagged format)."""
    policy = cfg.comparator_policy
    if policy not in POLICIES:
        raise ValueError(f"{POLICY_CHOICES_MESSAGE} Got {policy!r}.")
    source = SOURCES[policy].from_config(cfg, model_config)
    if getattr(cfg, "comparator_generation_mode", "decentralized") == "centralized":
        return CentralizedComparator(source, adapter, cfg.comparator_centralized_agent_index)
    return source
