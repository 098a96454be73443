"""FSDP2 (Lightning's ModelParallelStrategy) against strategy="ddp", on 2 CPU processes (gloo), run by
tests/components/test_fsdp.py.

Usage: ``fsdp_strategy_script.py OUT MODEL FIT [FIT ...]``, FIT among ``magrpo``, ``magrpo_lora``, ``iac``, ``maac``,
``madpo``, ``madpo_odd`` (3 items, one per generate call), ``madpo_iter``, ``madpo_history`` (MADPOIter against
the policy one round back), ``marlhf``, ``magrpo_kl`` (2-turn MAGRPO with the reference KL: the frozen references
are sharded too; the record adds the references' whole weights, this rank's element count of each and the largest
KL the rollouts measured), ``iac_kl`` (IAC with the reference KL). Each FIT is trained twice in the same two processes from the same seed: with ``strategy="ddp"`` (the
reference), then with ``ModelParallelStrategy()`` (every agent and critic sharded by the module's
``configure_model``). Each rank writes ``OUT/rank{r}.pt``: per fit and run, every trained member's parameters (agents,
then critics; a LoRA fit adds its frozen base last) before and after the fit, gathered whole and flattened in
float64, the elements this rank holds of each member, the whole element count, the global step, the world size and
the type name of the first agent parameter. The LoRA fit exports its adapters with ``save_team`` into
``OUT/magrpo_lora_agents``. IAC and MAAC export their agents with critics (and IAC's value heads) into
``OUT/{fit}_{run}_export``: ``save_agents`` on rank 0 under DDP, ``save_team`` on every rank under FSDP2.
"""
import os
import sys

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from comlrl_lightning.config import IACConfig, MAACConfig, MADPOConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.sharding import local_numel, save_team

out_dir, model_dir, names = sys.argv[1], sys.argv[2], sys.argv[3:]
if os.environ.get("FSDP_SCRIPT_DUMP"):
    import faulthandler
    faulthandler.dump_traceback_later(int(os.environ["FSDP_SCRIPT_DUMP"]), exit=True)
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, num_train_epochs=1,
                eval_interval=0, eval_num_samples=0, seed=0)
common = dict(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS)


def build(name: str, strategy, run: str):
    tk = dict(accelerator="cpu", devices=2, strategy=strategy, enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False, default_root_dir=out_dir, logger=False)
    if name in ("magrpo", "magrpo_lora"):  # 2 turns, 2 agents; LoRA: 2 adapters on one shared frozen base
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        args = MAGRPOConfig(num_turns=2, num_generations=2, train_batch_size=2, rollout_buffer_size=2, **sampling)
        lora = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]} if name == "magrpo_lora" else None
        return MAGRPOTrainer(args=args, external_transition=plain_transition, trainer_kwargs=tk, lora=lora, **common)
    if name in ("iac", "maac", "iac_kl"):  # separate critics (IAC) and one shared critic (MAAC), own optimizers
        from comlrl_lightning.trainers.actor_critic import IACTrainer, MAACTrainer

        config, trainer = (MAACConfig, MAACTrainer) if name == "maac" else (IACConfig, IACTrainer)
        kl = dict(reference_kl_enabled=True, reference_kl_coef=0.5, train_batch_size=1) if name == "iac_kl" else {}
        args = config(**{"num_generations": 2, "rollout_buffer_size": 2, "train_batch_size": 2,
                         "critic_learning_rate": 1e-2, **kl, **sampling})
        return trainer(args=args, trainer_kwargs=tk, **common)
    if name == "magrpo_kl":  # 1 item per batch: the second batch samples from updated agents, so the KL is > 0
        from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

        args = MAGRPOConfig(num_turns=2, num_generations=2, train_batch_size=1, rollout_buffer_size=2,
                            reference_kl_enabled=True, reference_kl_coef=0.5, **sampling)
        return MAGRPOTrainer(args=args, external_transition=plain_transition, trainer_kwargs=tk, **common)
    if name == "madpo":  # gradient clipping and accumulation over 2 batches
        from comlrl_lightning.trainers.preference import MADPOTrainer

        args = MADPOConfig(preference_num_candidates=4, preference_pairs_per_sample=2, train_batch_size=1,
                           gradient_clip_val=0.05, gradient_accumulation_steps=2,
                           **{**sampling, "max_new_tokens": 6})
        return MADPOTrainer(args=args, trainer_kwargs=tk, **common)
    if name == "madpo_odd":  # 3 items, one per generate call: rank 0 calls generate twice per agent, rank 1 once
        from comlrl_lightning.trainers.preference import MADPOTrainer

        args = MADPOConfig(preference_num_candidates=4, preference_pairs_per_sample=2, train_batch_size=1,
                           **{**sampling, "max_new_tokens": 6})
        tr = MADPOTrainer(args=args, trainer_kwargs=tk, **{**common, "train_dataset": items[:3]})
        tr.collection.chunk_size = 1
        return tr
    if name == "madpo_iter":  # 2 rounds, the current team as comparator, replay of every round
        from comlrl_lightning.config import MADPOIterConfig
        from comlrl_lightning.trainers.madpo import MADPOIterTrainer

        args = MADPOIterConfig(num_iterations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                               train_batch_size=1, preference_replay_mode="all_history",
                               preference_replay_sample_size=4, **{**sampling, "max_new_tokens": 6})
        return MADPOIterTrainer(args=args, evaluation=False, trainer_kwargs=tk, eval_dataset=None, **common)
    if name == "madpo_history":  # 2 rounds against the snapshot of the policy one round back (written every round)
        from comlrl_lightning.config import MADPOIterConfig
        from comlrl_lightning.trainers.madpo import MADPOIterTrainer

        args = MADPOIterConfig(num_iterations=2, preference_num_candidates=4, preference_pairs_per_sample=2,
                               train_batch_size=1, comparator_policy="history", comparator_history_k=1,
                               policy_checkpoint_dir=os.path.join(out_dir, f"snapshots_{run}"),
                               **{**sampling, "max_new_tokens": 6})
        return MADPOIterTrainer(args=args, evaluation=False, trainer_kwargs=tk, eval_dataset=None, **common)
    if name == "marlhf":  # a reward model fitted on collected pairs (replicated), then MAGRPO on it
        from comlrl_lightning.config.marlhf import MARLHFConfig
        from comlrl_lightning.trainers.marlhf import MARLHFTrainer

        args = MARLHFConfig(num_generations=2, rollout_buffer_size=1, preference_num_candidates=4,
                            preference_pairs_per_sample=2, reward_learning_rate=1e-3, reward_train_batch_size=4,
                            reward_num_train_epochs=1, **sampling)
        return MARLHFTrainer(args=args, evaluation=False, trainer_kwargs=tk, **common)
    raise ValueError(f"unknown fit {name!r}")


