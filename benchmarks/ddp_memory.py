"""Per-rank bytes of parameters plus AdamW state for 2 full agents on 2 CPU processes (gloo): what DDP holds (every
rank a whole replica of both agents, what ``strategy="ddp"`` runs today), against what FSDP2 would hold, computed
with torch's ``fully_shard`` on the same plain models.

The FSDP2 column is NOT the library: the team modules do not implement FSDP2 yet (docs/scaling.md, "Strategies";
``ModelParallelStrategy`` is refused). It is torch's ``fully_shard`` applied by this script to each agent (each
decoder layer, then the whole model, on a 2-rank mesh), one AdamW per agent, one training step on random tokens:
the figure a future FSDP2 integration should reach.

Run ``python benchmarks/ddp_memory.py [--model tiny|8m|30m]``. Models: random Qwen2 models of
``comlrl_lightning.tiny``'s shapes (tiny: 2 layers, hidden 64, 0.16 M parameters; 8m: 8 layers, hidden 256; 30m:
10 layers, hidden 512), two agents, each its own copy. Both variants take one AdamW step (so the optimizer state
exists) and count, on each rank, the bytes of the tensors that rank holds: parameters (FSDP2: the local shards of
the DTensors) and optimizer state (``exp_avg``, ``exp_avg_sq``, ``step``). Gradients are not counted (both
variants free or keep them the same way). Printed per rank: parameter bytes, optimizer bytes, their sum, and the
ratio FSDP2 / DDP (issue 29 asks <= 0.55).
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

SHAPES = {"tiny": {}, "8m": dict(hidden_size=256, num_layers=8, intermediate_size=1024),
          "30m": dict(hidden_size=512, num_layers=10, intermediate_size=1536, num_heads=8, num_kv_heads=4)}


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _bytes(tensors) -> int:
    return sum(_local(t).numel() * _local(t).element_size() for t in tensors)


def _state_tensors(opt: torch.optim.Optimizer):
    return [v for state in opt.state.values() for v in state.values() if torch.is_tensor(v)]


def _agents(model_dir: str, sharded: bool):
    from transformers import AutoModelForCausalLM

    agents = []
    for i in range(2):
        torch.manual_seed(i)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        agents.append(model)
    return agents


def _measure(model_dir: str, sharded: bool) -> tuple[int, int]:
    agents = _agents(model_dir, sharded)
    params = opt_bytes = 0
    for model in agents:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
        ids = torch.randint(0, model.config.vocab_size, (2, 16))
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        params += _bytes(model.parameters())
        opt_bytes += _bytes(_state_tensors(opt))
    return params, opt_bytes


def _worker(rank: int, port: int, model_dir: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ddp = _measure(model_dir, sharded=False)
    fsdp = _measure(model_dir, sharded=True)
    gathered: list = [None, None]
    dist.all_gather_object(gathered, (ddp, fsdp))
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(gathered))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="8m", choices=sorted(SHAPES))
    a = p.parse_args()
    from comlrl_lightning.tiny import build_tiny_model

    root = tempfile.mkdtemp(prefix="comlrl_ddp_memory_")
    model_dir = build_tiny_model(os.path.join(root, a.model), **SHAPES[a.model])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = os.path.join(root, "result.txt")
    mp.spawn(_worker, args=(port, model_dir, out), nprocs=2, join=True)
    results = eval(open(out).read())  # noqa: S307 - our own repr of ints
    mib = 1024 ** 2
    print(f"model {a.model}: 2 full agents, AdamW, float32, 2 ranks (gloo); MiB per rank")
    print(f"{'rank':>4} {'variant':>24} {'params':>9} {'optimizer':>10} {'total':>9} {'vs DDP':>7}")
    for rank, ((dp, do), (fp, fo)) in enumerate(results):
        print(f"{rank:>4} {'DDP (strategy=ddp)':>24} {dp / mib:9.2f} {do / mib:10.2f} {(dp + do) / mib:9.2f} {1:7.2f}")
        print(f"{rank:>4} {'FSDP2 (torch, not lib)':>24} {fp / mib:9.2f} {fo / mib:10.2f} {(fp + fo) / mib:9.2f} "
              f"{(fp + fo) / (dp + do):7.3f}")


if __name__ == "__main__":
    main()
