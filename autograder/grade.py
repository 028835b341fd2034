"""Grade a class with nbgrader: every assignment, every student, one command.

    .venv/bin/python autograder/grade.py SUBMITTED [--assignment A] [--student S] [--work DIR]
                                         [--roster CSV] [--due A=DATE] [--late-penalty zero]
                                         [--timeout S] [--jobs N]
    .venv/bin/python autograder/grade.py SUBMITTED --export-only [--work DIR]

SUBMITTED holds ``<student>/<assignment>/<notebook>.ipynb`` (what ``nbgrader collect`` or
``zip_collect`` produce). Every assignment of ``solutions/`` that has submissions is graded
(or those named with ``--assignment``), by real ``nbgrader autograde`` with its sqlite
gradebook, hidden tests included. Everything lands in the work folder (default
``autograder/work``), which is an nbgrader course folder:

    gradebook.db      the gradebook (students, scores, manual grades; kept between runs)
    grades.csv        totals per student and assignment, with names (``nbgrader export``)
    cells.csv         one row per graded cell: what each student lost where
    report.txt        each submission's problems, also printed
    feedback/         HTML per student, without hidden tests or solutions
    autograded/       the executed notebooks, for the instructor

Before nbgrader sees a submission it is checked against the release: a renamed notebook is
graded under its right name, deleted locked cells come back, duplicated ones are dropped,
invalid JSON scores 0. After autograding, a submission whose kernel died (``os._exit``, a
segfault) has the answer that killed it disabled and is graded again, so its other answers
keep their points. Each of these is a line in the report. ``--student`` regrades one student
and keeps everyone else's grades.

After hand grading (formgrader writes into the same gradebook), ``--export-only`` runs no
notebook: it recomputes the late penalties from the scores as they now are and writes the
CSVs, the report and the feedback again. Cells no person has graded yet say "awaiting manual
grading" in the report and the feedback, never a score of 0.
"""
from __future__ import annotations

import argparse
import ast
import atexit
import copy
import csv
import json
import multiprocessing
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import nbformat

import warm_kernels  # autograder/warm_kernels.py

HERE = Path(__file__).resolve().parent
SOLUTIONS = HERE.parent / "solutions"
CONFIG = HERE / "nbgrader_config.py"


# --- the course folder ------------------------------------------------------------------------

def write_config(work: Path, timeout: int | None, late_penalty: str | None = None) -> None:
    """The work folder's nbgrader_config.py: the course's config, with everything written
    (release, submitted, autograded, feedback, gradebook) moved into the work folder.
    Without ``late_penalty`` the folder keeps the rule it has (``none`` for a new one)."""
    if late_penalty is None:
        earlier = work / "nbgrader_config.py"
        found = re.search(r"penalty_method = '(\w+)'", earlier.read_text()) if earlier.exists() else None
        late_penalty = found.group(1) if found else "none"
    lines = ["c = get_config()", f"load_subconfig({str(CONFIG)!r})",
             f"c.CourseDirectory.root = {str(work)!r}",
             f"c.CourseDirectory.release_directory = {str(work / 'release')!r}",
             # parallel autograders share the gradebook: wait for sqlite's lock instead of failing
             f"c.CourseDirectory.db_url = {'sqlite:///' + str(work / 'gradebook.db') + '?timeout=120'!r}",
             f"c.GradingExecute.progress_dir = {str(work / 'progress')!r}",
             # nbgrader's built-in rules for a submission after its due date: no penalty, or score 0
             f"c.LateSubmissionPlugin.penalty_method = {late_penalty!r}"]
    if timeout:
        lines.append(f"c.Execute.timeout = {timeout}")
    work.mkdir(parents=True, exist_ok=True)
    (work / "nbgrader_config.py").write_text("\n".join(lines) + "\n")


