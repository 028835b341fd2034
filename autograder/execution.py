"""nbgrader's Execute, made safe for whatever a class submits.

Two additions, both configured in ``nbgrader_config.py``:

- Outputs are bounded while the notebook runs: a submission that prints megabytes keeps
  ``max_output_chars`` of it per cell (then a note), so neither the grader's memory nor the
  autograded notebook and feedback HTML grow with it. Error outputs are always kept: they
  decide the grade.
- Each notebook runs in a scratch copy of its folder, deleted afterwards: files a submission
  writes (relative paths, even ``../../../gradebook.db``) never reach the course folder or
  another student's. This is not a sandbox: absolute paths still reach the file system, so
  grade as a user who can write nothing else (see INSTRUCTORS.md).
- The cell about to run is written to ``progress_dir`` (one small JSON file per submission).
  When the kernel dies (``os._exit``, a segfault, out of memory) nbgrader drops the whole
  notebook; that file tells ``grade.py`` which cell did it.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nbformat import NotebookNode
from nbformat.v4 import new_output
from nbgrader.preprocessors import Execute
from traitlets import Integer, Unicode

TRUNCATED = "\n... output truncated by the grader ({limit:,} characters per cell) ...\n"


class GradingExecute(Execute):
    """``Execute`` in a scratch folder, with bounded outputs and a record of the cell being run."""

    max_output_chars = Integer(20_000, help="characters of output kept per cell").tag(config=True)
    progress_dir = Unicode("", help="folder for the 'cell being run' records (empty: none)").tag(config=True)

    def preprocess(self, nb: NotebookNode, resources: Any = None, km: Any = None):
        self._output_chars: dict[int, int] = {}
        info = (resources or {}).get("nbgrader", {})
        self._progress_file = None
        if self.progress_dir and info.get("student"):
            self._progress_file = Path(self.progress_dir) / info["assignment"] / info["student"] / f"{info['notebook']}.json"
            self._progress_file.parent.mkdir(parents=True, exist_ok=True)
        original = (resources or {}).get("metadata", {}).get("path")
        if not original:
            return super().preprocess(nb, resources, km)
        # three levels deep, like autograded/<student>/<assignment>, so ../../.. stays inside it
        scratch = Path(tempfile.mkdtemp(prefix="specdec-grading-"))
        run_dir = scratch / "autograded" / info.get("student", "student") / info.get("assignment", "assignment")
        shutil.copytree(original, run_dir)
        resources["metadata"]["path"] = str(run_dir)
        try:
            return super().preprocess(nb, resources, km)
        finally:
            resources["metadata"]["path"] = original
            shutil.rmtree(scratch, ignore_errors=True)

    def preprocess_cell(self, cell: NotebookNode, resources: Any, index: int):
        if self._progress_file is not None and cell.cell_type == "code":
            grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
            self._progress_file.write_text(json.dumps({"cell_index": index, "grade_id": grade_id}))
        return super().preprocess_cell(cell, resources, index)

    def output(self, outs: list[NotebookNode], msg: dict, display_id: str | None, cell_index: int):
        used = self._output_chars.get(cell_index, 0)
        is_error = msg["msg_type"] == "error"
        if used > self.max_output_chars and not is_error:
            return None  # already truncated: drop the rest
        out = super().output(outs, msg, display_id, cell_index)
        if out is None or is_error:
            return out
        size = len(out.get("text", "")) if out.output_type == "stream" else len(json.dumps(out.get("data", {})))
        if used + size > self.max_output_chars:
            note = TRUNCATED.format(limit=self.max_output_chars)
            if out.output_type == "stream":
                out.text = out.text[: max(0, self.max_output_chars - used)] + note
            else:
                outs[-1] = new_output("stream", name="stdout", text=note)
            size = self.max_output_chars + 1 - used  # marks the cell as full
        self._output_chars[cell_index] = used + size
        return out
