"""Grade a class: autograde every submission, then export grades and feedback.

    python autograder/grade.py SUBMITTED [--assignment ex01_speculative_loop] [--work DIR]

SUBMITTED holds ``<student>/<assignment>/<notebook>.ipynb`` (what ``nbgrader collect``
produces). Everything is written under the work folder (default ``autograder/work``):
the sqlite gradebook, autograded notebooks, ``feedback/`` HTML without hidden tests,
and ``grades.csv``. A crashing or looping submission is graded as far as it runs and
never stops the others.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "nbgrader_config.py"


def nbgrader(work: Path, *args: str) -> subprocess.CompletedProcess:
    """Run one nbgrader command on the work course folder, with this course's config."""
    work.mkdir(parents=True, exist_ok=True)
    # nbgrader reads nbgrader_config.py from the course root: the work folder's one loads the
    # course's and moves everything that gets written (release, gradebook...) into the work folder.
    (work / "nbgrader_config.py").write_text(
        f"c = get_config()\nload_subconfig({str(CONFIG)!r})\n"
        f"c.CourseDirectory.root = {str(work)!r}\n"
        f"c.CourseDirectory.release_directory = {str(work / 'release')!r}\n")
    # nbgrader runs alembic as a subprocess: the environment's bin/ must be on PATH.
    env_bin = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": env_bin + os.pathsep + os.environ.get("PATH", "")}
    return subprocess.run([str(Path(env_bin) / "nbgrader"), *args], cwd=work, env=env, capture_output=True, text=True)


def grade(submitted: Path, assignment: str, work: Path, timeout: int | None = None) -> list[dict]:
    """Autograde every student in ``submitted``; return one row per student."""
    if not (HERE.parent / "solutions" / assignment).is_dir():
        raise SystemExit(f"error: no assignment {assignment!r} in solutions/")
    students = sorted(p.name for p in submitted.iterdir() if (p / assignment).is_dir())
    if not students:
        raise SystemExit(f"error: no submissions of {assignment!r} under {submitted}")
    work.mkdir(parents=True, exist_ok=True)
    for student in students:
        target = work / "submitted" / student / assignment
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(submitted / student / assignment, target)

    extra = [f"--Execute.timeout={timeout}"] if timeout else []
    steps = [("generate_assignment", [assignment, "--force"]),
             ("autograde", [assignment, "--force", *extra]),
             ("generate_feedback", [assignment, "--force"]),
             ("export", [f"--to={work / 'grades.csv'}"])]
    for name, args in steps:
        result = nbgrader(work, name, *args)
        # autograde reports a broken submission in its log and goes on with the next one.
        if result.returncode != 0 and name != "autograde":
            raise SystemExit(f"error: nbgrader {name} failed:\n{result.stdout}\n{result.stderr}")
        (work / f"{name}.log").write_text(result.stdout + result.stderr)

    with open(work / "grades.csv") as f:
        rows = [row for row in csv.DictReader(f) if row["assignment"] == assignment]
    return sorted(rows, key=lambda row: row["student_id"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("submitted", type=Path)
    parser.add_argument("--assignment", default="ex01_speculative_loop")
    parser.add_argument("--work", type=Path, default=HERE / "work")
    parser.add_argument("--timeout", type=int, help="seconds per cell (default: the config's Execute.timeout)")
    args = parser.parse_args()
    rows = grade(args.submitted.resolve(), args.assignment, args.work.resolve(), args.timeout)
    print(f"{'student':12s} {'score':>6s} / max")
    for row in rows:
        print(f"{row['student_id']:12s} {float(row['score']):6.1f} / {float(row['max_score']):.1f}")
    print(f"grades: {args.work / 'grades.csv'}; feedback: {args.work / 'feedback'}")


if __name__ == "__main__":
    main()
