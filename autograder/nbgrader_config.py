"""nbgrader configuration of the specdec course.

The course root is this folder: ``cd autograder`` and run nbgrader as usual, or use
``python autograder/grade.py`` which runs the whole grading pass. Instructor sources
(with solutions and hidden tests) live in ``solutions/``; ``nbgrader generate_assignment``
writes the student versions to ``exercises/``.
"""
import sys
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import GetGrades

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from feedback import HideHiddenTests  # noqa: E402  (autograder/feedback.py)

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

c.CourseDirectory.course_id = "specdec"
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

# Feedback must not give the hidden tests away (nbgrader issue #917).
c.GenerateFeedback.preprocessors = [GetGrades, HideHiddenTests, CSSHTMLHeaderPreprocessor]
