"""``use_chat_template`` (docs/models.md, "Chat templates"): which formatters go through the agents' chat templates
(null: the library's own, not on the embedded tiny model; true: every one; false: none), the fallback without a
template, the check of the value, and the option on the facade, module and YAML paths."""

from __future__ import annotations

import copy
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import cpu_trainer_kwargs

from comlrl_lightning.agents import load_tokenizer
from comlrl_lightning.config import MADPOConfig, MAGRPOConfig
from comlrl_lightning.data.sources import (
    build_formatters,
    chat_prompt,
    is_embedded_tiny,
    templated_formatters,
    with_chat_template,
)
from comlrl_lightning.envs.code.prompts import FORMATTERS as CODE_FORMATTERS

ROOT = Path(__file__).resolve().parents[2]
ITEM = {"prompt": "def add(a, b):\n    \"\"\"Add.\"\"\"\n", "entry_point": "add", "test": "def check(c): pass"}
TEMPLATED = "<|im_start|>user\n"


def user_formatter(item: dict) -> str:
    return "Q: " + item["prompt"]


@pytest.fixture(scope="module")
def chat_model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny model copied without its ``comlrl_tiny.json`` marker and with a template of its own (the embedded
    ChatML behind a Jinja comment: same prompts, another template): a user's model with a chat template."""
    from comlrl_lightning.tiny import CHATML_TEMPLATE

    folder = tmp_path_factory.mktemp("chat") / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "comlrl_tiny.json").unlink()
    tok = load_tokenizer(str(folder))
    tok.chat_template = "{# a user's model #}" + CHATML_TEMPLATE
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def toks(tiny_model_dir, chat_model_dir):
    tiny, chat = load_tokenizer(tiny_model_dir), load_tokenizer(chat_model_dir)
    plain = copy.deepcopy(chat)
    plain.chat_template = None
    return tiny, chat, plain


def test_only_the_tiny_tokenizer_is_the_embedded_one(toks, tmp_path):
    tiny, chat, plain = toks
    assert is_embedded_tiny(tiny) and not is_embedded_tiny(chat) and not is_embedded_tiny(plain)
    tiny.save_pretrained(tmp_path / "exported")  # agents trained from the tiny model and exported: still tiny
    assert is_embedded_tiny(load_tokenizer(str(tmp_path / "exported")))


def test_default_wraps_the_librarys_formatters_on_a_model_with_a_template(toks):
    tiny, chat, plain = toks
    default = build_formatters(None, 1)[0]
    for library in (default, CODE_FORMATTERS[0]):
        (f,) = templated_formatters([library], [chat], None)
        assert f(ITEM) == chat_prompt(chat, library(ITEM)) and f(ITEM).startswith(TEMPLATED)
        assert templated_formatters([library], [tiny], None) == [library]  # the embedded tiny model: plain
        assert templated_formatters([library], [plain], None) == [library]  # no template: the fallback
    assert templated_formatters([user_formatter], [chat], None) == [user_formatter]  # a user's: as it is
    aux, _ = templated_formatters(list(CODE_FORMATTERS), [chat, chat], None)
    assert aux(ITEM, external_prompts="Fix it.") == chat_prompt(chat, "Fix it.")  # later turns too


def test_true_wraps_every_formatter_and_warns_where_a_tokenizer_has_no_template(toks):
    tiny, chat, plain = toks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f_tiny, f_chat = templated_formatters([user_formatter, user_formatter], [tiny, chat], True)
    assert f_tiny(ITEM) == chat_prompt(tiny, "Q: " + ITEM["prompt"]) and f_chat(ITEM).startswith(TEMPLATED)
    with pytest.warns(UserWarning, match=r"use_chat_template=True: the tokenizer of agent\(s\) \[1\] has no chat "
                                         r"template, so their prompts are used as the formatters return them"):
        _, f_plain = templated_formatters([user_formatter, user_formatter], [chat, plain], True)
    assert f_plain is user_formatter


def test_false_wraps_nothing_and_nothing_is_wrapped_twice(toks):
    tiny, chat, _ = toks
    formatters = [build_formatters(None, 1)[0], user_formatter]
    assert templated_formatters(formatters, [chat, chat], False) == formatters
    once = with_chat_template([user_formatter], [chat])
    assert templated_formatters(once, [chat], True)[0](ITEM) == once[0](ITEM)  # one template, not two


@pytest.mark.parametrize("cls", [MAGRPOConfig, MADPOConfig])
def test_the_option_is_checked(cls):
    for value in (None, True, False):
        assert cls(use_chat_template=value).use_chat_template is value
    with pytest.raises(ValueError, match=r"use_chat_template must be true, false or null\. Got 'yes'\. Allowed: "):
        cls(use_chat_template="yes")


# --- the option on every path -------------------------------------------------------------------------------
SEEN: list[str] = []


def recording_reward(*completions, prompts=None):
    SEEN.extend(prompts or [])
    return 1.0


def _fit_facade(agent_model: str, mode, formatters=None) -> list[str]:
    from comlrl_lightning.trainers import MAGRPOTrainer

    SEEN.clear()
    args = MAGRPOConfig(num_agents=2, num_generations=2, max_new_tokens=2, eval_interval=0, seed=0,
                        use_chat_template=mode)
    trainer = MAGRPOTrainer(agent_model=agent_model, train_dataset=[{"prompt": "Say hi."}], args=args,
                            reward_func=recording_reward, formatters=formatters,
                            trainer_kwargs=cpu_trainer_kwargs(max_steps=1))
    trainer.train()
    return list(SEEN)


def test_facade_path(tiny_model_dir, chat_model_dir):
    assert all(p.startswith(TEMPLATED) for p in _fit_facade(chat_model_dir, None))  # default: on
    assert _fit_facade(chat_model_dir, False) == ["Say hi."] * len(SEEN)  # off
    assert _fit_facade(tiny_model_dir, None)[0] == "Say hi."  # the embedded tiny model: off by default
    assert _fit_facade(tiny_model_dir, True)[0].startswith(TEMPLATED)
    assert _fit_facade(chat_model_dir, None, formatters=user_formatter)[0] == "Q: Say hi."  # a user's formatter


def test_module_path(chat_model_dir):
    import lightning as L

    from comlrl_lightning.data.task import TaskDataModule
    from comlrl_lightning.modules.magrpo import MAGRPOModule

    for mode, templated in ((None, True), (False, False)):
        SEEN.clear()
        args = MAGRPOConfig(num_agents=2, num_generations=2, max_new_tokens=2, eval_interval=0, seed=0,
                            use_chat_template=mode)
        module = MAGRPOModule(agent_model=chat_model_dir, args=args)
        dm = TaskDataModule(train_dataset=[{"prompt": "Say hi."}], eval_dataset=None,
                            reward_func=recording_reward, formatters=None)
        assert dm.formatters[0]({"prompt": "x"}) == "x"  # before a fit: as given
        L.Trainer(**cpu_trainer_kwargs(max_steps=1)).fit(module, datamodule=dm)
        assert SEEN and all(p.startswith(TEMPLATED) == templated for p in SEEN)
        assert dm.formatters[0]({"prompt": "x"}).startswith(TEMPLATED) == templated  # what evaluation reads


def test_yaml_path_takes_and_checks_the_option(capsys):
    from comlrl_lightning.cli import main

    config = str(ROOT / "configs" / "magrpo" / "tiny.yaml")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", config, "--model.init_args.args.use_chat_template=true", "--print_config"])
    assert exc.value.code == 0 and "use_chat_template: true" in capsys.readouterr().out
