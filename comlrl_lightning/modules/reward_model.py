"""JointRewardModel: a causal-LM backbone with a scalar head, trained on preference pairs (docs/preference.md §8).

The backbone is the base model of ``AutoModelForCausalLM`` (the LM head is dropped: only the last layer's
hidden states are needed). The head is ``Linear(hidden_size, 1)`` with bias and PyTorch's default init, in
the backbone's dtype. With ``reward_length_features`` a second, bias-free ``Linear(F, 1)``
(zero-initialised, so training starts from the plain model) reads each agent's response length
(the F numbers of :func:`~comlrl_lightning.reward_model.response_length_features`) and its output is added
(``"add"``) or is the reward (``"only"``). A row's reward is
the head applied to the hidden state at its last non-padding token
(:func:`~comlrl_lightning.reward_model.last_token_pool`), so left- and right-padded batches give the same
scores. Position ids are derived from the attention mask when the backbone accepts them, so a text scores
the same alone or padded in a batch, also for absolute-position backbones.

Training is plain automatic optimization: per batch of B pairs one forward over the 2B joint texts
(chosen rows then rejected rows, as in the collate of
:class:`~comlrl_lightning.data.reward_model.RewardPairDataModule`), the Bradley–Terry loss
``mean_b −log σ(r_chosen,b − r_rejected,b)``, one AdamW step (lr ``reward_learning_rate``) per batch.

Fresh model per round (MARLHFIter, docs/preference.md §8.3): :meth:`JointRewardModel.fresh` builds a new module from the
same source (reloaded from disk, or a new deep copy of the pristine model object) with a new head;
:meth:`JointRewardModel.reinitialize` does the same in place. Nothing is shared with the trained model, and
a new ``Trainer.fit`` creates a new optimizer.
"""

from __future__ import annotations

import copy
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn

from comlrl_lightning.agents import load_model, load_tokenizer, prepare_tokenizer
from comlrl_lightning.config.reward_model import RewardModelOptions
from comlrl_lightning.losses import bradley_terry_loss, bradley_terry_stats
from comlrl_lightning.modules.base import default_adamw, save_redacted_hyperparameters
from comlrl_lightning.modules.checkpoint_seal import seal_checkpoint, verify_checkpoint
from comlrl_lightning.reward_model import (
    check_prompt_part_fits,
    encode_joint_texts,
    infer_hidden_size,
    joint_reward_text,
    last_token_pool,
    num_length_features,
    resolve_max_length,
    response_length_features,
)


def _base_model(model: nn.Module) -> nn.Module:
    """The transformer under a causal-LM head (``model.base_model``); a base model is returned as is."""
    base = getattr(model, "base_model", None)
    return base if isinstance(base, nn.Module) else model


