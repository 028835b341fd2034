"""Lesson 8 without vLLM: the committed recorded run says where it comes from, and the lesson
draws its figures and summary from it, labelled as recorded, with nothing on stderr."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from specdec_ref.vllm import ScriptRun, busy_cores_elsewhere, load_recorded_run, record_run, recorded_label

REPO = Path(__file__).resolve().parents[1]
LESSON = REPO / "notebooks" / "08_serving_with_vllm.ipynb"
RECORDED = REPO / "notebooks" / "data" / "lesson8_vllm_run.json"


def test_committed_run_says_where_it_comes_from():
    record = load_recorded_run(RECORDED)
    recorded = record["recorded"]
    assert recorded["machine"]["cpu"] and recorded["machine"]["cores"] >= 1
    assert all(recorded["versions"][key] for key in ("vllm", "torch", "transformers"))
    assert recorded["date"][:4].isdigit() and "08_serving_with_vllm.ipynb" in recorded["command"]
    assert RECORDED.stat().st_size < 64_000  # small enough to read in a diff


def test_committed_run_has_what_the_lesson_draws():
    results = load_recorded_run(RECORDED)["results"]
    settings = results["settings"]
    prompts = len(results["prompt_ids"])
    assert {"plain", "speculative"} <= set(results["outputs"]) and prompts >= 1
    assert all(len(outputs) == prompts for outputs in results["outputs"].values())
    assert len(results["offline"]["token_ids"]) == prompts
    counts = results["spec_decode"]
    assert len(counts["accepted_per_position"]) == settings["k"]
    assert 0 < counts["num_accepted_tokens"] <= counts["num_draft_tokens"] == settings["k"] * counts["num_drafts"]
    for n in settings["concurrency"]:
        times = results["throughput"][str(n)]
        assert len(times["plain_seconds"]) == len(times["speculative_seconds"]) >= 3
        assert all(seconds > 0 for seconds in times["plain_seconds"] + times["speculative_seconds"])


def test_record_and_load_round_trip(tmp_path):
    machine, versions = {"cpu": "Test CPU", "cores": 4}, {"vllm": "9.9", "torch": "1.0", "transformers": "2.0"}
    written = record_run(tmp_path / "run.json", {"x": [1, 2]}, command="make run", machine=machine,
                         versions=versions, date="2030-01-02T03:04:05+00:00")
    loaded = load_recorded_run(tmp_path / "run.json")
    assert loaded == written and loaded["results"] == {"x": [1, 2]}
    assert loaded["recorded"]["reference_versions"]["torch"]  # this interpreter's, asked in a subprocess
    assert recorded_label(loaded) == "recorded on Test CPU (4 cores), 2030-01-02, vLLM 9.9: not measured on this machine"


def test_load_names_what_is_missing(tmp_path):
    record = json.loads(RECORDED.read_text())
    del record["recorded"]["machine"]["cpu"], record["recorded"]["versions"]["vllm"]
    (tmp_path / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"recorded\.machine\.cpu, recorded\.versions\.vllm"):
        load_recorded_run(tmp_path / "run.json")
    with pytest.raises(ValueError, match="command must say"):
        record_run(tmp_path / "other.json", {}, command=" ", machine={"cpu": "x", "cores": 1})
    with pytest.raises(ValueError, match="plain JSON"):
        record_run(tmp_path / "other.json", {"bad": float("nan")}, command="x", machine={"cpu": "x", "cores": 1})


def test_script_run_returns_what_the_script_wrote(tmp_path):
    """How the lesson runs vLLM's offline API from another environment: JSON in, JSON out, log kept."""
    script = tmp_path / "double.py"
    script.write_text("import json, sys\nprint('working')\n"
                      "json.dump([2 * x for x in json.load(open(sys.argv[1]))], open(sys.argv[2], 'w'))\n")
    run = ScriptRun(sys.executable, script, [1, 2, 3], log_path=tmp_path / "log.txt").start()
    assert run.result(timeout=60) == [2, 4, 6] and run.seconds > 0 and not run.running
    assert "working" in run.log_tail()
    script.write_text("raise SystemExit('no vLLM here')\n")
    with pytest.raises(RuntimeError, match="no vLLM here"):
        ScriptRun(sys.executable, script, None).start().result(timeout=60)


def test_busy_cores_elsewhere_leaves_out_this_process():
    busy = busy_cores_elsewhere(0.5)
    assert 0.0 <= busy <= (os.cpu_count() or 1) + 0.5


def test_lesson_draws_the_recorded_run(monkeypatch):
    """What a learner without vLLM sees (SPECDEC_LESSON8_RECORDED=1 forces it where vLLM exists)."""
    monkeypatch.setenv("SPECDEC_LESSON8_RECORDED", "1")
    notebook = nbformat.read(LESSON, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(LESSON.parent)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])]
    stderr = [output["text"][:200] for output in outputs if output.get("name") == "stderr"]
    assert not stderr, stderr
    text = "".join(output.get("text", "") for output in outputs)
    text += "".join(output.get("data", {}).get("text/markdown", "") for output in outputs)
    label = recorded_label(load_recorded_run(RECORDED))
    assert "mode: recorded" in text and "mode: live" not in text
    assert text.count(label) >= 5  # every section that shows recorded numbers says so
    assert "## What you measured" in text and f"*{label}.*" in text
    assert sum("image/png" in output.get("data", {}) for output in outputs) >= 2  # both figures drawn
    assert "greedy outputs identical to specdec_ref's" in text and "servers stopped" not in text
