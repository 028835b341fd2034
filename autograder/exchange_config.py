"""The course id and where the course's nbgrader exchange lives: one file for both sides.

The instructor's config (``nbgrader_config.py`` beside this file) loads it. Students need the
same settings, or ``fetch_assignment`` looks in nbgrader's default exchange and fails with
"Unwritable directory": on a JupyterHub, install this file once as
``/etc/jupyter/nbgrader_config.py``; elsewhere each student copies it to
``~/.jupyter/nbgrader_config.py``. ``SPECDEC_EXCHANGE_ROOT`` overrides the folder (a test
course, or a site that keeps exchanges elsewhere); every user must see the same value.
"""
import os

c = get_config()  # noqa: F821 (provided by traitlets when it loads this file)

c.CourseDirectory.course_id = "specdec"
c.Exchange.root = os.environ.get("SPECDEC_EXCHANGE_ROOT", "/srv/nbgrader/exchange")
