"""Late penalties that stay right when hand grades arrive after the first grading run.

nbgrader computes a late submission's penalty once, while it autogrades, from the score at
that moment. With the ``zero`` rule a late notebook that scored 13 gets a penalty of 13; a
written answer graded by hand afterwards raises the score to 14 and the notebook to 1 point,
in every later export and feedback page. Here the penalty is computed again from the
current score each time grades leave the gradebook: by ``nbgrader export`` (through
:class:`LatePenaltyCsvExport`), by ``nbgrader generate_feedback`` (through
:class:`ReassessLatePenalty`) and by ``grade.py``.
"""
from __future__ import annotations

from nbgrader.api import Gradebook
from nbgrader.plugins import CsvExportPlugin, LateSubmissionPlugin
from nbgrader.preprocessors import NbGraderPreprocessor


def reassess_late_penalties(gradebook: Gradebook, rule: LateSubmissionPlugin,
                            assignment: str | None = None, student: str | None = None) -> None:
    """Set every late notebook's penalty from its current score (hand grades included) by
    ``rule``; submissions on time get none. Limited to one assignment or student if given."""
    for each in gradebook.assignments:
        if assignment not in (None, each.name):
            continue
        for submission in each.submissions:
            if student not in (None, submission.student.id):
                continue
            seconds_late = submission.total_seconds_late
            for notebook in submission.notebooks:
                penalty = None
                if seconds_late > 0:
                    penalty = rule.late_submission_penalty(submission.student.id, notebook.score, seconds_late)
                if penalty is not None:
                    penalty = min(max(penalty, 0.0), notebook.score)  # as nbgrader clamps it
                notebook.late_submission_penalty = penalty
    gradebook.db.commit()


class LatePenaltyCsvExport(CsvExportPlugin):
    """nbgrader's CSV export, with late penalties computed from the scores as they are now."""

    def export(self, gradebook: Gradebook) -> None:
        reassess_late_penalties(gradebook, LateSubmissionPlugin(parent=self))
        super().export(gradebook)


class ReassessLatePenalty(NbGraderPreprocessor):
    """First step of ``generate_feedback``: the student's penalty from their current score."""

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gradebook:
            reassess_late_penalties(gradebook, LateSubmissionPlugin(parent=self), info["assignment"], info["student"])
        return nb, resources
