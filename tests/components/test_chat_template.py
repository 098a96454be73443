"""chat_prompt / with_chat_template (data/sources.py): the tokenizer's chat template around a formatter's prompt,
off on request, and the plain prompt where a tokenizer has no template (docs/models.md)."""

from __future__ import annotations

import copy

import pytest

from comlrl_lightning.agents import load_tokenizer
from comlrl_lightning.data.sources import chat_prompt, with_chat_template
from comlrl_lightning.envs.code.prompts import FORMATTERS

ITEM = {"prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add", "test": "def check(c): pass"}


@pytest.fixture(scope="module")
def toks(tiny_model_dir):
    chat = load_tokenizer(tiny_model_dir)
    plain = copy.deepcopy(chat)
    plain.chat_template = None
    return chat, plain


def test_chat_prompt_and_its_fallback(toks):
    chat, plain = toks
    assert chat_prompt(chat, "Say hi.") == "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    assert chat_prompt(plain, "Say hi.") == "Say hi."


def test_with_chat_template_wraps_each_agent_with_its_own_tokenizer(toks):
    chat, plain = toks
    aux, main = with_chat_template(FORMATTERS, [chat, plain])
    assert aux(ITEM) == chat_prompt(chat, FORMATTERS[0](ITEM)) and aux(ITEM).startswith("<|im_start|>user\n")
    assert main is FORMATTERS[1]  # no template: the formatter itself
    assert aux(ITEM, external_prompts="Fix it.") == chat_prompt(chat, "Fix it.")  # external_prompts still reach it
    assert with_chat_template(FORMATTERS, [chat, chat], enabled=False) == list(FORMATTERS)
    (shared,) = with_chat_template([lambda item: item["prompt"]], [chat])
    assert shared({"prompt": "x"}) == chat_prompt(chat, "x")
    with pytest.raises(ValueError, match="2 formatters for 1 tokenizers"):
        with_chat_template(FORMATTERS, [chat])
