"""FSDP2 checkpoints on CPU processes (gloo), run by tests/components/test_fsdp.py.

Usage: ``fsdp_checkpoint_script.py OUT MODEL FIT MODE [DEVICES] [CKPT]``. FIT: ``madpo_iter`` (MADPOIter, one round
per epoch, replay of every round) or ``magrpo`` (2-turn MAGRPO), 2 agents, under ``ModelParallelStrategy()``, a
sharded (distributed) checkpoint at the end of every epoch:

* ``full``: 2 epochs uninterrupted, checkpoints under ``OUT/ckpt``; then ``save_agents`` (refused: one rank cannot
  save a sharded agent) and every rank calls ``save_team`` into ``OUT/agents``;
* ``resume``: resume ``CKPT`` (the epoch-0 checkpoint of ``full``) and train to 2 epochs.

``DEVICES`` (default 2) is the number of processes. Each rank writes ``OUT/MODE_rank{r}.pt``: every agent's weights
gathered whole (float64), the global step, the world size and the refusal's message (full); a run that fails writes
the error's text to ``OUT/MODE_error.txt`` (rank 0) and exits with status 3.
"""
import os
import sys

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import ModelParallelStrategy

from comlrl_lightning.config import MADPOIterConfig, MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.trainers.madpo import MADPOIterTrainer
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

out_dir, model_dir, fit, mode = sys.argv[1:5]
devices = int(sys.argv[5]) if len(sys.argv) > 5 else 2
ckpt = sys.argv[6] if len(sys.argv) > 6 else None
items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music")]
epochs = 2
sampling = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-2, eval_interval=0,
                eval_num_samples=0, seed=0)
callbacks = [ModelCheckpoint(dirpath=os.path.join(out_dir, "ckpt"), filename="{epoch}", every_n_epochs=1,
                             save_top_k=-1, save_on_train_epoch_end=True)]
tk = dict(accelerator="cpu", devices=devices, strategy=ModelParallelStrategy(), enable_progress_bar=False,
          enable_model_summary=False, logger=False, default_root_dir=out_dir, callbacks=callbacks,
          enable_checkpointing=True)
common = dict(agent_model=model_dir, train_dataset=items, reward_func=cooperative_reward, formatters=FORMATTERS)
if fit == "magrpo":
    args = MAGRPOConfig(num_turns=2, num_generations=2, train_batch_size=2, rollout_buffer_size=2,
                        num_train_epochs=epochs, **sampling)
    tr = MAGRPOTrainer(external_transition=plain_transition, args=args, trainer_kwargs=tk, **common)
else:
    args = MADPOIterConfig(num_iterations=epochs, preference_num_candidates=4, preference_pairs_per_sample=2,
                           train_batch_size=1, preference_replay_mode="all_history", preference_replay_sample_size=4,
                           **sampling)
    tr = MADPOIterTrainer(args=args, evaluation=False, eval_dataset=None, trainer_kwargs=tk, **common)
try:
    tr.train(ckpt_path=ckpt)
except Exception as exc:  # noqa: BLE001 - the test reads the message
    if int(os.environ.get("LOCAL_RANK", 0)) == 0:
        with open(os.path.join(out_dir, f"{mode}_error.txt"), "w") as f:
            f.write(f"{type(exc).__name__}: {exc}")
    sys.exit(3)
refused = None
if mode == "full":
    from comlrl_lightning.sharding import save_team

    try:  # one rank's save_pretrained of a sharded agent: a clear error, not a hang
        tr.module.save_agents(os.path.join(out_dir, "single_rank"))
    except ValueError as exc:
        refused = str(exc)
    save_team(tr.module, os.path.join(out_dir, "agents"))
weights = [torch.cat([(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().double().reshape(-1)
                      for p in tr.team.parameters_of(i)]) for i in range(2)]
torch.save({"weights": weights, "global_step": tr.trainer.global_step, "world": tr.trainer.world_size,
            "refused": refused},
           os.path.join(out_dir, f"{mode}_rank{tr.trainer.global_rank}.pt"))
