"""ExportAgents: write ``output_dir/agent_{i}/`` (from_pretrained-loadable) when training ends."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.utilities import rank_zero_info


class ExportAgents(L.Callback):
    """Save every agent (model + tokenizer, or its LoRA adapter) to ``output_dir/agent_{i}`` at the end."""

    def __init__(self, output_dir: str = "outputs/agents"):
        self.output_dir = output_dir

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            paths = pl_module.save_agents(self.output_dir)
            rank_zero_info(f"Saved {len(paths)} agents under {self.output_dir}")
