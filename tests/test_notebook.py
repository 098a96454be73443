"""The quick-start notebook runs top to bottom on the embedded default, and its committed outputs are what a fresh
run prints (so the numbers it shows cannot go stale). Regenerate them with ``python tests/test_notebook.py``."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "quickstart.ipynb"


def execute(path: Path, workdir: Path):
    """The notebook at ``path`` executed in ``workdir``, stderr outputs (progress bars, warnings) dropped."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}).execute()
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and o.name == "stderr")]
    return nb


def results(nb) -> list[list[str]]:
    """Per code cell, what it printed or returned as text, less lines naming a temporary folder."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        text = "".join(o.get("text", "") if o.output_type == "stream" else o.get("data", {}).get("text/plain", "")
                       for o in cell.outputs if o.output_type in ("stream", "execute_result"))
        cells.append([line for line in text.splitlines() if not line.startswith("run folder:")])
    return cells


@pytest.mark.slow
def test_quickstart_notebook_executes_and_prints_its_committed_outputs(tmp_path):
    import nbformat

    nb = execute(NOTEBOOK, tmp_path)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "pairs from 8 items" in outputs
    assert "task reward (eval/reward_mean) per evaluation" in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    committed = nbformat.read(NOTEBOOK, as_version=4)
    assert results(nb) == results(committed), "the committed outputs are stale: run python tests/test_notebook.py"


def test_committed_notebook_shows_a_training_run_and_a_plot():
    """The notebook is committed with its outputs: a reader sees the run and its plots without running it."""
    import nbformat

    nb = nbformat.read(NOTEBOOK, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "task reward (eval/reward_mean) per evaluation" in text
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2  # rewards.png, losses.png


if __name__ == "__main__":  # rewrite the committed outputs from a fresh run
    import tempfile

    import nbformat

    with tempfile.TemporaryDirectory() as tmp:
        nbformat.write(execute(NOTEBOOK, Path(tmp)), NOTEBOOK)
    print(f"wrote {NOTEBOOK}", file=sys.stderr)
