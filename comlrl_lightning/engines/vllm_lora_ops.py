"""Multi-LoRA matrix products for vLLM's CPU build, grouped by adapter (docs/engines.md, "LoRA on CPU").

vLLM's CPU build applies LoRA adapters with PyTorch ops that first copy, for every token of a step, the whole
adapter matrix that token uses (``weights[indices]``, a ``[tokens, out, in]`` tensor) and then contract it with
an ``einsum``. With a few hundred sequences per step that copy costs more than the model's own layers: a team of
LoRA agents generated at less than half the tokens/s of a full-model agent. A team has a handful of adapters, so
the same products are a handful of dense matrix products, one per adapter in the batch:

    out[t] = W[i_t] @ x[t]   computed as   out[rows(i)] = x[rows(i)] @ W[i]^T   for each adapter i in the batch

:func:`install` replaces vLLM's six CPU LoRA ops (``bgmv_*`` for decode steps, ``sgmv_*`` for prefills) with
:func:`grouped_lora_matmul`-based ones of the same signatures and the same output semantics. It runs inside
vLLM's worker process (from :mod:`comlrl_lightning.engines.vllm_worker`), on CPU only; GPU builds use vLLM's own
kernels. Rows whose index is negative (a request without an adapter) get no LoRA term, as on GPU; the original
CPU op indexed the last adapter for them. Only torch is imported here.
"""

from __future__ import annotations

import torch


def grouped_lora_matmul(inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor,
                        dtype: torch.dtype) -> torch.Tensor:
    """Per-row LoRA product, one dense matmul per adapter present.

    ``out[t] = weights[indices[t]] @ inputs[t]`` for ``indices[t] >= 0`` and ``out[t] = 0`` for a negative index,
    computed in ``dtype``.

    Args:
        inputs: ``[T, in]``.
        weights: stacked adapter matrices ``[L, out, in]`` (or ``[L, 1, out, in]``, vLLM's layout).
        indices: ``[T]`` adapter slot of each row (``-1``: none).
        dtype: the dtype of the products and of the result.

    Returns:
        ``[T, out]`` in ``dtype``.
    """
    if weights.dim() == 4:
        weights = weights.squeeze(1)
    x = inputs.to(dtype)
    rows = x.shape[0]
    if indices.numel() != rows:
        raise ValueError(f"grouped_lora_matmul: {indices.numel()} adapter indices for {rows} input rows")
    slots, counts = torch.unique_consecutive(indices, return_counts=True)
    slots, counts = slots.tolist(), counts.tolist()
    if len(slots) == 1 and slots[0] >= 0:  # one adapter for the whole batch: one product
        return x @ weights[slots[0]].to(dtype).t()
    out = torch.zeros(rows, weights.shape[1], dtype=dtype, device=x.device)
    if len(slots) <= len(set(slots)) + 2:  # rows grouped by adapter (requests come in adapter order): slices
        start = 0
        for slot, count in zip(slots, counts):
            if slot >= 0:
                torch.mm(x[start: start + count], weights[slot].to(dtype).t(), out=out[start: start + count])
            start += count
        return out
    for slot in set(slots):  # interleaved rows: one gather per adapter
        if slot < 0:
            continue
        picked = (indices == slot).nonzero().squeeze(1)
        out.index_copy_(0, picked, x.index_select(0, picked) @ weights[slot].to(dtype).t())
    return out


def _exploded(lora_indices: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """Per-token adapter indices of a prefill: each sequence's index repeated over its tokens."""
    return torch.repeat_interleave(lora_indices, seq_lens)


def bgmv_shrink(inputs, lora_a_weights, output_tensor, lora_indices_tensor, scaling=1.0):
    """``output[:, :r] = scaling * A[i_t] @ x[t]`` (decode step)."""
    out = grouped_lora_matmul(inputs, lora_a_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : out.shape[1]] = scaling * out


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):
    """``output[:, :n] (+)= B[i_t] @ h[t]`` over the columns both have (decode step); a single computed row is
    broadcast to every output row, as in vLLM."""
    out = grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = 1 if out.shape[0] == 1 and output_tensor.shape[0] != 1 else output_tensor.shape[0]
    width = min(out.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :width] += out[:limit, :width]
    else:
        output_tensor[:, :width] = out[:limit, :width]


def bgmv_expand_slice(inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size,
                      add_inputs=True):
    """``output[:, offset:offset + size] (+)= B[i_t] @ h[t]`` (decode step, one slice of a fused layer)."""
    out = grouped_lora_matmul(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset: slice_offset + slice_size] += out
    else:
        output_tensor[:, slice_offset: slice_offset + slice_size] = out


def sgmv_shrink(inputs, lora_a_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, scaling):
    """:func:`bgmv_shrink` over a prefill, with per-sequence adapter indices."""
    bgmv_shrink(inputs, lora_a_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor), scaling)


def sgmv_expand(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                batches, max_seq_length, token_nums, add_inputs=False):
    """:func:`bgmv_expand` over a prefill, with per-sequence adapter indices."""
    bgmv_expand(inputs, lora_b_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor), add_inputs)


def sgmv_expand_slice(inputs, lora_b_weights, output_tensor, b_seq_start_loc, seq_len_tensor, lora_indices_tensor,
                      batches, max_seq_length, token_nums, slice_offset, slice_size, add_inputs=False):
    """:func:`bgmv_expand_slice` over a prefill, with per-sequence adapter indices."""
    bgmv_expand_slice(inputs, lora_b_weights, output_tensor, _exploded(lora_indices_tensor, seq_len_tensor),
                      slice_offset, slice_size, add_inputs)


OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def install() -> bool:
    """Put the grouped ops in place of vLLM's CPU LoRA ops, in this process. Returns False (and changes nothing)
    off CPU, or when this vLLM does not have the six ops where 0.32 has them."""
    import importlib
    import sys

    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return False
        modules = [importlib.import_module(name) for name in (
            "vllm.lora.ops.torch_ops.lora_ops", "vllm.lora.ops.torch_ops", "vllm.lora.punica_wrapper.punica_cpu")]
    except Exception:  # another vLLM layout (ImportError) or a module that fails to load: keep vLLM's own ops
        return False
    if not all(hasattr(m, op) for m in modules for op in OPS):
        return False
    ours = sys.modules[__name__]
    for module in modules:
        for op in OPS:
            setattr(module, op, getattr(ours, op))
    return True
