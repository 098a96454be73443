"""Trained tokens are the sampled tokens (issue 28, item 2): the rows a loss forward reads hold exactly the ids the
engine returned, with no decode-then-encode round trip between rollout and update.

Each test spies on the HF engine's returned ``Samples`` and on the rows handed to the loss forward
(``scored_token_logps`` / ``sequence_logps`` as the module imported them, only calls with gradients: the update's).
A multi-turn prompt is re-encoded from the transition's text (that is where prompt tokens come from); the
completion part of every row must still be the sampled ids. The power check: re-encoding the decoded
completions does change some of them, so a round trip would be caught.
"""

from __future__ import annotations

from collections import Counter

import torch
from conftest import cpu_trainer_kwargs

import comlrl_lightning.modules.actor_critic as ac_module
import comlrl_lightning.modules.madpo as madpo_module
import comlrl_lightning.modules.magrpo as magrpo_module
from comlrl_lightning.config import IACConfig, MADPOConfig, MAGRPOConfig
from comlrl_lightning.engines.hf import HFEngine
from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward
from comlrl_lightning.logprobs import trim_at_pad, trim_completion
from comlrl_lightning.multiturn.transitions import plain_transition

ITEMS = [{"prompt": f"Topic: {t}."} for t in ("rivers", "bread", "trains")]


def spy_engine(monkeypatch) -> list:
    """Every ``Samples`` the HF engine returns, with its agent."""
    sampled = []
    original = HFEngine.sample

    def sample(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        sampled.append((args[0] if args else kwargs["agent_index"], out))
        return out

    monkeypatch.setattr(HFEngine, "sample", sample)
    return sampled


def spy_loss_rows(monkeypatch, module, name: str) -> list[dict]:
    """The batches of the loss forwards (``module.name`` called with gradients on)."""
    rows = []
    original = getattr(module, name)

    def spy(model, batch, **kw):
        if torch.is_grad_enabled():
            rows.append({k: v.detach().cpu() for k, v in batch.items() if k != "position_ids"})
        return original(model, batch, **kw)

    monkeypatch.setattr(module, name, spy)
    return rows


def policy_rows(batches) -> list[tuple[tuple, tuple]]:
    """(prompt ids, completion ids) of each policy-gradient row: the scored span runs from the end of the prompt
    to the end of the row."""
    out = []
    for b in batches:
        for ids, score, att in zip(b["input_ids"], b["score_mask"], b["attention_mask"]):
            n = int(att.sum())
            ids, score = ids[:n].tolist(), score[:n].bool()
            first = int(score.int().argmax()) if bool(score.any()) else n
            assert bool(score[first:].all()) and not bool(score[:first].any())
            out.append((tuple(ids[:first]), tuple(ids[first:])))
    return out


def sampled_rows(sampled, team) -> list[tuple[tuple, tuple]]:
    out = []
    for agent, s in sampled:
        tok = team.tokenizers[agent]
        for p, comps in zip(s.prompt_ids, s.completion_ids):
            out += [(tuple(p), tuple(trim_completion(c, tok.eos_token_id, tok.pad_token_id))) for c in comps]
    return out


def assert_round_trip_would_show(sampled, team):
    """Decoding then re-encoding changes at least one sampled completion: equality above is not a coincidence."""
    changed = 0
    for agent, s in sampled:
        tok = team.tokenizers[agent]
        for comps in s.completion_ids:
            for c in comps:
                kept = trim_completion(c, tok.eos_token_id, tok.pad_token_id)
                again = tok(tok.decode(kept, skip_special_tokens=True), add_special_tokens=False)["input_ids"]
                changed += again != kept
    assert changed > 0


def magrpo_args(**kw):
    base = dict(num_train_epochs=1, num_generations=3, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None,
                agent_learning_rate=1e-3, eval_interval=0, logging_steps=1, rollout_buffer_size=2)
    base.update(kw)
    return MAGRPOConfig(**base)


def run_magrpo(monkeypatch, tiny_model_dir, args, transition=None):
    from comlrl_lightning.trainers.reinforce import MAGRPOTrainer

    sampled = spy_engine(monkeypatch)
    rows = spy_loss_rows(monkeypatch, magrpo_module, "scored_token_logps")
    tr = MAGRPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                       formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs(),
                       external_transition=transition)
    tr.train()
    return tr, sampled, rows


