"""Exact mid-epoch resume under DDP (issue 31 item 3): 2 CPU processes (gloo), MAGRPO 1-turn and MADPO. The
uninterrupted run takes a checkpoint after every step; a second launch resumes from one inside the first epoch. Each
rank ends with the uninterrupted run's weights (bit-equal: both runs do the same all-reduces in the same order), the
same counters, and logs the rows the uninterrupted run logged after the checkpoint (each rank's rollout streams and
loader shard resume from ``comlrl_rank_states`` and the loader state).

Run as subprocesses: under pytest, strategy="ddp" would re-run the whole pytest command in rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parents[1]  # tests/ (the DDP scripts live there)
SCRIPT = HERE / "ddp_mid_epoch_resume_script.py"


def _launch(tmp_path: Path, model_dir: str, family: str, mode: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), model_dir, family, mode], capture_output=True,
                         text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads((tmp_path / f"{mode}-rank{r}.json").read_text()) for r in (0, 1)]


def _first_epoch_mid_checkpoint(folder: Path, batches: int) -> str:
    for path in sorted(folder.glob("*.ckpt"), key=lambda p: p.stat().st_mtime_ns):
        (state,) = torch.load(path, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
        if state["epoch"] == 0 and 0 < state["batches"] < batches:
            return path.name
    raise AssertionError(f"no checkpoint inside the first epoch in {sorted(p.name for p in folder.iterdir())}")


@pytest.mark.slow
@pytest.mark.parametrize("family", ["magrpo", "madpo"])
def test_ddp_resume_from_a_mid_epoch_checkpoint_equals_the_uninterrupted_run(family, tiny_model_dir, tmp_path):
    full = _launch(tmp_path, tiny_model_dir, family, "full")
    assert [r["world"] for r in full] == [2, 2] and full[0]["batches"] >= 2
    assert full[0]["params"] == full[1]["params"]  # the replicas agree
    name = _first_epoch_mid_checkpoint(tmp_path / "ckpt", full[0]["batches"])
    resumed = _launch(tmp_path, tiny_model_dir, family, name)
    for a, b in zip(full, resumed):
        rank = a["rank"]
        assert b["params"] == a["params"], f"{family} rank {rank} resumed from {name}: weights differ"
        for key in ("global_step", "env_step", "updates_seen"):
            assert b[key] == a[key], f"{family} rank {rank} resumed from {name}: {key} {b[key]} != {a[key]}"
        assert len(b["rows"]) < len(a["rows"]) or not a["rows"], "the resumed run must take only the later steps"
        assert b["rows"] == a["rows"][len(a["rows"]) - len(b["rows"]):], \
            f"{family} rank {rank} resumed from {name}: rows {b['rows'][:2]} != {a['rows'][-len(b['rows']):][:2]}"
    assert resumed[0]["rows"], "rank 0 logged nothing after the checkpoint"
