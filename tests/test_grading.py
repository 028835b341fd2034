"""Real nbgrader over the whole sample class, graded once per session.

Every assignment under ``solutions/`` and every sample under ``autograder/samples`` (found, not
listed here) is graded by ``autograder/grade.py`` in one run, with two extra students per
assignment made on the fly: ``solution`` (the instructor's answers, as a student would hand
them in) and ``untouched_release`` (the release as handed out). The tests then read the
gradebook, the CSVs, the report and the feedback HTML. While working on one assignment,
``SPECDEC_GRADE_ONLY=ex01_speculative_loop`` (comma-separated) grades only those.
"""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "autograder"))
import grade  # noqa: E402  (autograder/grade.py)

pytestmark = pytest.mark.slow  # real nbgrader over the class: minutes (scripts/test.sh -m "not slow" skips it)

SAMPLES = ROOT / "autograder" / "samples"
ASSIGNMENTS = sorted(p.name for p in (ROOT / "solutions").iterdir() if any(p.glob("*.ipynb"))
                     if p.name in os.environ.get("SPECDEC_GRADE_ONLY", p.name).split(","))
GRADED = [a for a in ASSIGNMENTS if (SAMPLES / "expected" / f"{a}.json").exists()]
EX01 = "ex01_speculative_loop"
EXTRA = ("solution", "untouched_release")
# The broken inputs a class hands in (a dead kernel, a loop, invalid JSON, ...) are exercise 1's
# samples: these tests need it graded, and say so when SPECDEC_GRADE_ONLY leaves it out.
needs_ex01 = pytest.mark.skipif(EX01 not in ASSIGNMENTS, reason="checks exercise 1's samples of bad input, "
                                "which SPECDEC_GRADE_ONLY leaves out; the full run checks them")


def notebook(assignment: str, folder: str = "solutions"):
    return nbformat.read(ROOT / folder / assignment / f"{assignment}.ipynb", as_version=4)


