"""Each optimizer's gradients averaged over the ranks at its own step, instead of DDP's gradient hooks
(docs/scaling.md, "Strategies"): a mixin of :class:`~comlrl_lightning.modules.base.TeamModuleBase`.

Under a DDP wrapper every backward runs under the wrapper's ``no_sync()`` (DDP's hooks, which expect every parameter
of the module in each backward, stay idle), and each optimizer's gradients are averaged over the ranks just before
its step or its gradient clipping: one all-reduce per agent step, over that agent's parameters only, so every rank
steps the same weights and ``strategy="ddp"`` needs no unused-parameter search.

The host (a LightningModule) calls :meth:`OwnGradientAveraging.average_before_step` from its
``on_before_optimizer_step``.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch.nn.parallel import DistributedDataParallel

from comlrl_lightning.distributed import average_gradients


class OwnGradientAveraging(L.LightningModule):
    """Lightning's ``manual_backward`` and ``clip_gradients`` with each optimizer's gradients averaged at its own step
    under DDP (see the module docstring); Lightning's own behaviour under every other strategy."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: the optimizer whose gradients :meth:`clip_gradients` averaged since its last step (DDP)
        self._averaged_optimizer: torch.optim.Optimizer | None = None

    def averages_own_gradients(self) -> bool:
        """True when the fit runs under a DDP wrapper (any ``DDPStrategy``, ``strategy="ddp"`` included). Then
        :meth:`manual_backward` runs every backward under the wrapper's ``no_sync()`` (DDP's hooks, which expect
        every parameter of the module in each backward, stay idle) and each optimizer's gradients are averaged over
        the ranks just before its step (:meth:`average_before_step`) or its gradient clipping
        (:meth:`clip_gradients`), by :func:`~comlrl_lightning.distributed.average_gradients`: one all-reduce per
        agent step (per bucket of 16M elements), over that agent's parameters only, so every rank steps the same
        weights without DDP's unused-parameter search. Gradient accumulation reduces once per step."""
        trainer = self._trainer
        return trainer is not None and isinstance(trainer.strategy.model, DistributedDataParallel)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Lightning's ``manual_backward``; under DDP without DDP's gradient sync (:meth:`averages_own_gradients`)."""
        if not self.averages_own_gradients():
            super().manual_backward(loss, *args, **kwargs)
            return
        with self.trainer.strategy.model.no_sync():
            super().manual_backward(loss, *args, **kwargs)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        """Lightning's ``clip_gradients``, on the gradients averaged over the ranks (:meth:`averages_own_gradients`):
        the norm is the global one, as under DDP."""
        raw = optimizer.optimizer if isinstance(optimizer, LightningOptimizer) else optimizer
        if self.averages_own_gradients():
            self._average_gradients(raw)
            self._averaged_optimizer = raw
        super().clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                               gradient_clip_algorithm=gradient_clip_algorithm)

    def average_before_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Average ``optimizer``'s gradients unless :meth:`clip_gradients` did since its last step (called from
        ``on_before_optimizer_step``)."""
        averaged, self._averaged_optimizer = self._averaged_optimizer, None
        if averaged is optimizer or not self.averages_own_gradients():
            return
        self._average_gradients(optimizer)
        # Lightning's MixedPrecision (16-mixed) holds a scaler, other precision plugins none
        scaler = getattr(self.trainer.strategy.precision_plugin, "scaler", None)
        if scaler is not None:  # 16-mixed: unscale_ looked for inf/nan in this rank's gradients; every rank must
            import torch.distributed as dist  # agree to skip the step, as DDP's (reduced) gradients would

            state = getattr(scaler, "_per_optimizer_states", {}).get(id(optimizer), {})
            for found in state.get("found_inf_per_device", {}).values():
                dist.all_reduce(found, op=dist.ReduceOp.MAX)

    def _average_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        params = list({id(p): p for group in optimizer.param_groups for p in group["params"]
                       if p.requires_grad}.values())
        average_gradients(params, self.trainer.world_size)