def whole(params) -> torch.Tensor:
    return torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().reshape(-1)
                      for p in params])


def trained(tr) -> list[list[torch.Tensor]]:
    """Every trained member's parameters: the agents, then critics and value heads."""
    m = tr.module
    members = [list(tr.team.parameters_of(i)) for i in range(2)]
    members += [list(c.parameters()) for c in [*getattr(m, "critics", []), *getattr(m, "value_heads", [])]]
    if tr.team.uses_lora:  # the frozen base, once
        members.append([p for p in tr.team.models[0].parameters() if not p.requires_grad])
    return members


record, rank = {}, 0
for name in names:
    for run in ("ddp", "fsdp2"):
        torch.manual_seed(0)  # the critics' value heads are initialized from the global generator
        tr = build(name, "ddp" if run == "ddp" else ModelParallelStrategy(), run)
        initial = [whole(ps) for ps in trained(tr)]
        kls = []
        if getattr(tr.module, "reference", None) is not None:  # every KL the rollouts measure against the references
            method = "_sequence_kls" if hasattr(tr.module, "_sequence_kls") else "_turn_kls"  # MAGRPO / IAC, MAAC
            measure = getattr(tr.module, method)

            def recorded(*a, measure=measure, kls=kls, **k):
                out = measure(*a, **k)
                kls.extend(v for row in out for v in row)
                return out
            setattr(tr.module, method, recorded)
        tr.train()
        rank, members = tr.trainer.global_rank, trained(tr)
        if run == "fsdp2" and tr.team.uses_lora:  # every rank gathers, rank 0 writes the adapters
            save_team(tr.module, os.path.join(out_dir, f"{name}_agents"))
        if name in ("iac", "maac"):  # agents, value heads and critics: DDP from rank 0, FSDP2 gathered on every rank
            folder = os.path.join(out_dir, f"{name}_{run}_export")
            if run == "fsdp2":
                save_team(tr.module, folder)
            elif tr.trainer.global_rank == 0:
                tr.module.save_agents(folder)
        record[f"{name}/{run}"] = {
            "initial": initial, "weights": [whole(ps) for ps in members], "local": [local_numel(ps) for ps in members],
            "numel": [sum(p.numel() for p in ps) for ps in members], "global_step": tr.trainer.global_step,
            "world": tr.trainer.world_size, "param_type": type(members[0][0]).__name__}
        if getattr(tr.module, "reference", None) is not None:  # the frozen references (distinct copies), per agent
            refs = [list(tr.module.reference.model_for(i).parameters()) for i in range(2)]
            record[f"{name}/{run}"].update(
                ref_weights=[whole(ps) for ps in refs], ref_local=[local_numel(ps) for ps in refs],
                ref_numel=[sum(p.numel() for p in ps) for ps in refs], ref_type=type(refs[0][0]).__name__,
                kl_max=max(kls, default=0.0), kl_sum=sum(kls), agents_initial=initial[:2])
torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
