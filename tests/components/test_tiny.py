"""The embedded tiny model: deterministic offline build, real ``from_pretrained`` reload, cache reuse."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from comlrl_lightning import tiny
from comlrl_lightning.agents import resolve_model_source
from comlrl_lightning.tiny import TINY_MODEL_NAME, TINY_RECIPE_VERSION, build_tiny_model


def _files(folder: str | Path) -> dict[str, bytes]:
    root = Path(folder)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_build_is_deterministic(tiny_model_dir, tmp_path):
    """A second build of the default recipe in another folder gives byte-identical files."""
    other = build_tiny_model(tmp_path / "again")
    first, second = _files(tiny_model_dir), _files(other)
    assert set(first) == set(second)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "comlrl_tiny.json"):
        assert name in first, f"{name} missing from the build"
    for name in first:
        assert first[name] == second[name], f"{name} differs between two builds"


def test_different_seed_gives_different_weights(tiny_model_dir, tmp_path):
    other = build_tiny_model(tmp_path / "seed1", seed=1)
    assert _files(other)["tokenizer.json"] == _files(tiny_model_dir)["tokenizer.json"]
    assert _files(other)["model.safetensors"] != _files(tiny_model_dir)["model.safetensors"]


def test_reloads_offline_with_auto_classes(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    assert tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    assert tok.pad_token_id is not None and tok.eos_token_id is not None
    assert tok.pad_token_id != tok.eos_token_id
    assert model.config.pad_token_id == tok.pad_token_id
    assert model.config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert tok.padding_side == "left"

    # The chat template renders ChatML.
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"

    # Parameter count by hand: vocab 512, hidden 64, 2 layers, 4 heads of 16, 2 kv heads, MLP 256, tied.
    v, h, kv, mlp = 512, 64, 2 * 16, 256
    per_layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * mlp + 2 * h  # q, k+v (bias), o, MLP, norms
    expected = v * h + 2 * per_layer + h  # tied embedding, layers, final norm
    assert expected == 156_224
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.config.hidden_size == 64 and model.config.num_hidden_layers == 2

    # A forward pass works and gives the vocabulary-sized logits.
    ids = tok("Topic: rivers.", return_tensors="pt")["input_ids"]
    assert ids.shape[1] > 0
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


def test_second_build_reuses_folder(tmp_path, monkeypatch):
    out = tmp_path / "tiny"
    path = build_tiny_model(out)
    assert path == str(out.absolute())
    stamp = (out / "model.safetensors").stat().st_mtime_ns

    def boom(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again: the complete build was not reused")

    monkeypatch.setattr(tiny, "_train_tokenizer", boom)
    assert build_tiny_model(out) == path
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp

    # A different recipe is a rebuild (it needs the tokenizer again).
    with pytest.raises(AssertionError, match="trained again"):
        build_tiny_model(out, seed=7)
    # The failed rebuild left the old build in place and no temporary folder behind.
    assert json.loads((out / "comlrl_tiny.json").read_text())["seed"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny"]


def test_rebuild_on_other_recipe_or_corrupt_marker(tmp_path):
    out = tmp_path / "tiny"
    build_tiny_model(out)
    before = (out / "model.safetensors").read_bytes()
    build_tiny_model(out, seed=3)
    assert json.loads((out / "comlrl_tiny.json").read_text())["seed"] == 3
    assert (out / "model.safetensors").read_bytes() != before

    (out / "comlrl_tiny.json").write_text("{not json")
    build_tiny_model(out)
    assert json.loads((out / "comlrl_tiny.json").read_text())["seed"] == 0
    assert (out / "model.safetensors").read_bytes() == before


def test_embedded_name_resolves_to_cached_build(tmp_path, monkeypatch):
    monkeypatch.setenv("COMLRL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    assert TINY_MODEL_NAME == "embedded:tiny"
    path = resolve_model_source("embedded:tiny")
    expected = tmp_path / "cache" / f"tiny-v{TINY_RECIPE_VERSION}"
    assert Path(path) == expected.absolute()
    assert (expected / "config.json").is_file() and (expected / "comlrl_tiny.json").is_file()

    # Second resolution: the cached build, not a new one.
    stamp = (expected / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(tiny, "_train_tokenizer", lambda *a, **k: pytest.fail("rebuilt a cached build"))
    assert resolve_model_source("embedded:tiny") == path
    assert (expected / "model.safetensors").stat().st_mtime_ns == stamp

    # Other names pass through untouched.
    assert resolve_model_source("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert resolve_model_source(str(tmp_path)) == str(tmp_path)
