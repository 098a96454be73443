"""An empty dataset is a clear error naming it, from a facade and from the CLI (the file loader alone stops with a
bare StopIteration, which the CLI used to turn into an IndexError inside jsonargparse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from comlrl_lightning.envs.cooperative import FORMATTERS, cooperative_reward

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def empty_file(tmp_path) -> str:
    path = tmp_path / "tasks.jsonl"
    path.write_text("\n  \n")
    return str(path)


@pytest.mark.parametrize("facade", ["MADPOTrainer", "MAGRPOTrainer"])
def test_a_facade_names_the_empty_dataset(facade, empty_file):
    import comlrl_lightning

    cls = getattr(comlrl_lightning, facade)
    for source in (empty_file, []):
        with pytest.raises(ValueError, match=r"^train_dataset .* holds no task item \(an empty file or list\)"):
            cls(agent_model="embedded:tiny", train_dataset=source, reward_func=cooperative_reward,
                formatters=FORMATTERS)


def test_the_cli_names_the_empty_dataset_first(empty_file, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(ROOT / "configs/magrpo/tiny.yaml"), f"--data.init_args.eval_dataset={empty_file}"])
    assert exc.value.code == 2
    first = next(line for line in capsys.readouterr().err.splitlines() if line.startswith("error: "))
    assert first.startswith(f"error: data.init_args.eval_dataset {empty_file!r} holds no task item")
