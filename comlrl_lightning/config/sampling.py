"""Generation options: sampling settings, samples per prompt, and how agents' samples form joint actions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from comlrl_lightning.config.checks import bad_option, is_int, is_number, normalize_choice

GENERATION_BACKENDS = ("hf", "vllm")

JOINT_MODE_ALIASES = {"aligned": "aligned", "align": "aligned", "cross": "cross", "crossed": "cross"}


@dataclass
class SamplingOptions:
    """Settings passed to ``generate`` for training and evaluation."""

    max_new_tokens: int = 256
    """Generation length in tokens (also the API comparator's max tokens)."""
    temperature: float = 0.6
    """Sampling temperature for generation and evaluation."""
    top_p: float = 0.6
    """Nucleus sampling threshold."""
    top_k: int | None = 50
    """Top-k sampling; None leaves it out of ``generate``."""
    generation_backend: str = "hf"
    """Engine that samples every completion (docs/engines.md): "hf" (transformers ``generate``, the reference) or
    "vllm" (vLLM: LoRA agents as adapters of one engine; needs the ``[vllm]`` extra)."""
    vllm_kwargs: dict = field(default_factory=dict)
    """Extra keyword arguments of ``vllm.LLM`` (e.g. ``kv_cache_memory_bytes``, ``max_model_len``,
    ``gpu_memory_utilization``, ``dtype``); only read with ``generation_backend="vllm"``."""
    use_chat_template: bool | None = None
    """Prompts through the agents' chat templates (docs/models.md): null = the library's own formatters (the
    default ``item[prompt_field]``, the built-in tasks') where the agent's tokenizer has one (not the embedded
    tiny model's); true = every formatter, a user's too; false = none."""


@dataclass
class NumGenerationsOptions:
    """Samples per agent per prompt (RL trainers)."""

    num_generations: int = 4
    """Samples per agent per prompt or tree node (the MAGRPO family's group baseline needs >= 2)."""


@dataclass
class JointModeOptions:
    """How the agents' samples are combined into joint actions."""

    joint_mode: str = "aligned"
    """"aligned" ("align"): K joint actions, sample k of every agent together; "cross" ("crossed"): all K^N
    combinations. Preference trainers support "aligned" only."""


def check_sampling(cfg: Any) -> None:
    """Generation settings: max_new_tokens >= 1, temperature > 0, top_p in (0, 1], top_k >= 1 or None,
    generation_backend in :data:`GENERATION_BACKENDS` (stored lowercase), vllm_kwargs a dict."""
    if not is_int(cfg.max_new_tokens) or cfg.max_new_tokens < 1:
        raise bad_option("max_new_tokens must be >= 1.", cfg.max_new_tokens, "integers >= 1")
    if not is_number(cfg.temperature) or not cfg.temperature > 0:
        raise bad_option("temperature must be > 0.", cfg.temperature, "numbers > 0")
    if not is_number(cfg.top_p) or not 0 < cfg.top_p <= 1:
        raise bad_option("top_p must be in (0, 1].", cfg.top_p, "numbers in (0, 1]")
    if cfg.top_k is not None and (not is_int(cfg.top_k) or cfg.top_k < 1):
        raise bad_option("top_k must be >= 1 or null.", cfg.top_k, "integers >= 1 or null")
    backend = cfg.generation_backend
    if not isinstance(backend, str) or backend.strip().lower() not in GENERATION_BACKENDS:
        raise bad_option("generation_backend must be one of: hf, vllm.", backend, ", ".join(GENERATION_BACKENDS))
    cfg.generation_backend = backend.strip().lower()
    if cfg.use_chat_template is not None and not isinstance(cfg.use_chat_template, bool):
        raise bad_option("use_chat_template must be true, false or null.", cfg.use_chat_template,
                         "true (every formatter), false (none), null (the library's formatters, docs/models.md)")
    if not isinstance(cfg.vllm_kwargs, dict) or not all(isinstance(k, str) for k in cfg.vllm_kwargs):
        raise bad_option("vllm_kwargs must be a mapping of vllm.LLM keyword arguments.", cfg.vllm_kwargs,
                         "a dict with string keys, e.g. {kv_cache_memory_bytes: 67108864}")


def check_num_generations(cfg: Any, minimum: int, message: str | None = None) -> None:
    """``num_generations`` must be an integer >= ``minimum``; ``message`` replaces the default sentence."""
    value = cfg.num_generations
    if not is_int(value) or value < minimum:
        allowed = f"integers >= {minimum}" + (" (the group baseline needs several samples)" if minimum > 1 else "")
        raise bad_option(message or f"num_generations must be >= {minimum}.", value, allowed)


def normalize_joint_mode(cfg: Any) -> str:
    """``joint_mode`` through :data:`JOINT_MODE_ALIASES` (None = "aligned"); stores and returns it."""
    cfg.joint_mode = normalize_choice("joint_mode", cfg.joint_mode, JOINT_MODE_ALIASES, "aligned",
                                       "joint_mode must be one of: aligned, cross.")
    return cfg.joint_mode
