"""nbgrader configuration of the specdec course.

The course root is this folder: ``cd autograder`` and run nbgrader as usual, or use
``python autograder/grade.py`` which runs the whole grading pass. Instructor sources
(with solutions and hidden tests) live in ``solutions/``; ``nbgrader generate_assignment``
writes the student versions to ``exercises/``.
"""
import sys
from pathlib import Path

from nbconvert.preprocessors import ClearMetadataPreprocessor, CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, GetGrades, IgnorePattern,
                                    LimitOutput, SaveAutoGrades)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from execution import GradingExecute  # noqa: E402  (autograder/execution.py)
from feedback import HideHiddenTests  # noqa: E402  (autograder/feedback.py)
from late import LatePenaltyCsvExport, ReassessLatePenalty  # noqa: E402  (autograder/late.py)

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

load_subconfig(str(HERE / "exchange_config.py"))  # noqa: F821  (course id and exchange root, shared with students)
c.CourseDirectory.root = str(HERE)
c.CourseDirectory.source_directory = str(HERE.parent / "solutions")
c.CourseDirectory.release_directory = str(HERE.parent / "exercises")
c.CourseDirectory.submitted_directory = "submitted"
c.CourseDirectory.autograded_directory = "autograded"
c.CourseDirectory.feedback_directory = "feedback"

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}

# A student's infinite loop must not stall the class: each cell gets this many seconds, then
# the kernel is interrupted and grading goes on. (The working setting is Execute.timeout;
# ExecutePreprocessor.timeout is ignored by nbgrader.)
c.Execute.timeout = 120
c.Execute.interrupt_on_timeout = True
# A kernel still flushing megabytes of output must not fail the whole notebook: errors are
# read from the execute reply anyway, so a late output message loses nothing that grades.
c.Execute.raise_on_iopub_timeout = False

# nbgrader's own pipeline with Execute replaced: outputs bounded while a notebook runs (a
# submission may print megabytes), and the cell being run recorded (a kernel may die).
c.Autograde.autograde_preprocessors = [GradingExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
c.GradingExecute.max_output_chars = 20_000

# A test cell a student deleted comes back from the gradebook (nbgrader issues #1083, #1682);
# grade.py restores deleted cells itself before this and reports them.
c.OverwriteCells.add_missing_cells = True

# Feedback must not give the hidden tests away (nbgrader issue #917). Late penalties follow the
# score as it is now, hand grades included, in feedback and in `nbgrader export` (late.py).
c.GenerateFeedback.preprocessors = [ReassessLatePenalty, GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
c.ExportApp.plugin_class = LatePenaltyCsvExport
