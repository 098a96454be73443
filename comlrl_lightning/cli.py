"""``comlrl-lightning``: a LightningCLI over our modules, data modules and callbacks.

    comlrl-lightning fit --config configs/madpo/tiny.yaml
    comlrl-lightning fit --config configs/madpo/tiny.yaml --print_config

    comlrl-lightning validate --config configs/madpo/tiny.yaml --model.init_args.agent_model=<run>/agents
    comlrl-lightning report <run folder>

When the config leaves ``trainer.max_epochs`` unset, it is derived from the module's ``args``
(``num_train_epochs``, times ``num_iterations`` for the iterative trainers). ``validate`` / ``test`` evaluate a
team on the data module's eval_dataset with the task reward (``val/reward_mean``). ``report`` writes PNG plots of
a run's logged metrics (:mod:`comlrl_lightning.report`).

A ``fit`` stopped by SIGTERM exits with status 143 and a ``fit`` that took no optimizer step with status 3, both
after a one-paragraph summary on stderr: what was saved, where, and the command that resumes (or re-runs) it.

Discoverability: our modules, data modules and callbacks are imported before the parser is built, so
``fit --help`` lists them and ``--model.help MADPOModule`` takes the short name; option help shows the
docstring line of every config field. A config value error (a ``ValueError`` raised by our code while the CLI
builds the objects) is printed as its own sentence, first and last, instead of jsonargparse's nested report.

Overrides: ``--model.init_args.args.max_new_tokens=4`` changes that field of the config's ``args`` only, for the
iterative configs too (:func:`args_overrides_merged`); a bad value names the error of the ``args`` type meant
(:func:`args_type_error`).

Secrets (docs/preference.md §6): the secret values of the command line and of the config files it names are
collected before parsing (:func:`~comlrl_lightning.config.secrets.secrets_in_argv`); parse and value errors are
printed without them, and once the config is parsed, ``sys.argv`` (which W&B records as the run's arguments) holds
the command line with every secret of the config replaced by ``***`` until :func:`main` returns.
"""

from __future__ import annotations

import sys

#: the modules whose classes the CLI lists (imported before the parser is built)
CLI_MODULES = ("comlrl_lightning.modules", "comlrl_lightning.data", "comlrl_lightning.callbacks")

_SUBCOMMANDS = {
    "fit": "train a team (or a reward model) from a config: fit --config configs/madpo/tiny.yaml",
    "validate": "evaluate a team on eval_dataset with the task reward (val/reward_mean)",
    "test": "as validate, logged under test/",
    "predict": "not supported for team modules (use validate or test)",
    "report": "write PNG plots of a run's metrics: report <run folder>",
}


def _short_help() -> str:
    """``comlrl-lightning --help`` without importing Lightning (cheap)."""
    from comlrl_lightning import PUBLIC_HOMES

    lines = ["usage: comlrl-lightning {fit,validate,test,predict,report} ...", "",
             "Train and evaluate teams of cooperating LLM agents (LightningCLI).", "", "subcommands:"]
    lines += [f"  {name:<9} {text}" for name, text in _SUBCOMMANDS.items()]
    groups = {"modules (--model)": ".modules", "data modules (--data)": ".data",
              "callbacks (--trainer.callbacks)": ".callbacks"}
    for title, part in groups.items():
        names = sorted(n for n, m in PUBLIC_HOMES.items() if f"comlrl_lightning{part}" in m and n[0].isupper())
        if part == ".callbacks":  # read their names from the package file: importing it would load Lightning
            import ast
            from pathlib import Path

            tree = ast.parse((Path(__file__).parent / "callbacks" / "__init__.py").read_text())
            names = next(sorted(ast.literal_eval(node.value)) for node in tree.body if isinstance(node, ast.Assign)
                         and any(getattr(t, "id", None) == "__all__" for t in node.targets))
        lines += ["", f"{title}:", "  " + ", ".join(names)]
    lines += ["", "Details: comlrl-lightning fit --help; one class: comlrl-lightning fit --model.help MADPOModule",
              "Configs: configs/<method>/<name>.yaml (e.g. configs/madpo/tiny.yaml)."]
    return "\n".join(lines)


