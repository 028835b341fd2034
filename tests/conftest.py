"""Shared fixtures; they and the helpers they use live in factories.py.

(Test modules import helpers from ``factories``, never from ``conftest``: with
tests/integration having its own conftest.py, that name is ambiguous.)
"""
from factories import family_pair, tokenizer_a, tokenizer_b  # noqa: F401  (pytest fixtures)


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
