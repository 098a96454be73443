"""The quick-start notebook runs top to bottom on the embedded default, and its committed outputs are what a fresh
run prints (so the numbers it shows cannot go stale). Regenerate them with ``python tests/test_notebook.py``."""

import re
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


FLOAT = re.compile(r"-?\d+\.\d+")
# how far a printed decimal of a fresh run may lie from the committed one: the numbers after training move with the
# CPU's float rounding and thread count (README's Quick start states the same for the default job)
TOLERANCE = 0.08


def differences(fresh: list[list[str]], committed: list[list[str]]) -> list[str]:
    """Lines of ``fresh`` that differ from ``committed`` beyond float rounding: the text around the decimals and
    every whole number must be equal, each decimal within ``TOLERANCE``."""
    out = []
    if len(fresh) != len(committed):
        return [f"{len(fresh)} code cells printed, {len(committed)} committed"]
    for i, (a, b) in enumerate(zip(fresh, committed)):
        if len(a) != len(b):
            out.append(f"cell {i}: {len(a)} lines, {len(b)} committed")
            continue
        for la, lb in zip(a, b):
            fa, fb = [float(x) for x in FLOAT.findall(la)], [float(x) for x in FLOAT.findall(lb)]
            if FLOAT.sub("#", la) != FLOAT.sub("#", lb) or len(fa) != len(fb) or any(
                    abs(x - y) > TOLERANCE for x, y in zip(fa, fb)):
                out.append(f"cell {i}: {la!r} (committed: {lb!r})")
    return out


def test_differences_allow_float_rounding_only():
    committed = [["24 pairs from 8 items, mean reward 0.907"], ["per evaluation: [0.93, 1.046]"]]
    assert differences([["24 pairs from 8 items, mean reward 0.91"], ["per evaluation: [0.93, 1.01]"]], committed) == []
    assert differences([["25 pairs from 8 items, mean reward 0.907"], ["per evaluation: [0.93, 1.046]"]], committed)
    assert differences([["24 pairs from 8 items, mean reward 0.907"], ["per evaluation: [0.93, 1.2]"]], committed)
    assert differences([["24 pairs from 8 items, mean reward 0.907"]], committed)


@pytest.mark.slow
def test_quickstart_notebook_executes_and_prints_its_committed_outputs(tmp_path):
    import nbformat

    nb = execute(NOTEBOOK, tmp_path)
    outputs = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "pairs from 8 items" in outputs
    assert "task reward (eval/reward_mean) per evaluation" in outputs
    assert any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    committed = nbformat.read(NOTEBOOK, as_version=4)
    stale = differences(results(nb), results(committed))
    assert not stale, "the committed outputs are stale (run python tests/test_notebook.py):\n" + "\n".join(stale)


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
