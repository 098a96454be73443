"""Facades that assemble a Lightning Trainer, a module, a data module and callbacks."""