def grading_env() -> dict[str, str]:
    """Environment of nbgrader and the kernels it starts."""
    env_bin = str(Path(sys.executable).parent)  # nbgrader runs alembic as a subprocess
    return {"SPECDEC_GRADING": "1",  # ungraded benchmark cells skip themselves
            # One thread per kernel: kernels run side by side, and torch's threads spin-wait for
            # each other, so on a busy machine two threads ran the course's model 10x slower.
            "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
            "PATH": env_bin + os.pathsep + os.environ.get("PATH", ""),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def nbgrader(work: Path, *args: str) -> subprocess.CompletedProcess:
    """Run one nbgrader command in the work course folder."""
    exe = Path(sys.executable).parent / "nbgrader"
    return subprocess.run([str(exe), *args], cwd=work, env={**os.environ, **grading_env()},
                          capture_output=True, text=True)


def open_api(work: Path):
    """nbgrader's Python API on the work course folder (what the nbgrader commands run)."""
    warnings.filterwarnings("ignore", module="nbgrader")  # SQLAlchemy's, about nbgrader's sessions
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader
    config = PyFileConfigLoader("nbgrader_config.py", path=str(work)).load_config()
    return NbGraderAPI(config=config)


def gradebook(work: Path):
    from nbgrader.api import Gradebook
    return Gradebook(f"sqlite:///{work / 'gradebook.db'}", course_id="specdec")


# --- what was submitted -----------------------------------------------------------------------

def find_assignments(submitted: Path, named: list[str] | None) -> list[str]:
    known = sorted(p.name for p in SOLUTIONS.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
    for name in named or []:
        if name not in known:
            raise SystemExit(f"error: no assignment {name!r} in {SOLUTIONS} (there are: {', '.join(known)})")
    handed_in = {p.name for p in submitted.glob("*/*") if p.is_dir()}
    return [a for a in (named or known) if a in handed_in]


def find_students(submitted: Path, assignment: str, student: str | None) -> list[str]:
    students = sorted(p.parent.name for p in submitted.glob(f"*/{assignment}") if p.is_dir())
    return [s for s in students if student in (None, s)]


def read_roster(path: Path | None) -> dict[str, dict[str, str]]:
    """``id,first_name,last_name,email`` rows (nbgrader's ``db student import`` format)."""
    if path is None or not path.exists():
        return {}
    with open(path, newline="") as f:
        return {row["id"]: {k: row.get(k) or None for k in ("first_name", "last_name", "email")}
                for row in csv.DictReader(f)}


# --- repairs before nbgrader sees a submission -----------------------------------------------

def grade_id(cell) -> str | None:
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def repair_cells(nb, release, source) -> list[str]:
    """Put the release's locked cells back where a student deleted them, drop duplicated locked
    cells, and report locked cells whose text was edited (nbgrader restores those itself).

    A locked cell that reads as released (or as in the instructor's ``source``, for a student
    who handed in that notebook) is given the source's text, hidden tests included: it is what
    nbgrader runs anyway, and nbgrader then has no checksum change to warn about. Only real
    edits are reported."""
    problems = []
    released = {grade_id(c): c for c in release.cells if grade_id(c)}
    sources = {grade_id(c): c for c in source.cells if grade_id(c)}
    seen: set[str] = set()
    kept = []
    for cell in nb.cells:
        gid = grade_id(cell)
        if "nbgrader" in cell.get("metadata", {}) and not gid:
            del cell.metadata["nbgrader"]  # a half-copied cell: nbgrader's add_missing_cells crashes on it
        if gid in released and gid in seen:
            if released[gid].metadata.nbgrader.get("locked"):
                problems.append(f"duplicated cell {gid}: the copy was dropped")
                continue
            problems.append(f"duplicated answer cell {gid}: the last copy is graded")
            earlier = next(c for c in kept if grade_id(c) == gid)
            del earlier.metadata["nbgrader"]  # still runs, as the student ran it, but is not the answer
        seen.add(gid)
        kept.append(cell)
    nb.cells = kept

    order = [grade_id(c) for c in release.cells if grade_id(c)]
    for i, gid in enumerate(order):
        if gid in seen:
            continue
        original = released[gid]
        what = "answer cell" if original.metadata.nbgrader.get("solution") else "cell"
        problems.append(f"deleted {what} {gid}: restored from the release"
                        + (" (its answer is lost)" if what == "answer cell" else ""))
        previous = [j for j, c in enumerate(nb.cells) if grade_id(c) in order[:i]]
        nb.cells.insert(previous[-1] + 1 if previous else 0, copy.deepcopy(original))
        seen.add(gid)

    for cell in nb.cells:
        gid = grade_id(cell)
        original = released.get(gid)
        if original is None or not original.metadata.nbgrader.get("locked"):
            continue
        honest = cell.cell_type == original.cell_type and \
            cell.metadata.nbgrader.get("points") == original.metadata.nbgrader.get("points") and \
            cell.source in (original.source, sources[gid].source if gid in sources else original.source)
        if honest:
            cell.source = sources[gid].source if gid in sources else original.source
        else:
            problems.append(f"edited locked cell {gid}: restored from the source")
    return problems


def unique_cell_ids(nb) -> None:
    """Give cells copied by an old tool (same id twice) fresh ids, as Jupyter itself does."""
    seen = set()
    for i, cell in enumerate(nb.cells):
        if "id" in cell and cell.id in seen:
            cell.id = f"{cell.id}-copy{i}"
        seen.add(cell.get("id"))


def prepare(submission: Path, release: Path, dest: Path) -> tuple[list[str], dict[str, str]]:
    """Copy one student's assignment folder into the course's submitted/, repairing its
    notebooks against the release; return the problems found and the renamed notebooks
    (the release's notebook name -> the student's, without ``.ipynb``)."""
    problems, renamed = [], {}
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(submission, dest, ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints"))
    expected = sorted(release.glob("*.ipynb"))
    handed_in = sorted(p for p in submission.glob("*.ipynb"))
    unclaimed = [p for p in handed_in if p.name not in {e.name for e in expected}]
    for release_nb in expected:
        path = submission / release_nb.name
        if not path.exists():
            if len(expected) == 1 and len(unclaimed) == 1:
                path = unclaimed.pop()
                renamed[release_nb.stem] = path.stem
                problems.append(f"renamed notebook {path.name}: graded as {release_nb.name}, "
                                f"feedback under both names")
            else:
                problems.append(f"missing notebook {release_nb.name}: scored 0"
                                + (f" (found {', '.join(p.name for p in unclaimed)})" if unclaimed else ""))
                continue
        try:
            nb = nbformat.read(path, as_version=4)
            unique_cell_ids(nb)
            nbformat.validate(nb)
        except Exception as error:  # not JSON, or not a notebook
            problems.append(f"invalid notebook {path.name} ({type(error).__name__}: "
                            f"{str(error).splitlines()[0][:100]}): scored 0")
            continue
        source = SOLUTIONS / release.name / release_nb.name
        problems += repair_cells(nb, nbformat.read(release_nb, as_version=4),
                                 nbformat.read(source if source.exists() else release_nb, as_version=4))
        nbformat.write(nb, dest / release_nb.name)
    return problems, renamed


# --- autograding ------------------------------------------------------------------------------

_api = None
_warm_kernels = None  # this worker's kernel server (warm_kernels.start_server)


def _start_worker(work: str) -> None:
    global _api, _warm_kernels
    os.environ.update(grading_env())
    os.chdir(work)
    # nbgrader's SQLAlchemy warnings and the kernels' own stderr go to a log, not the console
    warnings.filterwarnings("ignore", module="nbgrader")
    (Path(work) / "logs").mkdir(exist_ok=True)
    os.dup2(os.open(Path(work) / "logs" / "stderr.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND), 2)
    if warm_kernels.available():  # kernels forked with torch imported: about 5 s less CPU each
        folder = Path(tempfile.mkdtemp(prefix="specdec-kernels-"))
        _warm_kernels = warm_kernels.start_server(folder)
        atexit.register(warm_kernels.stop_server, _warm_kernels, folder)
    _api = open_api(Path(work))


def cpu_seconds() -> float:
    """CPU time of this process and its finished children (the kernels): unlike the wall
    clock, it does not grow when the machine is busy."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    kernels = warm_kernels.kernel_cpu_seconds(_warm_kernels) if _warm_kernels else 0.0
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + kernels


def autograde(unit: tuple[str, str]) -> tuple[str, str, list[float], bool, str]:
    """Autograde one student's assignment (in a worker process); return its [wall, CPU]
    seconds and nbgrader's log."""
    assignment, student = unit
    wall, cpu = time.perf_counter(), cpu_seconds()
    result = _api.autograde(assignment, student, force=True, create=True)
    took = [time.perf_counter() - wall, cpu_seconds() - cpu]
    return assignment, student, took, result["success"], result.get("log", "")


KILLED = ("# The grader disabled this answer: running it killed the Python kernel (os._exit, a\n"
          "# segfault or running out of memory), which would cost every other answer its points.\n")


def disable_answer(cell) -> None:
    """Replace an answer cell's code by functions (of the same names) that raise a clear error."""
    message = "disabled by the grader: this answer killed the Python kernel"
    try:
        names = [n.name for n in ast.parse(cell.source).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    except SyntaxError:
        names = []
    stubs = [f"def {name}(*args, **kwargs):\n    raise RuntimeError({f'{name} {message}'!r})\n" for name in names]
    cell.source = KILLED + ("\n".join(stubs) if stubs else f"raise RuntimeError({message!r})\n")


def answer_to_disable(nb, dead: int) -> int | None:
    """The answer cell to blame for a kernel that died while running cell ``dead``: that cell
    itself if it is an answer, the answer its test is named after (``test_<function>_...``),
    else the last answer before it."""
    cells = nb.cells
    answers = [i for i, c in enumerate(cells) if c.metadata.get("nbgrader", {}).get("solution")
               and c.cell_type == "code" and not c.source.startswith(KILLED)]
    info = cells[dead].metadata.get("nbgrader", {})
    if dead in answers or not info:  # an answer, or a cell the student added
        return dead
    named = [i for i in answers if (info.get("grade_id") or "").startswith(f"test_{grade_id(cells[i])}_")]
    if named:
        return max(named, key=lambda i: len(grade_id(cells[i])))
    earlier = [i for i in answers if i < dead]
    return earlier[-1] if earlier else None


def recover(work: Path, assignment: str, student: str, log: str) -> list[str]:
    """After nbgrader dropped a notebook: find the cell that was running, disable the answer to
    blame in the submitted copy and say so. Returns the report lines ([] if nothing to do)."""
    problems = []
    for path in sorted((work / "submitted" / student / assignment).glob("*.ipynb")):
        if (work / "autograded" / student / assignment / path.name).exists():
            continue
        progress = work / "progress" / assignment / student / f"{path.stem}.json"
        if not progress.exists():
            continue
        nb = nbformat.read(path, as_version=4)
        dead = json.loads(progress.read_text())  # the cell that was running, from GradingExecute
        index = find_cell(nb, dead)
        blamed = answer_to_disable(nb, index) if index is not None else None
        if "DeadKernelError" in log or "Kernel died" in log:
            reason = "the kernel died"
        elif "UnresponsiveKernelError" in log or "could not interrupt" in log:
            reason = "the kernel could not be interrupted"
        else:  # not the answer's fault as far as we can tell: nothing to disable
            continue
        where = dead.get("grade_id") or f"cell {dead['cell_index']}"
        if blamed is None:
            problems.append(f"{reason} in {where}: nothing left to disable, scored 0")
            continue
        what = grade_id(nb.cells[blamed]) or f"cell {blamed}"
        problems.append(f"{reason} in {where}: disabled answer {what} and graded again")
        disable_answer(nb.cells[blamed])
        nbformat.write(nb, path)
        progress.unlink()
    return problems


def find_cell(nb, dead: dict) -> int | None:
    """The submitted cell that was running: by grade_id, else by position."""
    if dead.get("grade_id"):
        for i, cell in enumerate(nb.cells):
            if grade_id(cell) == dead["grade_id"]:
                return i
    index = dead.get("cell_index")
    return index if index is not None and index < len(nb.cells) else None


def score_zero(work: Path, assignment: str, student: str) -> None:
    """A submission with no gradable notebook: in the gradebook with every cell at 0, as nbgrader
    does for a missing notebook, and no stale autograded copy or feedback left from before."""
    for folder in ("autograded", "feedback"):
        shutil.rmtree(work / folder / student / assignment, ignore_errors=True)
    with gradebook(work) as gb:
        gb.update_or_create_submission(assignment, student)
        for notebook in gb.find_assignment(assignment).notebooks:
            for grade in gb.find_submission_notebook(notebook.name, assignment, student).grades:
                grade.auto_score, grade.needs_manual_grade = 0, False
        gb.db.commit()


# --- results ----------------------------------------------------------------------------------

AWAITING = "awaiting manual grading"
KEPT = "hand grade kept (the regrade flags it for review)"


def cell_status(grade, kind: str) -> str:
    """What a cell's score is: autograded, hand-graded, still waiting for a person, ..."""
    if grade.manual_score is not None:
        return KEPT if grade.needs_manual_grade else "hand-graded"
    if grade.needs_manual_grade:
        return AWAITING
    if kind == "written" and not grade.auto_score:
        return "not answered"  # nbgrader scores an unchanged written answer 0 without asking anyone
    return "autograded"


def cell_rows(work: Path, assignments: list[str]) -> list[dict]:
    """One row per graded cell per student and assignment, from the gradebook."""
    rows = []
    with gradebook(work) as gb:
        students = [s.id for s in gb.students]
        for assignment in assignments:
            for notebook in gb.find_assignment(assignment).notebooks:
                release = nbformat.read(work / "release" / assignment / f"{notebook.name}.ipynb", as_version=4)
                order = [grade_id(c) for c in release.cells]
                written = {grade_id(c) for c in release.cells if c.metadata.get("nbgrader", {}).get("solution")}
                for student in students:
                    try:
                        grades = gb.find_submission_notebook(notebook.name, assignment, student).grades
                    except Exception:  # nbgrader's MissingEntry: no submission
                        continue
                    for grade in sorted(grades, key=lambda g: order.index(g.name)):
                        status = cell_status(grade, "written" if grade.name in written else "test")
                        rows.append({"student": student, "assignment": assignment, "notebook": notebook.name,
                                     "grade_id": grade.name, "score": grade.score, "max_score": grade.max_score,
                                     "needs_manual_grade": grade.needs_manual_grade, "status": status})
    return rows


def cell_problems(work: Path, assignment: str, student: str, rows: list[dict]) -> list[str]:
    """A line for each cell whose output was cut, each cell waiting for (or kept from) a hand
    grade, and each autograded cell that lost points, with the error it showed."""
    problems = []
    for path in sorted((work / "autograded" / student / assignment).glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if any("output truncated by the grader" in o.get("text", "") for o in cell.get("outputs", [])):
                problems.append(f"output of {grade_id(cell) or 'a cell'} in {path.name} cut (it printed too much)")
    for row in rows:
        points = f"{row['score'] or 0:g}/{row['max_score']:g}"
        if row["status"] == AWAITING:
            problems.append(f"{row['grade_id']}: {AWAITING} ({row['max_score']:g} points)")
            continue
        if row["status"] == KEPT:
            problems.append(f"{row['grade_id']} {points}: {KEPT}")
            continue
        if row["score"] is None or row["score"] >= row["max_score"]:
            continue
        path = work / "autograded" / student / assignment / f"{row['notebook']}.ipynb"
        if row["status"] != "autograded" or not path.exists():  # hand-graded, unanswered, or no notebook
            problems.append(f"{row['grade_id']} {points}: {row['status']}")
            continue
        cell = next(c for c in nbformat.read(path, as_version=4).cells if grade_id(c) == row["grade_id"])
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            message = f"{errors[0].ename}: {errors[0].evalue}".splitlines()[0][:160]
            timed_out = errors[0].ename in ("TimeoutError", "CellTimeoutError", "KeyboardInterrupt")
            detail = ("timed out: " if timed_out else "") + message
        elif any(o.get("name") == "stderr" for o in cell.get("outputs", [])):
            detail = "wrote to stderr"  # nbgrader scores any stderr output as 0
        else:
            detail = "partial credit"
        problems.append(f"{row['grade_id']} {points}: {detail}")
    return problems


def late(work: Path, assignment: str, student: str) -> list[str]:
    """The report line of a late submission, if it is one."""
    from nbgrader.api import MissingEntry
    with gradebook(work) as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return []
        if not submission.total_seconds_late:
            return []
        penalty, seconds = submission.late_submission_penalty or 0, submission.total_seconds_late
        by = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"
        return [f"late by {by}: penalty {penalty:g}, "
                f"score after it {max(0.0, submission.score - penalty):g}"]


def label_feedback(work: Path, rows: list[dict]) -> None:
    """Feedback pages say "awaiting manual grading" where nbgrader shows a score of 0 that no
    person gave yet, and the page's total says how many points are still pending."""
    pending: dict[Path, list[dict]] = {}
    for row in rows:
        if row["status"] == AWAITING:
            page = work / "feedback" / row["student"] / row["assignment"] / f"{row['notebook']}.html"
            pending.setdefault(page, []).append(row)
    for page, cells in pending.items():
        if not page.exists():
            continue
        text = page.read_text()
        for row in cells:
            gid, points = re.escape(row["grade_id"]), f"{float(row['max_score']):.1f}"
            label = f"{AWAITING}, {points} points"
            text = re.sub(rf'(<a href="#{gid}">[^<]*</a>) \(Score: [^)]*\)', rf"\1 ({label})", text)
            text = re.sub(rf'(<a name="{gid}"></a>.*?)Score: [0-9.]+ / [0-9.]+', rf"\1{label[0].upper() + label[1:]}",
                          text, count=1, flags=re.S)
        waiting = sum(row["max_score"] for row in cells)
        text = re.sub(r"(<h4>[^<]*\(Score: [0-9.]+ / [0-9.]+)\)", rf"\1; {waiting:g} points {AWAITING})", text, count=1)
        page.write_text(text)


def copy_feedback_for_renamed(work: Path, assignment: str, student: str) -> None:
    """A renamed notebook's feedback also under the student's own name: ``nbgrader
    fetch_feedback`` looks it up by the file name the student submitted."""
    record = work / "renamed" / assignment / f"{student}.json"
    if not record.exists():
        return
    folder = work / "feedback" / student / assignment
    for graded_as, own in json.loads(record.read_text()).items():
        if (folder / f"{graded_as}.html").exists():
            shutil.copyfile(folder / f"{graded_as}.html", folder / f"{own}.html")


def write_feedback(work: Path, assignments: list[str], student: str | None = None) -> None:
    """nbgrader's feedback for every graded submission (or one student's), then the labels."""
    api = open_api(work)
    for assignment in assignments:
        if student is None:
            result = api.generate_feedback(assignment, force=True)
        elif (work / "autograded" / student / assignment).exists():
            result = api.generate_feedback(assignment, student, force=True)
        else:
            continue
        if not result["success"]:
            raise SystemExit(f"error: nbgrader generate_feedback {assignment} failed:\n{result.get('log')}")
        for folder in (work / "feedback").glob(f"{student or '*'}/{assignment}"):
            copy_feedback_for_renamed(work, assignment, folder.parent.name)


def write_outputs(work: Path, assignments: list[str], timings: dict) -> tuple[list[str], list[dict]]:
    """grades.csv, cells.csv and report.txt, and the feedback pages' labels; return the
    report's lines and the cell rows."""
    # Every assignment in the gradebook, not only those graded in this run: regrading one
    # student of one assignment keeps the other assignments' rows and report lines.
    with gradebook(work) as gb:
        assignments = sorted({a.name for a in gb.assignments} | set(assignments))
    export = nbgrader(work, "export", f"--to={work / 'grades.csv'}")  # late penalties reassessed (late.py)
    if export.returncode != 0:
        raise SystemExit(f"error: nbgrader export failed:\n{export.stdout}\n{export.stderr}")
    rows = cell_rows(work, assignments)
    with open(work / "cells.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["student"])
        writer.writeheader()
        writer.writerows(rows)
    label_feedback(work, rows)

    lines = []
    for assignment in assignments:
        for path in sorted((work / "problems" / assignment).glob("*.json")):
            student = path.stem
            mine = [r for r in rows if r["assignment"] == assignment and r["student"] == student]
            problems = json.loads(path.read_text()) + late(work, assignment, student) + \
                cell_problems(work, assignment, student, mine)
            score = sum(r["score"] or 0 for r in mine)
            total = sum(r["max_score"] for r in mine)
            waiting = sum(r["max_score"] for r in mine if r["status"] == AWAITING)
            seconds = timings.get(f"{assignment}/{student}")
            took = f", {seconds[0]:.0f} s ({seconds[1]:.0f} s CPU)" if seconds else ""
            pending = f" ({waiting:g} points {AWAITING})" if waiting else ""
            lines.append(f"{assignment} {student}: {score:g}/{total:g}{pending}{took}")
            lines += [f"    {p}" for p in problems]
    (work / "report.txt").write_text("\n".join(lines) + "\n")
    return lines, rows


def read_timings(work: Path) -> dict:
    """[wall, CPU] seconds per graded submission, retries included, from earlier runs."""
    path = work / "timings.json"
    return json.loads(path.read_text()) if path.exists() else {}


def export_only(work: Path, late_penalty: str | None = None) -> dict:
    """After hand grading: no notebook runs; late penalties follow the current scores (by
    ``late_penalty``, default the rule the class was graded with), and grades.csv, cells.csv,
    report.txt and the feedback are written again from the gradebook."""
    work = work.resolve()
    if not (work / "gradebook.db").exists():
        raise SystemExit(f"error: no gradebook in {work}: grade the class first")
    if late_penalty is not None:
        write_config(work, None, late_penalty)
    with gradebook(work) as gb:
        assignments = sorted(a.name for a in gb.assignments)
    write_feedback(work, [a for a in assignments if any((work / "autograded").glob(f"*/{a}"))])
    timings = read_timings(work)
    lines, rows = write_outputs(work, assignments, timings)
    return {"report": lines, "cells": rows, "timings": timings}


JOBS_POLL_SECONDS = 5  # how often a ``jobs`` function is asked again while notebooks run


# --- the whole pass ---------------------------------------------------------------------------

def grade(submitted: Path, work: Path, assignments: list[str] | None = None, student: str | None = None,
          roster: Path | None = None, timeout: int | None = None, jobs: int | Callable[[], int] = 2,
          due: dict[str, str] | None = None, late_penalty: str | None = None) -> dict:
    """Grade ``submitted`` into ``work``; return the report lines, cell rows and timings.
    ``jobs`` is how many notebooks run at once, or a function giving it (up to the CPU count),
    asked again whenever a notebook ends and every few seconds: a test run widens it once the
    machine frees up.
    ``due`` maps assignments to due dates (``"2026-12-01 17:00:00 UTC"``); a submission's
    ``timestamp.txt`` (written by ``nbgrader collect``) after it makes it late; ``late_penalty``
    (``none`` or ``zero``) is kept in the work folder for later runs."""
    submitted, work = submitted.resolve(), work.resolve()
    assignments = find_assignments(submitted, assignments)
    if not assignments:
        raise SystemExit(f"error: no submissions of any assignment in {SOLUTIONS} under {submitted}")
    write_config(work, timeout, late_penalty)
    api = open_api(work)
    for assignment in assignments:
        result = api.generate_assignment(assignment, force=True, create=True)
        if not result["success"]:
            raise SystemExit(f"error: nbgrader generate_assignment {assignment} failed:\n{result.get('log')}")

    names = read_roster(roster)
    units = [(a, s) for a in assignments for s in find_students(submitted, a, student)]
    if not units:
        raise SystemExit(f"error: no submissions of student {student!r} under {submitted}")
    with gradebook(work) as gb:
        for assignment, date in (due or {}).items():
            gb.update_or_create_assignment(assignment, duedate=date)
        for s in sorted({s for _, s in units} | set(names)):
            gb.update_or_create_student(s, **names.get(s, {}))

    problems = {}
    for assignment, s in units:
        found, renamed = prepare(submitted / s / assignment, work / "release" / assignment,
                                 work / "submitted" / s / assignment)
        if names and s not in names:
            found.append("not on the roster: no name in grades.csv")
        problems[(assignment, s)] = found
        record = work / "renamed" / assignment / f"{s}.json"
        record.unlink(missing_ok=True)
        if renamed:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps(renamed))
        shutil.rmtree(work / "progress" / assignment / s, ignore_errors=True)

    todo = [u for u in units if any((work / "submitted" / u[1] / u[0]).glob("*.ipynb"))]
    for assignment, s in set(units) - set(todo):
        score_zero(work, assignment, s)
    seconds_now: dict[str, list[float]] = {}
    at_once = jobs if callable(jobs) else (lambda: jobs)
    widest = (os.cpu_count() or 2) if callable(jobs) else max(1, jobs)
    context = multiprocessing.get_context("spawn")
    # Workers start as they are first needed, so a pool as wide as the most notebooks ever
    # graded at once holds no idle process while ``jobs()`` is lower.
    with ProcessPoolExecutor(max_workers=widest, mp_context=context, initializer=_start_worker,
                             initargs=(str(work),)) as pool:
        waiting, running = deque(todo), set()
        while waiting or running:
            while waiting and len(running) < max(1, min(at_once(), widest)):
                running.add(pool.submit(autograde, waiting.popleft()))
            done, _ = wait(running, timeout=JOBS_POLL_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                running.remove(future)
                assignment, s, took, ok, log = future.result()
                logs = work / "logs" / assignment
                logs.mkdir(parents=True, exist_ok=True)
                (logs / f"{s}.log").write_text(log)
                before = seconds_now.get(f"{assignment}/{s}", [0.0, 0.0])
                seconds_now[f"{assignment}/{s}"] = [before[0] + took[0], before[1] + took[1]]
                if not ok:
                    lines = recover(work, assignment, s, log)
                    problems[(assignment, s)] += lines or [f"nbgrader failed (see logs/{assignment}/{s}.log): scored 0"]
                    if any(line.endswith("graded again") for line in lines):
                        waiting.append((assignment, s))

    for (assignment, s), found in problems.items():
        (work / "problems" / assignment).mkdir(parents=True, exist_ok=True)
        (work / "problems" / assignment / f"{s}.json").write_text(json.dumps(found))
    timings = {**read_timings(work), **seconds_now}
    (work / "timings.json").write_text(json.dumps(timings, indent=1))

    write_feedback(work, assignments, student)
    lines, rows = write_outputs(work, assignments, timings)
    return {"report": lines, "cells": rows, "timings": timings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submitted", type=Path, help="folder of <student>/<assignment>/<notebook>.ipynb")
    parser.add_argument("--assignment", action="append", help="grade only this assignment (repeatable)")
    parser.add_argument("--student", help="regrade only this student; everyone else's grades are kept")
    parser.add_argument("--work", type=Path, default=HERE / "work", help="course folder for all output")
    parser.add_argument("--roster", type=Path, help="CSV id,first_name,last_name,email "
                        "(default: SUBMITTED/roster.csv when it exists)")
    parser.add_argument("--timeout", type=int, help="seconds per cell before the kernel is interrupted "
                        "(default: the config's Execute.timeout)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks graded at once (default 2)")
    parser.add_argument("--due", action="append", default=[], metavar="ASSIGNMENT=DATE",
                        help='due date, e.g. ex01_speculative_loop="2026-12-01 17:00:00 UTC" (repeatable)')
    parser.add_argument("--late-penalty", choices=("none", "zero"),
                        help="what a late submission loses: none (it is only marked late) or zero; "
                        "default: the rule this work folder was graded with, else none")
    parser.add_argument("--export-only", action="store_true",
                        help="run no notebook: after hand grading, recompute late penalties and rewrite "
                        "grades.csv, cells.csv, report.txt and the feedback from the gradebook")
    args = parser.parse_args()
    start = time.perf_counter()
    if args.export_only:
        result = export_only(args.work, args.late_penalty)
    else:
        due = dict(item.split("=", 1) for item in args.due)
        roster = args.roster or args.submitted / "roster.csv"
        result = grade(args.submitted, args.work, args.assignment, args.student, roster, args.timeout, args.jobs,
                       due, args.late_penalty)
    print("\n".join(result["report"]))
    work = args.work.resolve()
    print(f"\n{'exported' if args.export_only else 'graded'} in {time.perf_counter() - start:.0f} s. "
          f"gradebook: {work / 'gradebook.db'}\n"
          f"totals: {work / 'grades.csv'}; per cell: {work / 'cells.csv'}; report: {work / 'report.txt'}\n"
          f"feedback: {work / 'feedback'}/<student>/<assignment>/")


if __name__ == "__main__":
    main()
