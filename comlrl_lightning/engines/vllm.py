"""The vLLM engine (docs/engines.md): rollouts from vLLM, training in torch.

Team layouts:

* **LoRA agents on one base** (``lora=...``): one ``vllm.LLM`` with ``enable_lora``, one adapter per agent. A
  :meth:`VLLMEngine.sample_many` call serves every agent's request in one ``generate`` with one adapter per
  prompt. Base-model requests are never put in such a call (vLLM was measured giving them the last adapter):
  this engine serves the agents and, in calls of their own, saved adapters of the same team
  (:meth:`VLLMEngine.snapshot_engine`: the history comparator's snapshots); a comparator team with weights of its
  own (``model``) gets an engine of its own (:meth:`VLLMEngine.engine_for`).
* **Full-model agents**: one ``vllm.LLM`` per distinct agent model.

Weight sync is lazy: :meth:`VLLMEngine.sync` marks agents stale, and the next generation first pushes their
weights. LoRA: the adapter is saved to a fresh folder and served under a fresh integer id (the old id is removed),
so a stale adapter is never served (vLLM caches adapters by id). Full weights: the state dict is written as
safetensors, loaded with ``collective_rpc("reload_weights")``, the prefix cache is reset, and the weight
post-processing is re-run so that a tied ``lm_head`` is not left stale by the CPU build's pre-packing.

Sharded agents (FSDP2, ``ModelParallelStrategy``; docs/scaling.md, "FSDP2"): each rank has its own engine, and
:meth:`VLLMEngine.use_sharded_weights` makes every push first gather the whole weights (full agents) or the adapter
(LoRA agents; the frozen base once, at start) from the shards, on every rank, with
:func:`~comlrl_lightning.sharding.gathered_state_dict`, then push them as above. A gather is a collective announced as
a balanced one (:func:`~comlrl_lightning.distributed.register_balanced`): a rank with no generation left in a
collection round joins the others' gathers and keeps the weights for its own next push.

Reproducibility: each request draws one seed from its :class:`~comlrl_lightning.generation.SamplingStream`;
every (prompt, candidate) row gets its own seed derived from it (a shared seed would give correlated samples).

The engine starts on the first generation (once per fit: the team module closes it at the end of the run, on an
exception and on Ctrl-C); scripts that use it need an ``if __name__ == "__main__":`` guard (vLLM spawns its
engine processes).

Watching the engine processes for a death, stopping them and the ``/dev/shm`` clean-up (everything that reads vLLM's
private attributes) live in :mod:`.vllm_process`.
"""

from __future__ import annotations

import functools
import gc
import os
import random
import shutil
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import comlrl_lightning.engines.vllm_process as vllm_process
from comlrl_lightning.engines.base import SampleRequest
from comlrl_lightning.engines.vllm_process import EngineError, engine_dead_error, is_engine_dead
from comlrl_lightning.generation import Samples, SamplingSettings, SamplingStream, cut_at_pad, encode_prompts

#: Head sizes the CPU attention backend of vLLM 0.32 supports (a model with another size crashes at its first
#: generate, so the engine refuses it at start).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

#: LoRA ranks vLLM accepts for ``max_lora_rank``.
_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)

