"""The grouped LoRA products that replace vLLM's CPU LoRA ops (docs/engines.md, "LoRA on CPU"), against values
worked out by hand and against the per-row definition. Needs only torch: vLLM is not imported."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.engines import vllm_lora_ops as ops

# two adapters, 2 x 3 matrices (out = 2, in = 3)
W = torch.tensor([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]],
                  [[0.0, 0.0, 2.0], [1.0, 1.0, 1.0]]])
X = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])


def _per_row(x, w, idx):
    """The definition, one row at a time: W[i_t] @ x[t], zero for a negative index."""
    w = w.squeeze(1) if w.dim() == 4 else w
    return torch.stack([w[i] @ x[t] if i >= 0 else torch.zeros(w.shape[1]) for t, i in enumerate(idx.tolist())])


@pytest.mark.parametrize("idx, want", [
    ([0, 0, 0], [[1, 2], [4, 5], [7, 8]]),             # one adapter: one product
    ([0, 0, 1], [[1, 2], [4, 5], [18, 24]]),           # grouped rows: slices
    ([1, 0, 1], [[6, 6], [4, 5], [18, 24]]),           # interleaved
    ([-1, 1, -1], [[0, 0], [12, 15], [0, 0]]),         # a row without adapter gets no LoRA term
])
def test_grouped_product_by_hand(idx, want):
    got = ops.grouped_lora_matmul(X, W, torch.tensor(idx), torch.float32)
    assert torch.equal(got, torch.tensor(want, dtype=torch.float32))


@pytest.mark.parametrize("pattern", ["blocks", "interleaved", "with_none", "single"])
def test_grouped_product_equals_the_per_row_definition(pattern):
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(37, 16, generator=g), torch.randn(3, 1, 24, 16, generator=g)  # vLLM's [L, 1, out, in]
    idx = {"blocks": [0] * 12 + [2] * 20 + [1] * 5, "interleaved": [t % 3 for t in range(37)],
           "with_none": [t % 4 - 1 for t in range(37)], "single": [2] * 37}[pattern]
    idx = torch.tensor(idx)
    assert torch.allclose(ops.grouped_lora_matmul(x, w, idx, torch.float32), _per_row(x, w, idx), atol=1e-5)


def test_shrink_and_expand_write_the_output_as_documented():
    idx = torch.tensor([0, 1, 1])
    y = torch.full((3, 4), 9.0)  # shrink writes the first out columns, scaled, and leaves the rest
    ops.bgmv_shrink(X, W, y, idx, 0.5)
    assert torch.equal(y, torch.tensor([[0.5, 1.0, 9, 9], [6.0, 7.5, 9, 9], [9.0, 12.0, 9, 9]]))
    a = torch.ones(3, 2)  # expand adds (add_inputs) or overwrites
    ops.bgmv_expand(X, W, a, idx, True)
    assert torch.equal(a, torch.tensor([[2.0, 3.0], [13.0, 16.0], [19.0, 25.0]]))
    ops.bgmv_expand(X, W, a, idx, False)
    assert torch.equal(a, torch.tensor([[1.0, 2.0], [12.0, 15.0], [18.0, 24.0]]))
    s = torch.zeros(3, 5)  # one slice of a fused layer
    ops.bgmv_expand_slice(X, W, s, idx, 2, 2, True)
    assert torch.equal(s[:, 2:4], torch.tensor([[1.0, 2.0], [12.0, 15.0], [18.0, 24.0]]))
    assert torch.equal(s[:, [0, 1, 4]], torch.zeros(3, 3))


def test_prefill_ops_repeat_each_sequences_adapter_over_its_tokens():
    y = torch.zeros(3, 2)  # sequences of 2 and 1 tokens with adapters 1 and 0
    ops.sgmv_shrink(X, W, y, torch.tensor([0, 2]), torch.tensor([2, 1]), torch.tensor([1, 0]), 2, 2, 3, 1.0)
    assert torch.equal(y, torch.tensor([[6.0, 6.0], [12.0, 15.0], [7.0, 8.0]]))


def test_a_wrong_number_of_indices_is_refused():
    with pytest.raises(ValueError, match="2 adapter indices for 3 input rows"):
        ops.grouped_lora_matmul(X, W, torch.tensor([0, 1]), torch.float32)


def test_install_changes_nothing_without_vllm():
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: tests/engines/test_vllm_engine.py checks install() there")
    assert ops.install() is False
