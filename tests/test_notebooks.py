"""Every lesson notebook runs end to end in a real Jupyter kernel."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_there_are_lessons():
    assert NOTEBOOKS


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lesson_executes(path):
    notebook = nbformat.read(path, as_version=4)
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))
    # Lessons that compare with the baseline must show the outputs agree.
    assert "identical to the baseline: False" not in text
