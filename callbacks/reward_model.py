"""Reward-model callbacks of MARLHF: fit a JointRewardModel on preference pairs and make it the RL reward.

* :class:`LearnedRewardFit` (offline MARLHF, docs/preference.md §10): at fit start, collect pairs once with the task
  reward (:func:`~comlrl_lightning.preferences.collect_offline_pairs`), fit the reward model
  (:func:`~comlrl_lightning.modules.reward_model.fit_reward_model`, a nested ``Trainer.fit``), and set
  the module's training reward (``use_train_oracle``) to a
  :class:`~comlrl_lightning.reward_model.LearnedRewardOracle`. No pairs →
  a message and no RL.
* :class:`IterativeRewardModelFit` (MARLHFIter, round stage 4: after replay selection): at every round
  boundary, fit a **freshly built** reward model (new object, new head, new optimizer; nothing carried over)
  on the round's replay-selected training pairs and make it the module's training reward. A round without
  training pairs trains no RL (``use_train_oracle(None)``). With ``preference_scoring_reward="reward_model"``
  the latest fitted model also scores the next round's comparisons (``datamodule.use_preference_oracle``;
  the task reward until one exists).

Reward-model source: the ``reward_model`` argument (a JointRewardModel used as a template: every fit gets a
:meth:`~comlrl_lightning.modules.reward_model.JointRewardModel.fresh` copy, the template itself is never
trained), else ``args.reward_model_name``, else the agents' model name (``pl_module.reward_source``).
Device: ``args.reward_model_device``, else the module's device (the Lightning accelerator,
docs/decisions.md, decision 7).

Held-out pairs: ``val_fraction`` (default 0.1, whole prompt sets; 0 = train on every pair) of each fit's pairs
are held out; after every reward-model epoch the held-out accuracy is measured and the weights of the best
epoch are the ones kept (model selection: the tiny reward models of the built-in task memorise their few
distinct completions within an epoch or two, and an over-fitted model misleads RL).

Logs ``train/reward_model/{loss,accuracy,margin}`` (last step), ``val/reward_model/...`` (last epoch),
``reward_model/val_accuracy`` (the kept epoch's held-out accuracy, every fit), ``reward_model/num_pairs``
and ``reward_model/fits``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from comlrl_lightning.config.madpo import refuse_centralized_learner
from comlrl_lightning.distributed import world
from comlrl_lightning.logging_utils import log_metrics
from comlrl_lightning.protocols import RoundData, TaskSource, TeamModule, check_protocol
from comlrl_lightning.reward_model import LearnedRewardOracle, support_clip_bound
from comlrl_lightning.rounds import check_round_setup, next_round_at_epoch_end
from comlrl_lightning.sharding import shard_reward_model


def _inner_trainer_kwargs(device: torch.device, trainer: L.Trainer) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
                              "enable_model_summary": False, "num_sanity_val_steps": 0,
                              "default_root_dir": trainer.default_root_dir}
    if device.type == "cuda":
        kwargs.update(accelerator="gpu", devices=[device.index or 0])
    elif device.type == "mps":
        kwargs.update(accelerator="mps", devices=1)
    else:
        kwargs.update(accelerator="cpu", devices=1)
    return kwargs


class _KeepBestValAccuracy(L.Callback):
    """Inner-fit callback: after every validation epoch, keep a CPU copy of the weights when the held-out
    accuracy is the best so far (ties: the later epoch, trained longer); restore that copy at fit end.
    Model selection on held-out pairs: a reward model that starts to memorise its pairs stops improving
    there, and the RL stage then uses the epoch that generalised best."""

    def __init__(self) -> None:
        self.best: float | None = None
        self.state: dict | None = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        acc = trainer.callback_metrics.get("val/reward_model/accuracy")
        if acc is None or trainer.sanity_checking:
            return
        if self.best is None or float(acc) >= self.best:
            self.best = float(acc)
            self.state = {k: v.detach().to("cpu", copy=True) for k, v in pl_module.state_dict().items()}

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.state is not None:
            pl_module.load_state_dict(self.state)


class _PairCounts(L.Callback):
    """Inner-fit callback: how many pairs the reward model trains on and how many are held out (the split is the
    pair data module's, by whole prompt sets)."""

    def __init__(self) -> None:
        self.train: int | None = None
        self.held_out = 0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        dm = trainer.datamodule
        self.train = len(getattr(dm, "train_pairs", None) or [])
        self.held_out = len(getattr(dm, "eval_pairs", None) or [])


class _RewardModelFitting(L.Callback):
    """Shared part: resolve the source, build a fresh model, fit it, log, wrap it as an oracle."""

    sets_train_oracle = True

    def __init__(self, reward_model: Any = None, val_fraction: float = 0.1, seed: int | None = None,
                 trainer_kwargs: dict | None = None):
        self.reward_model = reward_model
        self.val_fraction = val_fraction
        self.seed = seed
        self.trainer_kwargs = dict(trainer_kwargs or {})
        self.fits = 0
        self.history: list[dict] = []
        self.current: Any = None  # the fitted JointRewardModel in use
        self.clip_max: float | None = None  # the current model's RL-reward bound (reward_clip_quantile)

    @contextlib.contextmanager
    def _refit_uncounted(self) -> Iterator[None]:
        """A refit at resume rebuilds the model the checkpoint did not hold: it is not a new fit, so ``fits`` and
        ``history`` stay as the original run left them."""
        fits, history = self.fits, list(self.history)
        try:
            yield
        finally:
            self.fits, self.history = fits, history

    def _setup(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        check_protocol(pl_module, TeamModule, type(self).__name__, "module", "MARLHFModule or MARLHFActorCriticModule")
        check_protocol(trainer.datamodule, TaskSource, type(self).__name__, "data module",
                       "TaskDataModule or MARLHFIterDataModule")
        refuse_centralized_learner(pl_module.args, type(self).__name__)
        if self.reward_model is None and pl_module.args.reward_model_name is None \
                and getattr(pl_module, "reward_source", None) is None:
            raise ValueError(
                "reward_model_name must be provided when agent models are objects: the agents have no model name "
                "the reward backbone could be loaded from. Set args.reward_model_name='<hub id or folder>' "
                "(e.g. 'embedded:tiny'), or pass reward_model=JointRewardModel(model_object, tokenizer)."
            )

    def device(self, pl_module: L.LightningModule) -> torch.device:
        spec = pl_module.args.reward_model_device
        return torch.device(spec) if spec is not None else pl_module.device

    def build(self, pl_module: L.LightningModule, seed: int) -> Any:
        """A freshly initialised reward model (new object: new backbone copy, new head)."""
        from comlrl_lightning.modules.reward_model import JointRewardModel

        template = self.reward_model
        if isinstance(template, JointRewardModel):
            return template.fresh(seed).to(self.device(pl_module))
        source = template or pl_module.args.reward_model_name or pl_module.reward_source
        model = JointRewardModel(source, args=pl_module.args.reward_model_options(),
                                 model_config=getattr(pl_module, "model_config", None), seed=seed,
                                 num_agents=pl_module.team.num_agents)
        return model.to(self.device(pl_module))

    def fit(self, trainer: L.Trainer, pl_module: L.LightningModule, pairs: list, seed: int) -> Any:
        """Build a fresh model, fit it on ``pairs`` for reward_num_train_epochs, return it (eval mode).

        Pairs with a side whose completions are all empty (a policy that stopped at once) cannot be scored by
        the reward-pair data module; they are dropped with a warning. Returns None when no pair is left.
        """
        from comlrl_lightning.modules import reward_model as rm_module

        kept = [p for p in pairs if all(any((c or "").strip() for c in side)
                                        for side in (p.winner_completions, p.loser_completions))]
        if len(kept) < len(pairs):
            rank_zero_warn(f"{len(pairs) - len(kept)} of {len(pairs)} preference pairs have a side whose completions "
                           "are all empty; they are left out of the reward-model fit.")
        log_metrics(trainer, {"reward_model/dropped_empty_pairs": len(pairs) - len(kept)})
        pairs = kept
        if not pairs:
            rank_zero_info("No usable preference pairs for the reward model; none is fitted.")
            return None
        model = self.build(pl_module, seed)
        device = self.device(pl_module)
        kwargs = {**_inner_trainer_kwargs(device, trainer), **self.trainer_kwargs}
        dm_kwargs: dict[str, Any] = {"seed": seed}
        best, counts = _KeepBestValAccuracy(), _PairCounts()
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), counts]
        if self.val_fraction and len(pairs) >= 2:
            dm_kwargs["val_fraction"] = self.val_fraction
            kwargs["callbacks"].append(best)
        metrics = rm_module.fit_reward_model(model, pairs, trainer_kwargs=kwargs, **dm_kwargs)
        model.to(device)  # the inner Trainer's teardown may have moved it to the CPU
        model.eval()
        self.fits += 1
        self.current = model
        out = {k: v for k, v in metrics.items() if "reward_model/" in k}
        out.update({"reward_model/num_pairs": len(pairs), "reward_model/fits": self.fits})
        if best.best is not None:  # held-out accuracy of the weights kept (the best epoch)
            out["reward_model/val_accuracy"] = best.best
        self.clip_max = self._clip_bound(pl_module, model, pairs)
        shard_reward_model(model, trainer)  # FSDP2 (ModelParallelStrategy): 1/W of the backbone per rank while scoring
        if self.clip_max is not None:
            out["reward_model/clip_max"] = self.clip_max
        self.history.append(out)
        log_metrics(trainer, out)
        acc = out.get("train/reward_model/accuracy")
        trained = len(pairs) if counts.train is None else counts.train
        split = f" ({counts.held_out} more held out for validation)" if counts.held_out else ""
        rank_zero_info(f"Reward model fitted on {trained} pairs{split} ({model.args.reward_num_train_epochs} epoch(s))"
                       + (f"; last-step train accuracy {acc:.3f}" if acc is not None else "")
                       + (f", held-out accuracy {out['reward_model/val_accuracy']:.3f} (best epoch kept)"
                          if "reward_model/val_accuracy" in out else "") + ".")
        return model

    @staticmethod
    def _clip_bound(pl_module: L.LightningModule, model: Any, pairs: list) -> float | None:
        """``reward_clip_quantile`` of the fitted model's scores on both sides of its pairs (None: no clip)."""
        q = getattr(pl_module.args, "reward_clip_quantile", None)
        if q is None:
            return None
        prompts = [list(p.prompts) for p in pairs] * 2
        texts = [list(p.winner_completions) for p in pairs] + [list(p.loser_completions) for p in pairs]
        return support_clip_bound(model.score(prompts, texts), q)

    def oracle(self, model: Any, formatters: Any) -> LearnedRewardOracle:
        """The RL / scoring oracle of a model this callback fitted (clipped at :attr:`clip_max` when set)."""
        return LearnedRewardOracle(model, formatters, clip_max=self.clip_max)

    def state_dict(self) -> dict:
        return {"fits": self.fits, "history": [dict(h) for h in self.history]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.fits = int(state_dict.get("fits", 0))
        self.history = [dict(h) for h in state_dict.get("history", [])]


class LearnedRewardFit(_RewardModelFitting):
    """Offline MARLHF: collect pairs with the task reward, fit the reward model, make it the RL reward.

    Args:
        reward_model: a JointRewardModel template, a source string, or None (``args.reward_model_name``, else
            the agents' model name).
        val_fraction: hold out this fraction of the pairs (whole prompt sets) to select the best epoch and report
            ``reward_model/val_accuracy``; 0 trains on every pair (upstream) and reports none.
        seed: seed of the sampling streams, pair selection and the reward head (None = ``args.seed``).
        chunk_size: task items generated together per agent.
        trainer_kwargs: extra ``lightning.Trainer`` kwargs of the reward-model fit.
    """

    def __init__(self, reward_model: Any = None, val_fraction: float = 0.1, seed: int | None = None,
                 chunk_size: int = 16, trainer_kwargs: dict | None = None):
        super().__init__(reward_model, val_fraction, seed, trainer_kwargs)
        self.chunk_size = chunk_size
        self.pairs: list = []
        self.collection_stats = None
        self._restored_pairs: list | None = None

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._setup(trainer, pl_module)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "pairs": [p.to_json() for p in self.pairs]}

    def load_state_dict(self, state_dict: dict) -> None:
        from comlrl_lightning.preferences import PreferencePair

        super().load_state_dict(state_dict)
        self._restored_pairs = [PreferencePair.from_json(r) for r in state_dict.get("pairs", [])]

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        from comlrl_lightning.preferences import CollectionStats, collect_offline_split

        args = pl_module.args
        seed = args.seed if self.seed is None else self.seed
        if self._restored_pairs is not None:  # resumed: refit on the pairs collected by the original run
            pairs, self._restored_pairs = self._restored_pairs, None
            stats = CollectionStats(num_pairs=len(pairs))
            with self._refit_uncounted():
                self._use_pairs(trainer, pl_module, pairs, stats, seed)
            return
        dm = trainer.datamodule
        # split across ranks and gathered (docs/scaling.md): every rank fits the same reward model on the same pairs
        rank, world_size = world(trainer)
        pairs, stats, _, _ = collect_offline_split(
            pl_module.team, list(dm.train_items), dm.formatters, dm.oracle, pl_module.sampling_settings(),
            args.preference_num_candidates, args.pair_selection, args.preference_pairs_per_sample, seed, rank,
            world_size, chunk_size=self.chunk_size, progress=False,
            where="LearnedRewardFit (the collection of the reward model's pairs)",
        )
        self._use_pairs(trainer, pl_module, pairs, stats, seed)

    def _use_pairs(self, trainer, pl_module, pairs, stats, seed) -> None:
        dm = trainer.datamodule
        self.pairs, self.collection_stats = pairs, stats
        log_metrics(trainer, {"round/index": 0, "round/num_pairs": stats.num_pairs,
                              "round/candidate_reward_mean": stats.reward_mean})
        rank_zero_info(f"MARLHF: collected {stats.num_pairs} preference pairs from {stats.num_items} task items "
                       f"(mean task reward {stats.reward_mean:.4f}).")
        if not pairs:
            rank_zero_info("MARLHF: no non-tied preference pairs were generated; no reward model is trained and "
                           "the policies are not updated.")
            pl_module.use_train_oracle(None)
            trainer.should_stop = True
            return
        model = self.fit(trainer, pl_module, pairs, seed)
        if model is None:
            pl_module.use_train_oracle(None)
            trainer.should_stop = True
            return
        pl_module.use_train_oracle(self.oracle(model, dm.formatters))


