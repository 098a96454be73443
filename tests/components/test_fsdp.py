"""FSDP2 through Lightning's ModelParallelStrategy (docs/scaling.md, "FSDP2"): the team modules shard their agents in
configure_model; an FSDP2 fit ends with the weights of the strategy="ddp" fit of the same seed, each rank holding
half of every member; the mesh checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from comlrl_lightning.sharding import block_classes, mesh_problem, resolve_mesh, shard_units
from comlrl_lightning.strategies import preflight, strategy_refusal

TESTS = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(TESTS.parent), "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
MEMBERS = {"magrpo": 2, "iac": 4, "maac": 3, "madpo": 2, "madpo_iter": 2, "marlhf": 2}  # agents, then critics


def _fit_both(tiny_model_dir, tmp_path, fits):
    out = subprocess.run([sys.executable, str(TESTS / "fsdp_strategy_script.py"), str(tmp_path), tiny_model_dir,
                          *fits], capture_output=True, text=True, timeout=900, env=ENV, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    return [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]


def _check(ranks, name):
    ddp, fsdp = ranks[0][f"{name}/ddp"], ranks[0][f"{name}/fsdp2"]
    assert fsdp["world"] == 2 and fsdp["global_step"] == ddp["global_step"] > 0
    assert fsdp["param_type"] == "DTensor" and ddp["param_type"] == "Parameter"
    assert len(fsdp["weights"]) == len(ddp["weights"]) == MEMBERS.get(name.removesuffix("_kl"), 2)
    local = [ranks[r][f"{name}/fsdp2"]["local"] for r in (0, 1)]
    numel, total = fsdp["numel"], sum(fsdp["numel"])
    for m, n in enumerate(numel):  # every member split between the ranks (DDP: each rank holds it whole)
        assert local[0][m] + local[1][m] == n and ranks[1][f"{name}/ddp"]["local"][m] == n, (name, m)
    for r in (0, 1):  # the agents in exact halves; a value head's 1-row output layer sits on rank 0 whole
        assert local[r][:2] == [n // 2 for n in numel[:2]], (name, r, local[r])
        assert abs(sum(local[r]) - total / 2) <= 0.01 * total, (name, r, local[r], numel)
    for a, b in zip(ranks[0][f"{name}/fsdp2"]["weights"], ranks[1][f"{name}/fsdp2"]["weights"]):
        assert torch.equal(a, b), name  # the gathered weights are one model
    for before, a, b in zip(fsdp["initial"], ddp["weights"], fsdp["weights"]):
        assert torch.isfinite(b).all() and not torch.equal(before, b), f"{name}: a member did not train"
        if name == "madpo":  # clipping and accumulation sum in another order; AdamW's normalized step g/(|g|+eps)
            # magnifies that rounding in gradient entries near 0: 9 of 156k entries differ by more than 1e-6
            diff = (b - a).abs()
            assert diff.max() <= 5e-5 and (diff > 1e-6).sum() <= 1e-3 * diff.numel(), (name, diff.max())
        else:
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=f"{name}: FSDP2 differs from strategy=ddp")


@pytest.mark.slow
def test_fsdp2_equals_ddp_and_shards_half_for_every_family(tiny_model_dir, tmp_path):
    """On 2 gloo processes, 2-turn MAGRPO, IAC (separate critics), MAAC (one shared critic), MADPO (clipping,
    accumulation over 2 batches), MADPOIter (2 rounds), MARLHF (a replicated reward model, then RL) and MAGRPO with
    LoRA on one base: every trained parameter is a DTensor, each rank holds half of every agent, and the fit ends
    with the weights of strategy="ddp" from the same seed (generation gathers each agent whole)."""
    ranks = _fit_both(tiny_model_dir, tmp_path, [*MEMBERS, "magrpo_lora"])
    for name in MEMBERS:
        _check(ranks, name)
    _check_lora(ranks, tiny_model_dir, tmp_path)


@pytest.mark.slow
def test_fsdp2_exports_critics_and_balances_uneven_collections(tiny_model_dir, tmp_path):
    """On 2 gloo processes: IAC (separate critics) and MAAC exported under FSDP2 write the folders of DDP's export
    (agents, critics, value heads) with the same weights; MADPO with 3 items collected one per generate call
    (rank 0 calls generate twice per agent, rank 1 once) does not hang and equals strategy="ddp"."""
    from safetensors.torch import load_file

    ranks = _fit_both(tiny_model_dir, tmp_path, ["iac", "maac", "madpo_odd"])
    for name in ("iac", "maac", "madpo_odd"):
        _check(ranks, name)
    for name in ("iac", "maac"):
        ddp, fsdp = tmp_path / f"{name}_ddp_export", tmp_path / f"{name}_fsdp2_export"
        files = sorted(p.relative_to(ddp) for p in ddp.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(fsdp) for p in fsdp.rglob("*") if p.is_file()), name
        assert any(f.name == "value_head.pt" for f in files) and any("critic" in f.parts for f in files), files
        for f in files:
            if f.suffix not in (".pt", ".safetensors"):
                continue
            a, b = (torch.load(d / f) if f.suffix == ".pt" else load_file(d / f) for d in (ddp, fsdp))
            assert a.keys() == b.keys(), (name, f)
            for k in a:
                torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=f"{name}: {f} {k}")


@pytest.mark.slow
def test_fsdp2_shards_references_and_writes_history_snapshots(tiny_model_dir, tmp_path):
    """On 2 gloo processes: 2-turn MAGRPO and IAC with the reference KL (coefficient 0.5) under FSDP2 shard the frozen
    references too (DTensors, half of each per rank, still the initial agents), measures the KLs of strategy="ddp"
    (> 0 once the agents moved) and ends with its weights; MADPOIter against the history comparator (2 rounds)
    gathers each snapshot on every rank, rank 0 writes the folders DDP writes (same files, same weights), and the
    run equals strategy="ddp"."""
    from safetensors.torch import load_file

    ranks = _fit_both(tiny_model_dir, tmp_path, ["magrpo_kl", "iac_kl", "madpo_history"])
    for name in ("magrpo_kl", "iac_kl", "madpo_history"):
        _check(ranks, name)
    for name in ("magrpo_kl", "iac_kl"):
        ddp, fsdp = ranks[0][f"{name}/ddp"], ranks[0][f"{name}/fsdp2"]
        assert fsdp["ref_type"] == "DTensor" and ddp["ref_type"] == "Parameter", name
        assert ranks[1][f"{name}/ddp"]["ref_local"] == ddp["ref_numel"]  # DDP: each rank holds every reference whole
        for r in (0, 1):
            assert ranks[r][f"{name}/fsdp2"]["ref_local"] == [n // 2 for n in fsdp["ref_numel"]], (name, r)
            for ref, initial in zip(ranks[r][f"{name}/fsdp2"]["ref_weights"], fsdp["agents_initial"]):
                assert torch.equal(ref, initial), name  # frozen: the initial policy
            assert ranks[r][f"{name}/fsdp2"]["kl_max"] > 0, name  # the agents moved away from it within the fit
            torch.testing.assert_close(ranks[r][f"{name}/fsdp2"]["kl_sum"], ranks[r][f"{name}/ddp"]["kl_sum"],
                                       rtol=1e-5, atol=1e-6, msg=name)

    folders = {run: tmp_path / f"snapshots_{run}" for run in ("ddp", "fsdp2")}
    files = {run: sorted(p.relative_to(d) for p in d.rglob("*.safetensors")) for run, d in folders.items()}
    assert files["ddp"] == files["fsdp2"]
    assert {f.parts[0] for f in files["ddp"]} == {"initial", "iteration_0000", "iteration_0001"}, files["ddp"]
    for f in files["ddp"]:
        a, b = (load_file(folders[run] / f) for run in ("ddp", "fsdp2"))
        assert a.keys() == b.keys(), f
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-5, msg=f"{f} {k}")
    for folder in (folders["fsdp2"] / "iteration_0000").iterdir():  # ordinary from_pretrained folders
        assert '"Qwen2ForCausalLM"' in (folder / "config.json").read_text()


def _check_lora(ranks, tiny_model_dir, tmp_path):
    """2 LoRA agents on one frozen base: the base is sharded once (half per rank) and stays frozen, each adapter (its
    own optimizer) is sharded and ends equal to strategy="ddp"; save_team wrote peft folders of the trained adapters."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    ddp, fsdp = ranks[0]["magrpo_lora/ddp"], ranks[0]["magrpo_lora/fsdp2"]
    assert fsdp["param_type"] == "DTensor" and fsdp["global_step"] == ddp["global_step"] > 0
    for r in (0, 1):
        assert ranks[r]["magrpo_lora/fsdp2"]["local"] == [n // 2 for n in fsdp["numel"]]
    adapters, base = fsdp["weights"][:2], fsdp["weights"][2]
    assert torch.equal(base, fsdp["initial"][2]) and torch.equal(base, ddp["weights"][2])  # frozen
    for before, a, b in zip(fsdp["initial"], ddp["weights"][:2], adapters):
        assert not torch.equal(before, b)
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for i in (0, 1):
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                          tmp_path / "magrpo_lora_agents" / f"agent_{i}")
        exported = torch.cat([p.detach().double().reshape(-1) for n, p in model.named_parameters() if "lora_" in n])
        assert torch.equal(exported, adapters[i])


