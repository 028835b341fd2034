"""Shared fixtures; they and the helpers they use live in factories.py.

(Test modules import helpers from ``factories``, never from ``conftest``: with
tests/integration having its own conftest.py, that name is ambiguous.)
"""
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from factories import family_pair, tokenizer_a, tokenizer_b  # noqa: F401  (pytest fixtures)

# scripts/test.sh runs the suite as two pytest processes at once on two cores (``--stream main``
# and ``--stream side``), one torch thread per process, then a third alone (``--stream quiet``).
# The split is by measured time (see docs/CONTRIBUTING.md for the latest figures per phase):
# - side: what runs its own processes for long: the vLLM servers' tests, lesson 8 (which starts
#   its own servers), then the class graded by nbgrader and the solutions run as a learner runs
#   them (one notebook at a time while the main stream runs, two once it has ended);
# - main: everything else, lessons first;
# - quiet: the tests marked ``quiet_machine``, which need the other cores idle.
STREAMS = ("main", "side", "quiet")
SIDE_FILES = ("test_grading.py", "test_grading_class.py", "test_learner_path.py")  # in this order (collection order)
ONE_CORE_FIRST = ("test_notebooks.py",)


def pytest_addoption(parser):
    parser.addoption("--stream", choices=STREAMS, help="run only this stream's tests (scripts/test.sh runs "
                     "main and side at once, then quiet); under it, subprocesses get one torch thread")


def pytest_configure(config):
    """Two streams on two cores: every subprocess (lesson kernels, CLIs, servers) gets one torch
    thread, as this process has (factories): two processes running two threads each on two
    cores stall each other (a decode ran 3x slower beside one busy core)."""
    if config.getoption("--stream") in ("main", "side"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


def stream_of(item: pytest.Item) -> str:
    if item.get_closest_marker("quiet_machine"):
        return "quiet"
    path = Path(item.path)
    if "integration" in path.parts or "08_serving_with_vllm" in item.name or path.name in SIDE_FILES:
        return "side"
    return "main"


def pytest_collection_modifyitems(config, items):
    """Under ``--stream``, keep that stream's tests; order the lessons first either way."""
    stream = config.getoption("--stream")
    if stream:
        other = [item for item in items if stream_of(item) != stream]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if stream_of(item) == stream]
    items.sort(key=lambda item: Path(item.path).name not in ONE_CORE_FIRST)  # stable: order kept otherwise


@pytest.fixture(scope="module")
def notebook_workers(request) -> Callable[[], int]:
    """How many notebooks a test may run at once, asked again as they run: one in the main stream
    (the side stream holds the other core); in the side stream one while the main stream runs and
    two from the moment it ends (scripts/test.sh creates the file $SPECDEC_MAIN_STREAM_DONE names
    then), so that each stream has a core of its own: three one-thread processes on two cores ran
    each test 1.5-1.9x slower."""
    stream = request.config.getoption("--stream")
    main_done = os.environ.get("SPECDEC_MAIN_STREAM_DONE")

    def workers() -> int:
        if stream == "main" or (stream == "side" and main_done and not Path(main_done).exists()):
            return 1
        return 2
    return workers


def pytest_terminal_summary(terminalreporter):
    """Print the wall time spent in each test file (setup, call and teardown together)."""
    per_file: dict[str, float] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if hasattr(report, "duration") and hasattr(report, "nodeid"):
                path = report.nodeid.split("::")[0]
                per_file[path] = per_file.get(path, 0.0) + report.duration
    if not per_file:
        return
    terminalreporter.write_sep("=", "time per test file")
    for path, seconds in sorted(per_file.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f} s  {path}")
    terminalreporter.write_line(f"{sum(per_file.values()):8.1f} s  in all")
