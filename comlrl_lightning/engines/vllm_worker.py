"""Runs inside vLLM's worker process (``worker_extension_cls``; docs/engines.md): full-weight reload for the vLLM
engine. Imports nothing of the package, so the worker stays light."""

from __future__ import annotations


class WeightSyncExtension:
    """Mixed into vLLM's worker class; :meth:`comlrl_reload_weights` is called by name through ``collective_rpc``."""

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
