"""The toy task the examples share: agent 0 answers, agent 1 elaborates; the reward prefers a longer second part."""

from __future__ import annotations

MODEL = "embedded:tiny"  # a hub id such as "Qwen/Qwen2.5-0.5B" for a real run

train_data = [{"prompt": f"Name a colour number {i}."} for i in range(4)]
eval_data = [{"prompt": "Name a fruit."}, {"prompt": "Name an animal."}]

formatters = [lambda item: item["prompt"] + " Answer:", lambda item: item["prompt"] + " Elaboration:"]


def reward_func(completions1, completions2):
    """One float per joint response: 1 when the elaboration is longer than the answer."""
    return [1.0 if len(b) > len(a) else 0.0 for a, b in zip(completions1, completions2)]
