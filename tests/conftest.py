"""Shared fixtures; they and the helpers they use live in factories.py.

(Test modules import helpers from ``factories``, never from ``conftest``: with
tests/integration having its own conftest.py, that name is ambiguous.)
"""
import os
from pathlib import Path

import pytest
from factories import family_pair, tokenizer_a, tokenizer_b  # noqa: F401  (pytest fixtures)

# Tests that run vLLM servers (and lesson 8, which starts its own) hold about one core for ten
# minutes. scripts/test.sh runs them as a second pytest (``--stream vllm``) beside the rest
# (``--stream main``), whose lessons run first so that they are what overlaps the servers.
STREAMS = ("main", "vllm")
ONE_CORE_FIRST = ("test_notebooks.py",)


def pytest_addoption(parser):
    parser.addoption("--stream", choices=STREAMS, help="run only this stream's tests (scripts/test.sh runs "
                     "both at once); under it, subprocesses get one torch thread")


def pytest_configure(config):
    """Two streams on two cores: every subprocess (lesson kernels, CLIs, servers) gets one torch
    thread, as this process has (factories): two processes running two threads each on two
    cores stall each other (a decode ran 3x slower beside one busy core)."""
    if config.getoption("--stream"):
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


def stream_of(item: pytest.Item) -> str:
    in_vllm = "integration" in Path(item.path).parts or "08_serving_with_vllm" in item.name
    return "vllm" if in_vllm else "main"


def pytest_collection_modifyitems(config, items):
    """Under ``--stream``, keep that stream's tests; order the lessons first either way."""
    stream = config.getoption("--stream")
    if stream:
        other = [item for item in items if stream_of(item) != stream]
        if other:
            config.hook.pytest_deselected(items=other)
            items[:] = [item for item in items if stream_of(item) == stream]
    items.sort(key=lambda item: Path(item.path).name not in ONE_CORE_FIRST)  # stable: order kept otherwise


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
