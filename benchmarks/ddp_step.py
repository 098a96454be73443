"""Agent update step under DDP on 2 CPU processes (gloo): ``strategy="ddp"`` (the team modules average each agent's
gradients at its own step, docs/scaling.md "Strategies") against ``strategy="ddp_find_unused_parameters_true"``
with DDP's own gradient hooks doing the reduction (what README asked for before: an autograd-graph search for
unused parameters before every backward, then DDP's bucketed all-reduce), measured in the same run.

Run ``python benchmarks/ddp_step.py [--quick] [--models tiny,8m] [--reps 3] [--items 8]``. The script starts the
second process itself (Lightning's launcher re-runs it); rank 0 prints.

Models (2 full-model agents, each its own copy, random weights except the tiny one, built in a temporary folder):

  tiny  the embedded default (``build_tiny_model``): Qwen2, 2 layers, hidden 64, 0.16 M parameters per agent;
  8m    ``build_tiny_model(hidden_size=256, num_layers=8, intermediate_size=1024)``: 8 layers, hidden 256,
        about 8 M parameters per agent.

Workload per fit: a 2-turn MAGRPO fit, ``--items`` prompts split over the 2 ranks, K=2 generations, 8 new tokens,
``train_batch_size`` 2, ``rollout_buffer_size`` 2, one epoch. Timed: every agent update (MAGRPO's ``_update``:
zero_grad, forward, backward, gradient reduction, AdamW step), on rank 0; the two variants alternate (ABBA
order), ``--reps`` fits each, after one warm-up fit each; the same seed every time. Printed per model: the median
ms per agent update of each variant, the ratio find_unused / ddp (> 1: ``strategy="ddp"`` is faster), the whole
fit's median seconds, whether both variants ended with identical weights (they must, up to float rounding), and the
load average.
On a shared machine the absolute times move with the load; the ratio is measured under the same load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.modules.base import TeamModuleBase
from comlrl_lightning.modules.magrpo import MAGRPOModule
from comlrl_lightning.multiturn.transitions import plain_transition
from comlrl_lightning.tiny import build_tiny_model
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

SHAPES = {"tiny": {}, "8m": dict(hidden_size=256, num_layers=8, intermediate_size=1024)}
VARIANTS = (("ddp", "ddp"), ("find_unused", "ddp_find_unused_parameters_true"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,8m")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--items", type=int, default=8)
    p.add_argument("--quick", action="store_true", help="tiny model only, 2 reps")
    p.add_argument("--root", default=os.path.join(tempfile.gettempdir(), "comlrl_ddp_step"),
                   help="folder of the built models and the fits' logs (shared by both processes)")
    a = p.parse_args()
    models = ["tiny"] if a.quick else a.models.split(",")
    reps = 2 if a.quick else a.reps
    rank0 = os.environ.get("LOCAL_RANK", "0") == "0"  # Lightning's launcher gives the second process LOCAL_RANK=1
    dirs = {}
    for name in models:
        path = os.path.join(a.root, name)
        if rank0 and not os.path.exists(os.path.join(path, "config.json")):
            build_tiny_model(path, **SHAPES[name])
        dirs[name] = path

    times: list[float] = []
    update = MAGRPOModule._update

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        out = update(self, *args, **kwargs)
        times.append(time.perf_counter() - start)
        return out

    MAGRPOModule._update = timed
    own = TeamModuleBase.averages_own_gradients
    items = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains", "music", "owls", "maps", "tea",
                                                  "rain", "salt", "bees", "iron", "moss")][: a.items]
    args = MAGRPOConfig(num_turns=2, num_generations=2, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None,
                        agent_learning_rate=1e-3, train_batch_size=2, rollout_buffer_size=2, num_train_epochs=1,
                        eval_interval=0, eval_num_samples=0, seed=0, agent_overlap="off")
    load = os.getloadavg()
    rows = []
    for name in models:
        per = {v: {"update": [], "fit": [], "weights": None} for v, _ in VARIANTS}
        for rep in range(reps + 1):  # rep 0: warm-up
            for variant, strategy in (VARIANTS if rep % 2 else VARIANTS[::-1]):  # ABBA: neither always first
                TeamModuleBase.averages_own_gradients = own if variant == "ddp" else (lambda self: False)
                torch.manual_seed(0)
                tr = MAGRPOTrainer(agent_model=dirs[name], train_dataset=items, reward_func=cooperative_reward,
                                   formatters=FORMATTERS, external_transition=plain_transition, args=args,
                                   trainer_kwargs=dict(accelerator="cpu", devices=2, strategy=strategy, logger=False,
                                                       enable_progress_bar=False, enable_model_summary=False,
                                                       enable_checkpointing=False, default_root_dir=a.root))
                times.clear()
                start = time.perf_counter()
                tr.train()
                fit = time.perf_counter() - start
                if rep > 0:
                    per[variant]["update"] += times
                    per[variant]["fit"].append(fit)
                per[variant]["weights"] = [p.detach().clone() for i in range(2) for p in tr.team.parameters_of(i)]
                if rank0 and rep == 0 and variant == "find_unused":
                    print(f"[{name}] {sum(p.numel() for p in tr.team.parameters_of(0)) / 1e6:.2f} M parameters per "
                          f"agent, {len(times)} agent updates per fit on rank 0", flush=True)
        TeamModuleBase.averages_own_gradients = own
        same = max(float((x - y).abs().max()) for x, y in zip(per["ddp"]["weights"], per["find_unused"]["weights"]))
        ms = {v: 1000 * statistics.median(per[v]["update"]) for v, _ in VARIANTS}
        fits = {v: statistics.median(per[v]["fit"]) for v, _ in VARIANTS}
        rows.append((name, ms, fits, same))
    if not rank0:
        return
    print(f"\nload average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; after: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"{'model':6} {'ddp ms/update':>14} {'find_unused ms/update':>22} {'ratio':>6} {'ddp fit s':>10} "
          f"{'find_unused fit s':>18} {'max |weight diff|':>18}")
    for name, ms, fits, same in rows:
        print(f"{name:6} {ms['ddp']:14.2f} {ms['find_unused']:22.2f} {ms['find_unused'] / ms['ddp']:6.2f} "
              f"{fits['ddp']:10.2f} {fits['find_unused']:18.2f} {same:18.2e}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
