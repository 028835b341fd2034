"""Each assignment as a learner runs it: every cell of the solution notebook in a real kernel,
outside the autograder, so the benchmark and exploration cells that skip themselves under
grading run too. The grading tests never reach those cells.

The long benchmarks run on smaller workloads here: each change below replaces one constant
(the test fails if the constant is gone) and keeps every code path of the cell.
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from test_notebooks import stderr_outputs

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir() if any(p.glob("*.ipynb")))
CELL_TIMEOUT_SECONDS = 300

# assignment -> (text in a cell, what it becomes here)
SMALLER = {
    "ex01_speculative_loop": [("for n in (16, 64):", "for n in (16,):")],
    "ex03_cached_loop": [("lengths, versus_cache_free, versus_reference = [32, 64, 128], [], []",
                          "lengths, versus_cache_free, versus_reference = [16, 32], [], []")],
    "ex06_prompt_lookup": [("NEW_TOKENS, K = 48, 4", "NEW_TOKENS, K = 12, 4")],
    "ex07_benchmark": [("NEW_TOKENS, KS, TEMPERATURE = 32, (1, 2, 4, 6), 0.7",
                        "NEW_TOKENS, KS, TEMPERATURE = 8, (1, 2), 0.7")],
}


def test_every_smaller_workload_names_an_assignment():
    assert set(SMALLER) <= set(ASSIGNMENTS)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solution_runs_end_to_end_outside_the_autograder(assignment, monkeypatch):
    monkeypatch.delenv("SPECDEC_GRADING", raising=False)
    path = ROOT / "solutions" / assignment / f"{assignment}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    for old, new in SMALLER.get(assignment, []):
        cells = [cell for cell in notebook.cells if old in cell.source]
        assert len(cells) == 1, f"{assignment}: expected one cell with {old!r}, found {len(cells)}"
        cells[0].source = cells[0].source.replace(old, new)
    NotebookClient(notebook, timeout=CELL_TIMEOUT_SECONDS, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))
    assert "skipped under the autograder" not in text and "SPECDEC_GRADING" not in os.environ
    noise = stderr_outputs(notebook)
    assert not noise, f"{assignment} writes to stderr (silence warnings and progress bars): " + "; ".join(noise)
