"""Strategies and launches (docs/scaling.md, "Strategies" and "Launching"): strategy="ddp" with each agent's gradients
averaged at its own step, the refusals of DeepSpeed, FSDP1 and an unprepared ModelParallelStrategy, and the
multi-node pre-flight against faked SLURM and torchrun environments."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from comlrl_lightning.strategies import check_launch, check_strategy, launch_mismatches, preflight, strategy_refusal

TESTS = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


# --- strategy="ddp": the modules' own per-agent averaging ---------------------------------------------------------
@pytest.mark.slow
def test_plain_ddp_equals_ddp_reducer_for_every_family(tiny_model_dir, tmp_path):
    """Each family trained with strategy="ddp" (no unused-parameter search; each optimizer's gradients averaged at
    its step) ends with the weights of the same fit reduced by DDP's own hooks (ddp_find_unused_parameters_true),
    and both ranks hold the same weights. MADPO clips the averaged gradients and accumulates 2 batches."""
    fits = ("magrpo", "iac", "maac", "madpo")
    out = subprocess.run([sys.executable, str(TESTS / "ddp_strategy_script.py"), str(tmp_path), tiny_model_dir, *fits],
                         capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    for name in fits:
        own, ref = ranks[0][f"{name}/ddp"], ranks[0][f"{name}/reference"]
        assert own["world"] == 2 and own["global_step"] == ref["global_step"] > 0
        members = {"magrpo": 2, "iac": 4, "maac": 3, "madpo": 2}[name]  # agents, then critics
        assert len(own["weights"]) == len(ref["weights"]) == members
        for run in ("ddp", "reference"):  # the replicas are identical (the ranks trained on different prompts)
            for a, b in zip(ranks[0][f"{name}/{run}"]["weights"], ranks[1][f"{name}/{run}"]["weights"]):
                assert torch.equal(a, b), (name, run)
        for a, b in zip(own["weights"], ref["weights"]):
            assert torch.isfinite(a).all()
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=f"{name}: ddp differs from DDP's reducer")


def test_average_gradients_on_two_gloo_processes(tmp_path):
    """Large gradients reduced in place, small ones in buckets split by size and by dtype; a gradient missing on one
    rank counts as zero there; a gradient missing on every rank stays None."""
    script = textwrap.dedent("""
        import os, sys
        import torch, torch.distributed as dist
        from comlrl_lightning.distributed import average_gradients
        rank = int(os.environ["RANK"])
        dist.init_process_group("gloo", rank=rank, world_size=2)
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.zeros(3, 4)), torch.nn.Parameter(torch.zeros(5)),
                  torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)), torch.nn.Parameter(torch.zeros(7)),
                  torch.nn.Parameter(torch.zeros(2))]
        grads = [[torch.randn_like(p) for p in params] for _ in range(2)]  # both ranks' gradients, same draws
        for i, p in enumerate(params):
            p.grad = grads[rank][i].clone()
        params[3].grad = None if rank == 1 else params[3].grad  # used on rank 0 only
        params[4].grad = None  # used nowhere
        calls = average_gradients(params, 2, bucket_numel=12, in_place_numel=12)
        expected = [(grads[0][i] + grads[1][i]) / 2 for i in range(3)] + [grads[0][3] / 2]
        ok = all(torch.allclose(p.grad, e) for p, e in zip(params, expected)) and params[4].grad is None
        # the counts of gradients; in place: the 12 elements; float32 buckets [5 + 7] [2 (None everywhere)];
        # float64: [2]
        print("RESULT", ok, calls, params[2].grad.dtype)
        dist.destroy_process_group()
    """)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**ENV, "RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
             for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (stdout, stderr) in zip(procs, outs):
        assert p.returncode == 0, stderr[-2000:]
        assert "RESULT True 5 torch.float64" in stdout


def test_average_gradients_is_identity_without_process_group():
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    from comlrl_lightning.distributed import average_gradients

    assert average_gradients([p], 2) == 0 and torch.equal(p.grad, torch.full((3,), 2.0))


# --- refused strategies -----------------------------------------------------------------------------------------
def _routes(message: str) -> None:
    assert 'strategy="ddp"' in message and "LoRA" in message and "FSDP2" in message
    assert "ModelParallelStrategy()" in message and "docs/scaling.md" in message


def test_deepspeed_is_refused_with_the_route():
    from lightning.pytorch.strategies import DeepSpeedStrategy

    fake = DeepSpeedStrategy.__new__(DeepSpeedStrategy)  # DeepSpeed itself is not installed: no __init__
    message = strategy_refusal(fake)
    assert "DeepSpeed" in message and "single optimizer" in message
    _routes(message)
    with pytest.raises(ValueError, match="DeepSpeed"):
        check_strategy(fake)


def test_fsdp1_is_refused_with_the_route():
    from lightning.pytorch.strategies import FSDPStrategy  # Trainer(strategy="fsdp") needs a GPU: the object alone

    trainer = SimpleNamespace(strategy=FSDPStrategy(), num_devices=1, num_nodes=1)
    with pytest.raises(ValueError) as err:
        preflight(trainer)
    assert 'strategy="fsdp", FSDP1' in str(err.value) and "19685" in str(err.value)
    _routes(str(err.value))


def test_ddp_and_single_device_pass():
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    assert strategy_refusal(DDPStrategy()) is None
    assert strategy_refusal(SingleDeviceStrategy("cpu")) is None


def test_model_parallel_needs_configure_model():
    """Every team module shards its agents in configure_model (tests/components/test_fsdp.py); a module without one
    is refused with the routes."""
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    class Prepared(L.LightningModule):
        def configure_model(self) -> None:
            pass

    assert strategy_refusal(ModelParallelStrategy(), Prepared()) is None
    message = strategy_refusal(ModelParallelStrategy(), L.LightningModule())
    assert "needs the module to shard its models in configure_model()" in message
    _routes(message)


# --- multi-node pre-flight --------------------------------------------------------------------------------------
CLEAN = ("SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "SLURM_JOB_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
         "TORCHELASTIC_RUN_ID")


@pytest.fixture
def bare_env(monkeypatch):
    for name in CLEAN:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_matching_launches_pass(bare_env):
    assert launch_mismatches(4, 2, {}) == []
    bare_env.setenv("SLURM_NTASKS", "8")
    bare_env.setenv("SLURM_NTASKS_PER_NODE", "4")
    bare_env.setenv("SLURM_NNODES", "2")
    bare_env.setenv("WORLD_SIZE", "8")
    bare_env.setenv("LOCAL_WORLD_SIZE", "4")
    check_launch(4, 2)
    assert launch_mismatches(4, 2, {"SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4(x2)", "SLURM_NNODES": "2"}) == []


def test_slurm_tasks_per_node_mismatch(bare_env):
    bare_env.setenv("SLURM_NTASKS", "8")
    bare_env.setenv("SLURM_NTASKS_PER_NODE", "4")
    bare_env.setenv("SLURM_NNODES", "2")
    with pytest.raises(ValueError) as err:
        check_launch(2, 2)
    message = str(err.value)
    assert "SLURM_NTASKS_PER_NODE=4" in message and "devices=2" in message and "set devices=4" in message
    assert "SLURM_NTASKS=8" in message and "2 x 2 = 4" in message and "--ntasks-per-node=2" in message
    assert "wait forever" in message


def test_slurm_nodes_mismatch(bare_env):
    bare_env.setenv("SLURM_NTASKS", "4")
    bare_env.setenv("SLURM_NTASKS_PER_NODE", "2")
    bare_env.setenv("SLURM_NNODES", "2")
    with pytest.raises(ValueError, match=r"SLURM_NNODES=2 node\(s\) but the trainer has num_nodes=1: set num_nodes=2"):
        check_launch(2, 1)


def test_slurm_ntasks_alone_and_uneven_nodes(bare_env):
    problems = launch_mismatches(2, 1, {"SLURM_NTASKS": "3"})
    assert len(problems) == 1 and "SLURM_NTASKS=3" in problems[0] and "= 2" in problems[0]
    uneven = launch_mismatches(2, 2, {"SLURM_NTASKS": "3", "SLURM_NTASKS_PER_NODE": "2,1", "SLURM_NNODES": "2"})
    assert any("same number of tasks" in p for p in uneven)


def test_interactive_slurm_shell_is_not_checked(bare_env):
    # salloc's shell: Lightning ignores SLURM there and starts its own processes, so the counts need not match
    assert launch_mismatches(2, 1, {"SLURM_NTASKS": "8", "SLURM_JOB_NAME": "interactive"}) == []


def test_torchrun_mismatches(bare_env):
    bare_env.setenv("WORLD_SIZE", "4")
    bare_env.setenv("LOCAL_WORLD_SIZE", "2")
    bare_env.setenv("TORCHELASTIC_RUN_ID", "abc")
    with pytest.raises(ValueError) as err:  # torchrun --nnodes=2 --nproc-per-node=2, trainer devices=4 num_nodes=1
        check_launch(4, 1)
    message = str(err.value)
    assert "LOCAL_WORLD_SIZE=2" in message and "devices=4" in message and "--nproc-per-node=4" in message
    assert "started WORLD_SIZE" not in message  # 4 x 1 = 4 agrees with WORLD_SIZE
    problems = launch_mismatches(1, 1, {"WORLD_SIZE": "4"})
    assert len(problems) == 1 and "WORLD_SIZE=4" in problems[0] and "--nnodes=1 --nproc-per-node=1" in problems[0]


def test_bad_environment_values_are_named(bare_env):
    with pytest.raises(ValueError, match="SLURM_NNODES='two'"):
        launch_mismatches(1, 1, {"SLURM_NTASKS": "1", "SLURM_NNODES": "two"})
    with pytest.raises(ValueError, match="SLURM_NTASKS_PER_NODE='4x'"):
        launch_mismatches(1, 1, {"SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "4x"})


def test_preflight_checks_multi_process_trainers_and_torchrun(bare_env):
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy

    bare_env.setenv("WORLD_SIZE", "2")  # what Lightning's own launcher leaves behind after a 2-process fit
    preflight(SimpleNamespace(strategy=SingleDeviceStrategy("cpu"), num_devices=1, num_nodes=1))
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        preflight(SimpleNamespace(strategy=DDPStrategy(), num_devices=2, num_nodes=2))
    bare_env.setenv("TORCHELASTIC_RUN_ID", "job")  # torchrun started 2 processes for a single-device trainer
    with pytest.raises(ValueError, match="WORLD_SIZE=2"):
        preflight(SimpleNamespace(strategy=SingleDeviceStrategy("cpu"), num_devices=1, num_nodes=1))


def test_multi_turn_early_termination_is_refused_on_several_processes(bare_env):
    """Ranks would stop their trees at different depths and run different numbers of agent updates (each an
    all-reduce): refused before any process group exists, naming the option, its value and the fix. One process,
    one turn, or no threshold pass."""
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

    from comlrl_lightning.config import IACConfig, MAGRPOConfig
    from comlrl_lightning.strategies import uneven_rollout_refusal

    class Module:  # what preflight reads of a team module: its args, and configure_model (FSDP2)
        def __init__(self, args):
            self.args = args

        def configure_model(self) -> None:
            pass

    module = Module

    stops = module(MAGRPOConfig(num_turns=2, early_termination_threshold=-0.2))
    for strategy in (DDPStrategy(), ModelParallelStrategy()):
        with pytest.raises(ValueError) as err:
            preflight(SimpleNamespace(strategy=strategy, num_devices=2, num_nodes=1), stops)
        assert "early_termination_threshold=-0.2 with num_turns=2 on 2 processes" in str(err.value)
        assert "null" in str(err.value) and "docs/scaling.md" in str(err.value)
    assert "on 4 processes" in uneven_rollout_refusal(module(IACConfig(num_turns=3, early_termination_threshold=0.5)),
                                                      4)
    preflight(SimpleNamespace(strategy=SingleDeviceStrategy("cpu"), num_devices=1, num_nodes=1), stops)
    for fine in (MAGRPOConfig(num_turns=2), MAGRPOConfig(num_turns=1, early_termination_threshold=-0.2)):
        assert uneven_rollout_refusal(module(fine), 2) is None
        preflight(SimpleNamespace(strategy=DDPStrategy(), num_devices=2, num_nodes=1), module(fine))
    assert uneven_rollout_refusal(None, 2) is None
