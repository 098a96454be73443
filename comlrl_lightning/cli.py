"""``comlrl-lightning``: a LightningCLI over our modules, data modules and callbacks.

    comlrl-lightning fit --config configs/madpo/tiny.yaml
    comlrl-lightning fit --config configs/madpo/tiny.yaml --print_config

When the config leaves ``trainer.max_epochs`` unset, it is derived from the module's ``args``
(``num_train_epochs``, times ``num_iterations`` for the iterative trainers).
"""

from __future__ import annotations


def _make_cli_class():
    import lightning as L
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback

    class RedactingArgumentParser(LightningArgumentParser):
        """Every dump of a config (``--print_config``, the saved ``config.yaml``) goes through ``redact_secrets``."""

        def dump(self, cfg, *args, **kwargs):
            from comlrl_lightning.config import redact_secrets

            return super().dump(redact_secrets(cfg), *args, **kwargs)

    class RedactingSaveConfigCallback(SaveConfigCallback):
        """Saves the run's config like Lightning does, minus literal API keys and secret headers."""

        def __init__(self, parser, config, *args, **kwargs):
            from comlrl_lightning.config import redact_secrets

            super().__init__(parser, redact_secrets(config), *args, **kwargs)

    class ComlrlCLI(LightningCLI):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("parser_class", RedactingArgumentParser)
            super().__init__(*args, **kwargs)

        def before_fit(self) -> None:
            args = getattr(self.model, "args", None)
            loop = self.trainer.fit_loop
            requested = self.config.get(self.subcommand, {}).get("trainer", {}).get("max_epochs")
            if args is not None and requested is None and hasattr(args, "num_train_epochs"):
                loop.max_epochs = int(args.num_train_epochs) * int(getattr(args, "num_iterations", 1))

        def after_fit(self) -> None:
            from comlrl_lightning.callbacks import TaskRewardEvaluation

            evaluations = [cb for cb in self.trainer.callbacks if isinstance(cb, TaskRewardEvaluation)]
            result = evaluations[0].before_after if evaluations else None
            if result is not None and self.trainer.is_global_zero:
                print(f"task reward (eval/reward_mean): before {result[0]:.4f} -> after {result[1]:.4f}")

    ComlrlCLI.save_callback = RedactingSaveConfigCallback
    return ComlrlCLI, L


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``comlrl-lightning`` console script."""
    cli_cls, L = _make_cli_class()
    cli_cls(
        L.LightningModule,
        L.LightningDataModule,
        subclass_mode_model=True,
        subclass_mode_data=True,
        auto_configure_optimizers=False,
        save_config_callback=cli_cls.save_callback,
        save_config_kwargs={"overwrite": True},
        args=argv,
    )


if __name__ == "__main__":
    main()
