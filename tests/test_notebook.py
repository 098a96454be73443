"""The quick-start notebook runs top to bottom on the embedded default."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_quickstart_notebook_executes(tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "pairs from 8 items" in outputs
    assert "task reward (eval/reward_mean) per evaluation" in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def test_committed_notebook_shows_a_training_run_and_a_plot():
    """The notebook is committed with its outputs: a reader sees the run and its plots without running it."""
    import nbformat

    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "task reward (eval/reward_mean) per evaluation" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # rewards.png, losses.png
