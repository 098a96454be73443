"""Every YAML under configs/ parses through the CLI (``fit --config X --print_config``), and what it prints
is a config the CLI accepts again (``--print_config`` of the printed file prints the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


def test_there_are_configs():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=[str(p.relative_to(ROOT / "configs")) for p in CONFIGS])
def test_config_prints(path, tmp_path, capsys):
    from comlrl_lightning.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(path), "--print_config"])
    assert exc.value.code == 0
    printed = capsys.readouterr().out
    assert "model:" in printed and "class_path:" in printed and "trainer:" in printed
    again = tmp_path / "printed.yaml"
    again.write_text(printed)
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", str(again), "--print_config"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == printed
