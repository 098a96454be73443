"""The cost of the checkpoint digest (comlrl_lightning/modules/checkpoint_seal.py): seal + verify of the state dict
of a random 30 M parameter Qwen2 (8 layers x 512 hidden, MLP 1728, vocabulary 400), built from a config (nothing is
downloaded). Prints the median of ``--repeats`` runs and, for scale, one ``torch.save`` of the same checkpoint.

    .venv/bin/python benchmarks/seal_cost.py --repeats 5
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the hashing itself is one thread)")
    opts = parser.parse_args()

    import lightning as L
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from comlrl_lightning.modules.checkpoint_seal import seal_checkpoint, verify_checkpoint

    torch.set_num_threads(opts.threads)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=400, hidden_size=512, intermediate_size=1728, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False)
    holder = L.LightningModule()
    holder.model = Qwen2ForCausalLM(config)
    state = holder.state_dict()
    params = sum(p.numel() for p in holder.parameters())
    megabytes = sum(t.numel() * t.element_size() for t in state.values()) / 1e6
    seal, verify = [], []
    for _ in range(opts.repeats):
        checkpoint = {"state_dict": state, "callbacks": {}, "comlrl_progress": {"env_step": 1}}
        start = time.perf_counter()
        seal_checkpoint(holder, checkpoint)
        middle = time.perf_counter()
        verify_checkpoint(holder, checkpoint)
        seal.append(middle - start)
        verify.append(time.perf_counter() - middle)
    start = time.perf_counter()
    torch.save(checkpoint, io.BytesIO())
    save = time.perf_counter() - start
    total = [s + v for s, v in zip(seal, verify)]
    print(f"{params / 1e6:.1f} M parameters, {megabytes:.0f} MB state dict ({next(iter(state.values())).dtype})")
    print(f"seal   median {statistics.median(seal):.3f} s")
    print(f"verify median {statistics.median(verify):.3f} s")
    print(f"seal + verify median {statistics.median(total):.3f} s  (runs: {', '.join(f'{t:.3f}' for t in total)})")
    print(f"torch.save to memory, once: {save:.3f} s")


if __name__ == "__main__":
    main()
