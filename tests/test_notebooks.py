"""Every lesson notebook is committed clean and runs end to end in a real Jupyter kernel,
with no error and nothing on stderr (warnings, progress bars) for a learner to ignore."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# A hung cell fails the lesson after this long instead of stalling the suite (a lesson's whole
# budget is 5 minutes on a 2-core CPU; no single cell should come near it).
CELL_TIMEOUT_SECONDS = 300


def test_there_are_lessons():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_lesson_is_clean(path):
    """Outputs are built for reading (scripts/build_lessons.sh), never committed: stale outputs
    would show numbers the current code did not compute."""
    notebook = nbformat.read(path, as_version=4)
    dirty = [f"cell {i}: {'outputs' if cell.outputs else ''} "
             f"{'execution_count ' + str(cell.execution_count) if cell.execution_count is not None else ''}".strip()
             for i, cell in enumerate(notebook.cells)
             if cell.cell_type == "code" and (cell.outputs or cell.execution_count is not None)]
    assert not dirty, f"{path.name} was committed with outputs; strip them (e.g. nbformat or " \
                      f"`jupyter nbconvert --clear-output --inplace`): {'; '.join(dirty)}"


def stderr_outputs(notebook: nbformat.NotebookNode) -> list[str]:
    """One line per code cell output written to stderr: the cell's index and the text's start."""
    return [f"cell {i}: {output.get('text', '')[:200]!r}"
            for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
            for output in cell.get("outputs", [])
            if output.get("output_type") == "stream" and output.get("name") == "stderr"]


def test_stderr_outputs_are_found():
    """The stderr check itself can fail: a notebook that writes to stderr is caught, with its cell."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)"),
                                               nbformat.v4.new_code_cell("import sys; sys.stderr.write('careful')")])
    NotebookClient(notebook, timeout=60, kernel_name="python3").execute()
    assert stderr_outputs(notebook) == ["cell 1: 'careful'"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lesson_executes(path):
    notebook = nbformat.read(path, as_version=4)
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    NotebookClient(notebook, timeout=CELL_TIMEOUT_SECONDS, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    noise = stderr_outputs(notebook)
    assert not noise, f"{path.name} writes to stderr (silence warnings and progress bars): " + "; ".join(noise)
    text = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))
    # Lessons that compare with the baseline must show the outputs agree.
    assert "identical to the baseline: False" not in text