class JointRewardModel(L.LightningModule):
    """Scalar reward of a joint multi-agent response (docs/preference.md §8).

    Args:
        model: the backbone source: a hub id, a local folder, ``embedded:tiny``, or a model object (a causal
            LM or its base model; it is deep-copied, the caller's object is never trained). None uses
            ``args.reward_model_name``.
        tokenizer: the tokenizer (required with a model object; loaded from the source otherwise). Without a
            pad token it pads with EOS; with neither it is an error.
        args: :class:`~comlrl_lightning.reward_model.RewardModelOptions`.
        model_config: load kwargs (``dtype``, ``attn_implementation``, ``model_kwargs``) for string sources.
        lora: peft ``LoraConfig`` kwargs; the backbone gets a LoRA adapter and only adapter + head train.
        seed: when set, the head (and LoRA) init uses this seed, so two builds with the same seed are equal;
            None draws from the global torch RNG (``seed_everything``).
        num_agents: responses per joint text; required with ``args.reward_length_features`` (the length head
            reads ``num_length_features(num_agents)`` features).

    Metrics: ``train/reward_model/{loss,accuracy,margin}`` per step, and
    ``val/reward_model/{loss,accuracy,margin}`` per epoch when the datamodule has eval pairs.
    """

    def __init__(
        self,
        model: str | nn.Module | None = None,
        tokenizer: Any = None,
        args: RewardModelOptions | None = None,
        model_config: dict | None = None,
        lora: dict | None = None,
        seed: int | None = None,
        num_agents: int | None = None,
    ):
        super().__init__()
        self.args = args if args is not None else RewardModelOptions()
        if not isinstance(self.args, RewardModelOptions):
            raise TypeError(f"args must be a RewardModelOptions; got {type(self.args).__name__}.")
        source = model if model is not None else self.args.reward_model_name
        if source is None:
            raise ValueError(
                "reward_model_name must be provided: pass model= (a hub id, a local folder, 'embedded:tiny' "
                "or a model object with its tokenizer) or set args.reward_model_name."
            )
        if not isinstance(source, (str, nn.Module)):
            raise TypeError(f"model must be a model name, path or torch module; got {type(source).__name__}.")
        if lora is not None and self.args.reward_freeze_backbone:
            raise ValueError(
                "reward_freeze_backbone=True cannot be combined with lora: a frozen backbone trains only the "
                "head, a LoRA backbone trains its adapter and the head. Drop one of the two."
            )
        mode = self.args.reward_length_features
        if mode != "off" and (isinstance(num_agents, bool) or not isinstance(num_agents, int) or num_agents < 1):
            raise ValueError(
                f"reward_length_features={mode!r} needs num_agents (responses per joint text, >= 1); got "
                f"{num_agents!r}. Pass JointRewardModel(..., num_agents=N); the MARLHF trainers pass the number "
                "of agents."
            )
        self.num_agents = num_agents
        if isinstance(source, str):
            save_redacted_hyperparameters(self, ignore=["tokenizer"])
        else:
            save_redacted_hyperparameters(self, ignore=["model", "tokenizer"])
        # Kept in a tuple so that Lightning does not register the pristine object as a submodule.
        self._source: tuple[str | nn.Module] = (source,)
        self._model_config = model_config
        self._lora = dict(lora) if lora is not None else None
        self._seed = seed
        if tokenizer is None:
            if not isinstance(source, str):
                raise ValueError("A tokenizer must be provided when the reward model is a model object.")
            tokenizer = load_tokenizer(source)
        self.tokenizer = prepare_tokenizer(tokenizer)
        self.backbone, self.head, self.length_head = self._build(seed)

    # --- construction ------------------------------------------------------------------------------------
    def _build(self, seed: int | None) -> tuple[nn.Module, nn.Linear, nn.Linear | None]:
        source = self._source[0]
        if isinstance(source, str):
            backbone = _base_model(load_model(source, self._model_config))
        else:
            backbone = _base_model(copy.deepcopy(source))
        hidden = infer_hidden_size(getattr(backbone, "config", None))
        ref = next(backbone.parameters(), None)
        with torch.random.fork_rng(devices=[], enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            if self._lora is not None:
                from peft import LoraConfig, get_peft_model

                backbone = get_peft_model(backbone, LoraConfig(**self._lora))
            head = nn.Linear(hidden, 1)
        length_head = None
        if self.args.reward_length_features != "off":
            length_head = nn.Linear(num_length_features(self.num_agents), 1, bias=False)
            nn.init.zeros_(length_head.weight)
        if ref is not None:
            head = head.to(device=ref.device, dtype=ref.dtype)
            if length_head is not None:
                length_head = length_head.to(device=ref.device, dtype=ref.dtype)
        if self.args.reward_freeze_backbone or self.args.reward_length_features == "only":
            backbone.requires_grad_(False)
        backbone.train()
        return backbone, head, length_head

    def fresh(self, seed: int | None = None) -> JointRewardModel:
        """A brand-new model from the same source and options (new backbone, new head, no shared tensors).

        ``seed`` defaults to this model's ``seed``; with the same seed the result equals this model as it
        was first built.
        """
        return JointRewardModel(
            self._source[0], self.tokenizer, copy.deepcopy(self.args), copy.deepcopy(self._model_config),
            copy.deepcopy(self._lora), self._seed if seed is None else seed, self.num_agents,
        ).to(self.device)

    def reinitialize(self, seed: int | None = None) -> None:
        """Replace backbone and head in place by freshly built ones (see :meth:`fresh`).

        Call it between fits: a new ``Trainer.fit`` then builds a new optimizer over the new parameters.
        """
        if self._trainer is not None and self.trainer.training:
            raise RuntimeError("reinitialize() cannot run inside Trainer.fit; call it between fits.")
        self.backbone, self.head, self.length_head = self._build(self._seed if seed is None else seed)
        self.to(self.device)

    @property
    def max_length(self) -> int | None:
        """Truncation length: ``reward_max_length``, else the tokenizer's, else the backbone's positions."""
        fallback = getattr(getattr(self.backbone, "config", None), "max_position_embeddings", None)
        return resolve_max_length(self.tokenizer, self.args.reward_max_length, fallback)

    # --- scoring -----------------------------------------------------------------------------------------
    def _accepts_position_ids(self) -> bool:
        target = self.backbone.get_base_model() if hasattr(self.backbone, "get_base_model") else self.backbone
        try:
            return "position_ids" in inspect.signature(target.forward).parameters
        except (TypeError, ValueError):
            return False

    def forward(self, batch: Sequence[str] | dict[str, Tensor]) -> Tensor:
        """Rewards of joint texts (tokenized here) or of a tokenized batch.

        Args:
            batch: a list of B texts, or a dict with ``input_ids`` and ``attention_mask`` ``[B, T]`` (and, for a
                length-aware head, ``length_features`` ``[B, F]``).

        Returns:
            ``[B]`` rewards (with grad in training).
        """
        if isinstance(batch, str):
            raise TypeError("JointRewardModel expects a list of texts or a tokenized batch, not one string.")
        if self.length_head is not None and not (isinstance(batch, dict) and "length_features" in batch):
            raise ValueError(
                f"reward_length_features={self.args.reward_length_features!r}: the head needs each agent's response, "
                "so pass a tokenized batch with length_features (RewardPairDataModule builds them) or score joint "
                "responses with score()."
            )
        if not isinstance(batch, dict):
            batch = encode_joint_texts(self.tokenizer, list(batch), self.max_length)
        if self.args.reward_length_features == "only":
            return self._length_reward(batch["length_features"], batch["input_ids"].shape[0])
        input_ids = batch["input_ids"].to(self.device)
        mask = batch["attention_mask"].to(self.device)
        kwargs: dict[str, Any] = {"input_ids": input_ids, "attention_mask": mask, "use_cache": False}
        if self._accepts_position_ids():
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp(min=0)
        frozen = not any(p.requires_grad for p in self.backbone.parameters())
        with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen):
            out = self.backbone(**kwargs)
        hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
        reward = self.head(last_token_pool(hidden, mask)).squeeze(-1)
        if self.length_head is not None:
            reward = reward + self._length_reward(batch["length_features"], reward.shape[0])
        return reward

    def _length_reward(self, feats: Tensor, rows: int) -> Tensor:
        """``[B]`` output of the length head on ``feats`` ``[B, F]``."""
        if feats.shape != (rows, self.length_head.in_features):
            raise ValueError(
                f"length_features has shape {tuple(feats.shape)}; this length-aware head expects "
                f"[{rows}, {self.length_head.in_features}] (response_length_features for num_agents={self.num_agents})."
            )
        w = self.length_head.weight
        return self.length_head(feats.to(device=w.device, dtype=w.dtype)).squeeze(-1)

    @torch.no_grad()
    def score(
        self,
        prompts_per_pair: Sequence[Sequence[str]],
        completions_per_pair: Sequence[Sequence[str]],
        batch_size: int = 16,
    ) -> list[float]:
        """Rewards of joint responses (docs/preference.md §8.4-8.5): entry j scores ``completions_per_pair[j]`` given
        ``prompts_per_pair[j]`` (one text per agent), in eval mode and without grad. The training mode is
        restored afterwards.

        Raises ValueError when the lists differ in length or ``reward_max_length`` leaves no room for the
        responses of a sample (see :func:`~comlrl_lightning.reward_model.check_prompt_part_fits`).
        """
        if len(prompts_per_pair) != len(completions_per_pair):
            raise ValueError(
                f"score got {len(prompts_per_pair)} prompt lists but {len(completions_per_pair)} completion "
                "lists; pass one of each per joint response."
            )
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1; got {batch_size}.")
        max_length = self.max_length
        checked: set[tuple[str, ...]] = set()
        texts, feats = [], []
        for j, (prompts, comps) in enumerate(zip(prompts_per_pair, completions_per_pair)):
            if isinstance(prompts, str) or isinstance(comps, str):
                raise TypeError(f"joint response {j}: prompts and completions must be lists (one per agent).")
            n = max(len(prompts), len(comps))
            key = (str(n), *map(str, prompts))
            if key not in checked:  # RL samples of one item share prompts: check each prompt set once
                check_prompt_part_fits(self.tokenizer, prompts, n, max_length, f"joint response {j}")
                checked.add(key)
            texts.append(joint_reward_text(prompts, comps))
            if self.length_head is not None:
                if len(comps) > self.num_agents:
                    raise ValueError(f"joint response {j} has {len(comps)} responses; this length-aware reward "
                                     f"model was built for num_agents={self.num_agents}.")
                feats.append(response_length_features(comps, self.num_agents))
        was_training = self.training
        self.eval()
        try:
            out: list[float] = []
            for start in range(0, len(texts), batch_size):
                batch = encode_joint_texts(self.tokenizer, texts[start:start + batch_size], max_length)
                if feats:
                    batch["length_features"] = torch.tensor(feats[start:start + batch_size])
                out.extend(self(batch).float().cpu().tolist())
        finally:
            self.train(was_training)
        return out

    # --- training ----------------------------------------------------------------------------------------
    def _pair_step(self, batch: dict[str, Any], stage: str) -> Tensor:
        b = int(batch["pair_index"].numel())
        rewards = self(batch)
        chosen, rejected = rewards[:b], rewards[b:]
        per_pair = bradley_terry_loss(chosen, rejected)
        if not torch.isfinite(per_pair.detach()).all():
            bad = ~torch.isfinite(per_pair.detach().cpu())
            raise FloatingPointError(
                f"Reward-model loss is not finite for {stage} pair(s) {batch['pair_index'][bad].tolist()} "
                f"(rewards chosen {chosen.detach()[bad].tolist()}, "
                f"rejected {rejected.detach()[bad].tolist()}). Lower reward_learning_rate or check the pairs."
            )
        loss = per_pair.mean()
        stats = bradley_terry_stats(chosen, rejected)
        on_step = stage == "train"
        self.log_dict(
            {f"{stage}/reward_model/loss": loss.detach(), f"{stage}/reward_model/accuracy": stats["accuracy"],
             f"{stage}/reward_model/margin": stats["margin"]},
            batch_size=b, on_step=on_step, on_epoch=not on_step, prog_bar=False,
        )
        if on_step:  # the progress bar shows the loss, as for the team modules
            self.log("loss", loss.detach(), prog_bar=True, logger=False, batch_size=b)
        return loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._pair_step(batch, "train")

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        return self._pair_step(batch, "val")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        seal_checkpoint(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        verify_checkpoint(self, checkpoint)

    def save_reward_model(self, output_dir: str | Path) -> Path:
        """Write the model to ``output_dir``: ``backbone/`` (save_pretrained + tokenizer; ``backbone.pt`` for a torch
        module without save_pretrained), ``head.pt`` (+ ``length_head.pt``) and ``reward_model.json`` (class, options,
        num_agents, how to load). Returns the folder."""
        folder = Path(output_dir)
        folder.mkdir(parents=True, exist_ok=True)
        if hasattr(self.backbone, "save_pretrained"):  # a Hugging Face or peft model; else a plain torch module
            self.backbone.save_pretrained(str(folder / "backbone"))
        else:
            torch.save(self.backbone.state_dict(), folder / "backbone.pt")
        self.tokenizer.save_pretrained(str(folder / "backbone"))
        torch.save({k: v.detach().cpu() for k, v in self.head.state_dict().items()}, folder / "head.pt")
        if self.length_head is not None:  # reward_length_features: the length-aware head
            torch.save({k: v.detach().cpu() for k, v in self.length_head.state_dict().items()},
                       folder / "length_head.pt")
        (folder / "reward_model.json").write_text(json.dumps({
            "class": f"{type(self).__module__}.{type(self).__name__}",
            "options": self.args.to_dict(),
            "num_agents": self.num_agents,
            "load": "JointRewardModel(model='<folder>/backbone', args=RewardModelOptions(**options), "
                    "num_agents=num_agents); head.load_state_dict(torch.load('<folder>/head.pt')) (and length_head "
                    "from length_head.pt when present)",
        }, indent=2) + "\n")
        return folder

    def configure_model(self) -> None:
        """The reward model's own fit is not sharded: under ``ModelParallelStrategy`` (FSDP2) it is refused here
        with a pointer, instead of Lightning's request to implement this hook. MARLHF under FSDP2 fits it on each
        rank in a single-process fit and shards it after (docs/scaling.md, "FSDP2")."""
        from comlrl_lightning.sharding import data_parallel_mesh

        if self._trainer is not None and data_parallel_mesh(self._trainer) is not None:
            raise ValueError("JointRewardModel fit with ModelParallelStrategy (FSDP2) is not supported: the reward "
                             "model trains whole. Fit it with strategy='auto' (one device) or 'ddp'; MARLHFTrainer "
                             "under ModelParallelStrategy fits it on each rank that way and shards it for scoring "
                             "(docs/scaling.md, \"FSDP2\").")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        if not params:
            raise ValueError("JointRewardModel has no trainable parameters.")
        return default_adamw(params, self.args.reward_learning_rate)

    def on_fit_start(self) -> None:
        t = self.trainer
        if t.max_steps == -1 and t.max_epochs != self.args.reward_num_train_epochs:
            rank_zero_warn(
                f"Trainer max_epochs={t.max_epochs} differs from reward_num_train_epochs="
                f"{self.args.reward_num_train_epochs}; the Trainer's value is used. Pass "
                "max_epochs=args.reward_num_train_epochs (or use fit_reward_model) to follow the option."
            )


def fit_reward_model(
    model: JointRewardModel,
    train_pairs: Any,
    eval_pairs: Any = None,
    trainer_kwargs: dict | None = None,
    **datamodule_kwargs: Any,
) -> dict[str, float]:
    """Train ``model`` on pairs for ``reward_num_train_epochs`` epochs; return the final logged metrics.

    ``train_pairs`` / ``eval_pairs`` (and ``datamodule_kwargs``): what
    :class:`~comlrl_lightning.data.reward_model.RewardPairDataModule` takes. ``trainer_kwargs`` go to
    ``lightning.Trainer`` (``max_epochs`` defaults to the option). The model is left in eval mode, as
    upstream leaves it after training.
    """
    from comlrl_lightning.data.reward_model import RewardPairDataModule

    kwargs = {"max_epochs": model.args.reward_num_train_epochs, **(trainer_kwargs or {})}
    trainer = L.Trainer(**kwargs)
    trainer.fit(model, datamodule=RewardPairDataModule(train_pairs, eval_pairs, **datamodule_kwargs))
    model.eval()
    return {k: float(v) for k, v in trainer.callback_metrics.items() if k != "loss"}  # "loss": progress bar only
