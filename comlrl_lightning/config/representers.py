"""YAML form of the config dataclasses: the ``hparams.yaml`` Lightning's loggers write with ``yaml.dump`` must load
back with ``yaml.safe_load``, so every config dumps as a plain mapping of its fields (no ``!!python/object`` tag)."""

from __future__ import annotations

import dataclasses

import yaml


def _represent_config(dumper: yaml.Dumper, data: object) -> yaml.Node:
    """A config as the plain YAML mapping of its fields."""
    return dumper.represent_dict({f.name: getattr(data, f.name) for f in dataclasses.fields(data)})


def register_yaml_representers(*classes: type) -> None:
    """Dump the given config classes as plain mappings with ``yaml.dump`` / ``yaml.safe_dump``."""
    for cls in classes:
        for dumper in (yaml.Dumper, yaml.SafeDumper):
            yaml.add_representer(cls, _represent_config, Dumper=dumper)


def register_config_classes(*classes: type) -> None:
    """Register config dataclasses of your own (a backend with its own config, docs/architecture.md): each dumps as a
    plain YAML mapping in ``hparams.yaml`` and may be unpickled by ``torch.load(weights_only=True)``, which Lightning
    uses when it resumes a checkpoint that holds the module's ``args``. The shipped configs
    (``comlrl_lightning.config.CONFIG_CLASSES``) get the same two registrations from the package."""
    import torch

    register_yaml_representers(*classes)
    torch.serialization.add_safe_globals(list(classes))
