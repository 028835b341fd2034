"""Every lesson notebook is committed clean and runs end to end in a real Jupyter kernel,
with no error and nothing on stderr (warnings, progress bars) for a learner to ignore.

``execute_notebooks`` runs several notebooks two at a time, each in its own process with one
torch thread (two kernels with two threads each on two cores stall each other: torch's threads
spin-wait); the learner path uses it for the assignments' solutions.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
# A hung cell fails the lesson after this long instead of stalling the suite (a lesson's whole
# budget is 5 minutes on a 2-core CPU; no single cell should come near it).
CELL_TIMEOUT_SECONDS = 300
# The suite runs the lessons' longest measurements on smaller workloads: each change replaces one
# constant (the test fails if the constant is gone) and keeps every code path of its cell; the
# lessons' sentences are printed from what they measure. With SPECDEC_EXECUTED_LESSONS set (an
# executed copy kept for reading) every lesson runs as a learner runs it. lesson -> (old, new)
SMALLER = {
    "01_why_speculative_decoding": [("NEW_TOKENS = 96 ", "NEW_TOKENS = 32 "), ("N_PROMPTS = 5 ", "N_PROMPTS = 3 "),
                                    ("SMOL_TOKENS, SMOL_PROMPTS = 64, 2", "SMOL_TOKENS, SMOL_PROMPTS = 16, 1"),
                                    ("TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 20", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5"),
                                    ("CONTEXT, ROUNDS = 64, 5", "CONTEXT, ROUNDS = 64, 3")],
    "02_roofline": [("SIZE_ROUNDS, MAX_SIZE_ROUNDS = 5, 20", "SIZE_ROUNDS, MAX_SIZE_ROUNDS = 5, 5")],
    "03_draft_verify_accept": [("NEW_TOKENS = 64 ", "NEW_TOKENS = 48 "),
                               ("TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 20", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5")],
    "04_why_it_is_exact": [("N_PROMPTS, GREEDY_TOKENS, KS = 12, 48,", "N_PROMPTS, GREEDY_TOKENS, KS = 6, 32,"),
                           ("GENERATE_RUNS = 500 ", "GENERATE_RUNS = 250 ")],
    "05_acceptance_k_speedup": [("NEW_TOKENS, N_PROMPTS = 48, 3", "NEW_TOKENS, N_PROMPTS = 24, 2"),
                                ("TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 20", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5")],
    "06_tokenizers_uag": [("NEW_TOKENS, K, N_PROMPTS = 48, 4, 3", "NEW_TOKENS, K, N_PROMPTS = 16, 4, 2"),
                          ("TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 20", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5")],
    "07_prompt_lookup_and_family": [("NEW_TOKENS, K, PER_GROUP = 64, 3, 3", "NEW_TOKENS, K, PER_GROUP = 12, 3, 1"),
                                    ("REAL_TOKENS, REAL_K, PER_KIND = 64, 2, 2",
                                     "REAL_TOKENS, REAL_K, PER_KIND = 12, 2, 1"),
                                    ("TIMING_PAIRS, MAX_TIMING_PAIRS = 6, 12", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5")],
    "08_serving_with_vllm": [("NEW_TOKENS, N_PROMPTS, CONCURRENCY = 64, 6, (1, 2, 4, 8)",
                              "NEW_TOKENS, N_PROMPTS, CONCURRENCY = 16, 3, (1, 2)"),
                             ("TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 20", "TIMING_PAIRS, MAX_TIMING_PAIRS = 5, 5")],
}


def with_smaller_workloads(notebook: nbformat.NotebookNode, changes: list[tuple[str, str]], name: str) -> None:
    """Apply ``changes`` (old text -> new text, each in exactly one cell) to ``notebook`` in place."""
    for old, new in changes:
        cells = [cell for cell in notebook.cells if old in cell.source]
        assert len(cells) == 1, f"{name}: expected one cell with {old!r}, found {len(cells)}"
        cells[0].source = cells[0].source.replace(old, new)

_RUN_ONE = """
import sys, nbformat
from nbclient import NotebookClient
source, folder, executed, timeout = sys.argv[1:5]
notebook = nbformat.read(source, as_version=4)
NotebookClient(notebook, timeout=int(timeout), kernel_name="python3", allow_errors=True,
               resources={"metadata": {"path": folder}}).execute()