def _checkpoint_run(tiny_model_dir, tmp_path, mode, devices=2, ckpt=None, fit="madpo_iter"):
    argv = [sys.executable, str(TESTS / "fsdp_checkpoint_script.py"), str(tmp_path), tiny_model_dir, fit, mode,
            str(devices)]
    out = subprocess.run(argv + ([ckpt] if ckpt else []), capture_output=True, text=True, timeout=300, env=ENV,
                         cwd=tmp_path)
    error = tmp_path / f"{mode}_error.txt"
    return out, (error.read_text() if error.exists() else None)


@pytest.mark.slow
def test_fsdp2_madpo_iter_resume_equals_uninterrupted(tiny_model_dir, tmp_path):
    """MADPOIter under FSDP2, 2 rounds, writes distributed checkpoints (one shard file per rank); resuming the round-0
    checkpoint (round files, replay and per-rank streams in meta.pt; the agents' and optimizers' shards) ends with the
    uninterrupted run's weights and global step."""
    out, error = _checkpoint_run(tiny_model_dir, tmp_path, "full")
    assert out.returncode == 0 and error is None, (error, out.stderr[-3000:])
    first = tmp_path / "ckpt" / "epoch=0.ckpt"
    assert {"__0_0.distcp", "__1_0.distcp", "meta.pt"} <= {p.name for p in first.iterdir()}  # a shard per rank
    out, error = _checkpoint_run(tiny_model_dir, tmp_path, "resume", ckpt=str(first))
    assert out.returncode == 0 and error is None, (error, out.stderr[-3000:])
    for r in (0, 1):
        full, resumed = torch.load(tmp_path / f"full_rank{r}.pt"), torch.load(tmp_path / f"resume_rank{r}.pt")
        assert resumed["global_step"] == full["global_step"] > 0 and resumed["world"] == 2
        for a, b in zip(full["weights"], resumed["weights"]):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_fsdp2_world_size_refusal_and_export(tiny_model_dir, tmp_path):
    """A MAGRPO FSDP2 checkpoint resumed on 1 process is refused, naming both world sizes; save_agents from one rank
    is refused naming save_team, which writes ordinary from_pretrained folders holding the trained weights."""
    from transformers import AutoModelForCausalLM

    out, error = _checkpoint_run(tiny_model_dir, tmp_path, "full", fit="magrpo")
    assert out.returncode == 0 and error is None, (error, out.stderr[-3000:])
    out, error = _checkpoint_run(tiny_model_dir, tmp_path, "resume", devices=1, fit="magrpo",
                                 ckpt=str(tmp_path / "ckpt" / "epoch=0.ckpt"))
    assert out.returncode == 3 and error is not None, out.stderr[-3000:]
    assert "world size 2" in error and "world size 1" in error and "relaunch with 2 processes" in error

    full = torch.load(tmp_path / "full_rank0.pt")
    assert "save_team" in full["refused"] and "every rank" in full["refused"]
    initial = torch.cat([p.detach().double().reshape(-1)
                         for p in AutoModelForCausalLM.from_pretrained(tiny_model_dir).parameters()])
    for i in (0, 1):
        folder = tmp_path / "agents" / f"agent_{i}"
        assert '"Qwen2ForCausalLM"' in (folder / "config.json").read_text()
        model = AutoModelForCausalLM.from_pretrained(folder)
        weights = torch.cat([p.detach().double().reshape(-1) for p in model.parameters() if p.requires_grad])
        assert torch.equal(weights, full["weights"][i])
        assert not torch.equal(weights, initial)  # trained


