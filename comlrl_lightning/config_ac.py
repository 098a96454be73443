"""Configs of the actor-critic trainers: :class:`IACConfig` and :class:`MAACConfig` (spec multiturn.md §1.2–1.3).

Option names and defaults are CoMLRL 1.4.3's, except ``early_termination_threshold`` (None) and
``num_turns`` (1), our decision 10: a single-turn run needs no transition. Every option is validated at
construction; messages name the option, the value and what is allowed, and start with upstream's sentence
where upstream has one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from comlrl_lightning.config import _bad, check_counts, check_sampling, normalize_parallel_training


def _device_count(spec: Any) -> int | None:
    """Entries of a device spec: None for None/"auto"/a single string (any count), else the list length."""
    if spec is None or isinstance(spec, str):
        return None
    return len(list(spec))


@dataclass
class _ActorCriticOptions:
    """Options shared by IAC and MAAC (spec §1.2; MAAC differences in §1.3)."""

    agent_learning_rate: float = 5e-6
    """Actor AdamW learning rate (IAC attached-head mode: also the value heads')."""
    critic_learning_rate: float | None = 5e-6
    """Critic AdamW learning rate (IAC: None → ``agent_learning_rate``)."""
    rollout_buffer_size: int = 8
    """Samples per agent before an update; the whole buffer is drained then."""
    train_batch_size: int | None = None
    """Minibatch size, in samples, inside one update (None → ``rollout_buffer_size``)."""
    value_loss_coef: float = 0.6
    """Weight of the critic's squared error."""
    advantage_normalization: bool = True
    """Z-normalise advantages over all samples of one agent and turn in a drain."""
    max_new_tokens: int = 256
    """Generation length."""
    temperature: float = 0.6
    """Sampling temperature."""
    top_p: float = 0.6
    """Nucleus sampling threshold."""
    top_k: int | None = None
    """Top-k sampling; None disables it."""
    num_train_epochs: int = 40
    """Passes over the train dataset."""
    critic_type: str = "v"
    """"v": V(h), the value at the last prompt token; "q": Q(h, a), at the last response token. Case-insensitive."""
    num_agents: int = 2
    """Number of agents N (used by the trainer)."""
    num_turns: int = 1
    """Turns per episode T; > 1 needs an ``external_transition`` (default 1, decision 10; upstream: 2)."""
    parallel_training: str = "none"
    """"none" or "mp" (accepted for compatibility; placement follows the Lightning accelerator, decision 7)."""
    agent_devices: Any = None
    """Device spec of the actors (required by "mp")."""
    critic_devices: Any = None
    """Device spec of the critics (required by "mp" when there are separate critics)."""
    external_prompt_passthrough: bool = False
    """Multi-turn: use the transition's strings as prompts, with no formatter."""
    discount: float = 1.0
    """γ of the one-step TD target (multi-turn only)."""
    num_generations: int = 1
    """Samples per agent per prompt (single-turn only; must be 1 when ``num_turns > 1``)."""
    eval_interval: int = 16
    """Evaluate before every k-th training item (0 = never; a final evaluation runs when eval data exists)."""
    eval_num_samples: int = 4
    """Evaluation items per evaluation."""
    eval_batch_size: int = 1
    """Evaluation items generated together."""
    early_termination_threshold: float | None = None
    """Stop an episode after a turn whose mean reward is > this (None = off, decision 10; upstream: -0.2)."""
    logging_steps: int = 1
    """Minimum env-step distance between two training-metric logs."""
    reference_kl_enabled: bool = False
    """Subtract β · KL(π‖π_ref) from each reward (frozen copies of the initial agents)."""
    reference_kl_coef: float = 0.1
    """β of the reference-KL penalty (>= 0, checked even when the KL is off)."""
    reference_devices: Any = None
    """Devices of the reference models (default: each agent's device)."""
    # --- ours -------------------------------------------------------------------------------------------
    seed: int = 0
    """Seed of the sampling streams and of the minibatch shuffles."""

    _method = "AC"

    def _separate_critics(self) -> bool:
        return True

    def __post_init__(self) -> None:
        method = self._method
        check_counts(self, ("rollout_buffer_size", "num_agents", "num_turns", "eval_batch_size", "logging_steps",
                            "num_train_epochs", "max_new_tokens"), ("eval_interval", "eval_num_samples"))
        if self.train_batch_size is None:
            self.train_batch_size = self.rollout_buffer_size
        if not isinstance(self.train_batch_size, int) or self.train_batch_size < 1:
            raise _bad("train_batch_size must be >= 1.", self.train_batch_size, "integers >= 1 or null")
        if not isinstance(self.num_generations, int) or self.num_generations < 1:
            raise _bad("num_generations must be >= 1.", self.num_generations, "integers >= 1")
        if self.num_turns > 1 and self.num_generations != 1:
            raise _bad(
                f"Multi-turn {method} currently supports num_generations == 1 (num_turns={self.num_turns}): "
                "a multi-turn episode is a single trajectory. Set num_generations=1, or num_turns=1 to sample "
                "several completions per prompt.", self.num_generations, "1 when num_turns > 1")
        ct = str(self.critic_type).strip().lower() if self.critic_type is not None else ""
        if ct not in ("v", "q"):
            raise _bad("critic_type must be one of: 'v', 'q'.", self.critic_type, "'v', 'q' (case-insensitive)")
        self.critic_type = ct
        normalize_parallel_training(self)
        pt = self.parallel_training
        if pt == "mp":
            if self._separate_critics() and self.critic_devices is None:
                raise _bad("parallel_training='mp' requires explicit critic_devices.", self.critic_devices,
                           "a device string or a list of device strings")
        for name, expected in (("agent_devices", self.num_agents), ("critic_devices", self._critic_count())):
            count = _device_count(getattr(self, name))
            if pt != "mp" and count:
                continue  # "none": the first entry is used, as upstream's resolve_single_device does
            if count is not None and count not in (1, expected):
                raise _bad(f"{name} length ({count}) must be 1 or {expected}.", getattr(self, name),
                           f"a device string or a list of length 1 or {expected}")
            if count == 0:
                raise _bad(f"{name} must be a non-empty list or 'auto'.", getattr(self, name), "non-empty lists")
        if self.reference_kl_coef is None or not self.reference_kl_coef >= 0:
            raise _bad("reference_kl_coef must be >= 0.", self.reference_kl_coef, "numbers >= 0")
        if self.reference_kl_enabled:
            count = _device_count(self.reference_devices)
            if count is not None and count not in (1, self.num_agents):
                raise _bad(f"reference_devices length ({count}) must be 1 or N (N={self.num_agents}).",
                           self.reference_devices, f"a device string or a list of length 1 or {self.num_agents}")
        if self.early_termination_threshold is not None:
            try:
                self.early_termination_threshold = float(self.early_termination_threshold)
            except (TypeError, ValueError):
                raise _bad("early_termination_threshold must be a number or null.",
                           self.early_termination_threshold, "numbers or null") from None
        check_sampling(self)
        if not self.agent_learning_rate > 0:
            raise _bad("agent_learning_rate must be > 0.", self.agent_learning_rate, "numbers > 0")
        if not self.value_loss_coef >= 0:
            raise _bad("value_loss_coef must be >= 0.", self.value_loss_coef, "numbers >= 0")
        if not 0 <= self.discount <= 1:
            raise _bad("discount must be in [0, 1].", self.discount, "numbers in [0, 1]")

    def _critic_count(self) -> int:
        return self.num_agents

    def to_dict(self) -> dict[str, Any]:
        """Plain-type dict of every option (for logging and checkpoints)."""
        return asdict(self)


@dataclass
class IACConfig(_ActorCriticOptions):
    """Independent actor-critic (spec multiturn.md §1.2): one critic per actor.

    The critic is a separate causal LM with a value head (``use_separate_critic=True``) or a value head on the
    actor itself (``False``; the actor optimizer then also trains the head).
    """

    use_separate_critic: bool = True
    """True: one separate critic model per agent. False: a value head attached to each actor."""
    value_clip_range: float | None = 0.2
    """PPO-style value clipping ε; applied only to attached value heads (upstream). None disables it."""
    critic_value_head_hidden_dim: int | None = None
    """Hidden projection (Linear + Tanh) of the separate critics' value head; None = a single Linear."""
    value_head_hidden_dim: int | None = None
    """Hidden projection of the attached value heads; None = a single Linear."""

    _method = "IAC"

    def _separate_critics(self) -> bool:
        return bool(self.use_separate_critic)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_learning_rate is None:
            self.critic_learning_rate = self.agent_learning_rate
        if not self.critic_learning_rate > 0:
            raise _bad("critic_learning_rate must be > 0.", self.critic_learning_rate, "numbers > 0 or null")
        if self.value_clip_range is not None and not self.value_clip_range > 0:
            raise _bad("value_clip_range must be > 0 or null.", self.value_clip_range, "numbers > 0 or null")
        for name in ("critic_value_head_hidden_dim", "value_head_hidden_dim"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise _bad(f"{name} must be >= 1 or null.", value, "integers >= 1 or null")


@dataclass
class MAACConfig(_ActorCriticOptions):
    """Multi-agent actor-critic with one centralised critic over the joint history (and joint action).

    Same options as IAC except: no ``use_separate_critic``/``value_clip_range``/head dims (the critic head's
    hidden dim is ``model_config["critic_value_head_hidden_dim"]``), ``critic_learning_rate`` must be a number,
    and ``critic_devices`` names exactly one device in "mp" mode.
    """

    _method = "MAAC"

    def _critic_count(self) -> int:
        return 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.critic_learning_rate is None or not self.critic_learning_rate > 0:
            raise _bad("critic_learning_rate must be > 0 (MAAC does not fall back to agent_learning_rate).",
                       self.critic_learning_rate, "numbers > 0")
        if self.parallel_training == "mp" and _device_count(self.critic_devices) not in (None, 1):
            raise _bad("MAAC critic_devices must resolve to exactly one device.", self.critic_devices,
                       "one device string or a one-element list")