nbformat.write(notebook, executed)
"""


def execute_notebooks(jobs: dict[str, tuple[Path, Path]], out: Path, env: dict[str, str] | None = None,
                      workers: Callable[[], int] = lambda: 2) -> dict[str, nbformat.NotebookNode | str]:
    """Execute notebooks ``name -> (file, folder the kernel runs in)``, ``workers()`` at a time
    (asked again before each starts), each in its own process with one torch thread; return each
    executed notebook (errors kept in its cells' outputs), or the runner's stderr when the run
    itself failed (a cell timed out)."""
    env = {**(env or os.environ), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    slots = threading.Condition()
    running = 0

    def run(name: str) -> nbformat.NotebookNode | str:
        nonlocal running
        with slots:
            while not slots.wait_for(lambda: running < workers(), timeout=5):
                pass
            running += 1
        try:
            source, folder = jobs[name]
            executed = out / f"{name}.executed.ipynb"
            done = subprocess.run([sys.executable, "-c", _RUN_ONE, str(source), str(folder), str(executed),
                                   str(CELL_TIMEOUT_SECONDS)], env=env, capture_output=True, text=True)
        finally:
            with slots:
                running -= 1
                slots.notify_all()
        if done.returncode != 0:
            return done.stderr[-4000:]
        return nbformat.read(executed, as_version=4)

    with ThreadPoolExecutor(max_workers=len(jobs) or 1) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


def errors_of(notebook: nbformat.NotebookNode) -> list[str]:
    """One entry per cell that raised: its index, the error and the traceback's last lines."""
    return [f"cell {i}: {out['ename']}: {out['evalue']}\n" + "\n".join(out.get("traceback", [])[-3:])
            for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"
            for out in cell.get("outputs", []) if out.get("output_type") == "error"]


def test_there_are_lessons():
    assert NOTEBOOKS
    assert set(SMALLER) <= {path.stem for path in NOTEBOOKS}


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


def test_the_runner_reports_errors_and_stderr(tmp_path):
    """The parallel runner keeps what the checks read: an error and stderr are found, by cell."""
    cells = [nbformat.v4.new_code_cell("import sys; sys.stderr.write('careful')"), nbformat.v4.new_code_cell("1 / 0")]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), tmp_path / "bad.ipynb")
    executed = execute_notebooks({"bad": (tmp_path / "bad.ipynb", tmp_path)}, tmp_path)["bad"]
    assert errors_of(executed)[0].startswith("cell 1: ZeroDivisionError")
    assert stderr_outputs(executed) == ["cell 0: 'careful'"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_lesson_executes(path):
    # One lesson at a time, in this process's kernel manager: lessons time things, and several
    # run real models for minutes; two at a time on two cores pushed a cell past its timeout.
    # (scripts/test.sh runs its other stream beside them, with one torch thread per process.)
    notebook = nbformat.read(path, as_version=4)
    if not os.environ.get("SPECDEC_EXECUTED_LESSONS"):
        with_smaller_workloads(notebook, SMALLER.get(path.stem, []), path.name)
    # Raises CellExecutionError, with the cell and its traceback, if any cell fails.
    NotebookClient(notebook, timeout=CELL_TIMEOUT_SECONDS, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    if os.environ.get("SPECDEC_EXECUTED_LESSONS"):  # keep the executed copy for reading
        nbformat.write(notebook, Path(os.environ["SPECDEC_EXECUTED_LESSONS"]) / path.name)
    noise = stderr_outputs(notebook)
    assert not noise, f"{path.name} writes to stderr (silence warnings and progress bars): " + "; ".join(noise)
    text = "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []))
    # Lessons that compare with the baseline must show the outputs agree.
    assert "identical to the baseline: False" not in text