def user_error(exc: BaseException) -> str | None:
    """The sentence of the deepest ``ValueError`` / ``TypeError`` (or error class of our own, e.g. ``SandboxError``)
    raised by our own code in ``exc``'s chain (e.g. "temperature must be > 0. Got 0.0. Allowed: numbers > 0."), or
    None when there is none."""
    found, seen, stack = None, set(), [exc]
    while stack:
        e = stack.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, (ValueError, TypeError)) or type(e).__module__.startswith("comlrl_lightning."):
            tb, ours = e.__traceback__, False
            while tb is not None:
                name = tb.tb_frame.f_code.co_filename
                ours = ours or ("comlrl_lightning" in name and "comlrl_lightning/cli.py" not in name)
                tb = tb.tb_next
            if ours:
                found = e
        stack += [e.__context__, e.__cause__]
    return str(found) if found is not None else None


def unknown_option(message: str) -> str | None:
    """"X has no option 'y'. Did you mean ...?" for jsonargparse's deepest "Option 'y' is not accepted" of class X in
    ``message`` (the usage and the Union-subtype report bury it), or None when the message is about something else."""
    import importlib
    import inspect
    import re

    from comlrl_lightning.config.checks import did_you_mean

    found = re.findall(r"Problem with given class_path '([\w.]+)':\s*Option '(\w+)' is not accepted", message)
    if not found:
        return None
    path, option = found[-1]
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
        params = [p for p in inspect.signature(cls).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (ImportError, AttributeError, TypeError, ValueError):
        return f"{name} has no option {option!r}."
    return f"{name} has no option {option!r}.{did_you_mean(option, [p.name for p in params])}"


#: ``--model.init_args.args.FIELD[=VALUE]`` (``init_args.`` optional at both levels; ``FIELD`` one name, no dot)
_ARGS_FIELD = r"--model\.(?:init_args\.)?args\.(?:init_args\.)?(\w+)(?:=(.*))?"


def args_overrides_merged(argv: list[str]) -> list[str]:
    """``argv`` with each command-line override of one field of the module's ``args``
    (``--model.init_args.args.max_new_tokens=4``) given as a one-field mapping
    (``--model.init_args.args {"max_new_tokens": "4"}``), in place.

    ``args`` of MADPOModule is ``MADPOConfig | MADPOIterConfig`` (MARLHF's likewise). jsonargparse reads a
    one-field override as a value of the union's first type that accepts the field, and that type's parse keeps
    only its own fields of the config read so far: the iterative fields (``num_iterations``, ``comparator_policy``,
    the replay options) went back to their defaults. A mapping is instead merged with the config read so far and
    the union's type is chosen by the merged fields, as for a second ``--config`` file. The value stays the string
    typed, which jsonargparse converts to the field's type as it does on the command line. Deeper keys
    (``args.vllm_kwargs.x=1``) are left as they are (:func:`~comlrl_lightning.trainers.common.check_args_kept`
    warns if one drops fields)."""
    import json
    import re

    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        match = re.fullmatch(_ARGS_FIELD, arg) if isinstance(arg, str) else None
        no_value = match is not None and match.group(2) is None and (i + 1 >= len(argv) or argv[i + 1][:2] == "--")
        if match is None or match.group(1) == "help" or no_value:  # left for the parser (or its error)
            out.append(arg)
            i += 1
            continue
        value = match.group(2) if match.group(2) is not None else argv[i + 1]
        out += ["--model.init_args.args", json.dumps({match.group(1): value}, ensure_ascii=False)]
        i += 1 if match.group(2) is not None else 2
    return out


def args_type_error(config, failure: str) -> Exception | None:
    """The error the module's own type of ``args`` raises on the parsed ``model.init_args.args``, or None (also
    when ``failure``, the message of the failed build, names none of the types of ``args``).

    When building ``args`` fails, jsonargparse tries every type of the union (``MADPOConfig | MADPOIterConfig``)
    and reports the first type's error, e.g. "MADPOConfig has no option 'num_iterations'" for an iterative config
    whose ``max_new_tokens`` is 0. The type meant is the one named by ``class_path``, else the smallest type that
    has every field parsed; its own error ("max_new_tokens must be >= 1. Got 0. ...") is the one to show."""
    import dataclasses
    import importlib
    import typing

    def imported(path: str):
        module, _, name = str(path).rpartition(".")
        return getattr(importlib.import_module(module), name)

    try:
        model = config.get("model") or {}
        args = (model.get("init_args") or {}).get("args")
        if args is None or not hasattr(args, "get"):
            return None
        if args.get("class_path"):
            types, values = [imported(args["class_path"])], args.get("init_args") or {}
        else:
            hint = typing.get_type_hints(imported(model["class_path"]).__init__).get("args")
            types, values = [t for t in typing.get_args(hint) if dataclasses.is_dataclass(t)], args
        values = values.as_dict() if hasattr(values, "as_dict") else dict(values)
        if not any(t.__name__ in failure for t in types):  # the build failed elsewhere
            return None
        for cls in sorted(types, key=lambda t: len(dataclasses.fields(t))):
            if set(values) <= {f.name for f in dataclasses.fields(cls) if f.init}:
                try:
                    cls(**values)
                except (ValueError, TypeError) as exc:
                    return exc
                return None
    except Exception:  # noqa: BLE001 - an explanation only: the original error stands
        return None
    return None


#: exit status of ``fit`` stopped by SIGTERM (128 + 15, as a shell reports a process killed by it)
EXIT_SIGTERM = 143
#: exit status of a ``fit`` that finished without one optimizer step
EXIT_TRAINED_NOTHING = 3


def run_summary(trainer, headline: str) -> str:
    """One paragraph: ``headline``, what the run saved and where, and how to resume or re-run it."""
    from pathlib import Path

    run = Path(trainer.log_dir) if trainer.log_dir else None
    ckpts = []
    for cb in trainer.checkpoint_callbacks:
        ckpts += [p for p in (cb.last_model_path, cb.best_model_path) if p and Path(p).exists()]
        if cb.dirpath and Path(cb.dirpath).is_dir():
            ckpts += sorted(str(p) for p in Path(cb.dirpath).glob("*.ckpt"))
    ckpts = sorted(set(ckpts), key=lambda p: Path(p).stat().st_mtime)
    saved = []
    if run is not None and (run / "metrics.csv").exists():
        saved.append(f"the metrics ({run / 'metrics.csv'})")
    if run is not None and (run / "config.yaml").exists():
        saved.append(f"the config ({run / 'config.yaml'})")
    if ckpts:
        saved.append(f"{len(ckpts)} checkpoint(s), the newest {ckpts[-1]}")
    agents = run / "agents" if run is not None else None
    if agents is not None and agents.is_dir():
        saved.append(f"the exported agents ({agents})")
    text = headline + " Saved: " + ("; ".join(saved) if saved else "nothing") + "."
    config = f"{run / 'config.yaml'}" if run is not None and (run / "config.yaml").exists() else "<your config>"
    if ckpts:
        text += f" Resume: comlrl-lightning fit --config {config} --ckpt_path {ckpts[-1]}"
    else:
        text += (" No checkpoint was written (trainer.enable_checkpointing is off or no epoch ended), so a resume "
                 f"starts over: comlrl-lightning fit --config {config}")
    return text


def stop_run(trainer, status: int, headline: str) -> None:
    """Print :func:`run_summary` (rank 0) and exit with ``status``."""
    if trainer.is_global_zero:
        sys.stderr.write(f"\n{run_summary(trainer, headline)}\n")
    raise SystemExit(status)


def _make_cli_class(want_help: bool = False):
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

    from jsonargparse import set_parsing_settings

    # config fields' docstrings in the help (parsing them costs CPU-seconds, so only when help is asked for)
    set_parsing_settings(docstring_parse_attribute_docstrings=want_help)

    class ComlrlParser(RedactingArgumentParser):
        """Redacting dumps, and a config value error's own sentence first and last (not buried in the
        Union-subtype report)."""

        secrets: set[str] = set()  # the command line's secret values (main sets them): never printed

        def error(self, message: str, ex: Exception | None = None):
            from comlrl_lightning.config.secrets import scrub

            sentence = user_error(ex) if ex is not None else None
            sentence = sentence or unknown_option(message)
            message, sentence = scrub(message, self.secrets), scrub(sentence, self.secrets)
            if sentence is not None and self.exit_on_error:
                sys.stderr.write(f"error: {sentence}\n")
                message = f"{message}\n{sentence}"
            return super().error(message, ex)

    class ComlrlCLI(LightningCLI):
        secrets: set[str] = set()

        def parse_arguments(self, parser, args) -> None:
            # a one-field override of the module's args keeps the config's other fields (args_overrides_merged)
            if args is not None and not isinstance(args, (list, tuple)):  # a dict or Namespace: nothing to merge
                return super().parse_arguments(parser, args)
            given = list(sys.argv[1:] if args is None else args)
            merged = args_overrides_merged(given)
            if merged == given:
                return super().parse_arguments(parser, args)
            if args is None:  # as Lightning does with sys.argv (passing it as args would warn about both)
                self.config = parser.parse_args(merged)
                return None
            return super().parse_arguments(parser, merged)

        def instantiate_classes(self) -> None:
            # W&B reads sys.argv when its run starts (in fit): from here on it holds no secret of the config
            from comlrl_lightning.config.secrets import redact_argv, secret_values

            hidden = self.secrets | secret_values(self.config)
            sys.argv[1:] = redact_argv(sys.argv[1:], hidden)
            try:
                super().instantiate_classes()
                return
            except (ValueError, TypeError) as exc:
                failed = exc
            # outside the handler, so that the union's report (its first type's error) is not the context
            config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
            meant = args_type_error(config, str(failed))
            raise meant if meant is not None else failed

        def _instantiate_trainer(self, config: dict, callbacks: list) -> L.Trainer:
            from comlrl_lightning.callbacks.progress import with_progress_bar
            from comlrl_lightning.checkpoint_io import with_atomic_checkpoint_io

            # checkpoints are written to a temporary file and renamed over the target (docs/guide.md §1.1)
            config["plugins"] = with_atomic_checkpoint_io(config.get("plugins"), config.get("strategy"),
                                                          config.get("accelerator"))
            given = config.get("callbacks") or []
            given = [*(given if isinstance(given, list) else [given]), *callbacks]
            added = with_progress_bar(given, config.get("enable_progress_bar", True))[len(given):]
            return super()._instantiate_trainer(config, [*callbacks, *added])

        def before_instantiate_classes(self) -> None:
            # An empty dataset file is named here, before the data module's loader stops on it without a word.
            from comlrl_lightning.trainers.common import check_args_kept, check_not_empty

            config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
            data = config.get("data") or {}
            init = data.get("init_args", data) if hasattr(data, "get") else {}
            for name in ("train_dataset", "eval_dataset"):
                value = init.get(name) if hasattr(init, "get") else None
                if value is not None:
                    check_not_empty(value, f"data.init_args.{name}")
            check_args_kept(config)

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
            if self.trainer.global_step == 0:  # a run that looks successful but changed no weight
                stop_run(self.trainer, EXIT_TRAINED_NOTHING, "Training took no optimizer step: the weights are "
                         "unchanged (e.g. the reward gave no preference, so no pair was formed; or "
                         "limit_train_batches/max_steps is 0).")

        def _run_subcommand(self, subcommand: str) -> None:
            from lightning.pytorch.utilities.exceptions import SIGTERMException

            try:
                super()._run_subcommand(subcommand)
            except SIGTERMException:
                if subcommand != "fit":
                    raise
                stop_run(self.trainer, EXIT_SIGTERM, f"Training was stopped by SIGTERM after "
                         f"{self.trainer.global_step} optimizer steps (epoch {self.trainer.current_epoch}).")

    ComlrlCLI.save_callback = RedactingSaveConfigCallback
    ComlrlCLI.parser_cls = ComlrlParser
    return ComlrlCLI, L


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``comlrl-lightning`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_short_help())
        return
    if args[0] == "report":
        from comlrl_lightning.report import main as report_main

        report_main(args[1:])
        return
    import importlib

    for name in CLI_MODULES:
        importlib.import_module(name)
    cli_cls, L = _make_cli_class(want_help=any(a in ("-h", "--help") or ".help" in a for a in args))
    from comlrl_lightning.config.secrets import scrub, secrets_in_argv

    cli_cls.secrets = cli_cls.parser_cls.secrets = secrets = secrets_in_argv(args)
    saved_argv = list(sys.argv)
    try:
        cli_cls(
            L.LightningModule,
            L.LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            auto_configure_optimizers=False,
            save_config_callback=cli_cls.save_callback,
            save_config_kwargs={"overwrite": True},
            parser_class=cli_cls.parser_cls,
            args=argv,
        )
    except (ValueError, TypeError) as exc:
        sentence = user_error(exc)
        if sentence is None:
            raise
        sentence = scrub(sentence, secrets)
        detail = scrub(str(exc), secrets).splitlines()
        shown = "\n".join(detail[:12] + (["  ..."] if len(detail) > 12 else []))
        sys.stderr.write(f"error: {sentence}\n\n{shown}\n\nerror: {sentence}\n")
        raise SystemExit(2) from None
    finally:
        sys.argv[:] = saved_argv


if __name__ == "__main__":
    main()
