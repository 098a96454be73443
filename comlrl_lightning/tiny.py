"""The embedded offline default: a tiny causal LM and tokenizer, built deterministically.

No download is involved: the tokenizer is a byte-level BPE trained on a few fixed lines of text, the model
is a 2-layer Qwen2 with random weights drawn from a fixed seed. Both are written with ``save_pretrained`` and
loaded back through the same ``from_pretrained`` path that real checkpoints use, so every test and default
config exercises the real loading code.

Use ``build_tiny_model(folder)`` to write it somewhere, or the model name :data:`TINY_MODEL_NAME` in a
config, which :mod:`comlrl_lightning.agents` resolves to a cached build.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

#: Model name that configs use for the embedded default (resolved by ``agents.resolve_model_source``).
TINY_MODEL_NAME = "embedded:tiny"

#: Bumped whenever the recipe changes so that cached builds are rebuilt.
TINY_RECIPE_VERSION = 2

PAD, EOS, IM_START, IM_END = "<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Training text for the tokenizer: enough variety for a 512-token vocabulary, and the words the built-in
# cooperative task uses, so that prompts tokenize into a handful of tokens.
_CORPUS = [
    "Write a short answer about the topic, then a longer elaboration that adds new words.",
    "Topic: rivers, mountains, forests, deserts, oceans, islands, volcanoes, glaciers, storms, rain.",
    "Topic: bread, cheese, apples, coffee, tea, soup, rice, honey, salt, pepper, lemons, bananas.",
    "Topic: trains, bicycles, rockets, ships, bridges, roads, maps, engines, clocks, lamps, radios.",
    "Topic: music, painting, poetry, dance, theatre, film, chess, football, tennis, swimming.",
    "Agent one answers briefly. Agent two explains with more detail and different words.",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
    "Cooperation means each agent does its own part so that the team reaches a better result.",
    "def aux(x):\n    return x + 1\n\ndef main(values):\n    return [aux(v) for v in values]\n",
    "numbers letters words sentences paragraphs questions answers ideas reasons examples facts.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = < > ( ) [ ] { } : ; , . ! ? ' \"",
]


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    return tok


def build_tiny_model(
    output_dir: str | os.PathLike,
    *,
    seed: int = 0,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
) -> str:
    """Build the tiny causal LM and its tokenizer into ``output_dir`` and return the folder path.

    The build is deterministic (same files for the same arguments) and needs no network. The folder is
    written under a temporary name and renamed, so a crash never leaves a half-written model behind; an
    existing complete build of the same recipe is reused as is.
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out = Path(output_dir).absolute()
    marker = out / "comlrl_tiny.json"
    recipe = {
        "recipe_version": TINY_RECIPE_VERSION,
        "seed": seed,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
    }
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == recipe:
                return str(out)
        except json.JSONDecodeError:
            pass

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        raw = _train_tokenizer(vocab_size)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=raw,
            pad_token=PAD,
            eos_token=EOS,
            bos_token=None,
            additional_special_tokens=[IM_START, IM_END],
            padding_side="left",
            model_max_length=4096,
        )
        tokenizer.chat_template = CHATML_TEMPLATE
        config = Qwen2Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            max_position_embeddings=4096,
            tie_word_embeddings=True,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bos_token_id=None,
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "comlrl_tiny.json").write_text(json.dumps(recipe))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return str(out)


def default_tiny_dir() -> Path:
    """Cache folder of the embedded default (``$COMLRL_LIGHTNING_CACHE`` or ``~/.cache/comlrl_lightning``)."""
    base = os.environ.get("COMLRL_LIGHTNING_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "comlrl_lightning"
    )
    return Path(base) / f"tiny-v{TINY_RECIPE_VERSION}"


def tiny_model_path() -> str:
    """Path of the cached embedded default, built on first use."""
    return build_tiny_model(default_tiny_dir())