def test_magrpo_single_turn_trains_the_sampled_ids(monkeypatch, tiny_model_dir):
    tr, sampled, rows = run_magrpo(monkeypatch, tiny_model_dir, magrpo_args())
    assert rows and tr.module.optimizer_steps > 0
    # every sampled completion is trained exactly once, with its own prompt, token for token
    assert Counter(policy_rows(rows)) == Counter(sampled_rows(sampled, tr.team))
    assert_round_trip_would_show(sampled, tr.team)


def test_magrpo_multi_turn_trains_the_sampled_ids(monkeypatch, tiny_model_dir):
    args = magrpo_args(num_turns=2, num_generations=2, joint_mode="cross", rollout_buffer_size=3)
    tr, sampled, rows = run_magrpo(monkeypatch, tiny_model_dir, args, transition=plain_transition)
    trained, drawn = Counter(policy_rows(rows)), Counter(sampled_rows(sampled, tr.team))
    assert trained == drawn
    # turn-2 prompts hold earlier completions as text (re-encoded: prompt tokens only), so they are longer
    lengths = sorted({len(p) for p, _ in drawn})
    assert len(lengths) > 2 and tr.module.env_step == 2 * (4 + 4 * 4)
    assert_round_trip_would_show(sampled, tr.team)


def test_actor_critic_trains_the_sampled_ids(monkeypatch, tiny_model_dir):
    from comlrl_lightning.trainers.actor_critic import IACTrainer

    sampled = spy_engine(monkeypatch)
    rows = spy_loss_rows(monkeypatch, ac_module, "scored_token_logps")
    args = IACConfig(use_separate_critic=False, max_new_tokens=6, temperature=1.0, top_p=1.0,
                     agent_learning_rate=1e-3, critic_learning_rate=1e-3, num_train_epochs=1, eval_interval=0)
    tr = IACTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS[:2], reward_func=cooperative_reward,
                    formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())
    tr.train()
    trained, drawn = set(policy_rows(rows)), set(sampled_rows(sampled, tr.team))
    assert rows and trained == drawn


def test_madpo_pair_rows_are_the_sampled_ids(monkeypatch, tiny_model_dir):
    """Offline MADPO scores the generated rows of the pairs: [prompt ; completion cut at pad, without its last
    token] (docs/decisions.md, decision 3: the last token is not scored, so the row does not need it), every
    completion token of the row scored."""
    from comlrl_lightning.trainers.preference import MADPOTrainer

    sampled = spy_engine(monkeypatch)
    rows = spy_loss_rows(monkeypatch, madpo_module, "sequence_logps")
    args = MADPOConfig(num_train_epochs=1, preference_num_candidates=4, preference_pairs_per_sample=2,
                       max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=None, agent_learning_rate=1e-3,
                       train_batch_size=4, eval_interval=0)
    tr = MADPOTrainer(agent_model=tiny_model_dir, train_dataset=ITEMS, reward_func=cooperative_reward,
                      formatters=FORMATTERS, args=args, trainer_kwargs=cpu_trainer_kwargs())
    tr.train()
    pad = tr.team.tokenizers[0].pad_token_id
    by_row: dict[tuple, set] = {}
    for _, s in sampled:
        for p, comps in zip(s.prompt_ids, s.completion_ids):
            for c in comps:
                kept = trim_at_pad(c, pad)
                by_row.setdefault(tuple(p) + tuple(kept[:-1]), set()).add((len(p), max(len(kept) - 1, 0)))
    assert rows
    checked = 0
    for b in rows:
        for ids, score, att in zip(b["input_ids"], b["score_mask"], b["attention_mask"]):
            n = int(att.sum())
            key = tuple(ids[:n].tolist())
            assert key in by_row, "a MADPO row is not a sampled [prompt ; completion]"
            scored = score[:n].tolist()
            assert any(scored == [0] * p + [1] * c for p, c in by_row[key] if p + c == n)
            checked += 1
    assert checked >= 4
    assert_round_trip_would_show(sampled, tr.team)
