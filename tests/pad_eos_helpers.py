"""Prompts holding the tokenizer's pad or EOS text, shared by the HF and vLLM engine tests (issue 28, item 4)."""

from __future__ import annotations

PAD, EOS = "<|pad|>", "<|endoftext|>"


def prompts_with(special: str) -> list[str]:
    """The special text at the start, in the middle, at the end, repeated, alone, next to the other special
    token, and a plain prompt: different lengths, so the batch is left-padded."""
    other = EOS if special == PAD else PAD
    return [f"{special}Topic: rivers.", f"Topic: {special} bread and butter.", f"Say it{special}",
            f"{special}{special}a{special}", special, f"x{other}{special}y", "Topic: a plain prompt, longer."]
