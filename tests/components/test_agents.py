"""Loading the agents: strings, local paths, model objects, tokenizers, dtypes, LoRA adapters, saving."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from comlrl_lightning.agents import (
    AgentTeam,
    ModelLoadError,
    build_agents,
    load_kwargs,
    load_model,
    prepare_tokenizer,
)
from comlrl_lightning.tiny import build_tiny_model


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory) -> str:
    """A second, different tiny model: other seed and a narrower hidden size."""
    return build_tiny_model(tmp_path_factory.mktemp("small") / "model", seed=1, hidden_size=32,
                            intermediate_size=64)


def _auto(path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


# --- homogeneous string source --------------------------------------------------------------------------

def test_agent_model_gives_independent_copies(tiny_model_dir):
    team = build_agents(agent_model=tiny_model_dir, num_agents=3)
    assert team.num_agents == 3
    assert len({id(m) for m in team.models}) == 3
    assert not team.shares_parameters()
    assert len(team.unique_models()) == 3
    assert team.names == [tiny_model_dir] * 3
    assert team.adapters == [None, None, None] and not team.uses_lora

    s0, s1 = team.models[0].state_dict(), team.models[1].state_dict()
    assert s0.keys() == s1.keys()
    for k in s0:
        assert torch.equal(s0[k], s1[k]), k
    # Same values, separate storage: changing one agent leaves the other alone.
    p0, p1 = team.parameters_of(0), team.parameters_of(1)
    assert len(p0) == len(p1) == len(list(team.models[0].parameters()))
    assert {p.data_ptr() for p in p0}.isdisjoint({p.data_ptr() for p in p1})
    with torch.no_grad():
        p0[0].add_(1.0)
    assert not torch.equal(p0[0], p1[0])

    for m, tok in zip(team.models, team.tokenizers):
        assert m.training
        assert tok.pad_token_id is not None
        assert m.config.pad_token_id == tok.pad_token_id
        assert m.config.eos_token_id == tok.eos_token_id


def test_heterogeneous_local_paths(tiny_model_dir, small_model_dir):
    team = build_agents(agents=[tiny_model_dir, small_model_dir])
    assert [m.config.hidden_size for m in team.models] == [64, 32]
    assert team.names == [tiny_model_dir, small_model_dir]
    assert team.tokenizers[0] is not team.tokenizers[1]  # one tokenizer per source
    assert not team.shares_parameters()
    n_small = sum(p.numel() for p in team.parameters_of(1))
    n_tiny = sum(p.numel() for p in team.parameters_of(0))
    assert n_tiny == 156_224 and n_small < n_tiny

    # The same string twice loads two models but shares one tokenizer object.
    team2 = build_agents(agents=[tiny_model_dir, tiny_model_dir])
    assert team2.models[0] is not team2.models[1]
    assert team2.tokenizers[0] is team2.tokenizers[1]


# --- model objects ------------------------------------------------------------------------------------------

def test_model_objects_need_a_tokenizer(tiny_model_dir):
    m0, tok = _auto(tiny_model_dir)
    m1, _ = _auto(tiny_model_dir)
    with pytest.raises(ValueError, match="Tokenizer\\(s\\) must be provided when agents are model objects"):
        build_agents(agents=[m0, m1])
    team = build_agents(agents=[m0, m1], tokenizer=tok)
    assert team.models[0] is m0 and team.models[1] is m1
    assert team.tokenizers == [tok, tok]
    assert not team.shares_parameters()
    assert team.names == [m0.config._name_or_path] * 2


def test_same_object_twice_shares_parameters(tiny_model_dir):
    m, tok = _auto(tiny_model_dir)
    team = build_agents(agents=[m, m], tokenizer=tok)
    assert team.shares_parameters()
    assert team.unique_models() == [m]
    assert [p.data_ptr() for p in team.parameters_of(0)] == [p.data_ptr() for p in team.parameters_of(1)]


def test_tokenizer_list_length_must_match(tiny_model_dir):
    m, tok = _auto(tiny_model_dir)
    with pytest.raises(ValueError, match="tokenizers length must match agents") as err:
        build_agents(agents=[m, m], tokenizer=[tok, tok, tok])
    assert "3" in str(err.value) and "2" in str(err.value)
    team = build_agents(agents=[m, m], tokenizer=[tok, tok])
    assert team.num_agents == 2
    with pytest.raises(ValueError, match="tokenizers length must match agents"):
        AgentTeam([m, m], [tok])


def test_pad_token_falls_back_to_eos(tiny_model_dir):
    m, tok = _auto(tiny_model_dir)
    eos_id = tok.eos_token_id
    tok.pad_token = None
    assert tok.pad_token_id is None
    team = build_agents(agents=[m], tokenizer=tok)
    assert team.tokenizers[0].pad_token == "<|endoftext|>"
    assert team.tokenizers[0].pad_token_id == eos_id
    assert m.config.pad_token_id == eos_id and m.config.eos_token_id == eos_id
    assert m.generation_config.pad_token_id == eos_id


def test_tokenizer_without_pad_or_eos_is_an_error(tiny_model_dir):
    m, tok = _auto(tiny_model_dir)
    tok.pad_token = None
    tok.eos_token = None
    with pytest.raises(ValueError, match="pad_token_id"):
        build_agents(agents=[m], tokenizer=tok)
    with pytest.raises(ValueError, match="neither a pad token nor an EOS"):
        prepare_tokenizer(tok)


def test_argument_errors(tiny_model_dir):
    m, tok = _auto(tiny_model_dir)
    with pytest.raises(ValueError, match="Either agent_model or agents must be provided"):
        build_agents()
    with pytest.raises(ValueError, match="agent_model should be a string"):
        build_agents(agent_model=m, tokenizer=tok)
    with pytest.raises(ValueError, match="non-null"):
        build_agents(agents=[m, None], tokenizer=tok)
    with pytest.raises(ValueError, match="non-empty"):
        build_agents(agents=[], tokenizer=tok)
    with pytest.raises(ValueError, match="num_agents must be >= 1"):
        build_agents(agent_model=tiny_model_dir, num_agents=0)
    with pytest.raises(ValueError, match="lora"):
        build_agents(agents=[tiny_model_dir, tiny_model_dir], lora=LORA)


def test_broken_local_folder_names_the_path(tmp_path):
    broken = tmp_path / "not_a_model"
    broken.mkdir()
    with pytest.raises(ModelLoadError, match="not_a_model"):
        load_model(str(broken))


# --- load kwargs / dtype ------------------------------------------------------------------------------------

def test_load_kwargs():
    assert load_kwargs(None) == {"attn_implementation": "sdpa"}
    assert load_kwargs({"dtype": "bfloat16"}) == {"dtype": torch.bfloat16, "attn_implementation": "sdpa"}
    assert load_kwargs({"torch_dtype": "float16"})["dtype"] is torch.float16
    assert load_kwargs({"dtype": "auto"})["dtype"] == "auto"
    assert load_kwargs({"attn_implementation": None}) == {}
    nested = load_kwargs({"model_kwargs": {"torch_dtype": torch.float64, "attn_implementation": "eager"}})
    assert nested == {"dtype": torch.float64, "attn_implementation": "eager"}


def test_model_config_dtype_is_honoured(tiny_model_dir):
    team = build_agents(agent_model=tiny_model_dir, num_agents=1, model_config={"dtype": "bfloat16"})
    dtypes = {p.dtype for p in team.models[0].parameters()}
    assert dtypes == {torch.bfloat16}
    team = build_agents(agent_model=tiny_model_dir, num_agents=1,
                        model_config={"model_kwargs": {"torch_dtype": "float16"}})
    assert {p.dtype for p in team.models[0].parameters()} == {torch.float16}


def test_special_tokens_from_model_config(tiny_model_dir):
    team = build_agents(agent_model=tiny_model_dir, num_agents=2,
                        model_config={"special_tokens": {"additional_special_tokens": ["<|tool|>"]}})
    for tok in team.tokenizers:
        ids = tok("<|tool|>", add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and tok.convert_ids_to_tokens(ids) == ["<|tool|>"]


# --- LoRA ---------------------------------------------------------------------------------------------------

def test_lora_one_base_with_one_adapter_per_agent(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    team = build_agents(agent_model=tiny_model_dir, num_agents=2, lora=LORA)
    assert team.uses_lora
    assert team.models[0] is team.models[1]
    assert team.adapters == ["agent_0", "agent_1"]
    assert not team.shares_parameters()
    model = team.models[0]

    names = {id(p): n for n, p in model.named_parameters()}
    for i, own, other in ((0, "agent_0", "agent_1"), (1, "agent_1", "agent_0")):
        params = team.parameters_of(i)
        # 2 layers x (q_proj, v_proj) x (lora_A, lora_B)
        assert len(params) == 8
        for p in params:
            assert f".{own}." in names[id(p)] and f".{other}." not in names[id(p)]
            assert "lora_" in names[id(p)]
    assert {id(p) for p in team.parameters_of(0)}.isdisjoint({id(p) for p in team.parameters_of(1)})

    # The frozen base: no trainable parameter outside the adapters, even after activating an agent.
    for i in (0, 1):
        with team.activate(i) as active:
            assert active is model
            assert model.active_adapter == f"agent_{i}"
            base_trainable = [n for n, p in model.named_parameters() if p.requires_grad and "lora_" not in n]
            assert base_trainable == []
            assert all(p.requires_grad for j in (0, 1) for p in team.parameters_of(j))

    # Give each adapter distinct weights (lora_B starts at zero) so the saved files are distinguishable.
    with torch.no_grad():
        for i in (0, 1):
            for k, p in enumerate(team.parameters_of(i)):
                p.copy_(torch.full_like(p, 0.01 * (i + 1) + 0.001 * k))

    paths = team.save(tmp_path / "out")
    assert paths == [str(tmp_path / "out" / "agent_0"), str(tmp_path / "out" / "agent_1")]
    for i in (0, 1):
        folder = Path(paths[i])
        assert (folder / "adapter_config.json").is_file()
        assert (folder / "adapter_model.safetensors").is_file()
        assert not (folder / f"agent_{i}").exists()
        assert not (folder / "model.safetensors").exists()  # the adapter only, not the base

        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        loaded = PeftModel.from_pretrained(base, str(folder))
        expected = {names[id(p)].replace(f".agent_{i}.", ".default."): p for p in team.parameters_of(i)}
        got = {n: p for n, p in loaded.named_parameters() if "lora_" in n}
        assert set(got) == set(expected)
        for n, p in got.items():
            assert torch.equal(p, expected[n]), n

        tok = AutoTokenizer.from_pretrained(str(folder))
        assert tok.pad_token_id == team.tokenizers[i].pad_token_id
        assert tok.eos_token_id == team.tokenizers[i].eos_token_id


def test_save_full_models(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    team = build_agents(agent_model=tiny_model_dir, num_agents=2)
    with torch.no_grad():
        team.parameters_of(1)[0].add_(0.5)
    paths = team.save(tmp_path)
    for i, path in enumerate(paths):
        assert Path(path).name == f"agent_{i}"
        reloaded = AutoModelForCausalLM.from_pretrained(path)
        for (n, a), b in zip(team.models[i].state_dict().items(), reloaded.state_dict().values()):
            assert torch.equal(a, b), n
        assert AutoTokenizer.from_pretrained(path).pad_token_id == team.tokenizers[i].pad_token_id
    first = next(iter(team.models[0].state_dict().values()))
    other = next(iter(AutoModelForCausalLM.from_pretrained(paths[1]).state_dict().values()))
    assert not torch.equal(first, other)


# --- hub ids offline ----------------------------------------------------------------------------------------

def test_hub_id_offline_fails_fast(monkeypatch):
    # "Fast" = no network attempt at all (a wall-clock bound would depend on the machine's load).
    connects = []
    monkeypatch.setattr(socket.socket, "connect", lambda self, address: connects.append(address))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE") as err:
        build_agents(agent_model="comlrl-test-nobody/definitely-not-a-model", num_agents=2)
    assert "comlrl-test-nobody/definitely-not-a-model" in str(err.value)

    with pytest.raises(ModelLoadError, match="HF_HUB_OFFLINE"):
        load_model("comlrl-test-nobody/definitely-not-a-model")
    assert connects == []


def test_tokenizer_larger_than_the_embedding_is_refused_at_build(tiny_model_dir):
    """Issue 14, finding 10: a tokenizer with more ids than embedding rows is an error when the agents are built."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.add_special_tokens({"additional_special_tokens": ["<|extra_a|>", "<|extra_b|>"]})
    rows = model.get_input_embeddings().num_embeddings
    with pytest.raises(ValueError, match=f"agent 0.*{len(tok)} token ids.*only {rows} rows"):
        build_agents(agents=[model], tokenizer=tok)
    # special tokens added through model_config grow the embeddings of the models we load
    team = build_agents(agent_model=tiny_model_dir, num_agents=1,
                        model_config={"special_tokens": {"additional_special_tokens": ["<|tool|>"]}})
    assert team.models[0].get_input_embeddings().num_embeddings == len(team.tokenizers[0])


def test_a_model_object_without_a_causal_lm_head_is_refused(tiny_model_dir):
    from transformers import AutoModel

    from comlrl_lightning.agents import build_agents, load_tokenizer

    backbone = AutoModel.from_pretrained(tiny_model_dir)  # the Qwen2 body, no lm_head
    tok = load_tokenizer(tiny_model_dir)
    with pytest.raises(ValueError, match=r"agents\[1\] is a Qwen2Model, which has no causal-LM head"):
        build_agents(agents=[load_model(tiny_model_dir), backbone], tokenizer=tok)