#: ``SamplingSettings.extra`` keys (HF ``generate`` names) and their vLLM ``SamplingParams`` names.
_EXTRA_TO_VLLM = {"repetition_penalty": "repetition_penalty", "min_new_tokens": "min_tokens",
                  "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                  "min_p": "min_p"}

#: Defaults for CPU runs: a 256 MiB KV cache (vLLM's default reserves 4 GiB per engine), no torch.compile
#: (full-model engines otherwise compile with inductor at start, minutes on 2 cores; LoRA engines never compile), and
#: no chunked prefill: vLLM 0.32's CPU worker crashes ("CPU Generator does not use offset") when a seeded request's
#: prefill is split over steps, which happened at random with a few hundred sequences per call.
CPU_DEFAULTS = {"kv_cache_memory_bytes": 256 * 2**20, "enforce_eager": True, "enable_chunked_prefill": False}


#: Worker mix-in (every engine): reloads full weights (and a tied ``lm_head``) in vLLM's worker process and, on
#: CPU, runs LoRA adapters through the grouped ops of :mod:`.vllm_lora_ops`.
WORKER_EXTENSION = "comlrl_lightning.engines.vllm_worker.WeightSyncExtension"


def head_size_of(config: Any) -> int:
    """Attention head size of a transformers config: ``head_dim``, else ``hidden_size // num_attention_heads``."""
    head = getattr(config, "head_dim", None)
    return int(head) if head else int(config.hidden_size) // int(config.num_attention_heads)


def check_head_size(config: Any, where: str, supported: Sequence[int] = CPU_HEAD_SIZES) -> None:
    """``ValueError`` naming the head size and the supported ones when vLLM's CPU attention cannot serve it."""
    size = head_size_of(config)
    if size not in supported:
        raise ValueError(
            f"{where} has attention head size {size} (hidden_size {config.hidden_size} / "
            f"{config.num_attention_heads} heads), which vLLM's CPU attention does not support; supported head sizes: "
            f"{', '.join(map(str, supported))}. Use a model with a supported head size (e.g. hidden 128 with 4 heads) "
            "or generation_backend='hf'.")


def row_seeds(seed: int, count: int) -> list[int]:
    """``count`` per-row seeds derived from one stream draw: ``random.Random(seed).getrandbits(63)`` in order."""
    rng = random.Random(seed)
    return [rng.getrandbits(63) for _ in range(count)]


def _lora_rank(r: int) -> int:
    return next((v for v in _LORA_RANKS if v >= r), r)


def _is_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


class _Server:
    """One ``vllm.LLM`` and what it serves (the agents, their model folder, adapter versions)."""

    def __init__(self, agents: list[int], folder: str, label: str):
        self.agents = agents
        self.folder = folder
        self.label = label
        self.llm: Any = None
        self.loras: dict[int, Any] = {}  # agent -> current LoRARequest
        self.closing = False
        self.died = False
        self.workers: list[Any] = []  # psutil processes under the engine core (they outlive a killed core)

    def watch(self, poll: float = 0.2) -> None:
        """Start the thread that wakes every call blocked on this engine's death (:func:`.vllm_process.watch`)."""
        vllm_process.watch(self, poll)

    def dead(self) -> bool:
        """True once the engine core process exited unasked (seen by :meth:`watch` or by vLLM's own monitor)."""
        return vllm_process.is_dead(self)


class VLLMEngine:
    """Generation engine on vLLM for a team (LoRA agents on one base, or full-model agents).

    Args:
        team: the :class:`~comlrl_lightning.agents.AgentTeam` served.
        vllm_kwargs: extra ``vllm.LLM`` keyword arguments (``kv_cache_memory_bytes``, ``max_model_len``,
            ``gpu_memory_utilization``, ``dtype``, ``enforce_eager``, ...); ``dtype`` defaults to the agents' dtype
            and, on CPU, ``kv_cache_memory_bytes`` to 256 MiB (unless ``VLLM_CPU_KVCACHE_SPACE`` is set) and
            ``enforce_eager`` to True (:data:`CPU_DEFAULTS`).
        workdir: folder for model copies and adapter versions (default: a fresh temporary folder, removed on
            :meth:`close`).
    """

    name = "vllm"

    def __init__(self, team: Any, vllm_kwargs: dict | None = None, workdir: str | os.PathLike | None = None):
        self.team = team
        self.vllm_kwargs = dict(vllm_kwargs or {})
        self.workdir_root = workdir
        self.workdir: Path | None = None
        self.servers: list[_Server] = []
        self.server_of: dict[int, _Server] = {}
        self.stale: set[int] = set(range(team.num_agents))
        # weight versions (docs/engines.md, "Verification"): syncs asked for per agent, and how many of them the
        # served weights include (a sample reports the latter)
        self.requested = [0] * team.num_agents
        self.applied = [0] * team.num_agents
        self._next_lora_id = 1
        self._version = 0
        self._shm_before: set[str] = set()
        # FSDP2 (use_sharded_weights): the balanced-collective key of each part (full model, base, adapter), the
        # parts gathered while joining another rank's push, and (seconds, bytes) of every gather on this rank
        self._gather_keys: dict[tuple, int] | None = None
        self._gathered: dict[tuple, dict] = {}
        self.gathers: list[tuple[float, int]] = []
        n = team.num_agents
        self.lora = team.uses_lora
        if self.lora and (not all(a is not None for a in team.adapters) or len(team.unique_models()) != 1):
            raise ValueError("The vLLM engine serves LoRA agents only as adapters of one shared base (lora=...); "
                             f"got adapters {team.adapters} on {len(team.unique_models())} models.")
        if not self.lora and n < 1:
            raise ValueError("The vLLM engine needs at least one agent.")

    # --- life cycle -----------------------------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self.servers)

    def start(self) -> None:
        """Start the engine processes (done by the first generation)."""
        if self.started:
            return
        self.workdir = Path(tempfile.mkdtemp(prefix="comlrl-vllm-", dir=self.workdir_root))
        self._shm_before = vllm_process.shm_names()
        try:
            if self.lora:
                model = self.team.models[0]
                base = self._weights(("base",)) if self.sharded else None
                folder = self._save_base(model, base)
                self.servers = [_Server(list(range(self.team.num_agents)), folder, "LoRA agents (one base)")]
            else:
                groups: dict[int, list[int]] = {}
                for i, m in enumerate(self.team.models):
                    groups.setdefault(id(m), []).append(i)
                for agents in groups.values():
                    model = self.team.models[agents[0]]
                    folder = self.workdir / f"model_{agents[0]}"
                    # not save_pretrained: under a process group transformers writes the weights on rank 0 only
                    state = self._weights(("model", agents[0])) if self.sharded else _local_state(model)
                    self._save_full(model, state, folder)
                    label = f"agent {agents[0]}" if len(agents) == 1 else f"agents {agents}"
                    self.servers.append(_Server(agents, str(folder), label))
            for server in self.servers:
                self._launch(server)
                for i in server.agents:
                    self.server_of[i] = server
            self.stale = set(range(self.team.num_agents)) if self.lora else set()
            if not self.lora:  # the saved folders hold the current weights
                self.applied = list(self.requested)
        except BaseException:
            self.close()
            raise

    def _save_base(self, model: Any, whole: dict | None = None) -> str:
        """The base weights of a peft model, saved without the adapters (``peft_model.unload``-free: the
        ``base_layer`` weights are copied under their plain names); ``whole``: the base's gathered state dict
        (sharded agents)."""
        from safetensors.torch import save_file

        base = model.get_base_model()
        folder = self.workdir / "base"
        folder.mkdir()
        state = {}
        for key, value in (base.state_dict() if whole is None else whole).items():
            if ".lora_" in key:
                continue
            state[key.replace(".base_layer.", ".")] = value.detach().to("cpu").contiguous()
        tied = getattr(base.config, "tie_word_embeddings", False)
        if tied:
            state.pop("lm_head.weight", None)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        _save_config(base, folder)
        return str(folder)

    def _save_full(self, model: Any, state: dict, folder: Path) -> None:
        """A full model's folder from its state dict (a sharded model's gathered one)."""
        from safetensors.torch import save_file

        folder.mkdir()
        state = dict(state)
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        _save_config(model, folder)

    # --- sharded agents (FSDP2) -----------------------------------------------------------------------------
    @property
    def sharded(self) -> bool:
        """True once :meth:`use_sharded_weights` was called: pushes gather the weights from the ranks' shards."""
        return self._gather_keys is not None

    def use_sharded_weights(self) -> None:
        """The team's agents are sharded (FSDP2; :func:`~comlrl_lightning.sharding.shard_team` calls this on every
        rank, after sharding them): from now on each push gathers the whole weights it needs from the shards (a
        collective, on every rank) before pushing them as for unsharded agents. The parts gathered: each distinct
        full model, or, for LoRA agents, the frozen base (once, at start) and each agent's adapter. Registers one
        balanced collective per part, in the same order on every rank."""
        from comlrl_lightning.distributed import register_balanced

        if self.sharded:
            return
        parts = sorted({self._part(i) for i in range(self.team.num_agents)})
        if self.lora:
            parts.insert(0, ("base",))
        me = weakref.ref(self)  # the registry is global: it must not keep a closed engine alive
        self._gather_keys = {part: register_balanced(functools.partial(_join_part, me, part)) for part in parts}

    def _part(self, agent: int) -> tuple:
        """The gathered part that holds agent ``agent``'s served weights."""
        if self.lora:
            return ("adapter", agent)
        model = self.team.models[agent]
        return ("model", next(i for i, m in enumerate(self.team.models) if m is model))

    def _gather(self, part: tuple) -> dict:
        """The whole state dict of ``part`` on this rank, CPU (a collective over the ranks); time and bytes are
        appended to :attr:`gathers`."""
        import time

        from comlrl_lightning.sharding import gathered_state_dict

        start = time.perf_counter()
        if part[0] == "model":
            state = gathered_state_dict(self.team.models[part[1]])
        elif part[0] == "base":
            state = gathered_state_dict(self.team.models[0].get_base_model(), lambda k: ".lora_" not in k)
        else:
            name = self.team.adapters[part[1]]
            state = gathered_state_dict(self.team.models[0], lambda k: ".lora_" in k and f".{name}." in k)
        size = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
        self.gathers.append((time.perf_counter() - start, size))
        return state

    def _weights(self, part: tuple) -> dict:
        """``part``'s current whole weights: the ones gathered while joining another rank's push, else a gather
        announced to the other ranks (a balanced collective)."""
        from comlrl_lightning.distributed import announce_balanced

        if part in self._gathered:
            return self._gathered.pop(part)
        announce_balanced(self._gather_keys[part])
        return self._gather(part)

    def _join(self, part: tuple) -> None:
        """Take part in another rank's gather of ``part`` (this rank has no generation left in the round) and keep
        the weights for this rank's next push."""
        self._gathered[part] = self._gather(part)

    def _llm_kwargs(self, server: _Server) -> dict:
        model = self.team.models[server.agents[0]]
        dtype = next(model.parameters()).dtype
        kwargs: dict[str, Any] = {"dtype": str(dtype).removeprefix("torch."), "skip_tokenizer_init": True,
                                  "disable_log_stats": True, "seed": 0}
        if _is_cpu():
            kwargs.update(CPU_DEFAULTS)
            if "VLLM_CPU_KVCACHE_SPACE" in os.environ:
                kwargs.pop("kv_cache_memory_bytes")
        if self.lora:
            ranks = [int(c.r) for c in model.peft_config.values()]
            kwargs.update(enable_lora=True, max_loras=len(server.agents), max_lora_rank=_lora_rank(max(ranks)))
        kwargs["worker_extension_cls"] = WORKER_EXTENSION
        kwargs.update(self.vllm_kwargs)
        return kwargs

    def _launch(self, server: _Server) -> None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(server.folder)
        if _is_cpu():
            check_head_size(config, f"The model of the vLLM engine for {server.label} ({server.folder})")
        from vllm import LLM

        vllm_process.set_worker_shutdown_timeout()
        try:
            server.llm = LLM(model=server.folder, **self._llm_kwargs(server))
        except Exception as exc:
            raise EngineError(f"The vLLM engine for {server.label} ({server.folder}) failed to start: "
                              f"{type(exc).__name__}: {exc}") from exc
        server.watch()

    def close(self) -> None:
        """Shut every engine down (processes and shared memory) and remove the work folder."""
        servers, self.servers, self.server_of = self.servers, [], {}
        for server in servers:
            server.closing = True
            llm, server.llm = server.llm, None
            if llm is None:
                continue
            vllm_process.shutdown(llm)
            vllm_process.stop(server.workers)
            del llm
        gc.collect()
        if servers:  # what a killed engine process (core or worker) could not free
            vllm_process.unlink_orphan_shm(self._shm_before)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None
        self.stale = set(range(self.team.num_agents))
        self._gathered.clear()  # every rank's next start gathers afresh (close runs on every rank at fit end)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # --- weights --------------------------------------------------------------------------------------------
    def weight_version(self, agent_index: int) -> int:
        """The number of weight updates of agent ``agent_index`` the engine was told about (:meth:`sync`); samples
        report how many of them the served weights include."""
        return self.requested[agent_index]

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """Mark agents stale (None: all); their weights are pushed before the next generation."""
        agents = range(self.team.num_agents) if agent_indices is None else agent_indices
        self.stale.update(agents)
        for i in agents:
            self.requested[i] += 1
            if self.sharded:  # weights gathered while joining another rank's push are now old
                self._gathered.pop(self._part(i), None)

    def _push(self, agents: Sequence[int]) -> None:
        for i in sorted(set(agents) & self.stale):
            server = self.server_of[i]
            if self.lora:
                self._push_adapter(server, i)
                self.applied[i] = self.requested[i]
            else:
                self._push_full(server)
                self.stale.difference_update(server.agents)
                for j in server.agents:
                    self.applied[j] = self.requested[j]
            self.stale.discard(i)

    def _push_adapter(self, server: _Server, agent: int) -> None:
        from vllm.lora.request import LoRARequest

        self._version += 1
        folder = self.workdir / f"adapter_{agent}_v{self._version}"
        model, name = self.team.models[agent], self.team.adapters[agent]
        state = {"state_dict": self._weights(("adapter", agent))} if self.sharded else {}
        model.save_pretrained(str(folder), selected_adapters=[name], **state)
        sub = folder / name
        if sub.is_dir():  # peft writes non-default adapters into a subfolder
            for f in sub.iterdir():
                os.replace(f, folder / f.name)
            sub.rmdir()
        old = server.loras.get(agent)
        request = LoRARequest(f"agent{agent}-v{self._version}", self._new_lora_id(), str(folder))
        server.loras[agent] = request
        if old is not None:
            self._call(server, server.llm.llm_engine.remove_lora, old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _push_full(self, server: _Server) -> None:
        from safetensors.torch import save_file

        self._version += 1
        model = self.team.models[server.agents[0]]
        folder = self.workdir / f"weights_v{self._version}"
        folder.mkdir()
        state = dict(self._weights(self._part(server.agents[0]))) if self.sharded else _local_state(model)
        if getattr(model.config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        self._call(server, server.llm.collective_rpc, "comlrl_reload_weights", kwargs={"weights_path": str(folder)})
        self._call(server, server.llm.reset_prefix_cache)
        shutil.rmtree(folder, ignore_errors=True)

    # --- sampling -------------------------------------------------------------------------------------------
    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        return self.sample_many([SampleRequest(agent_index, prompts, num_candidates, stream)], settings)[0]

    def sample_many(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
        """One ``generate`` per engine for all requests it serves (LoRA: mixed adapters in one call)."""
        self._check(requests)
        self.start()
        self._push([r.agent_index for r in requests])
        out = self._serve(requests, settings, lambda server, agent: server.loras.get(agent))
        for r, s in zip(requests, out):
            s.version = self.applied[r.agent_index]
        return out

    def engine_for(self, team: Any) -> VLLMEngine:
        """A new engine, with this engine's settings, for another team that is not trained (e.g. a ``model``
        comparator's agents): it starts on its first call and never receives weight pushes; the caller closes it."""
        return VLLMEngine(team, self.vllm_kwargs, self.workdir_root)

    def snapshot_engine(self, adapter_dirs: Sequence[str | os.PathLike]) -> AdapterSnapshotEngine | None:
        """An engine serving saved LoRA adapters of this team (``adapter_dirs[i]`` for agent i, e.g. the history
        comparator's snapshots) from this engine's base model, or None when this engine does not serve LoRA agents.
        The snapshots are never loaded into torch: vLLM reads each adapter folder on first use."""
        if not self.lora:
            return None
        dirs = [Path(d) for d in adapter_dirs]
        if len(dirs) != self.team.num_agents:
            raise ValueError(f"snapshot_engine needs one adapter folder per agent ({self.team.num_agents}); "
                             f"got {len(dirs)}.")
        missing = [str(d) for d in dirs if not (d / "adapter_config.json").is_file()]
        if missing:
            raise ValueError(f"Not LoRA adapter folders (no adapter_config.json): {missing}.")
        return AdapterSnapshotEngine(self, [str(d) for d in dirs])

    def _new_lora_id(self) -> int:
        self._next_lora_id += 1
        return self._next_lora_id - 1

    @staticmethod
    def _check(requests: Sequence[SampleRequest]) -> None:
        for r in requests:
            if r.num_candidates < 1:
                raise ValueError(f"num_candidates must be >= 1. Got {r.num_candidates}.")

    def _serve(self, requests: Sequence[SampleRequest], settings: SamplingSettings, adapter_of: Any) -> list[Samples]:
        """Generate every request on the server of its agent, one ``generate`` per server; ``adapter_of(server,
        agent)`` is the ``LoRARequest`` a request of that agent is served with (LoRA layout)."""
        encoded = []
        for r in requests:
            tok = self.team.tokenizers[r.agent_index]
            ids, _ = encode_prompts(self.team.models[r.agent_index], tok, list(r.prompts), settings.max_new_tokens)
            seeds = row_seeds(r.stream.next_seed(), len(ids) * r.num_candidates)
            encoded.append((ids, seeds))
        outputs: list[list[list[int]]] = [[] for _ in requests]
        logprobs: list[list[list[float]]] = [[] for _ in requests]
        for server in self.servers:
            mine = [q for q, r in enumerate(requests) if r.agent_index in server.agents]
            if not mine:
                continue
            prompts, params, loras, owners = [], [], [], []
            for q in mine:
                r = requests[q]
                ids, seeds = encoded[q]
                tok = self.team.tokenizers[r.agent_index]
                for p, prompt in enumerate(ids):
                    for c in range(r.num_candidates):
                        prompts.append({"prompt_token_ids": prompt})
                        params.append(self._params(settings, tok, seeds[p * r.num_candidates + c]))
                        loras.append(adapter_of(server, r.agent_index))
                        owners.append(q)
            kwargs = {"lora_request": loras} if self.lora else {}
            results = self._call(server, server.llm.generate, prompts, params, use_tqdm=False, **kwargs)
            for q, res in zip(owners, results):
                completion = res.outputs[0]
                outputs[q].append(list(completion.token_ids))
                logprobs[q].append(_sampled_logprobs(completion))
        out = []
        for q, r in enumerate(requests):
            tok = self.team.tokenizers[r.agent_index]
            ids, _ = encoded[q]
            k = r.num_candidates
            eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
            rows = [[cut_at_pad(outputs[q][p * k + c], tok.pad_token_id, eos) for c in range(k)]
                    for p in range(len(ids))]
            texts = [[tok.decode(c, skip_special_tokens=True) for c in row] for row in rows]
            lps = [[None if logprobs[q][p * k + c] is None else logprobs[q][p * k + c][:len(rows[p][c])]
                     for c in range(k)] for p in range(len(ids))]
            out.append(Samples(prompt_ids=[list(x) for x in ids], completion_ids=rows, texts=texts,
                               logprobs=None if any(x is None for row in lps for x in row) else lps))
        return out

    def _params(self, settings: SamplingSettings, tok: Any, seed: int) -> Any:
        from vllm import SamplingParams

        eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
        extra = {}
        for key, value in settings.extra.items():
            if key == "do_sample":
                continue
            if key not in _EXTRA_TO_VLLM:
                raise ValueError(f"generation_kwargs key {key!r} has no vLLM equivalent; the vLLM engine supports "
                                 f"{sorted(_EXTRA_TO_VLLM)}. Remove it or use generation_backend='hf'.")
            extra[_EXTRA_TO_VLLM[key]] = value
        return SamplingParams(n=1, temperature=settings.temperature, top_p=settings.top_p,
                              top_k=settings.top_k if settings.top_k is not None else 0,
                              max_tokens=settings.max_new_tokens, seed=seed, stop_token_ids=[eos], detokenize=False,
                              logprobs=0, **extra)

    def _call(self, server: _Server, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` with an engine failure turned into an :class:`EngineError` naming the engine."""
        try:
            if server.dead():
                raise engine_dead_error()
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_engine_dead(exc):
                raise EngineError(f"The vLLM engine for {server.label} ({server.folder}) died "
                                  f"({type(exc).__name__}). Resume the run from its last checkpoint.") from exc
            raise


class AdapterSnapshotEngine:
    """Saved LoRA adapters of a team (one folder per agent) served by that team's :class:`VLLMEngine`, on the same
    base model, in calls of their own (docs/engines.md, "Comparators"). The adapters are frozen: :meth:`sync` does
    nothing. Each folder gets a fresh adapter id on first use; :meth:`close` removes them from the engine (the
    folders stay)."""

    name = "vllm-snapshot"

    def __init__(self, parent: VLLMEngine, adapter_dirs: Sequence[str]):
        self.parent = parent
        self.adapter_dirs = list(adapter_dirs)
        self.requests: dict[int, Any] = {}  # agent -> LoRARequest of its snapshot

    def _adapter(self, server: _Server, agent: int) -> Any:
        if agent not in self.requests:
            from vllm.lora.request import LoRARequest

            lora_id = self.parent._new_lora_id()
            self.requests[agent] = LoRARequest(f"snapshot{agent}-{lora_id}", lora_id, self.adapter_dirs[agent])
        return self.requests[agent]

    def sample(self, agent_index: int, prompts: Sequence[str], num_candidates: int, settings: SamplingSettings,
               stream: SamplingStream) -> Samples:
        return self.sample_many([SampleRequest(agent_index, prompts, num_candidates, stream)], settings)[0]

    def sample_many(self, requests: Sequence[SampleRequest], settings: SamplingSettings) -> list[Samples]:
        self.parent._check(requests)
        self.parent.start()
        out = self.parent._serve(requests, settings, self._adapter)
        for r, s in zip(requests, out):  # the folder vLLM was asked to read (checked by the history comparator)
            s.source = self.requests[r.agent_index].lora_path
        return out

    def sync(self, agent_indices: Sequence[int] | None = None) -> None:
        """Nothing: snapshots do not change."""

    def close(self) -> None:
        """Remove the snapshot adapters from the running engine (a stopped engine holds none)."""
        requests, self.requests = self.requests, {}
        for request in requests.values():
            for server in self.parent.servers:
                if server.llm is not None and not server.dead():
                    self.parent._call(server, server.llm.llm_engine.remove_lora, request.lora_int_id)


def _local_state(model: Any) -> dict:
    """An unsharded model's state dict on the CPU."""
    return {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}


def _join_part(engine: Any, part: tuple) -> None:
    """:meth:`VLLMEngine._join` of the engine ``engine()`` (a weak reference)."""
    live = engine()
    if live is None:
        raise RuntimeError("Another rank gathers sharded weights for a vLLM engine this rank no longer holds.")
    live._join(part)


def _save_config(model: Any, folder: Path) -> None:
    """``model``'s config and generation config into ``folder``; ``architectures`` names the plain class (a sharded
    model's class is ``FSDP<name>``, which vLLM would not find)."""
    import copy

    from comlrl_lightning.sharding import plain_class_name

    config = copy.deepcopy(model.config)
    if config.architectures is None or any(a.startswith("FSDP") for a in config.architectures):
        config.architectures = [plain_class_name(model)]
    config.save_pretrained(str(folder))
    gen = getattr(model, "generation_config", None)
    if gen is not None:
        gen.save_pretrained(str(folder))


def _sampled_logprobs(completion: Any) -> list[float] | None:
    """The log-prob vLLM reports for each sampled token (``logprobs=0``: the sampled token's only; raw log-probs,
    before temperature and top-k/top-p, vLLM's default ``logprobs_mode``), or None when it reports none."""
    per_token = getattr(completion, "logprobs", None)
    if per_token is None:
        return None
    out = []
    for token, entry in zip(completion.token_ids, per_token):
        found = entry.get(token) if entry is not None else None
        if found is None:
            return None
        out.append(float(getattr(found, "logprob", found)))
    return out