# --- mesh checks and what gets sharded ------------------------------------------------------------------------
def test_mesh_auto_is_data_parallel_over_every_process():
    assert resolve_mesh("auto", "auto", 4) == (4, 1)
    assert resolve_mesh(4, "auto", 4) == (4, 1)
    assert mesh_problem("auto", "auto", 4) is None and mesh_problem(4, 1, 4) is None


def test_tensor_parallel_and_uncovered_mesh_are_clear_errors():
    message = mesh_problem("auto", 2, 4)
    assert "tensor_parallel_size=2" in message and "tensor parallelism" in message
    assert "data_parallel_size=4, tensor_parallel_size=1" in message
    message = mesh_problem(3, 1, 4)
    assert "3 x 1 = 3" in message and "runs 4" in message and "data_parallel_size=4" in message
    with pytest.raises(ValueError, match="data_parallel_size=0"):
        resolve_mesh(0, 1, 2)


def test_preflight_checks_and_resolves_the_model_parallel_mesh(tiny_model_dir):
    import lightning as L
    from lightning.pytorch.strategies import ModelParallelStrategy

    class Prepared(L.LightningModule):
        def configure_model(self) -> None:
            pass

    strategy = ModelParallelStrategy(data_parallel_size=3)
    with pytest.raises(ValueError, match="3 x 1 = 3"):
        preflight(SimpleNamespace(strategy=strategy, num_devices=2, num_nodes=1), Prepared())
    strategy = ModelParallelStrategy(tensor_parallel_size=2)
    assert "tensor parallelism" in strategy_refusal(strategy, Prepared(), 2)
    strategy = ModelParallelStrategy()  # "auto": Lightning would make both processes tensor-parallel ranks
    preflight(SimpleNamespace(strategy=strategy, num_devices=1, num_nodes=1), Prepared())
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (1, 1)
    on = Prepared()
    on.args = SimpleNamespace(agent_overlap="on")
    assert "agent_overlap='on'" in strategy_refusal(ModelParallelStrategy(), on, 2)


