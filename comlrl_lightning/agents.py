"""Load the agents: hub ids, local paths or model objects; tokenizers; optional LoRA adapters.

An :class:`AgentTeam` is what modules and callbacks receive. It holds one model per agent (the same object
may appear several times: shared weights, or one peft base carrying one named adapter per agent), one
tokenizer per agent, and answers "which parameters belong to agent i".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from comlrl_lightning.errors import ModelLoadError
from comlrl_lightning.tiny import TINY_MODEL_NAME, tiny_model_path


def resolve_model_source(source: str) -> str:
    """Map a user-facing model name to what ``from_pretrained`` takes.

    ``embedded:tiny`` is the project's offline default (built on first use); a ``.gguf`` path or a
    ``packaged:`` name becomes its cached de-quantised folder (:mod:`comlrl_lightning.gguf`, docs/models.md);
    everything else is passed through (a local folder or a hub id).
    """
    if source == TINY_MODEL_NAME:
        return tiny_model_path()
    from comlrl_lightning.gguf import is_gguf_source, resolve_gguf

    return resolve_gguf(source) if is_gguf_source(source) else source


def _hub_reachable(timeout_s: float = 3.0) -> bool:
    """Quick TCP probe of the hub endpoint, bounded in time even when DNS hangs."""
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    host = endpoint.split("://", 1)[-1].split("/", 1)[0]
    port = 443 if endpoint.startswith("https") else 80
    if ":" in host:
        host, port_text = host.rsplit(":", 1)
        port = int(port_text)
    result: list[bool] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout_s + 0.5)
    return bool(result and result[0])


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _looks_like_path(source: str) -> bool:
    """A source written as a file-system path (absolute, ./, ../, ~, or more than one '/'), not a hub id."""
    return (source.startswith(("/", "./", "../", "~", ".\\")) or os.path.isabs(source) or source.count("/") >= 2
            or "\\" in source)


def team_folder_sources(source: str, num_agents: int) -> list[str] | None:
    """``[source/agent_0, ..., source/agent_{n-1}]`` when ``source`` is an exported team folder (what
    ``ExportAgents`` and ``save_model`` write: ``agent_{i}/`` subfolders, no model of its own), else None."""
    folder = Path(source)
    if not folder.is_dir() or (folder / "config.json").exists() or not (folder / "agent_0").is_dir():
        return None
    found = sorted(p.name for p in folder.glob("agent_*") if p.is_dir())
    missing = [f"agent_{i}" for i in range(num_agents) if not (folder / f"agent_{i}").is_dir()]
    if missing:
        raise ValueError(f"{source!r} is an exported team folder with {found}, but num_agents={num_agents} needs "
                         f"{missing} too. Set num_agents={len(found)} or pass agents=[...] explicitly.")
    return [str(folder / f"agent_{i}") for i in range(num_agents)]


def _from_pretrained(loader: Any, source: str, what: str, **kwargs: Any) -> Any:
    """``loader.from_pretrained`` with a fast, explicit failure for hub ids that cannot be reached."""
    source = resolve_model_source(source)
    if Path(source).exists():
        try:
            return loader.from_pretrained(source, **kwargs)
        except Exception as exc:  # noqa: BLE001 - re-raised with the path named
            raise ModelLoadError(f"Failed to load {what} from local path {source!r}: {exc}") from exc
    if _looks_like_path(source):
        raise ModelLoadError(
            f"Cannot load {what} from {source!r}: no such local folder (it is written as a path, so it is not "
            f"looked up on the model hub). Check the path, or pass a hub id (org/name) or {TINY_MODEL_NAME!r}."
        )
    # Not a local path: a hub id. Use the local cache first, then the network only if it is reachable.
    try:
        return loader.from_pretrained(source, local_files_only=True, **kwargs)
    except Exception:  # noqa: BLE001 - not cached; decide below
        pass
    if _offline():
        raise ModelLoadError(
            f"Cannot load {what} {source!r}: it is not a local folder, it is not in the Hugging Face cache, "
            "and HF_HUB_OFFLINE is set. Pass a local checkpoint folder, or use the embedded default "
            f"{TINY_MODEL_NAME!r}."
        )
    if not _hub_reachable():
        raise ModelLoadError(
            f"Cannot load {what} {source!r}: it is not a local folder or cached, and the model hub is not "
            "reachable from this machine. Pass a local checkpoint folder (or set HF_HUB_OFFLINE=1 to fail "
            f"at once), or use the embedded default {TINY_MODEL_NAME!r}."
        )
    try:
        return loader.from_pretrained(source, **kwargs)
    except Exception as exc:  # noqa: BLE001
        raise ModelLoadError(f"Failed to load {what} from identifier {source!r}: {exc}") from exc


def load_kwargs(model_config: dict | None) -> dict[str, Any]:
    """``from_pretrained`` kwargs from ``model_config`` (dtype / torch_dtype, attn_implementation, model_kwargs)."""
    cfg = dict(model_config or {})
    nested = dict(cfg.pop("model_kwargs", None) or {})
    merged = {**cfg, **nested}
    out: dict[str, Any] = {}
    dtype = merged.get("dtype", merged.get("torch_dtype"))
    if dtype is not None:
        out["dtype"] = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else dtype
    attn = merged.get("attn_implementation", "sdpa")
    if attn is not None:
        out["attn_implementation"] = attn
    return out


def load_model(source: str, model_config: dict | None = None) -> nn.Module:
    """Load one causal LM from a hub id, a local folder, a ``.gguf`` file / ``packaged:`` name, or ``embedded:tiny``."""
    from transformers import AutoModelForCausalLM

    return _from_pretrained(AutoModelForCausalLM, source, "model", **load_kwargs(model_config))


def load_tokenizer(source: str, special_tokens: dict | None = None) -> Any:
    """Load a tokenizer and apply the pad-token fallback (pad := eos)."""
    from transformers import AutoTokenizer

    tok = _from_pretrained(AutoTokenizer, source, "tokenizer")
    if special_tokens:
        tok.add_special_tokens(special_tokens)
    return prepare_tokenizer(tok)


def prepare_tokenizer(tok: Any) -> Any:
    """Pad-token fallback: a tokenizer without a pad token uses its EOS token; neither is an error."""
    if tok.pad_token is None and tok.eos_token is not None:
        tok.pad_token = tok.eos_token
    if tok.pad_token_id is None:
        raise ValueError(
            f"Tokenizer must expose pad_token_id: {type(tok).__name__} has neither a pad token nor an EOS "
            "token. Set tokenizer.pad_token before passing it."
        )
    return tok


def model_name_of(model: Any) -> str:
    """A readable name for a model object (its ``_name_or_path``, model type, or class name)."""
    cfg = getattr(model, "config", None)
    for attr in ("_name_or_path", "model_type"):
        value = getattr(cfg, attr, None)
        if value:
            return str(value)
    return type(model).__name__


def loadable_name_of(model: Any) -> str | None:
    """The source a model object was loaded from (``config._name_or_path``) when it can be loaded again: an
    existing local folder, ``embedded:tiny`` or a hub id (``org/name``); else None."""
    import os
    import re

    name = getattr(getattr(model, "config", None), "_name_or_path", None)
    if not isinstance(name, str) or not name:
        return None
    if name == TINY_MODEL_NAME or os.path.isdir(name) or re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return name
    return None


@dataclass
class AgentTeam:
    """The agents of one run.

    ``models[i]`` is agent i's model (objects may repeat), ``tokenizers[i]`` its tokenizer and
    ``adapters[i]`` the name of its peft adapter (None without LoRA). ``names[i]`` is the source name.
    ``engine`` samples the agents (docs/engines.md); None means the HF reference engine, made on first use.
    """

    models: list[nn.Module]
    tokenizers: list[Any]
    adapters: list[str | None] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    engine: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.models)
        if not self.adapters:
            self.adapters = [None] * n
        if not self.names:
            self.names = [model_name_of(m) for m in self.models]
        if len(self.tokenizers) != n or len(self.adapters) != n:
            raise ValueError("tokenizers length must match agents.")
        for model, tok in zip(self.models, self.tokenizers):
            sync_special_tokens(model, tok)

    @property
    def num_agents(self) -> int:
        return len(self.models)

    @property
    def uses_lora(self) -> bool:
        return any(a is not None for a in self.adapters)

    def unique_models(self) -> list[nn.Module]:
        """Each distinct model object once, in agent order."""
        seen: dict[int, nn.Module] = {}
        for m in self.models:
            seen.setdefault(id(m), m)
        return list(seen.values())

    def shares_parameters(self) -> bool:
        """True when two agents train the same parameters (one model object passed for several agents)."""
        keys = [(id(m), a) for m, a in zip(self.models, self.adapters)]
        return len(set(keys)) < len(keys)

    def parameters_of(self, i: int) -> list[nn.Parameter]:
        """Trainable parameters of agent i (its adapter's weights with LoRA)."""
        model, adapter = self.models[i], self.adapters[i]
        if adapter is None:
            return [p for p in model.parameters() if p.requires_grad]
        tag = f".{adapter}."
        return [p for n, p in model.named_parameters() if tag in n]

    @contextlib.contextmanager
    def activate(self, i: int) -> Iterator[nn.Module]:
        """Context in which agent i's model (with its adapter active) is yielded."""
        model, adapter = self.models[i], self.adapters[i]
        if adapter is not None:
            model.set_adapter(adapter)
            # set_adapter marks only the active adapter trainable; keep every agent's adapter trainable.
            for j, name in enumerate(self.adapters):
                if name is not None:
                    for p in self.parameters_of(j):
                        p.requires_grad_(True)
        yield model

    def save(self, output_dir: str | os.PathLike) -> list[str]:
        """Write ``output_dir/agent_{i}/`` (model + tokenizer, or the LoRA adapter + tokenizer) per agent.

        Each folder is written under a temporary name and renamed into place, so a crash never leaves a
        half-written agent (an existing folder is replaced only once the new one is complete).
        """
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for i, (model, tok, adapter) in enumerate(zip(self.models, self.tokenizers, self.adapters)):
            final = out / f"agent_{i}"
            target = Path(tempfile.mkdtemp(prefix=f".agent_{i}.", dir=out))
            try:
                self._save_one(model, tok, adapter, target)
                if final.exists():
                    shutil.rmtree(final)
                os.replace(target, final)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            paths.append(str(final))
        return paths

    @staticmethod
    def _save_one(model: Any, tok: Any, adapter: str | None, target: Path) -> None:
        if adapter is not None:
            model.save_pretrained(str(target), selected_adapters=[adapter])
            # peft writes non-default adapters into a subfolder; flatten it so from_pretrained works.
            sub = target / adapter
            if sub.is_dir():
                for f in sub.iterdir():
                    os.replace(f, target / f.name)
                sub.rmdir()
        else:
            model.save_pretrained(str(target))
        tok.save_pretrained(str(target))


def sync_special_tokens(model: Any, tok: Any) -> None:
    """Copy the tokenizer's pad/eos ids into the model config and generation config."""
    eos = tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id
    for cfg in (getattr(model, "config", None), getattr(model, "generation_config", None)):
        if cfg is not None:
            cfg.pad_token_id = tok.pad_token_id
            cfg.eos_token_id = eos


def check_vocab(model: Any, tokenizer: Any, name: str, grow: bool = False) -> None:
    """The tokenizer's ids must all have an embedding row: a larger tokenizer would train until the first
    out-of-range id, then fail deep inside torch. With ``grow`` (``model_config["special_tokens"]`` added tokens
    to a model we loaded) the embeddings are resized to the tokenizer instead."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = getattr(emb, "num_embeddings", None)
    size = len(tokenizer) if tokenizer is not None else None
    if rows is None or size is None or size <= rows:
        return
    if grow:
        model.resize_token_embeddings(size)
        return
    raise ValueError(
        f"The tokenizer of {name} has {size} token ids but the model's embedding has only {rows} rows, so an id >= "
        f"{rows} would crash inside torch. Use the model's own tokenizer, or call "
        f"model.resize_token_embeddings({size}) before passing the model.")


def build_agents(
    agent_model: str | None = None,
    agents: Sequence[Any] | None = None,
    num_agents: int = 2,
    tokenizer: Any = None,
    model_config: dict | None = None,
    lora: dict | None = None,
) -> AgentTeam:
    """Resolve the agents of a run.

    * ``agent_model``: one hub id / local path / ``embedded:tiny`` loaded ``num_agents`` times
      (independent copies; an exported team folder with ``agent_{i}/`` subfolders gives agent i its own), or,
      with ``lora``, once as a frozen base carrying one adapter per agent.
    * ``agents``: a list of ids, paths or model objects (heterogeneous allowed; a repeated object shares
      its weights between agents).
    * ``tokenizer``: None (load one per string source), one tokenizer for all, or one per agent.
    * ``lora``: peft ``LoraConfig`` keyword arguments (e.g. ``{"r": 8, "lora_alpha": 16}``).
    """
    if agent_model is None and agents is None:
        raise ValueError("Either agent_model or agents must be provided.")
    if agents is None:
        if not isinstance(agent_model, str):
            raise ValueError(
                "agent_model should be a string to create homogeneous agents; got "
                f"{type(agent_model).__name__}. Pass model objects through `agents` instead."
            )
        if num_agents < 1:
            raise ValueError(f"num_agents must be >= 1. Got {num_agents}.")
        sources: list[Any] = team_folder_sources(agent_model, num_agents) or [agent_model] * num_agents
    else:
        sources = list(agents)
        if not sources:
            raise ValueError("agents must be a non-empty list of model ids, paths or model objects.")
        if any(s is None for s in sources):
            raise ValueError("agents entries must be non-null.")
    n = len(sources)
    model_config = dict(model_config or {})
    special = model_config.pop("special_tokens", None)

    # Tokenizers.
    if tokenizer is None:
        if not all(isinstance(s, str) for s in sources):
            raise ValueError("Tokenizer(s) must be provided when agents are model objects.")
        cache: dict[str, Any] = {}
        tokenizers = []
        for s in sources:
            if s not in cache:
                cache[s] = load_tokenizer(s, special)
            tokenizers.append(cache[s])
    elif isinstance(tokenizer, (list, tuple)):
        if len(tokenizer) != n:
            raise ValueError(f"tokenizers length must match agents: got {len(tokenizer)} tokenizers for {n} agents.")
        tokenizers = [prepare_tokenizer(t) for t in tokenizer]
    else:
        tokenizers = [prepare_tokenizer(tokenizer)] * n
    if special and tokenizer is not None:
        for t in {id(t): t for t in tokenizers}.values():
            t.add_special_tokens(special)

    if lora is not None:
        if agents is not None or not isinstance(agent_model, str):
            raise ValueError("lora needs homogeneous agents from one agent_model string (one shared frozen base).")
        from peft import LoraConfig, get_peft_model

        base = load_model(agent_model, model_config)
        check_vocab(base, tokenizers[0], agent_model, grow=bool(special))
        lora_kwargs = {"task_type": "CAUSAL_LM", **lora}
        peft_model = get_peft_model(base, LoraConfig(**lora_kwargs), adapter_name="agent_0")
        for i in range(1, n):
            peft_model.add_adapter(f"agent_{i}", LoraConfig(**lora_kwargs))
        for name, p in peft_model.named_parameters():  # every agent's adapter trains, not only the active one
            if any(f".agent_{i}." in name for i in range(n)):
                p.requires_grad_(True)
        return AgentTeam([peft_model] * n, tokenizers, [f"agent_{i}" for i in range(n)], [agent_model] * n)

    models = []
    names = []
    for s in sources:
        if isinstance(s, str):
            models.append(load_model(s, model_config))
            names.append(s)
        elif isinstance(s, nn.Module):
            check_causal_lm(s, f"agents[{len(models)}]")
            models.append(s)
            names.append(model_name_of(s))
        else:
            raise ValueError(f"agents entries must be model ids, paths or torch modules; got {type(s).__name__}.")
    for i, (m, s) in enumerate(zip(models, sources)):
        check_vocab(m, tokenizers[i], f"agent {i} ({names[i]})", grow=bool(special) and isinstance(s, str))
        m.train()
    return AgentTeam(models, tokenizers, names=names)


def check_causal_lm(model: nn.Module, where: str) -> None:
    """Refuse a model object that cannot be trained as an agent: one without a causal-LM head (an ``AutoModel``
    backbone, a classifier) has no next-token logits to sample from or to score."""
    head = model.get_output_embeddings() if callable(getattr(model, "get_output_embeddings", None)) else None
    if head is None or not callable(getattr(model, "generate", None)):
        raise ValueError(f"{where} is a {type(model).__name__}, which has no causal-LM head (no output embeddings "
                         "or no generate): an agent must be a causal language model such as AutoModelForCausalLM. "
                         "Load it with AutoModelForCausalLM.from_pretrained(...), or pass its name or folder.")
