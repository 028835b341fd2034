"""``/metrics`` pages recorded from the course's own vLLM CPU servers, for readers without vLLM.

``scripts/record_vllm_metrics.py`` starts the servers (no speculation, a draft model, n-gram
prompt lookup; and the draft-model server once more, restarted) with :class:`VLLMServer`,
reads ``GET /metrics`` before and after a few completions, and writes each page exactly as
the server sent it to ``specdec_ref/vllm/data/metrics/<name>.txt``. One recorded-run file
beside them (``recording.json``, the layout of :func:`specdec_ref.vllm.record_run`) says
where they come from: date, vLLM / torch / transformers versions, CPU, the recording
command, and for every page the server's command line and which requests it follows.

The files ship inside the package, so a notebook running in any folder finds them:

    >>> from specdec_ref.vllm import recorded_metrics, recorded_metrics_run
    >>> text = recorded_metrics("draft_model_after")
    >>> recorded_metrics_run()["results"]["pages"]["draft_model_after"]["reading"]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .recorded import load_recorded_run

#: The folder of the recorded pages and of ``recording.json``.
RECORDED_METRICS_DIR = Path(__file__).resolve().parent / "data" / "metrics"
_RECORDING = "recording.json"


def recorded_metrics_run() -> dict[str, Any]:
    """The recording's description (a :func:`load_recorded_run` record): ``recorded`` holds the
    date, command, machine and versions; ``results["pages"]`` one entry per page."""
    return load_recorded_run(RECORDED_METRICS_DIR / _RECORDING)


def recorded_metrics_names() -> list[str]:
    """Names of the recorded pages, e.g. ``"draft_model_after"``."""
    return sorted(path.stem for path in RECORDED_METRICS_DIR.glob("*.txt"))


def recorded_metrics(name: str) -> str:
    """The recorded ``/metrics`` page ``name``, exactly as the server sent it.

    Raises:
        KeyError: no page of that name (the message lists the recorded ones).
    """
    path = RECORDED_METRICS_DIR / f"{name}.txt"
    if not path.is_file():
        raise KeyError(f"no recorded /metrics page {name!r}; recorded: {', '.join(recorded_metrics_names())}")
    return path.read_text()
