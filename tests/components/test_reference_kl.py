"""Reference KL (docs/multiturn.md §9, §11.1): config checks, frozen references, k3 properties, return shaping."""

from __future__ import annotations

import pytest
import torch

from comlrl_lightning.agents import build_agents
from comlrl_lightning.config.magrpo import MAGRPOConfig, MAREINFORCEConfig
from comlrl_lightning.logprobs import build_scoring_batch, token_logps
from comlrl_lightning.losses import kl_penalized_returns
from comlrl_lightning.multiturn.tree import AgentDraw, build_tree, node_samples
from comlrl_lightning.reference import ReferencePolicies, resolve_reference_devices, sequence_kl


def test_defaults_are_off():
    cfg = MAGRPOConfig()
    assert cfg.reference_kl_enabled is False and cfg.reference_devices is None and cfg.reference_kl_coef == 0.1


@pytest.mark.parametrize("enabled", [False, True])
def test_negative_coefficient_rejected_even_when_disabled(enabled):
    with pytest.raises(ValueError, match="reference_kl_coef"):
        MAGRPOConfig(reference_kl_coef=-0.1, reference_kl_enabled=enabled)


def test_reference_device_count_mismatch_rejected():
    with pytest.raises(ValueError, match="reference_devices length"):
        MAGRPOConfig(num_agents=2, num_generations=2, reference_kl_enabled=True,
                     reference_devices=["cpu", "cpu", "cpu"])
    MAGRPOConfig(num_agents=2, reference_kl_enabled=True, reference_devices=["cpu", "cpu"])
    MAGRPOConfig(num_agents=2, reference_kl_enabled=False, reference_devices=["cpu", "cpu", "cpu"])  # unchecked


def test_reference_devices_resolve_independently():
    assert resolve_reference_devices(["cuda:1"], [torch.device("cuda:0")], 1) == [torch.device("cuda:1")]
    assert resolve_reference_devices(None, ["cuda:0", "cpu"], 2) == [torch.device("cuda:0"), torch.device("cpu")]
    assert resolve_reference_devices("cpu", [None, None], 2) == [torch.device("cpu")] * 2
    with pytest.raises(ValueError, match="reference_devices length"):
        resolve_reference_devices(["cpu"] * 3, [None, None], 2)


def test_self_reference_is_a_frozen_distinct_copy(tiny_model_dir):
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    module = MAGRPOModule(agent_model=tiny_model_dir, args=MAGRPOConfig(
        num_agents=1, num_turns=1, num_generations=2, reference_kl_enabled=True))
    ref = module.reference
    assert len(ref) == 1
    ref_model = ref.model_for(0)
    assert ref_model is not module.team.models[0]
    assert all(not p.requires_grad for p in ref_model.parameters()) and not ref_model.training
    # not a submodule: not checkpointed, not optimized
    assert all(p is not q for p in module.parameters() for q in ref_model.parameters())
    # agents sharing one object share one reference copy
    team = build_agents(tiny_model_dir, num_agents=1)
    shared = build_agents(agents=[team.models[0], team.models[0]], tokenizer=team.tokenizers[0])
    refs = ReferencePolicies(shared)
    assert refs.model_for(0) is refs.model_for(1)


def _kl_of_model_with_itself(team, refs) -> torch.Tensor:
    batch = build_scoring_batch([[2, 3]], [[4, 5]], pad_id=team.tokenizers[0].pad_token_id, drop_last=False)
    with torch.no_grad():
        pol = token_logps(team.models[0](input_ids=batch["input_ids"]).logits, batch["input_ids"])
    ref = refs.token_logps(0, batch)
    assert batch["score_mask"].tolist() == [[0, 0, 1, 1]]  # prompt_len 2, response_len 2
    return sequence_kl(pol, ref, batch["score_mask"])


def test_kl_of_a_model_with_itself_is_zero(tiny_model_dir):
    team = build_agents(tiny_model_dir, num_agents=1)
    team.models[0].eval()
    kl = _kl_of_model_with_itself(team, ReferencePolicies(team))
    assert kl.shape == (1,) and kl.item() == pytest.approx(0.0, abs=1e-6)


def test_k3_is_nonnegative_and_zero_only_for_equal_logps():
    g = torch.Generator().manual_seed(0)
    pol = -torch.rand(64, 12, generator=g) * 5
    ref = -torch.rand(64, 12, generator=g) * 5
    mask = torch.rand(64, 12, generator=g) > 0.3
    kl = sequence_kl(pol, ref, mask)
    assert (kl >= 0).all() and (kl[mask.any(-1)] > 0).all()
    assert torch.equal(sequence_kl(pol, pol.clone(), mask), torch.zeros(64))
    # masked positions never count, even with garbage there
    garbage = ref.clone()
    garbage[~mask] = float("nan")
    assert torch.allclose(sequence_kl(pol, garbage, mask), kl)


def test_magrpo_return_adjustment_uses_kl_at_its_own_node():
    assert kl_penalized_returns(torch.tensor([1.0, 2.0]), [0.2, 0.4], 0.5).tolist() == pytest.approx([0.9, 1.8])

    def sample(agent, turn, prompt, used):
        return AgentDraw(prompt, used, [1], [[5], [6]], ["x", "y"], kls=[0.2, 0.4] if turn == 0 else [1.0, 1.0])

    rewards = iter([1.0, 2.0] + [0.0] * 4)
    root, _ = build_tree(1, 2, 2, "aligned", [("p", "p")], sample, lambda *a: next(rewards),
                         lambda texts, ph, rh, turn, path: [("q", "q")])
    cfg = MAREINFORCEConfig(num_agents=1, reference_kl_enabled=True, reference_kl_coef=0.5,
                            advantage_normalization=False)
    samples = node_samples(root, 1, 2, cfg.advantage_mode, cfg.advantage_normalization, cfg.reference_kl_coef)
    # root returns [1, 2] (children's rewards are 0, their KLs never reach the parent) -> [0.9, 1.8]
    assert samples[0].returns == [1.0, 2.0]
    assert samples[0].advantages == pytest.approx([0.9, 1.8])
    assert samples[1].advantages == pytest.approx([-0.5, -0.5])  # child: 0 - 0.5 * 1.0


def test_lora_reference_is_the_base_with_the_adapter_disabled(tiny_model_dir):
    team = build_agents(tiny_model_dir, num_agents=2, lora={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0})
    team.models[0].eval()
    refs = ReferencePolicies(team)
    assert refs.model_for(0) is None and refs.model_for(1) is None
    assert _kl_of_model_with_itself(team, refs).item() == pytest.approx(0.0, abs=1e-6)  # LoRA B starts at 0
    with torch.no_grad():
        for p in team.parameters_of(0):
            p.add_(0.5)
    batch = build_scoring_batch([[2, 3]], [[4, 5]], pad_id=team.tokenizers[0].pad_token_id, drop_last=False)
    with team.activate(0) as model, torch.no_grad():
        pol = token_logps(model(input_ids=batch["input_ids"]).logits, batch["input_ids"])
        with model.disable_adapter():
            base = token_logps(model(input_ids=batch["input_ids"]).logits, batch["input_ids"])
    ref = refs.token_logps(0, batch)
    scored = batch["score_mask"].bool()  # the reference computes logits of the scored positions only
    assert bool((ref[~scored] == 0).all())
    assert torch.allclose(ref[scored], base[scored]) and not torch.allclose(ref[scored], pol[scored])
    assert sequence_kl(pol, ref, batch["score_mask"]).item() > 0