def test_every_team_module_implements_configure_model():
    from comlrl_lightning.modules.base import TeamModuleBase

    assert strategy_refusal(__import__("lightning.pytorch.strategies", fromlist=["x"]).ModelParallelStrategy(),
                            TeamModuleBase.__new__(TeamModuleBase)) is None


def test_references_are_frozen_members_and_their_devices_are_the_meshs():
    """The references to shard are the distinct frozen copies (a LoRA agent's reference, the base with its adapter
    off, has none); reference_devices under ModelParallelStrategy is refused naming the option and its value."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from comlrl_lightning.sharding import frozen_members, shard_team

    shared, lora = torch.nn.Linear(2, 2), None
    module = SimpleNamespace(reference=SimpleNamespace(models=[shared, shared, lora]),
                             _trainer=SimpleNamespace(strategy=ModelParallelStrategy()),
                             args=SimpleNamespace(parallel_training="none", generation_backend="hf",
                                                  reference_devices="cuda:1"))
    assert frozen_members(module) == [shared]
    assert frozen_members(SimpleNamespace(reference=None)) == []
    with pytest.raises(ValueError, match=r"reference_devices='cuda:1' with ModelParallelStrategy"):
        shard_team(module)


def test_shard_units_are_the_decoder_layers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert block_classes(model) == {"Qwen2DecoderLayer"}
    assert shard_units(model) == list(model.model.layers)
    assert shard_units(torch.nn.Linear(2, 2)) == []
