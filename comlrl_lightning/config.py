"""Dataclass configs with the option names of the spec (CoMLRL 1.4.3 public API).

Every option is validated when the object is built (``__post_init__``); a bad value raises ``ValueError``
whose message starts with upstream's sentence (so code written against CoMLRL keeps matching) and adds
the value given and what is allowed.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from typing import Any


def _bad(message: str, value: Any, allowed: str | None = None) -> ValueError:
    """A ValueError that says what is wrong, the value given, and what is allowed."""
    text = f"{message} Got {value!r}."
    if allowed:
        text += f" Allowed: {allowed}."
    return ValueError(text)


def _normalize_choice(option: str, value: Any, aliases: dict[str, str], default: str, message: str) -> str:
    """Strip and lowercase ``value``, map it through ``aliases``; None means ``default``."""
    if value is None:
        return default
    key = str(value).strip().lower()
    if key not in aliases:
        allowed = ", ".join(sorted(set(aliases.values()), key=list(aliases.values()).index))
        raise _bad(message, value, f"{allowed} (aliases: {', '.join(sorted(aliases))})")
    return aliases[key]


def check_counts(cfg: Any, at_least_one: tuple[str, ...], at_least_zero: tuple[str, ...] = ()) -> None:
    """Integer options that must be >= 1 / >= 0 (upstream's messages plus the value and what is allowed)."""
    for name in at_least_one:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 1:
            raise _bad(f"{name} must be >= 1.", value, "integers >= 1")
    for name in at_least_zero:
        value = getattr(cfg, name)
        if not isinstance(value, int) or value < 0:
            raise _bad(f"{name} must be >= 0.", value, "integers >= 0")


def normalize_parallel_training(cfg: Any) -> None:
    """``parallel_training``: lowercased, "null" → "none", only none/mp; "mp" needs ``agent_devices``."""
    pt = "none" if cfg.parallel_training is None else str(cfg.parallel_training).strip().lower()
    pt = "none" if pt == "null" else pt
    if pt not in ("none", "mp"):
        raise _bad("parallel_training only supports: none, mp.", cfg.parallel_training, "none, mp")
    if pt == "mp" and cfg.agent_devices is None:
        raise _bad("parallel_training='mp' requires explicit agent_devices.", cfg.agent_devices,
                   "a device string or a list of length 1 or num_agents")
    cfg.parallel_training = pt


def check_reference_devices(cfg: Any) -> None:
    """With reference KL on, ``reference_devices`` (when set) must name 1 or ``num_agents`` devices."""
    devices = cfg.reference_devices
    if cfg.reference_kl_enabled and devices is not None:
        count = 1 if isinstance(devices, str) else len(list(devices))
        if count not in (1, cfg.num_agents):
            raise _bad(f"reference_devices length ({count}) must be 1 or N.", devices,
                       f"a device string, or a list of 1 or num_agents={cfg.num_agents} entries")


def check_sampling(cfg: Any) -> None:
    """Generation settings: max_new_tokens >= 1, temperature > 0, top_p in (0, 1], top_k >= 1 or None."""
    if not isinstance(cfg.max_new_tokens, int) or cfg.max_new_tokens < 1:
        raise _bad("max_new_tokens must be >= 1.", cfg.max_new_tokens, "integers >= 1")
    if not cfg.temperature > 0:
        raise _bad("temperature must be > 0.", cfg.temperature, "numbers > 0")
    if not 0 < cfg.top_p <= 1:
        raise _bad("top_p must be in (0, 1].", cfg.top_p, "numbers in (0, 1]")
    if cfg.top_k is not None and cfg.top_k < 1:
        raise _bad("top_k must be >= 1 or null.", cfg.top_k, "integers >= 1 or null")


_SECRET_HEADER_WORDS = ("auth", "key", "token", "secret", "cookie")

JOINT_MODE_ALIASES = {"aligned": "aligned", "align": "aligned", "cross": "cross", "crossed": "cross"}


@dataclass
class MADPOConfig:
    """Options of the offline MADPO trainer (spec preference.md §2.1).

    Attributes are documented one per line; defaults are upstream's.
    """

    # --- training -----------------------------------------------------------------------------------
    num_train_epochs: int = 20
    """MADPO: DPO epochs over the pair set (per round in the iterative trainers)."""
    agent_learning_rate: float = 5e-6
    """AdamW learning rate of every agent."""
    logging_steps: int = 50
    """Minimum env-step distance between two training-metric logs (upstream's gate; Lightning logs per step)."""
    num_agents: int = 2
    """Number of agents (roles)."""
    collaboration_mode: str = "decentralized"
    """"decentralized" (one model per role). "centralized" (one model writing all roles) is not supported yet."""
    parallel_training: str = "none"
    """"none" or "mp" (agents on separate devices)."""
    agent_devices: Any = None
    """Device spec for the agents: None (the Lightning accelerator), a string, or a list of length 1 or N."""
    max_new_tokens: int = 256
    """Generation length (also the API comparator's max tokens)."""
    temperature: float = 0.6
    """Sampling temperature for generation and evaluation."""
    top_p: float = 0.6
    """Nucleus sampling threshold."""
    top_k: int | None = 50
    """Top-k sampling; None leaves it out of ``generate``."""
    num_turns: int = 1
    """Number of turns; the preference trainers support 1 only."""
    discount: float = 1.0
    """Discount, forwarded to actor-critic backends."""
    joint_mode: str = "aligned"
    """How candidates form joint responses; preference trainers support "aligned" (alias "align") only."""
    early_termination_threshold: float | None = None
    """Forwarded to the RL stage; None = off."""
    external_prompt_passthrough: bool = False
    """Multi-turn only: use a transition's prompt as is instead of passing it through the formatter."""
    eval_interval: int = 16
    """Evaluate before every k-th update (0 = never; a final evaluation always runs when eval data exists)."""
    eval_num_samples: int = 4
    """Evaluation items per evaluation (the first ones of ``eval_dataset``)."""
    eval_batch_size: int = 1
    """Evaluation items generated together."""
    rollout_buffer_size: int = 2
    """RL-stage buffer size; also the default for ``train_batch_size``."""
    train_batch_size: int | None = None
    """DPO pairs per optimizer step (None = ``rollout_buffer_size``)."""
    advantage_normalization: bool = True
    """RL stage only."""
    advantage_mode: str = "mean"
    """RL stage only: mean, raw, max or rloo."""
    reference_kl_enabled: bool = False
    """MADPO is reference-free: setting this loads nothing and adds no term (a warning says so)."""
    reference_kl_coef: float = 0.1
    """KL coefficient of the RL stage."""
    reference_devices: Any = None
    """Reference-model devices (default: the agent devices)."""
    # --- preference collection ----------------------------------------------------------------------
    preference_num_candidates: int = 80
    """Samples per agent per task item (N)."""
    preference_pairs_per_sample: int | None = 16
    """Maximum pairs kept per task item; None keeps all."""
    pair_selection: str = "reward_gap"
    """reward_gap (largest gaps first), all (every non-tied pair; needs a null limit) or random."""
    dpo_beta: float = 0.1
    """DPO temperature (eta) in -log sigmoid(eta * joint margin)."""
    use_environment_step: bool = True
    """Advance ``env_step`` during DPO updates."""
    environment_steps_per_pair: int = 2
    """env_step increment per trained pair."""
    # --- ours ---------------------------------------------------------------------------------------
    seed: int = 0
    """Seed of the generation streams (agents, comparator, eval) and of pair shuffling."""
    gradient_clip_val: float | None = None
    """Clip each agent's gradient norm to this value (None = no clipping)."""
    gradient_accumulation_steps: int = 1
    """Optimizer steps happen every this many batches."""

    _allowed_pair_selection = ("reward_gap", "all", "random")
    _method = "MADPO"

    def __post_init__(self) -> None:
        self._validate_base()

    # Validation order follows spec §2.6 so that the first error matches upstream's.
    def _validate_base(self) -> None:
        if self.collaboration_mode not in ("decentralized", "centralized"):
            raise _bad("collaboration_mode must be decentralized or centralized.", self.collaboration_mode,
                       "decentralized, centralized")
        if self.collaboration_mode == "centralized":
            raise _bad("collaboration_mode='centralized' is not supported by comlrl-lightning yet.",
                       self.collaboration_mode, "decentralized")
        check_counts(self, ("num_train_epochs", "num_agents", "rollout_buffer_size"),
                     ("eval_interval", "eval_num_samples"))
        check_counts(self, ("eval_batch_size", "num_turns", "logging_steps"))
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if self.train_batch_size < 1:
            raise _bad("train_batch_size must be >= 1.", self.train_batch_size, "integers >= 1 or null")
        normalize_parallel_training(self)
        if self.reference_kl_coef < 0:
            raise _bad("reference_kl_coef must be >= 0.", self.reference_kl_coef, "numbers >= 0")
        self._validate_reference_kl()
        if self.num_turns != 1:
            raise _bad("MADPO currently supports num_turns=1 only.", self.num_turns, "1")
        if self.preference_num_candidates < 2:
            raise _bad("preference_num_candidates must be >= 2.", self.preference_num_candidates,
                       "integers >= 2")
        if self.preference_pairs_per_sample is not None and self.preference_pairs_per_sample < 1:
            raise _bad("preference_pairs_per_sample must be >= 1 or null.", self.preference_pairs_per_sample,
                       "integers >= 1 or null")
        if not (isinstance(self.dpo_beta, (int, float)) and math.isfinite(self.dpo_beta) and self.dpo_beta > 0):
            raise _bad("dpo_beta must be > 0.", self.dpo_beta, "finite numbers > 0")
        if self.environment_steps_per_pair < 1:
            raise _bad("environment_steps_per_pair must be >= 1.", self.environment_steps_per_pair,
                       "integers >= 1")
        ps = "reward_gap" if self.pair_selection in (None, "") else str(self.pair_selection).strip().lower()
        if ps not in self._allowed_pair_selection:
            allowed = ", ".join(self._allowed_pair_selection)
            raise _bad(f"pair_selection must be one of: {allowed}.", self.pair_selection, allowed)
        if ps == "all" and self.preference_pairs_per_sample is not None:
            raise _bad("preference_pairs_per_sample must be null when pair_selection='all'.",
                       self.preference_pairs_per_sample, "null")
        self.pair_selection = ps
        # Our decision 1: joint_mode is checked here, not at generation time.
        jm = _normalize_choice("joint_mode", self.joint_mode, JOINT_MODE_ALIASES, "aligned",
                               "joint_mode must be one of: aligned, cross.")
        if jm != "aligned":
            raise _bad(f"{self._method} preference generation currently supports aligned joint_mode only.",
                       self.joint_mode, "aligned, align")
        self.joint_mode = jm
        if self.gradient_accumulation_steps < 1:
            raise _bad("gradient_accumulation_steps must be >= 1.", self.gradient_accumulation_steps,
                       "integers >= 1")
        if self.gradient_clip_val is not None and not self.gradient_clip_val > 0:
            raise _bad("gradient_clip_val must be > 0 or null.", self.gradient_clip_val, "numbers > 0 or null")
        check_sampling(self)

    def _validate_reference_kl(self) -> None:
        # Decision 2: MADPO is reference-free; the option is accepted for compatibility and ignored.
        if self.reference_kl_enabled:
            warnings.warn(
                f"{type(self).__name__}: reference_kl_enabled=True has no effect; MADPO is reference-free, "
                "so no reference model is loaded and no KL term is added.",
                UserWarning,
                stacklevel=4,
            )

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


REPLAY_MODE_ALIASES = {
    "current": "current", "latest": "current", "new": "current",
    "nearest_k": "nearest_k", "recent_k": "nearest_k", "last_k": "nearest_k", "k": "nearest_k",
    "all_history": "all_history",
    "lambda_decay": "lambda_decay", "lambda": "lambda_decay", "td_lambda": "lambda_decay",
    "td-lambda": "lambda_decay",
}
COMPARATOR_POLICY_ALIASES = {
    "current": "current", "self": "current", "online": "current",
    "current_copy": "current_copy", "copy": "current_copy", "online_copy": "current_copy",
    "current-offload": "current_copy", "current_offload": "current_copy",
    "model": "model", "external": "model", "comparator": "model", "reference": "model", "ref": "model",
    "history": "history", "checkpoint": "history", "previous": "history", "previous_iteration": "history",
    "api": "api", "http": "api", "endpoint": "api",
}
GENERATION_MODE_ALIASES = {
    "decentralized": "decentralized", "decentralised": "decentralized", "multi_agent": "decentralized",
    "multi-agent": "decentralized",
    "centralized": "centralized", "centralised": "centralized", "single_agent": "centralized",
    "single-agent": "centralized",
}
API_FORMAT_ALIASES = {
    "generic": "generic",
    "openai": "openai", "openai_chat": "openai", "chat": "openai",
    "anthropic": "anthropic", "anthropic_messages": "anthropic", "messages": "anthropic",
    "openai_responses": "openai_responses", "responses": "openai_responses", "codex": "openai_responses",
}


@dataclass
class _IterativePreferenceOptions:
    """Options shared by the iterative trainers (spec preference.md §2.3)."""

    num_iterations: int = 6
    """Preference-refresh rounds."""
    preference_replay_mode: str = "current"
    """current, nearest_k, all_history or lambda_decay (aliases in spec §2.5)."""
    preference_replay_k: int | None = None
    """K for nearest_k: the K most recent non-empty rounds."""
    preference_replay_lambda: float | None = None
    """lambda for lambda_decay, in [0, 1]."""
    preference_replay_sample_size: int | None = None
    """Pairs drawn per round (non-current modes); None = this round's new pair count."""
    preference_replay_dir: str | None = None
    """Folder for the per-round replay files (default ``<default_root_dir>/preference_replay``)."""
    log_reward_distribution: bool = False
    """Write and log histograms of raw rewards (needs ``reward_func.reward_range``)."""
    policy_checkpoint_dir: str | None = None
    """Where per-round policy snapshots go; setting it turns snapshots on."""
    comparator_policy: str = "current"
    """current, current_copy, model, history or api."""
    comparator_generation_mode: str = "decentralized"
    """decentralized (one comparator per role) or centralized (one model writes all roles)."""
    comparator_centralized_agent_index: int = 0
    """Agent slot whose model/tokenizer the centralized comparator uses."""
    comparator_model_name: str | None = None
    """Comparator model for comparator_policy='model' (one id or path for every role)."""
    comparator_agents: list | None = None
    """Per-role comparator sources for comparator_policy='model'."""
    comparator_devices: Any = None
    """Comparator devices (default: the agent devices)."""
    comparator_num_candidates: int | None = None
    """Comparator samples per item (M); None = preference_num_candidates."""
    comparator_history_k: int | None = None
    """history: compare against the policy as it was k rounds ago (None = 1)."""
    comparator_api_url: str | None = None
    """Endpoint of the API comparator."""
    comparator_api_format: str = "generic"
    """generic, openai, anthropic or openai_responses (aliases in spec §2.5)."""
    comparator_api_model: str | None = None
    """``model`` field sent to the API."""
    comparator_api_max_n_per_request: int | None = None
    """Maximum ``n`` per OpenAI-chat request."""
    comparator_api_timeout: float = 120.0
    """Seconds per HTTP request."""
    comparator_api_headers: dict | None = None
    """Extra HTTP headers."""
    comparator_api_key: str | None = None
    """Literal API key (prefer comparator_api_key_env); never logged or saved."""
    comparator_api_key_env: str | None = None
    """Name of the environment variable holding the API key."""
    comparator_api_key_header: str = "Authorization"
    """Header carrying the key."""
    comparator_api_key_prefix: str = "Bearer"
    """Prefix of the key header value."""
    comparator_api_response_field: str = "completions"
    """Dotted path to the completions in a generic response."""
    comparator_api_extra_body: dict | None = None
    """Dict merged into every request body."""

    _method = "MADPOIter"

    def _validate_iterative(self) -> None:
        if self.num_iterations < 1:
            raise _bad("num_iterations must be >= 1.", self.num_iterations, "integers >= 1")
        mode = _normalize_choice(
            "preference_replay_mode", self.preference_replay_mode, REPLAY_MODE_ALIASES, "current",
            "preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay.")
        self.preference_replay_mode = mode
        k, lam, size = self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        if mode == "current":
            if k not in (None, 1):
                raise _bad("preference_replay_k must be null or 1 when preference_replay_mode='current'.", k,
                           "null, 1")
            if size is not None:
                raise _bad("preference_replay_sample_size is only valid when preference_replay_mode is "
                           "'nearest_k', 'all_history', or 'lambda_decay'.", size, "null")
        elif mode == "nearest_k":
            if k is None:
                raise _bad("preference_replay_k is required when preference_replay_mode='nearest_k'.", k,
                           "integers >= 1")
            if k < 1:
                raise _bad("preference_replay_k must be >= 1.", k, "integers >= 1")
        elif k is not None:
            raise _bad("preference_replay_k is only valid when preference_replay_mode='nearest_k'.", k, "null")
        if mode == "lambda_decay":
            if lam is None:
                raise _bad("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.",
                           lam, "numbers in [0, 1]")
            if not 0.0 <= lam <= 1.0:
                raise _bad("preference_replay_lambda must be in [0, 1].", lam, "numbers in [0, 1]")
        elif lam is not None:
            raise _bad("preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'.",
                       lam, "null")
        if mode != "current" and size is not None and size < 1:
            raise _bad("preference_replay_sample_size must be >= 1 or null.", size, "integers >= 1 or null")
        policy = _normalize_choice(
            "comparator_policy", self.comparator_policy, COMPARATOR_POLICY_ALIASES, "current",
            "comparator_policy must be one of: current, current_copy, model, history, api.")
        self.comparator_policy = policy
        gen = _normalize_choice(
            "comparator_generation_mode", self.comparator_generation_mode, GENERATION_MODE_ALIASES,
            "decentralized", "comparator_generation_mode must be one of: decentralized, centralized.")
        self.comparator_generation_mode = gen
        if gen == "centralized":
            idx = self.comparator_centralized_agent_index
            if idx < 0:
                raise _bad("comparator_centralized_agent_index must be >= 0.", idx, f"0..{self.num_agents - 1}")
            if idx >= self.num_agents:
                raise _bad("comparator_centralized_agent_index must be smaller than num_agents.", idx,
                           f"0..{self.num_agents - 1}")
        if self.comparator_num_candidates is not None and self.comparator_num_candidates < 1:
            raise _bad("comparator_num_candidates must be >= 1 or null.", self.comparator_num_candidates,
                       "integers >= 1 or null")
        if self.comparator_api_max_n_per_request is not None and self.comparator_api_max_n_per_request < 1:
            raise _bad("comparator_api_max_n_per_request must be >= 1 or null.",
                       self.comparator_api_max_n_per_request, "integers >= 1 or null")
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        if policy == "model" and not has_model:
            raise _bad("comparator_model_name or comparator_agents is required when comparator_policy='model'.",
                       None, "a model id/path, or a list of them")
        if policy in ("current", "current_copy", "history") and has_model:
            raise _bad("comparator_model_name and comparator_agents are only valid when comparator_policy='model'.",
                       self.comparator_model_name or self.comparator_agents, "null")
        if self.comparator_agents is not None:
            n = len(self.comparator_agents)
            if gen == "centralized" and n not in (1, self.num_agents):
                raise _bad("comparator_agents length must be 1 or num_agents when "
                           "comparator_generation_mode='centralized'.", n, f"1 or {self.num_agents}")
            if gen == "decentralized" and n != self.num_agents:
                raise _bad("comparator_agents length must equal num_agents.", n, str(self.num_agents))
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            if self.comparator_history_k < 1:
                raise _bad("comparator_history_k must be >= 1.", self.comparator_history_k, "integers >= 1")
        elif self.comparator_history_k is not None:
            raise _bad("comparator_history_k is only valid when comparator_policy='history'.",
                       self.comparator_history_k, "null")
        # Our decision 1: the API format is validated here (upstream silently falls back to generic).
        self.comparator_api_format = _normalize_choice(
            "comparator_api_format", self.comparator_api_format, API_FORMAT_ALIASES, "generic",
            "comparator_api_format must be one of: generic, openai, anthropic, openai_responses.")
        if policy == "api" and not self.comparator_api_url:
            raise _bad("comparator_api_url is required when comparator_policy='api'.", self.comparator_api_url,
                       "an http(s) URL")
        if not self.comparator_api_timeout > 0:
            raise _bad("comparator_api_timeout must be > 0.", self.comparator_api_timeout, "seconds > 0")

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option with the literal API key redacted."""
        d = asdict(self)
        if d.get("comparator_api_key"):
            d["comparator_api_key"] = "***"
        if d.get("comparator_api_headers"):
            d["comparator_api_headers"] = {
                k: ("***" if any(w in k.lower() for w in _SECRET_HEADER_WORDS) else v)
                for k, v in d["comparator_api_headers"].items()
            }
        return d

    def __repr__(self) -> str:  # never show a literal API key
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({items})"


@dataclass(repr=False)
class MADPOIterConfig(_IterativePreferenceOptions, MADPOConfig):
    """Options of the iterative MADPO trainer: the base options plus spec §2.3 (defaults of §2.4)."""

    num_train_epochs: int = 1
    preference_num_candidates: int = 20
    preference_pairs_per_sample: int | None = 4
    pair_selection: str = "comparator_reward"

    _allowed_pair_selection = ("reward_gap", "all", "random", "comparator_reward")
    _method = "MADPOIter"

    def __post_init__(self) -> None:
        self._validate_base()
        self._validate_iterative()


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` (config object, dict, list, namespace) without literal API keys or secret headers.

    ``comparator_api_key`` becomes None and header values whose name mentions auth/key/token/secret/cookie
    become "***". Used for checkpoint hyperparameters and saved CLI configs.
    """
    import copy

    mapping = isinstance(value, dict) or (
        hasattr(value, "keys") and hasattr(value, "__setitem__") and not hasattr(value, "__dataclass_fields__"))
    if mapping:
        out = value.clone() if hasattr(value, "clone") else copy.copy(value)
        for k in list(value.keys()):
            v = value[k]
            name = str(k).rsplit(".", 1)[-1]
            if name == "comparator_api_key" and v:
                out[k] = None
            elif name == "comparator_api_headers" and v:
                out[k] = {h: ("***" if any(w in str(h).lower() for w in _SECRET_HEADER_WORDS) else hv)
                          for h, hv in dict(v).items()}
            else:
                out[k] = redact_secrets(v)
        return out
    if isinstance(value, (list, tuple)):
        return type(value)(redact_secrets(v) for v in value)
    if hasattr(value, "__dataclass_fields__"):
        out = copy.copy(value)
        if getattr(out, "comparator_api_key", None):
            out.comparator_api_key = None
        if getattr(out, "comparator_api_headers", None):
            out.comparator_api_headers = redact_secrets({"comparator_api_headers": out.comparator_api_headers})[
                "comparator_api_headers"]
        return out
    return value


__all__ = ["MADPOConfig", "MADPOIterConfig", "redact_secrets"]
