"""DDP on CPU: two gloo processes train MADPO on disjoint shards of the pairs and end with identical weights.

Run as a subprocess: under pytest, strategy="ddp" would re-run the whole pytest command in rank 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]  # tests/ (the DDP script lives there)


@pytest.mark.slow
def test_madpo_ddp_two_cpu_processes(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, str(HERE / "ddp_madpo_script.py"), str(tmp_path), tiny_model_dir],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2]
    # 16 pairs, batch 2, 2 ranks -> 4 batches per rank, one optimizer step per agent per batch
    assert ranks[0]["pairs"] == ranks[1]["pairs"] == 16
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 8
    # gradients are averaged across ranks, so both replicas end with the same weights
    assert ranks[0]["sums"] == pytest.approx(ranks[1]["sums"], rel=0, abs=1e-9)
