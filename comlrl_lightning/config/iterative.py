"""Options of the iterative trainers (MADPOIter, MARLHFIter): rounds, preference replay, comparators
(docs/preference.md §2.3; aliases of docs/preference.md §2.5)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.comparators.api_formats import API_FORMAT_ALIASES  # one table for config and client
from comlrl_lightning.config.checks import (
    bad_option,
    check_counts,
    check_optional_count,
    check_positive,
    is_int,
    is_number,
    normalize_choice,
)
from comlrl_lightning.config.devices import check_devices_exist
from comlrl_lightning.config.secrets import redact_secrets

REPLAY_MODE_ALIASES = {
    "current": "current", "latest": "current", "new": "current",
    "nearest_k": "nearest_k", "recent_k": "nearest_k", "last_k": "nearest_k", "k": "nearest_k",
    "all_history": "all_history",
    "lambda_decay": "lambda_decay", "lambda": "lambda_decay", "td_lambda": "lambda_decay",
    "td-lambda": "lambda_decay",
}
#: ``comparator_policy``: every policy, in the order messages list them, with the other names it accepts
#: (docs/preference.md §2.5). The one table of policies: the check below, its message and the source factory
#: (:func:`comlrl_lightning.comparators.local.build_comparator`, one source class per policy) all read it.
POLICIES: dict[str, tuple[str, ...]] = {
    "current": ("self", "online"),
    "current_copy": ("copy", "online_copy", "current-offload", "current_offload"),
    "model": ("external", "comparator", "reference", "ref"),
    "history": ("checkpoint", "previous", "previous_iteration"),
    "api": ("http", "endpoint"),
}
COMPARATOR_POLICY_ALIASES = {name: policy for policy, aliases in POLICIES.items() for name in (policy, *aliases)}
POLICY_CHOICES_MESSAGE = f"comparator_policy must be one of: {', '.join(POLICIES)}."
GENERATION_MODE_ALIASES = {
    "decentralized": "decentralized", "decentralised": "decentralized", "multi_agent": "decentralized",
    "multi-agent": "decentralized",
    "centralized": "centralized", "centralised": "centralized", "single_agent": "centralized",
    "single-agent": "centralized",
}


@dataclass
class IterativePreferenceOptions:
    """Options shared by the iterative trainers (docs/preference.md §2.3)."""

    num_iterations: int = 6
    """Preference-refresh rounds."""
    preference_replay_mode: str = "current"
    """current, nearest_k, all_history or lambda_decay (aliases in docs/preference.md §2.5)."""
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
    """generic, openai, anthropic or openai_responses (aliases in docs/preference.md §2.5)."""
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
        check_counts(self, ("num_iterations",))
        mode = normalize_choice(
            "preference_replay_mode", self.preference_replay_mode, REPLAY_MODE_ALIASES, "current",
            "preference_replay_mode must be one of: current, nearest_k, all_history, lambda_decay.")
        self.preference_replay_mode = mode
        k, lam, size = self.preference_replay_k, self.preference_replay_lambda, self.preference_replay_sample_size
        if mode == "current":
            if k not in (None, 1):
                raise bad_option("preference_replay_k must be null or 1 when preference_replay_mode='current'.", k,
                                 "null, 1")
            if size is not None:
                raise bad_option("preference_replay_sample_size is only valid when preference_replay_mode is "
                                 "'nearest_k', 'all_history', or 'lambda_decay'.", size, "null")
        elif mode == "nearest_k":
            if k is None:
                raise bad_option("preference_replay_k is required when preference_replay_mode='nearest_k'.", k,
                                 "integers >= 1")
            if not is_int(k) or k < 1:
                raise bad_option("preference_replay_k must be >= 1.", k, "integers >= 1")
        elif k is not None:
            raise bad_option("preference_replay_k is only valid when preference_replay_mode='nearest_k'.", k, "null")
        if mode == "lambda_decay":
            if lam is None:
                raise bad_option("preference_replay_lambda is required when preference_replay_mode='lambda_decay'.",
                                 lam, "numbers in [0, 1]")
            if not is_number(lam) or not 0.0 <= lam <= 1.0:
                raise bad_option("preference_replay_lambda must be in [0, 1].", lam, "numbers in [0, 1]")
        elif lam is not None:
            raise bad_option("preference_replay_lambda is only valid when preference_replay_mode='lambda_decay'.",
                             lam, "null")
        if mode != "current":
            check_optional_count("preference_replay_sample_size", size)
        policy = normalize_choice(
            "comparator_policy", self.comparator_policy, COMPARATOR_POLICY_ALIASES, "current", POLICY_CHOICES_MESSAGE)
        self.comparator_policy = policy
        gen = normalize_choice(
            "comparator_generation_mode", self.comparator_generation_mode, GENERATION_MODE_ALIASES,
            "decentralized", "comparator_generation_mode must be one of: decentralized, centralized.")
        if getattr(self, "collaboration_mode", "decentralized") == "centralized":
            gen = "centralized"  # a joint learner's comparator writes joint texts too (docs/coming-from-comlrl.md)
        self.comparator_generation_mode = gen
        if gen == "centralized":
            idx = self.comparator_centralized_agent_index
            if idx < 0:
                raise bad_option("comparator_centralized_agent_index must be >= 0.", idx, f"0..{self.num_agents - 1}")
            if idx >= self.num_agents:
                raise bad_option("comparator_centralized_agent_index must be smaller than num_agents.", idx,
                                 f"0..{self.num_agents - 1}")
        check_devices_exist(self, "comparator_devices")
        check_optional_count("comparator_num_candidates", self.comparator_num_candidates)
        check_optional_count("comparator_api_max_n_per_request", self.comparator_api_max_n_per_request)
        has_model = self.comparator_model_name is not None or self.comparator_agents is not None
        if policy == "model" and not has_model:
            raise bad_option("comparator_model_name or comparator_agents is required when comparator_policy='model'.",
                             None, "a model id/path, or a list of them")
        if policy in ("current", "current_copy", "history") and has_model:
            raise bad_option(
                "comparator_model_name and comparator_agents are only valid when comparator_policy='model'.",
                self.comparator_model_name or self.comparator_agents, "null")
        if self.comparator_agents is not None:
            n = len(self.comparator_agents)
            if gen == "centralized" and n not in (1, self.num_agents):
                raise bad_option("comparator_agents length must be 1 or num_agents when "
                                 "comparator_generation_mode='centralized'.", n, f"1 or {self.num_agents}")
            if gen == "decentralized" and n != self.num_agents:
                raise bad_option("comparator_agents length must equal num_agents.", n, str(self.num_agents))
        if policy == "history":
            if self.comparator_history_k is None:
                self.comparator_history_k = 1
            if not is_int(self.comparator_history_k) or self.comparator_history_k < 1:
                raise bad_option("comparator_history_k must be >= 1.", self.comparator_history_k, "integers >= 1")
        elif self.comparator_history_k is not None:
            raise bad_option("comparator_history_k is only valid when comparator_policy='history'.",
                             self.comparator_history_k, "null")
        # docs/decisions.md, decision 1: the API format is validated here (upstream silently falls back to generic).
        self.comparator_api_format = normalize_choice(
            "comparator_api_format", self.comparator_api_format, API_FORMAT_ALIASES, "generic",
            "comparator_api_format must be one of: generic, openai, anthropic, openai_responses.")
        if policy == "api" and not self.comparator_api_url:
            raise bad_option("comparator_api_url is required when comparator_policy='api'.", self.comparator_api_url,
                             "an http(s) URL")
        check_positive("comparator_api_timeout", self.comparator_api_timeout)

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option, secrets redacted (:func:`~comlrl_lightning.config.secrets.redact_secrets`;
        the literal key reads "***")."""
        d = redact_secrets(asdict(self))
        if self.comparator_api_key:
            d["comparator_api_key"] = "***"
        return d

    def __repr__(self) -> str:  # never show a literal API key
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({items})"
