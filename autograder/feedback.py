"""Feedback without the answers: hidden tests and their tracebacks are removed."""
from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M)
NOTE = "# (hidden tests: run by the grader, not shown)\n"


class HideHiddenTests(Preprocessor):
    """Replace hidden test regions by a note; in those cells keep an error's name and message
    but not its traceback, which would quote the hidden test line."""

    enabled = Bool(True)  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and HIDDEN.search(cell.source):
            cell.source = HIDDEN.sub(NOTE, cell.source)
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output.get('ename', 'Error')}: {output.get('evalue', '')}"]
        return cell, resources
