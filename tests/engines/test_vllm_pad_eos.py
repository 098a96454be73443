"""Prompts that contain the pad or EOS token (issue 28, item 4) on the vLLM engine (CPU build): the engine gets the
prompt ids with those ids in place and returns only what it generated, so the rows the loss reads hold [prompt ;
sampled completion] and their teacher-forced log-probs equal the log-probs vLLM reported for the sampled tokens.
A pad or EOS id of the prompt that was dropped, masked or taken as the completion's start would change them.
The HF engine's counterpart is tests/components/test_pad_eos_prompts.py."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from pad_eos_helpers import EOS, PAD, prompts_with  # noqa: E402

from comlrl_lightning.agents import build_agents  # noqa: E402
from comlrl_lightning.engines.vllm import VLLMEngine  # noqa: E402
from comlrl_lightning.generation import SamplingSettings, SamplingStream  # noqa: E402
from comlrl_lightning.logprobs import scored_token_logps  # noqa: E402
from comlrl_lightning.modules.magrpo import completion_batch  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

K = 2
SETTINGS = SamplingSettings(max_new_tokens=6, temperature=1.0, top_p=1.0, top_k=None)


@pytest.fixture(scope="module")
def served(vllm_model_dir):
    team = build_agents(vllm_model_dir, num_agents=1)
    engine = VLLMEngine(team, {"kv_cache_memory_bytes": 32 * 2**20})
    yield team, engine
    engine.close()


@pytest.mark.parametrize("pad_eq_eos", [False, True])
@pytest.mark.parametrize("special", [PAD, EOS])
def test_special_text_in_prompts_is_served_and_sliced_correctly(served, special, pad_eq_eos):
    team, engine = served
    tok = team.tokenizers[0]
    pad = tok.pad_token
    if pad_eq_eos:
        tok.pad_token = tok.eos_token
    try:
        prompts = prompts_with(special)
        expected = [tok(p, add_special_tokens=True)["input_ids"] for p in prompts]
        special_id = tok.convert_tokens_to_ids(special)
        assert sum(ids.count(special_id) for ids in expected) >= 8  # the ids really are in the prompts
        samples = engine.sample(0, prompts, K, SETTINGS, SamplingStream(5))
        assert samples.prompt_ids == expected  # passed to vLLM as ids, special ids in place
        assert samples.logprobs is not None
        rows = [samples.prompt_ids[p] for p in range(len(prompts)) for _ in range(K)]
        comps = [c for cs in samples.completion_ids for c in cs]
        batch = completion_batch(rows, comps, tok)
        model = team.models[0].eval()
        with torch.no_grad():
            logps, _ = scored_token_logps(model, batch)
        checked = 0
        for r, comp in enumerate(comps):
            start, n = len(rows[r]), int(batch["score_mask"][r].sum())
            assert batch["input_ids"][r, :start + n].tolist() == rows[r] + comp[:n]
            reported = samples.logprobs[r // K][r % K]
            for t in range(n):  # measured healthy gap < 5e-5 (benchmarks/sync_gap.py)
                assert abs(float(logps[r, start + t]) - reported[t]) < 1e-3, (prompts[r // K], t)
                checked += 1
        assert checked > 0
        # CoMLRL's slice (the completion from the prompt's first pad id on) is not what the rows hold
        for p, ids in enumerate(expected):
            if tok.pad_token_id in ids:
                comlrl = ids[ids.index(tok.pad_token_id):]
                assert all(c[:len(comlrl)] != comlrl for c in samples.completion_ids[p])
    finally:
        tok.pad_token = pad
