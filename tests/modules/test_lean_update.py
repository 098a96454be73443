"""The lean update (#25): logits computed only where a scored token is predicted give the same log-probs, losses and
gradients as full logits (with transformers' ``logits_to_keep`` and with the slicing fallback, plain and LoRA), and
the default fused AdamW gives the same weights as the single-tensor AdamW up to float rounding."""

from __future__ import annotations

import torch
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import load_model
from comlrl_lightning.config import MAGRPOConfig
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.logprobs import (
    accepts_logits_to_keep,
    build_scoring_batch,
    first_scored_position,
    masked_sequence_logps,
    scored_token_logps,
    sequence_logps,
    token_logps,
)
from comlrl_lightning.losses import policy_gradient_loss
from comlrl_lightning.modules.base import default_adamw
from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

# prompts of different lengths, completions of different lengths (one empty after trimming at pad 0)
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16], [17, 18, 19]]
COMPLETIONS = [[20, 21, 22], [23, 24, 25, 26, 27], [28], [29, 30]]


class NoKeep(torch.nn.Module):
    """A model whose forward has no ``logits_to_keep`` (the slicing fallback)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask, use_cache=False, output_hidden_states=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache,
                          output_hidden_states=output_hidden_states)


def test_first_scored_position_by_hand():
    mask = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    assert first_scored_position(mask) == 1
    assert first_scored_position(mask[[0, 2]]) == 3
    assert first_scored_position(mask[[2]]) == 5


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check_equal_to_full_logits(model, pad):
    batch = build_scoring_batch(PROMPTS, COMPLETIONS, pad, drop_last=False)
    mask = batch["score_mask"].bool()
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    full = token_logps(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             use_cache=False).logits, batch["input_ids"])
    g_full = _grads(model, policy_gradient_loss(full, mask, adv))
    lean, _ = scored_token_logps(model, batch)
    assert lean.shape == full.shape
    torch.testing.assert_close(lean[mask], full[mask], rtol=1e-5, atol=1e-5)
    assert bool((lean[:, :first_scored_position(batch["score_mask"])] == 0).all())
    g_lean = _grads(model, policy_gradient_loss(lean, mask, adv))
    assert g_lean.keys() == g_full.keys() and g_full
    for name in g_full:
        torch.testing.assert_close(g_lean[name], g_full[name], rtol=1e-4, atol=1e-6)


def test_completion_only_logits_equal_full_logits(tiny_model_dir):
    model = load_model(tiny_model_dir)
    assert accepts_logits_to_keep(model)
    _check_equal_to_full_logits(model, pad=0)


def test_completion_only_logits_without_logits_to_keep(tiny_model_dir):
    model = NoKeep(load_model(tiny_model_dir))
    assert not accepts_logits_to_keep(model)
    _check_equal_to_full_logits(model, pad=0)


def test_completion_only_logits_with_lora(tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(load_model(tiny_model_dir), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                                  init_lora_weights=False))
    assert accepts_logits_to_keep(model)
    _check_equal_to_full_logits(model, pad=0)


def test_madpo_sequence_logps_equal_full_logits(tiny_model_dir):
    model = load_model(tiny_model_dir)
    batch = build_scoring_batch(PROMPTS, COMPLETIONS, 0, drop_last=True)
    with torch.no_grad():
        full = masked_sequence_logps(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                           use_cache=False).logits, batch["input_ids"], batch["score_mask"])
        torch.testing.assert_close(sequence_logps(model, batch), full, rtol=1e-5, atol=1e-5)


def test_fused_adamw_equals_single_tensor_adamw_up_to_rounding(tiny_model_dir):
    torch.manual_seed(0)
    models = [load_model(tiny_model_dir) for _ in range(2)]
    fused = default_adamw(list(models[0].parameters()), 1e-2)
    plain = torch.optim.AdamW(list(models[1].parameters()), lr=1e-2, foreach=False)
    assert fused.param_groups[0]["fused"] is True
    ids = torch.randint(1, 400, (4, 12))
    for _ in range(5):
        for model, opt in zip(models, (fused, plain)):
            opt.zero_grad(set_to_none=True)
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
    moved = 0.0
    for (name, a), b, c in zip(models[0].named_parameters(), models[1].parameters(),
                               load_model(tiny_model_dir).parameters()):
        # float rounding of the two kernels: k_proj's bias has a near-zero gradient (softmax ignores it), which Adam
        # scales up to ~lr-sized steps of either sign, so its rounding differences reach ~1e-5 after 5 steps
        torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5, msg=name)
        moved = max(moved, float((a - c).abs().max()))
    assert moved > 1e-3  # the steps really moved the weights


def test_agents_get_the_fused_adamw_by_default(tiny_model_dir):
    args = MAGRPOConfig(num_generations=2, max_new_tokens=2, eval_interval=0, num_train_epochs=1)
    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=[{"prompt": "Topic: owls."}], eval_dataset=None,
                       reward_func=cooperative_reward, formatters=FORMATTERS, args=args,
                       trainer_kwargs=cpu_trainer_kwargs())
    optimizers = tr.module.configure_optimizers()
    assert all(o.param_groups[0]["fused"] is True for o in optimizers)
