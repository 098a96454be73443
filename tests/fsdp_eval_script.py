"""Evaluation under FSDP2 (Lightning's ModelParallelStrategy) against strategy="ddp", on 2 CPU processes (gloo), run
by tests/test_fsdp_eval.py.

Usage: ``fsdp_eval_script.py OUT MODEL FIT [FIT ...]``, FIT among ``magrpo`` (single turn, 3 eval items generated 2 + 1
per call, then ``validate``), ``magrpo_turns`` (2 turns), ``iac_turns`` (2 turns with early termination),
``madpo_iter`` (2 rounds), ``iac_uneven`` (2-turn IAC with the reference KL, whose task reward differs per rank during
evaluation, as a sandbox timeout or a remote judge can: rank 0's episodes end after turn 1, rank 1's run 2 turns, so
rank 1 generates, runs critic and KL passes more often during the same evaluation) and ``maac_uneven`` (the same
with MAAC's shared critic, no KL); ``magrpo_fail`` (FSDP2 only, last: the task reward raises during evaluation on
rank 1, so every rank stops with a ``RankFailure``; the script exits with an error). Every fit evaluates its 3 eval items before every update and at the end
(``eval_interval=1``). Each FIT runs with ``strategy="ddp"``, then with ``ModelParallelStrategy()``, from the same
seed, in the same two processes. Each rank writes ``OUT/rank{r}.pt``: per fit and run, the evaluation callback's
history (update, metrics), ``validate``'s metrics (``magrpo``), the balanced collectives this rank announced during
evaluations (sharded ``generate`` calls, critic and KL passes; none under DDP), both agents' parameters after the fit
(gathered whole, flattened, float64), the global step and the world size.
"""
import os
import sys
from datetime import timedelta

import torch
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

import comlrl_lightning.distributed as distributed
from comlrl_lightning.config import IACConfig, MAACConfig, MADPOIterConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition

out_dir, model_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
if os.environ.get("FSDP_SCRIPT_DUMP"):  # a hang prints every thread's stack and exits
    import faulthandler
    faulthandler.dump_traceback_later(int(os.environ["FSDP_SCRIPT_DUMP"]), exit=True)
TIMEOUT = timedelta(seconds=int(os.environ.get("FSDP_EVAL_PG_TIMEOUT", "120")))  # a collective left alone fails
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
eval_items = [{"prompt": f"Topic: {t}."} for t in ("clouds", "stones", "maps")]  # 3: odd, and 2 + 1 per call
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=1, eval_num_samples=3, eval_batch_size=2, seed=0)
common = dict(agent_model=model_dir, train_dataset=items, eval_dataset=eval_items, formatters=FORMATTERS)

in_eval = [False]
announced: list[int] = []
announce = distributed.announce_balanced


def counted(key: int) -> None:
    if in_eval[0]:
        announced.append(key)
    announce(key)


distributed.announce_balanced = counted  # sharding imports it at each call


def uneven_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """The task reward, except during evaluation on rank 0: 10 (above the threshold 5, so the episode ends there)."""
    if in_eval[0] and distributed.world()[0] == 0:
        return [10.0] * len(completions1)
    return cooperative_reward(completions1, completions2)


def failing_reward(completions1: list[str], completions2: list[str]) -> list[float]:
    """The task reward, except during evaluation on rank 1: an error."""
    if in_eval[0] and distributed.world()[0] == 1:
        raise ValueError("the judge is unreachable")
    return cooperative_reward(completions1, completions2)


def build(name: str, strategy):
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=out_dir, logger=False)
    if name == "magrpo_fail":  # the task reward raises during evaluation on rank 1 only
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        args = MAGRPOConfig(num_generations=2, train_batch_size=2, rollout_buffer_size=2, **sampling)
        return MAGRPOTrainer(args=args, reward_func=failing_reward, trainer_kwargs=tk, **common)
    if name in ("magrpo", "magrpo_turns"):
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        turns = 2 if name == "magrpo_turns" else 1
        args = MAGRPOConfig(num_turns=turns, num_generations=2, train_batch_size=2, rollout_buffer_size=2, **sampling)
        return MAGRPOTrainer(args=args, external_transition=plain_transition if turns > 1 else None,
                             reward_func=cooperative_reward, trainer_kwargs=tk, **common)
    if name in ("iac_turns", "iac_uneven", "maac_uneven"):
        from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer

        uneven = name != "iac_turns"
        config, trainer = (MAACConfig, MAACTrainer) if name == "maac_uneven" else (IACConfig, IACTrainer)
        # iac_turns: some episodes end after turn 1 (mean reward > 1); the uneven fits: on rank 0 only (10 > 5). In
        # evaluation only (eval_threshold): a fit with early termination on several processes is refused
        # (strategies.uneven_rollout_refusal: the ranks' update counts would differ)
        extra = dict(reference_kl_enabled=True, reference_kl_coef=0.5) if name == "iac_uneven" else {}
        args = config(num_turns=2, num_generations=1, rollout_buffer_size=2, train_batch_size=2,
                      critic_learning_rate=1e-2, **extra, **sampling)
        eval_threshold[0] = 5.0 if uneven else 1.0
        return trainer(args=args, external_transition=plain_transition, trainer_kwargs=tk, **common,
                       reward_func=uneven_reward if uneven else cooperative_reward)
    if name == "madpo_iter":
        from comlrl_lightning.trainers.madpo import MADPOIterTrainer

        args = MADPOIterConfig(num_iterations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                               train_batch_size=1, **{**sampling, "max_new_tokens": 6})
        return MADPOIterTrainer(args=args, reward_func=cooperative_reward, trainer_kwargs=tk, **common)
    raise ValueError(f"unknown fit {name!r}")


def whole(params) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().reshape(-1)
                      for p in params])


record, rank = {}, 0
for name in names:
    for run in ("fsdp2",) if name == "magrpo_fail" else ("ddp", "fsdp2"):  # ddp: rank 0 would wait for rank 1
        torch.manual_seed(0)
        eval_threshold = [None]
        strategy = DDPStrategy(timeout=TIMEOUT) if run == "ddp" else ModelParallelStrategy(timeout=TIMEOUT)
        tr = build(name, strategy)
        evaluate = tr.module.evaluate

        def flagged(*a, evaluate=evaluate, args=tr.module.args, threshold=eval_threshold[0], **k):
            in_eval[0] = True
            args.early_termination_threshold = threshold
            try:
                return evaluate(*a, **k)
            finally:
                in_eval[0] = False
                args.early_termination_threshold = None
        tr.module.evaluate = flagged
        announced.clear()
        tr.train()
        rank = tr.trainer.global_rank
        entry = {"history": [(u, {k: float(v) for k, v in m.items()}) for u, m in tr.evaluation.history],
                 "announced": list(announced), "global_step": tr.trainer.global_step,
                 "world": tr.trainer.world_size, "weights": [whole(tr.team.parameters_of(i)) for i in range(2)]}
        if name == "magrpo":  # validate: every eval item scored by the fitted team (val/...)
            announced.clear()
            entry["validate"] = {k: float(v) for k, v in tr.trainer.validate(tr.module, datamodule=tr.datamodule,
                                                                               verbose=False)[0].items()}
            entry["validate_announced"] = list(announced)
        record[f"{name}/{run}"] = entry
        print(f"rank {rank} {name}/{run}: {len(entry['history'])} evaluations, {len(entry['announced'])} announced",
              flush=True)
torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
