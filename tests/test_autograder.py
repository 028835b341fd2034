"""Real nbgrader: the released exercise matches the solutions, and a class is graded end to end
(sqlite gradebook, hidden tests, a crashing and a looping submission, feedback without answers)."""
from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "autograder"))
import grade  # noqa: E402  (autograder/grade.py)

ASSIGNMENT = "ex01_speculative_loop"


def sources(path: Path) -> list[tuple[str, str]]:
    notebook = nbformat.read(path, as_version=4)
    return [(cell.cell_type, cell.source) for cell in notebook.cells]


def test_committed_exercise_is_the_release_of_the_solution(tmp_path):
    result = grade.nbgrader(tmp_path, "generate_assignment", ASSIGNMENT, "--force")
    assert result.returncode == 0, result.stderr
    fresh = tmp_path / "release" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    committed = ROOT / "exercises" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert sources(fresh) == sources(committed), "exercises/ is stale: rerun nbgrader generate_assignment"
    text = committed.read_text()
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text
    assert "raise NotImplementedError()" in text


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    work = tmp_path_factory.mktemp("grading")
    rows = grade.grade(ROOT / "autograder" / "samples", ASSIGNMENT, work, timeout=60)
    return work, {row["student_id"]: row for row in rows}


def test_every_student_is_graded(graded):
    _, rows = graded
    assert sorted(rows) == ["alice", "bob", "carol", "dave"]
    assert all(float(row["max_score"]) == 9 for row in rows.values())


def test_scores_follow_the_hidden_tests(graded):
    _, rows = graded
    assert float(rows["alice"]["score"]) == 9  # everything right
    assert float(rows["bob"]["score"]) == 3  # 1 + a*k fails; the rule right; part 3 not done


def test_a_looping_submission_is_interrupted_and_the_rest_graded(graded):
    work, rows = graded
    assert float(rows["dave"]["score"]) == 7  # part 1 timed out; parts 2 and 3 right
    feedback = (work / "feedback" / "dave" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert "CellTimeoutError" in feedback or "KeyboardInterrupt" in feedback


def test_a_crashing_kernel_costs_only_its_own_student(graded):
    _, rows = graded
    assert float(rows["carol"]["score"]) < 9
    # ...and the students graded after her still got their marks (checked above).


def test_feedback_does_not_reveal_hidden_tests(graded):
    work, _ = graded
    for student in ("alice", "bob", "dave"):
        html = (work / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
        assert "hidden tests: run by the grader" in html
        assert "BEGIN HIDDEN TESTS" not in html and "roofline.expected_tokens_per_pass(a, k)" not in html
    # The autograded notebooks, for the instructor, do contain them.
    autograded = work / "autograded" / "alice" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    assert "BEGIN HIDDEN TESTS" in autograded.read_text()


def test_gradebook_is_sqlite(graded):
    work, _ = graded
    assert (work / "gradebook.db").read_bytes()[:16] == b"SQLite format 3\x00"
