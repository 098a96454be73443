"""The built wheel works outside the repository: real callback files, package data, console script."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "disabled"})
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, env: dict[str, str],
         timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Copy the sources (links kept as links) to a scratch folder, build the wheel there, install it."""
    root = tmp_path_factory.mktemp("packaging")
    src = root / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist")
    for folder in ("comlrl_lightning", "callbacks"):
        shutil.copytree(REPO / folder, src / folder, symlinks=True, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    # Building in the copy keeps build/ and *.egg-info out of the working tree.
    res = _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                "-w", str(root / "wheel")], src, _env(), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    (wheel,) = (root / "wheel").glob("comlrl_lightning-*.whl")
    site = root / "site"
    res = _run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
               root, _env(), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    return {"src": src, "wheel": wheel, "site": site, "cwd": elsewhere}


def test_wheel_contains_real_callback_files_and_data(built):
    src = built["src"]
    assert (src / "comlrl_lightning" / "callbacks").is_symlink()  # the layout this test is about
    with zipfile.ZipFile(built["wheel"]) as whl:
        infos = {i.filename: i for i in whl.infolist()}
        callback_files = sorted(p.name for p in (src / "callbacks").glob("*.py"))
        assert "__init__.py" in callback_files
        for name in callback_files:
            arc = f"comlrl_lightning/callbacks/{name}"
            assert arc in infos, f"{arc} missing from the wheel"
            mode = infos[arc].external_attr >> 16
            assert not stat.S_ISLNK(mode), f"{arc} is a symlink in the wheel"
            assert whl.read(arc) == (src / "callbacks" / name).read_bytes()

        data = "comlrl_lightning/envs/data/cooperative_length.jsonl"
        assert data in infos
        shipped = src / "comlrl_lightning" / "envs" / "data" / "cooperative_length.jsonl"
        assert whl.read(data) == shipped.read_bytes()

        (entry_points,) = [n for n in infos if n.endswith(".dist-info/entry_points.txt")]
        text = whl.read(entry_points).decode()
        assert "[console_scripts]" in text
        assert "comlrl-lightning = comlrl_lightning.cli:main" in text
        assert not any(n.startswith(("tests/", "callbacks/")) for n in infos)


def test_installed_wheel_imports_and_runs_outside_the_repo(built):
    """One interpreter (imports are slow): the modules come from the wheel, and its CLI answers --help."""
    site = built["site"]
    code = (
        "import json, comlrl_lightning, comlrl_lightning.callbacks as cb\n"
        "import comlrl_lightning.envs.cooperative as coop\n"
        "from comlrl_lightning.callbacks import PreferenceCollection, TaskRewardEvaluation, ExportAgents\n"
        "import comlrl_lightning.data.sources, comlrl_lightning.agents, comlrl_lightning.cli as cli\n"
        "print('RESULT:' + json.dumps({'pkg': comlrl_lightning.__file__, 'callbacks': cb.__file__,\n"
        "      'cli': cli.__file__, 'pc': PreferenceCollection.__module__, 'data': str(coop.DATA_FILE),\n"
        "      'data_ok': coop.DATA_FILE.is_file()}), flush=True)\n"
        "try:\n"
        "    cli.main(['--help'])\n"
        "except SystemExit as exc:\n"
        "    print('EXIT:' + repr(exc.code))\n"
        "else:\n"
        "    print('EXIT:None')\n"
    )
    res = _run([sys.executable, "-c", code], built["cwd"], _env(PYTHONPATH=str(site)))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    (result,) = [ln for ln in lines if ln.startswith("RESULT:")]
    out = json.loads(result[len("RESULT:"):])
    site_real = site.resolve()
    for key in ("pkg", "callbacks", "cli", "data"):
        path = Path(out[key]).resolve()
        assert path.is_relative_to(site_real), f"{key} imported from {path}, not the installed wheel"
        assert not path.is_relative_to(REPO)
    assert out["pc"] == "comlrl_lightning.callbacks.preference_collection"
    assert out["data_ok"] is True
    installed_callbacks = site / "comlrl_lightning" / "callbacks"
    assert installed_callbacks.is_dir() and not installed_callbacks.is_symlink()
    # The installed CLI's --help: exit status 0 and the fit subcommand listed.
    assert lines[-1] in ("EXIT:0", "EXIT:None"), res.stdout[-2000:]
    assert "fit" in res.stdout


def test_console_script_help(tmp_path):
    script = Path(sys.executable).parent / "comlrl-lightning"
    assert script.is_file(), f"console script not installed at {script}"
    res = _run([str(script), "--help"], tmp_path, _env())
    assert res.returncode == 0, res.stderr
    assert "fit" in res.stdout and "usage" in res.stdout.lower()
