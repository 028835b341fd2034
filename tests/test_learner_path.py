"""Each assignment as a learner runs it: the solution notebook in a real kernel, outside the
autograder, so the benchmark and exploration cells that skip themselves under grading run too.
The grading tests never reach those cells. The autograded test cells are left out here: the
class's grading (tests/test_grading.py) runs every one of them, hidden tests included, on the
solution as handed in.

The long benchmarks run on smaller workloads here: each change below replaces one constant
(the test fails if the constant is gone) and keeps every code path of the cell.
"""
from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

from test_grading import is_autograded_test
from test_notebooks import errors_of, execute_notebooks, stderr_outputs, with_smaller_workloads

ROOT = Path(__file__).resolve().parents[1]
ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir() if any(p.glob("*.ipynb")))

# assignment -> (text in a cell, what it becomes here)
SMALLER = {
    "ex01_speculative_loop": [("for n in (16, 64):", "for n in (16,):")],
    "ex03_cached_loop": [("lengths, versus_cache_free, versus_reference = [32, 64, 128], [], []",
                          "lengths, versus_cache_free, versus_reference = [16, 32], [], []")],
    "ex06_prompt_lookup": [("NEW_TOKENS, K = 48, 4", "NEW_TOKENS, K = 12, 4")],
    "ex07_benchmark": [("NEW_TOKENS, KS, TEMPERATURE = 32, (1, 2, 4, 6), 0.7",
                        "NEW_TOKENS, KS, TEMPERATURE = 8, (1, 2), 0.7")],
    "ex09_feature_drafting": [("PER_KIND, NEW_TOKENS, K, REPEATS = 1, 24, 2, 2",
                               "PER_KIND, NEW_TOKENS, K, REPEATS = 1, 6, 2, 1")],
}


def test_every_smaller_workload_names_an_assignment():
    assert set(SMALLER) <= set(ASSIGNMENTS)


@pytest.fixture(scope="module")
def executed_solutions(tmp_path_factory, notebook_workers) -> dict:
    """Every solution but its autograded tests, with its smaller workloads, executed outside the
    grader (two at a time when this pytest has both cores: see notebook_workers)."""
    out = tmp_path_factory.mktemp("learner_path")
    jobs = {}
    for assignment in ASSIGNMENTS:
        path = ROOT / "solutions" / assignment / f"{assignment}.ipynb"
        notebook = nbformat.read(path, as_version=4)
        with_smaller_workloads(notebook, SMALLER.get(assignment, []), assignment)
        notebook.cells = [cell for cell in notebook.cells if not is_autograded_test(cell)]
        nbformat.write(notebook, out / f"{assignment}.ipynb")
        jobs[assignment] = (out / f"{assignment}.ipynb", path.parent)  # the kernel runs in the solution's folder
    env = {k: v for k, v in os.environ.items() if k != "SPECDEC_GRADING"}
    return execute_notebooks(jobs, out, env, workers=notebook_workers)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_the_solution_runs_end_to_end_outside_the_autograder(assignment, executed_solutions):
    notebook = executed_solutions[assignment]
    assert not isinstance(notebook, str), f"{assignment} did not run to the end:\n{notebook}"
    errors = errors_of(notebook)
    assert not errors, f"{assignment} raised:\n" + "\n".join(errors)
    text = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))
    assert "skipped under the autograder" not in text
    noise = stderr_outputs(notebook)
    assert not noise, f"{assignment} writes to stderr (silence warnings and progress bars): " + "; ".join(noise)
