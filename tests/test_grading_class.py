"""One class graded the way INSTRUCTORS.md tells an instructor to, through nbgrader's exchange.

Three students take exercise 2 (the quickest to grade, with a written answer): ``ada``
answers everything on time, ``cy`` answers everything but late and renamed the notebook,
``dee`` hands in the instructor's own notebook. (An untouched release, and every broken input,
are graded in test_grading.py.) The
instructor releases through the exchange, each student fetches and submits with the course's
student-side config, the instructor collects, grades with a late penalty of zero, grades the
written answers by hand through nbgrader's gradebook API, runs ``grade.py --export-only``,
releases feedback, and regrades one student. The late penalty is checked after every step.
"""
from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat
import pytest
from nbgrader.api import Gradebook

from test_grading import ROOT, grade, nbgrader_info, notebook, solution_as_submitted, text_of

pytestmark = pytest.mark.slow

EX = "ex02_roofline"
WRITTEN = "written_roofline_gap"
NBGRADER = str(Path(sys.executable).parent / "nbgrader")


def run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    result = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def student_env(base: dict[str, str], home: Path) -> dict[str, str]:
    """A student's shell: their own home, with the course's student-side config installed
    where INSTRUCTORS.md says (~/.jupyter/nbgrader_config.py)."""
    (home / ".jupyter").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ROOT / "autograder" / "exchange_config.py", home / ".jupyter" / "nbgrader_config.py")
    return {**base, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter")}


def answered(nb, written: str):
    """``nb`` with every code answer from the solutions and the written answer in the student's words."""
    answers = {nbgrader_info(c)["grade_id"]: c.source for c in solution_as_submitted(EX).cells
               if nbgrader_info(c).get("solution")}
    for cell in nb.cells:
        gid = nbgrader_info(cell).get("grade_id")
        if gid == WRITTEN:
            cell.source = written
        elif gid in answers:
            cell.source = answers[gid]
    return nb


def grades_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as f:
        return {row["student_id"]: row for row in csv.DictReader(f) if row["assignment"] == EX}


def cells_csv(work: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(work / "cells.csv") as f:
        return {(row["student"], row["grade_id"]): row for row in csv.DictReader(f) if row["assignment"] == EX}


def report_lines(work: Path, student: str) -> str:
    lines, mine, current = (work / "report.txt").read_text().splitlines(), [], None
    for line in lines:
        if not line.startswith(" "):
            current = line.split(":")[0]
        if current == f"{EX} {student}":
            mine.append(line.strip())
    return "\n".join(mine)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    top = tmp_path_factory.mktemp("class_of_three")
    exchange, course_root, work = top / "exchange", top / "course", top / "work"
    exchange.mkdir()
    course_root.mkdir()  # collect keeps its own gradebook there, as it does in autograder/
    exchange.chmod(0o777)
    base = {**os.environ, **grade.grading_env(), "SPECDEC_EXCHANGE_ROOT": str(exchange)}
    autograder = ROOT / "autograder"
    # the instructor's commands run in autograder/; where collect writes is moved out of the repository
    elsewhere = f"--CourseDirectory.root={course_root}"
    run([NBGRADER, "release_assignment", EX, elsewhere], autograder, base)

    homes = {s: top / "home" / s for s in ("ada", "cy", "dee")}
    envs = {s: student_env(base, home) for s, home in homes.items()}

    def fetch_and_submit(student: str, edit) -> None:
        run([NBGRADER, "fetch_assignment", EX], homes[student], envs[student])
        edit(homes[student] / EX)
        run([NBGRADER, "submit", EX, f"--student={student}"], homes[student], envs[student])

    def answer(folder: Path, text: str) -> None:
        path = folder / f"{EX}.ipynb"
        nbformat.write(answered(nbformat.read(path, as_version=4), text), path)

    fetch_and_submit("ada", lambda folder: answer(folder, "The measured step is slower than the roofline because ..."))

    def hand_in_instructor_notebook(folder: Path) -> None:
        shutil.copyfile(ROOT / "solutions" / EX / f"{EX}.ipynb", folder / f"{EX}.ipynb")

    fetch_and_submit("dee", hand_in_instructor_notebook)
    due = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
    time.sleep(1.5)

    def answer_late_and_rename(folder: Path) -> None:
        answer(folder, "My answer, handed in late.")
        (folder / f"{EX}.ipynb").rename(folder / f"{EX}-Copy1.ipynb")

    fetch_and_submit("cy", answer_late_and_rename)

    run([NBGRADER, "collect", EX, elsewhere], autograder, base)
    roster = top / "roster.csv"
    roster.write_text("id,first_name,last_name,email\n" + "".join(
        f"{s},{s.title()},Student,{s}@example.edu\n" for s in homes))
    graded = run([sys.executable, str(autograder / "grade.py"), str(course_root / "submitted"), "--work", str(work),
                  "--roster", str(roster), "--due", f"{EX}={due}", "--late-penalty", "zero"], ROOT, base)
    return {"top": top, "work": work, "submitted": course_root / "submitted", "base": base, "homes": homes,
            "envs": envs, "graded": graded, "stages": {"graded": snapshot(work)}}


def snapshot(work: Path) -> dict:
    """What the instructor has in hand after a step: totals, cells, report, feedback pages."""
    return {"grades": grades_csv(work / "grades.csv"), "cells": cells_csv(work), "report": (work / "report.txt").read_text(),
            "feedback": {p.relative_to(work / "feedback").as_posix(): text_of(p.read_text())
                         for p in (work / "feedback").glob(f"*/{EX}/*.html")}}


def hand_grade(work: Path, student: str, points: float) -> None:
    """What formgrader does when a person grades a written answer (its grade API's PUT)."""
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}", course_id="specdec") as gb:
        written = gb.find_grade(WRITTEN, EX, EX, student)
        written.manual_score, written.needs_manual_grade = points, False
        gb.db.commit()


@pytest.fixture(scope="module")
def after_hand_grading(course):
    work, base = course["work"], course["base"]
    hand_grade(work, "ada", 2)
    hand_grade(work, "cy", 3)
    run([sys.executable, str(ROOT / "autograder" / "grade.py"), str(course["submitted"]), "--export-only",
         "--work", str(work)], ROOT, base)
    course["stages"]["exported"] = snapshot(work)
    run([NBGRADER, "release_feedback", EX], work, base)
    for student in course["homes"]:
        run([NBGRADER, "fetch_feedback", EX, f"--student={student}"], course["homes"][student], course["envs"][student])
    return course


def test_autograding_gives_every_student_their_automatic_points(course):
    cells = course["stages"]["graded"]["cells"]
    automatic = {nbgrader_info(c)["grade_id"]: nbgrader_info(c)["points"] for c in notebook(EX).cells
                 if nbgrader_info(c).get("grade") and not nbgrader_info(c).get("solution")}
    for student in ("ada", "cy", "dee"):
        assert {gid: float(cells[(student, gid)]["score"]) for gid in automatic} == automatic, student


def test_the_late_penalty_is_right_at_every_step(after_hand_grading, tmp_path):
    course = after_hand_grading
    automatic = sum(float(row["score"]) for (s, gid), row in course["stages"]["graded"]["cells"].items()
                    if s == "cy" and gid != WRITTEN)
    for stage, raw in (("graded", automatic), ("exported", automatic + 3)):
        cy = course["stages"][stage]["grades"]["cy"]
        assert float(cy["raw_score"]) == raw and float(cy["late_submission_penalty"]) == raw, (stage, cy)
        assert float(cy["score"]) == 0, stage
        assert float(course["stages"][stage]["grades"]["ada"]["late_submission_penalty"] or 0) == 0, stage
    assert re.search(r"late by \d+ s: penalty \d+, score after it 0$", report_lines(course["work"], "cy"), re.M)
    # a plain `nbgrader export`, after one more hand grade, follows it too
    hand_grade(course["work"], "cy", 1)
    run([NBGRADER, "export", f"--to={tmp_path / 'plain.csv'}"], course["work"], course["base"])
    cy = grades_csv(tmp_path / "plain.csv")["cy"]
    assert float(cy["raw_score"]) == automatic + 1 and float(cy["score"]) == 0, cy
    hand_grade(course["work"], "cy", 3)


def test_ungraded_written_answers_are_labelled_awaiting_not_zero(after_hand_grading):
    graded, exported = after_hand_grading["stages"]["graded"], after_hand_grading["stages"]["exported"]
    assert graded["cells"][("ada", WRITTEN)]["status"] == "awaiting manual grading"
    assert re.search(rf"^{EX} ada: \d+/\d+ \(3 points awaiting manual grading\)", graded["report"], re.M)
    page = graded["feedback"][f"ada/{EX}/{EX}.html"]
    assert "awaiting manual grading" in page and "Score: 0.0 / 3.0" not in page
    # after hand grading: ada's and cy's are graded, dee's still waits
    assert exported["cells"][("ada", WRITTEN)]["status"] == "hand-graded"
    assert float(exported["cells"][("ada", WRITTEN)]["score"]) == 2
    assert "awaiting" not in exported["feedback"][f"ada/{EX}/{EX}.html"]
    assert "Score: 2.0 / 3.0" in exported["feedback"][f"ada/{EX}/{EX}.html"]
    assert exported["cells"][("dee", WRITTEN)]["status"] == "awaiting manual grading"
    assert f"{WRITTEN}: awaiting manual grading (3 points)" in exported["report"]


def test_cells_csv_and_report_follow_the_hand_grades(after_hand_grading):
    exported = after_hand_grading["stages"]["exported"]
    for student, row in exported["grades"].items():
        mine = [float(c["score"] or 0) for (s, _), c in exported["cells"].items() if s == student]
        assert abs(sum(mine) - float(row["raw_score"])) < 1e-9, student
    assert re.search(rf"^{EX} ada: {float(exported['grades']['ada']['raw_score']):g}/", exported["report"], re.M)


def test_students_fetch_their_feedback_through_the_exchange_even_renamed(after_hand_grading):
    homes = after_hand_grading["homes"]
    for student, name in (("ada", EX), ("dee", EX), ("cy", f"{EX}-Copy1")):
        pages = list((homes[student] / EX / "feedback").glob(f"*/{name}.html"))
        assert len(pages) == 1, f"{student} fetched no feedback for {name}.ipynb"
    page = text_of(next((homes["cy"] / EX / "feedback").glob("*/*.html")).read_text())
    assert "Late submission penalty" in page
    assert "feedback under both names" in report_lines(after_hand_grading["work"], "cy")


def test_honest_work_raises_no_tampering_report(course):
    work = course["work"]
    for student in ("ada", "cy", "dee"):
        assert "locked cell" not in report_lines(work, student), student
        assert "checksum" not in (work / "logs" / EX / f"{student}.log").read_text().lower(), student


def test_a_regrade_keeps_the_hand_grade_and_the_penalty(after_hand_grading):
    course = after_hand_grading
    work = course["work"]
    run([sys.executable, str(ROOT / "autograder" / "grade.py"), str(course["submitted"]), "--student", "ada",
         "--work", str(work)], ROOT, course["base"])
    regraded = snapshot(work)
    assert float(regraded["cells"][("ada", WRITTEN)]["score"]) == 2
    assert regraded["cells"][("ada", WRITTEN)]["status"] == "hand grade kept (the regrade flags it for review)"
    assert "hand grade kept" in report_lines(work, "ada")
    assert regraded["grades"]["ada"]["raw_score"] == course["stages"]["exported"]["grades"]["ada"]["raw_score"]
    assert float(regraded["grades"]["cy"]["score"]) == 0 and float(regraded["grades"]["cy"]["raw_score"]) > 0
