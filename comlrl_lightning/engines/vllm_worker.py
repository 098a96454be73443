"""Runs inside vLLM's worker process (``worker_extension_cls``; docs/engines.md): full-weight reload for the vLLM
engine and, on CPU, the grouped LoRA ops of :mod:`.vllm_lora_ops`. Imports nothing else of the package, so the
worker stays light.

Importing this module (vLLM does it when the worker starts) installs the grouped LoRA ops unless the environment
variable ``COMLRL_VLLM_LORA_OPS`` is ``vllm`` (keep vLLM's own CPU ops)."""

from __future__ import annotations

import os

from comlrl_lightning.engines import vllm_lora_ops

#: Whether this worker process runs the grouped LoRA ops.
GROUPED_LORA_OPS = os.environ.get("COMLRL_VLLM_LORA_OPS", "grouped") != "vllm" and vllm_lora_ops.install()


class WeightSyncExtension:
    """Mixed into vLLM's worker class; its methods are called by name through ``collective_rpc``."""

    def comlrl_lora_ops(self) -> str:
        """Which CPU LoRA ops this worker runs: ``"grouped"`` (ours) or ``"vllm"``."""
        return "grouped" if GROUPED_LORA_OPS else "vllm"

    def comlrl_reload_weights(self, weights_path: str) -> int:
        """Load the checkpoint folder ``weights_path`` into the served model in place, then re-run the weight
        post-processing of every layer whose weight is shared with another (a tied ``lm_head``): the CPU build
        pre-packs the ``lm_head`` weight, and the in-place reload only refreshes the embedding it is tied to.
        Returns the number of layers re-processed."""
        self.reload_weights(weights_path=weights_path)
        model = self.get_model()
        owners: dict[int, list] = {}
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if weight is not None and hasattr(module, "quant_method"):
                owners.setdefault(id(weight), []).append(module)
        done = 0
        for modules in owners.values():
            if len(modules) < 2:
                continue
            for module in modules:
                method = getattr(module, "quant_method", None)
                if method is not None and hasattr(method, "process_weights_after_loading"):
                    method.process_weights_after_loading(module)
                    done += 1
        return done