class IterativeRewardModelFit(_RewardModelFitting):
    """MARLHFIter: a freshly initialised reward model per round, fitted on the round's training pairs.

    Must come after ReplaySelection (``round_stage`` 4). Round t's model uses head seed
    ``seed * 1000 + t`` (deterministic, different per round). Args as :class:`LearnedRewardFit` (no
    collection options: pairs come from the round callbacks through ``datamodule.pairs``).
    """

    round_stage = 4

    def __init__(self, reward_model: Any = None, val_fraction: float = 0.1, seed: int | None = None,
                 trainer_kwargs: dict | None = None):
        super().__init__(reward_model, val_fraction, seed, trainer_kwargs)
        self.next_round = 0
        self.round_models: list[Any] = []  # each round's fitted model (None: no pairs); see keep_round_models
        self.keep_round_models = False  # tests/debugging: keep every round's model object in round_models

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        check_round_setup(trainer, "IterativeRewardModelFit")
        self._setup(trainer, pl_module)
        check_protocol(trainer.datamodule, RoundData, "IterativeRewardModelFit", "data module", "MARLHFIterDataModule")

    def _round(self, trainer: L.Trainer, pl_module: L.LightningModule, round_index: int) -> None:
        dm = trainer.datamodule
        args = pl_module.args
        pairs = list(dm.pairs)
        self.next_round = round_index + 1
        scoring = getattr(args, "preference_scoring_reward", "task") == "reward_model"
        # The previous round's model is dropped here (kept only as the scoring oracle when scoring with it).
        pl_module.use_train_oracle(None)
        seed = (args.seed if self.seed is None else self.seed) * 1000 + round_index
        model = self.fit(trainer, pl_module, pairs, seed) if pairs else None
        if model is None:
            rank_zero_info(f"MARLHFIter: round {round_index} has no training pairs; no reward model is fitted and "
                           "no RL runs this round.")
            self.round_models.append(None)
            if not scoring:
                self.current = None
                dm.use_preference_oracle(None)
            return
        self.round_models.append(model if self.keep_round_models else id(model))
        oracle = self.oracle(model, dm.formatters)
        pl_module.use_train_oracle(oracle)
        dm.use_preference_oracle(oracle if scoring else None)

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.next_round == 0:
            self._round(trainer, pl_module, 0)
        elif self.current is None:
            # Resumed at a round boundary: the reward model is not in the checkpoint; refit the current
            # round's model on its training pairs (restored with the data module's state).
            with self._refit_uncounted():
                self._round(trainer, pl_module, self.next_round - 1)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        nxt = next_round_at_epoch_end(trainer, pl_module)
        if nxt is not None and nxt == self.next_round:
            self._round(trainer, pl_module, nxt)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "next_round": self.next_round}

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)
        self.next_round = int(state_dict.get("next_round", 0))
