"""The package root exports the public names lazily; the callbacks have one module name."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import comlrl_lightning

REPO = Path(__file__).resolve().parents[1]

# the public names and where they live (written out here, not read from the package's own table)
HOMES = {
    "MADPOTrainer": "comlrl_lightning.trainers.madpo",
    "MADPOIterTrainer": "comlrl_lightning.trainers.madpo",
    "MAGRPOTrainer": "comlrl_lightning.trainers.magrpo",
    "MAREINFORCETrainer": "comlrl_lightning.trainers.magrpo",
    "MARLOOTrainer": "comlrl_lightning.trainers.magrpo",
    "MAReMaxTrainer": "comlrl_lightning.trainers.magrpo",
    "CentralizedMAGRPOTrainer": "comlrl_lightning.trainers.magrpo",
    "IACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MAACTrainer": "comlrl_lightning.trainers.actor_critic",
    "MARLHFTrainer": "comlrl_lightning.trainers.marlhf",
    "MARLHFIterTrainer": "comlrl_lightning.trainers.marlhf",
    "MADPOConfig": "comlrl_lightning.config",
    "MADPOIterConfig": "comlrl_lightning.config",
    "MARLHFConfig": "comlrl_lightning.config",
    "MARLHFIterConfig": "comlrl_lightning.config",
    "MAGRPOConfig": "comlrl_lightning.config",
    "MAREINFORCEConfig": "comlrl_lightning.config",
    "MARLOOConfig": "comlrl_lightning.config",
    "MAReMaxConfig": "comlrl_lightning.config",
    "CentralizedMAGRPOConfig": "comlrl_lightning.config.magrpo",
    "IACConfig": "comlrl_lightning.config",
    "MAACConfig": "comlrl_lightning.config",
    "MADPOModule": "comlrl_lightning.modules.madpo",
    "MAGRPOModule": "comlrl_lightning.modules.magrpo",
    "CentralizedMAGRPOModule": "comlrl_lightning.modules.centralized_magrpo",
    "ActorCriticModule": "comlrl_lightning.modules.actor_critic",
    "IACModule": "comlrl_lightning.modules.actor_critic",
    "MAACModule": "comlrl_lightning.modules.actor_critic",
    "MARLHFModule": "comlrl_lightning.modules.marlhf",
    "MARLHFActorCriticModule": "comlrl_lightning.modules.marlhf",
    "JointRewardModel": "comlrl_lightning.modules.reward_model",
    "PreferenceDataModule": "comlrl_lightning.data.madpo",
    "IterativePreferenceDataModule": "comlrl_lightning.data.madpo",
    "MARLHFIterDataModule": "comlrl_lightning.data.marlhf",
    "TaskDataModule": "comlrl_lightning.data.task",
    "CentralizedTaskDataModule": "comlrl_lightning.data.centralized",
    "RewardPairDataModule": "comlrl_lightning.data.reward_model",
    "build_tiny_model": "comlrl_lightning.tiny",
}


def _run(code: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_all_lists_every_public_name():
    assert sorted(comlrl_lightning.__all__) == sorted([*HOMES, "__version__"])
    assert set(comlrl_lightning.__all__) <= set(dir(comlrl_lightning))


@pytest.mark.parametrize("name", sorted(HOMES))
def test_root_name_is_the_object_at_its_home(name):
    home = importlib.import_module(HOMES[name])
    assert getattr(comlrl_lightning, name) is getattr(home, name)


def test_from_import_and_star_import():
    from comlrl_lightning import JointRewardModel, MADPOIterConfig, MADPOTrainer, MAGRPOConfig, build_tiny_model
    from comlrl_lightning.config import MADPOIterConfig as home_config
    from comlrl_lightning.modules.reward_model import JointRewardModel as home_rm
    from comlrl_lightning.trainers.madpo import MADPOTrainer as home_trainer

    assert (MADPOTrainer, MADPOIterConfig, JointRewardModel) == (home_trainer, home_config, home_rm)
    assert MAGRPOConfig().num_agents == 2 and callable(build_tiny_model)
    namespace: dict = {}
    exec("from comlrl_lightning import *", namespace)
    assert set(HOMES) | {"__version__"} <= set(namespace)


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'NoSuchTrainer'"):
        comlrl_lightning.NoSuchTrainer  # noqa: B018
    with pytest.raises(ImportError):
        from comlrl_lightning import NoSuchTrainer  # noqa: F401


def test_version_matches_the_project():
    version = re.search(r'^version = "([^"]+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert version is not None and comlrl_lightning.__version__ == version.group(1)


def test_importing_the_package_stays_cheap():
    res = _run("import sys, comlrl_lightning, comlrl_lightning.tiny; "
               "heavy = sorted(m for m in ('lightning', 'torch', 'transformers') if m in sys.modules); "
               "assert not heavy, heavy; "
               "comlrl_lightning.MADPOConfig; print('ok')")
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr


# --- callbacks: one module name ----------------------------------------------------------------------------

def test_callbacks_folder_is_not_a_second_package():
    res = _run("import callbacks")
    assert res.returncode != 0
    assert "ImportError: The callbacks package is comlrl_lightning.callbacks" in res.stderr
    assert "Import comlrl_lightning.callbacks" in res.stderr
    res = _run("from callbacks.export import ExportAgents")
    assert res.returncode != 0 and "Import comlrl_lightning.callbacks" in res.stderr


def test_callbacks_under_the_package_name():
    res = _run("import comlrl_lightning.callbacks as cb; from comlrl_lightning.callbacks.export import ExportAgents; "
               "assert cb.ExportAgents is ExportAgents and ExportAgents.__module__ == "
               "'comlrl_lightning.callbacks.export'; print('ok')")
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stdout + res.stderr