def nbgrader_info(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_autograded_test(cell) -> bool:
    """Whether a cell is an autograded test cell (graded, not an answer)."""
    return bool(nbgrader_info(cell).get("grade")) and not nbgrader_info(cell).get("solution")


def autograded_cells(assignment: str) -> dict[str, float]:
    """Points of each autograded test cell of an assignment."""
    return {nbgrader_info(c)["grade_id"]: nbgrader_info(c)["points"] for c in notebook(assignment).cells
            if is_autograded_test(c)}


def solution_as_submitted(assignment: str):
    """The release with the instructor's answers in its answer cells (without the markers)."""
    answers = {nbgrader_info(c)["grade_id"]: re.sub(r"(?m)^[ \t]*### (BEGIN|END) SOLUTION\n?", "", c.source)
               for c in notebook(assignment).cells if nbgrader_info(c).get("solution")}
    release = notebook(assignment, "exercises")
    for cell in release.cells:
        cell.source = answers.get(nbgrader_info(cell).get("grade_id"), cell.source)
    return release


@pytest.fixture(scope="module")
def graded(tmp_path_factory, notebook_workers):
    """Grade every sample of every assignment, plus each assignment's solution and untouched
    release, and one student who edited a locked test cell."""
    submitted = tmp_path_factory.mktemp("class") / "submitted"
    shutil.copytree(SAMPLES, submitted, ignore=shutil.ignore_patterns("expected", "roster.csv"))
    for assignment in ASSIGNMENTS:
        for student, nb in (("solution", solution_as_submitted(assignment)),
                            ("untouched_release", notebook(assignment, "exercises"))):
            (submitted / student / assignment).mkdir(parents=True)
            nbformat.write(nb, submitted / student / assignment / f"{assignment}.ipynb")
    tampered = nbformat.read(submitted / "alt_correct" / EX01 / f"{EX01}.ipynb", as_version=4)
    cell = next(c for c in tampered.cells if nbgrader_info(c).get("grade_id") == "test_accept_greedy_bonus")
    cell.source = "pass  # the test I could not pass"
    (submitted / "edits_tests" / EX01).mkdir(parents=True)
    nbformat.write(tampered, submitted / "edits_tests" / EX01 / f"{EX01}.ipynb")

    work = submitted.parent / "work"
    result = grade.grade(submitted, work, ASSIGNMENTS, roster=SAMPLES / "roster.csv",
                         jobs=notebook_workers)
    scores: dict[str, dict[str, dict[str, float]]] = {}
    for row in result["cells"]:
        scores.setdefault(row["assignment"], {}).setdefault(row["student"], {})[row["grade_id"]] = row["score"]
    return {"work": work, "submitted": submitted, "report": result["report"], "scores": scores,
            "timings": result["timings"]}


def report_of(graded, assignment: str, student: str) -> list[str]:
    """The report's lines for one submission (its heading, then its problems)."""
    lines, mine = graded["report"], []
    for line in lines:
        if not line.startswith(" "):
            current = line.split(":")[0]
        if current == f"{assignment} {student}":
            mine.append(line.strip())
    assert mine, f"no report entry for {student}/{assignment}"
    return mine


def test_grading_time(graded):
    """Not an assertion on speed: the timings are recorded for every graded notebook."""
    timings = graded["timings"]
    print("\n".join(f"{unit}: {wall:.0f} s, {cpu:.0f} s CPU" for unit, (wall, cpu) in sorted(timings.items())))
    assert all(wall > 0 and cpu > 0 for wall, cpu in timings.values())


@pytest.mark.parametrize("assignment", GRADED)
def test_samples_score_as_expected_cell_by_cell(graded, assignment):
    expected = json.loads((SAMPLES / "expected" / f"{assignment}.json").read_text())
    cells = autograded_cells(assignment)
    got = graded["scores"][assignment]
    wrong = []
    for student, want in expected.items():
        assert set(want) == set(cells), f"{assignment}.json: {student} must list every test cell {sorted(cells)}"
        have = {cell: got.get(student, {}).get(cell) for cell in want}
        if have != want:
            wrong.append(f"{student}: expected {want}, got {have}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("assignment", GRADED)
def test_every_sample_has_expected_scores(assignment):
    students = {p.parent.name for p in SAMPLES.glob(f"*/{assignment}") if p.is_dir()}
    expected = set(json.loads((SAMPLES / "expected" / f"{assignment}.json").read_text()))
    assert students == expected, f"samples without expected scores: {students - expected}; " \
                                 f"expected scores without a sample: {expected - students}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solutions_score_full_marks(graded, assignment):
    got = graded["scores"][assignment]["solution"]
    assert {cell: got[cell] for cell in autograded_cells(assignment)} == autograded_cells(assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_untouched_releases_score_zero(graded, assignment):
    got = graded["scores"][assignment]["untouched_release"]
    assert {cell: got[cell] for cell in autograded_cells(assignment)} == dict.fromkeys(autograded_cells(assignment), 0)
    # graded, not dropped: the autograded notebook and feedback exist
    assert (graded["work"] / "feedback" / "untouched_release" / assignment / f"{assignment}.html").exists()


def text_of(html_page: str) -> str:
    """An HTML page's text, as a reader sees it (syntax highlighting splits code into spans)."""
    return html.unescape(re.sub(r"<[^>]+>", "", html_page))


def marked_lines(assignment: str, begin: str, end: str) -> set[str]:
    """Distinctive lines between ``### BEGIN <x>`` and ``### END <x>`` in the source notebook."""
    released = json.dumps(nbformat.writes(notebook(assignment, "exercises")))
    lines, inside = set(), False
    for cell in notebook(assignment).cells:
        for line in cell.source.splitlines():
            if begin in line:
                inside = True
            elif end in line:
                inside = False
            elif inside and len(line.strip()) > 20 and line.strip() not in released:
                lines.add(line.strip())
    return lines


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_feedback_contains_no_hidden_tests_and_no_solutions(graded, assignment):
    hidden = marked_lines(assignment, "BEGIN HIDDEN TESTS", "END HIDDEN TESTS")
    solution = marked_lines(assignment, "BEGIN SOLUTION", "END SOLUTION")
    pages = sorted((graded["work"] / "feedback").glob(f"*/{assignment}/*.html"))
    assert len(pages) >= 3
    for page in pages:
        student = page.parts[-3]
        text = text_of(page.read_text())
        assert "BEGIN HIDDEN TESTS" not in text and "BEGIN SOLUTION" not in text, page
        # a student's own code may equal a line of the solution: only lines they did not write count
        own = "\n".join(c.source for p in (graded["work"] / "submitted" / student / assignment).glob("*.ipynb")
                        for c in nbformat.read(p, as_version=4).cells)
        leaked = [line for line in hidden | solution if line in text and line not in own]
        assert not leaked, f"{student}'s feedback shows {leaked[:3]}"


@needs_ex01
def test_bad_inputs_get_a_clear_line_and_lose_only_their_cells(graded):
    def lines(student):
        return "\n".join(report_of(graded, EX01, student))

    assert "kernel died in test_accept_greedy_prefix: disabled answer accept_greedy and graded again" in lines("crash_kernel")
    assert "test_expected_tokens_per_pass_limits 0/1: timed out: TimeoutError" in lines("infinite_loop")
    assert "invalid notebook ex01_speculative_loop.ipynb" in lines("invalid_json")
    assert "renamed notebook ex01_speculative_loop-Copy1.ipynb: graded as ex01_speculative_loop.ipynb" in lines("renamed_notebook")
    assert "deleted cell test_accept_greedy_bonus: restored from the release" in lines("deleted_cell")
    assert "duplicated cell test_expected_tokens_per_pass_values: the copy was dropped" in lines("duplicated_cell")
    assert "duplicated answer cell accept_greedy: the last copy is graded" in lines("duplicated_cell")
    assert "edited locked cell test_accept_greedy_bonus: restored from the source" in lines("edits_tests")
    # the edit changed nothing: the restored test graded the (correct) answer
    assert graded["scores"][EX01]["edits_tests"] == graded["scores"][EX01]["alt_correct"]


def test_clean_submissions_are_not_flagged_as_tampered(graded):
    """Quiet for honest work: no report line, and no checksum warning in nbgrader's log (which
    it writes for every test cell with hidden tests unless the grader gives it the source)."""
    honest = [(a, s) for a in ASSIGNMENTS for s in EXTRA]
    honest += [(EX01, s) for s in ("alt_correct", "seed_formula", "no_bonus") if EX01 in ASSIGNMENTS]
    for assignment, student in honest:
        assert not [line for line in report_of(graded, assignment, student) if "locked cell" in line], student
        log = (graded["work"] / "logs" / assignment / f"{student}.log").read_text()
        assert "checksum" not in log.lower(), f"{student}/{assignment}: {log[-1500:]}"


def test_unanswered_written_answers_say_so(graded):
    """An untouched written answer scores 0 without a person: 'not answered', not 'partial credit'."""
    for assignment in ASSIGNMENTS:
        written = {nbgrader_info(c)["grade_id"]: nbgrader_info(c)["points"] for c in notebook(assignment).cells
                   if nbgrader_info(c).get("solution") and nbgrader_info(c).get("grade") and c.cell_type == "markdown"}
        lines = report_of(graded, assignment, "untouched_release")
        for gid, points in written.items():
            assert f"{gid} 0/{points:g}: not answered" in lines, lines


@needs_ex01
def test_crashed_kernel_gets_feedback(graded):
    page = graded["work"] / "feedback" / "crash_kernel" / EX01 / f"{EX01}.html"
    assert "disabled by the grader" in text_of(page.read_text())


@needs_ex01
def test_megabytes_of_output_are_truncated(graded):
    autograded = graded["work"] / "autograded" / "prints_megabytes" / EX01 / f"{EX01}.ipynb"
    page = graded["work"] / "feedback" / "prints_megabytes" / EX01 / f"{EX01}.html"
    assert "output truncated by the grader" in autograded.read_text()
    assert autograded.stat().st_size < 500_000 and page.stat().st_size < 2_000_000


@needs_ex01
def test_files_a_submission_writes_stay_out_of_the_course(graded):
    work = graded["work"]
    assert (work / "gradebook.db").read_bytes()[:16] == b"SQLite format 3\x00"
    assert not (work / "autograded" / "writes_files" / EX01 / "results.json").exists()
    assert nbformat.read(work / "autograded" / "writes_files" / EX01 / f"{EX01}.ipynb", as_version=4).cells


def test_grades_csv_has_names_and_cells_csv_adds_up(graded):
    work = graded["work"]
    roster = {row["id"]: row for row in csv.DictReader(open(SAMPLES / "roster.csv"))}
    with open(work / "grades.csv") as f:
        totals = list(csv.DictReader(f))
    for row in totals:
        if row["student_id"] in roster:
            assert row["last_name"] == roster[row["student_id"]]["last_name"]
    assert {r["student_id"] for r in totals} >= set(roster)
    with open(work / "cells.csv") as f:
        cells = list(csv.DictReader(f))
    assert list(cells[0]) == ["student", "assignment", "notebook", "grade_id", "score", "max_score",
                              "needs_manual_grade", "status"]
    for row in totals:
        mine = [c for c in cells if c["student"] == row["student_id"] and c["assignment"] == row["assignment"]]
        if mine:
            assert abs(sum(float(c["score"] or 0) for c in mine) - float(row["raw_score"])) < 1e-6, row


@needs_ex01
def test_regrading_one_student_keeps_the_others(graded, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(graded["work"], work)
    before = {(r["student"], r["assignment"], r["grade_id"]): r["score"] for r in csv.DictReader(open(work / "cells.csv"))}
    result = grade.grade(graded["submitted"], work, [EX01], student="seed_formula", roster=SAMPLES / "roster.csv")
    after = {(r["student"], r["assignment"], r["grade_id"]): r["score"] for r in csv.DictReader(open(work / "cells.csv"))}
    assert after == before
    assert list(json.loads((work / "timings.json").read_text())) == list(json.loads((graded["work"] / "timings.json").read_text()))
    assert any(line.startswith(f"{EX01} seed_formula:") for line in result["report"])


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_committed_exercise_is_a_fresh_release(tmp_path, assignment):
    grade.write_config(tmp_path, None)
    # nbgrader's own API, what `nbgrader generate_assignment` runs, without a process per assignment
    result = grade.open_api(tmp_path).generate_assignment(assignment, force=True, create=True)
    assert result["success"], result.get("log")
    fresh = nbformat.read(tmp_path / "release" / assignment / f"{assignment}.ipynb", as_version=4)
    committed = notebook(assignment, "exercises")
    assert [(c.cell_type, c.source, nbgrader_info(c)) for c in committed.cells] == \
           [(c.cell_type, c.source, nbgrader_info(c)) for c in fresh.cells], \
        f"exercises/{assignment} is stale: cd autograder && nbgrader generate_assignment {assignment} --force"


# Every assignment's solution and release are autograded above (full marks, zero); here
# nbgrader's own validate command, what a student's Validate button runs, on two of them:
# the first and the benchmarking one, whose timed cells skip themselves under the grader.
VALIDATED = [EX01, "ex07_benchmark"]


def test_nbgrader_validate_sources_pass_and_releases_fail():
    """The learner's self-check (``scripts/self_check.sh``, nbgrader's ``validate``): the source
    notebooks pass their own tests, the releases fail them."""
    sources = [str(ROOT / "solutions" / a / f"{a}.ipynb") for a in VALIDATED]
    releases = [str(ROOT / "exercises" / a / f"{a}.ipynb") for a in VALIDATED]
    runs = [subprocess.Popen(["bash", str(ROOT / "scripts" / "self_check.sh"), *args],
                             env={**grade.os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for args in (sources, ["--invert", *releases])]
    outputs = [run.communicate()[0] for run in runs]
    assert outputs[0].count("Success! Your notebook passes all the tests.") == len(sources), outputs[0][-3000:]
    assert outputs[1].count("Success! The notebook does not pass any tests.") == len(releases), outputs[1][-3000:]
