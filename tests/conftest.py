"""Shared fixtures: the embedded tiny model (built once per session), offline environment, CPU trainers."""

from __future__ import annotations

import os

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

# Tests that run model code need the bubblewrap sandbox (docs/sandbox.md). Where it cannot run they skip, and the
# session says so in its header and its summary, with the command that installs it.
INSTALL_BWRAP = "`sudo apt-get install bubblewrap` (Debian/Ubuntu; `dnf install bubblewrap` on Fedora)"
_SANDBOX_WORDS = ("bubblewrap", "no sandbox here", "the sandbox needs Linux")


def _sandbox_problem() -> str | None:
    from comlrl_lightning.envs.code.sandbox import unavailable_reason

    return unavailable_reason()


def pytest_configure(config):
    config.addinivalue_line("markers", "sandbox: runs model code in the bubblewrap sandbox; skipped where it cannot run")


def pytest_report_header(config):
    from comlrl_lightning.envs.code.sandbox import bwrap_path  # cheap; the full probe runs where sandbox tests are

    if bwrap_path() is None:
        return f"sandbox: bubblewrap is not installed; the tests that run model code skip. Install: {INSTALL_BWRAP}"
    return None


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("sandbox")]
    problem = _sandbox_problem() if marked else None
    if problem is not None:
        skip = pytest.mark.skip(reason=f"no sandbox here: {problem.split('. ')[0]}")
        for item in marked:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    skipped = [r for r in terminalreporter.stats.get("skipped", [])
               if any(w in str(getattr(r, "longrepr", "")) for w in _SANDBOX_WORDS)]
    if skipped:
        terminalreporter.write_sep("=", "sandbox")
        terminalreporter.write_line(
            f"{len(skipped)} tests that run model code were skipped, the sandbox cannot run here: "
            f"{(_sandbox_problem() or 'see the skip reasons').split('. ')[0]}. Install bubblewrap to run them: "
            f"{INSTALL_BWRAP} (docs/sandbox.md).")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """Folder of the embedded tiny model, built once for the session."""
    from comlrl_lightning.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """The tiny model with a head size vLLM's CPU attention serves (hidden 128, 4 heads: 32), float32."""
    from comlrl_lightning.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny128") / "model", hidden_size=128, num_heads=4,
                            num_kv_heads=2)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """One intra-op thread: on the 2-core CI machine this is faster and far steadier than the default."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


#: What Lightning's process launcher writes into ``os.environ`` of the process that calls ``fit`` (even with one
#: device, e.g. under ModelParallelStrategy). Left behind in the test process, they would reach every later test's
#: subprocess: a script launched with ``LOCAL_RANK`` set believes an outer launcher started its ranks, starts no
#: rank 1, and rank 0 waits for it forever (seen in a CI run: tests/trainers/test_ddp.py after an in-process
#: ModelParallelStrategy fit).
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE", "RANK", "GROUP_RANK",
                      "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def _launcher_environment():
    """Restore the launcher variables after every test (see ``LAUNCHER_VARIABLES``)."""
    before = {k: os.environ.get(k) for k in LAUNCHER_VARIABLES}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session", autouse=True)
def _cache_dir(tmp_path_factory):
    """Keep the embedded default's cache inside the test session (never the user's home)."""
    path = tmp_path_factory.mktemp("cache")
    old = os.environ.get("COMLRL_LIGHTNING_CACHE")
    os.environ["COMLRL_LIGHTNING_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("COMLRL_LIGHTNING_CACHE", None)
    else:
        os.environ["COMLRL_LIGHTNING_CACHE"] = old


def cpu_trainer_kwargs(**overrides):
    """Quiet single-device CPU trainer settings for tests."""
    kwargs = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                  log_every_n_steps=1)
    kwargs.update(overrides)
    return kwargs
