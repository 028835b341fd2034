"""The recorded /metrics pages of exercise 8 and the readings of specdec_ref.vllm.parse_check.

The pages are what the course's vLLM CPU servers sent (scripts/record_vllm_metrics.py); the
rules of ``parse_check`` stand in for vLLM's own parser where vLLM is not installed, so they
must read what vLLM reads (checked against vLLM itself by the ``vllm``-marked test).
"""
from __future__ import annotations

import json

import pytest

from specdec_ref.vllm import SpecDecodeMetrics, recorded_metrics, recorded_metrics_names, recorded_metrics_run
from specdec_ref.vllm.parse_check import (VLLMUnavailable, course_argv_reading, course_config_reading,
                                          course_vllm_python, vllm_readings)

PAGES = {f"{server}_{reading}" for server in ("plain", "draft_model", "ngram") for reading in ("start", "before", "after")}


def test_every_page_is_recorded_and_described():
    assert set(recorded_metrics_names()) == PAGES | {"draft_model_restarted"}
    run = recorded_metrics_run()  # checks date, command, machine and versions are there
    assert run["recorded"]["versions"]["vllm"] and run["recorded"]["machine"]["cpu"]
    assert set(run["results"]["pages"]) == set(recorded_metrics_names())
    with pytest.raises(KeyError, match="draft_model_after"):
        recorded_metrics("no_such_page")


def read(name: str) -> SpecDecodeMetrics:
    return SpecDecodeMetrics.from_prometheus_text(recorded_metrics(name))


@pytest.mark.parametrize("server, k", [("draft_model", 4), ("ngram", 12)])
def test_the_pages_count_what_the_servers_did(server, k):
    start, before, after = (read(f"{server}_{reading}") for reading in ("start", "before", "after"))
    assert start == SpecDecodeMetrics(accepted_per_position=(0,) * k)  # every position listed from the start
    delta = after - before
    assert delta.num_drafts > 0 and len(delta.accepted_per_position) == k
    assert sum(delta.accepted_per_position) == delta.num_accepted_tokens <= delta.num_draft_tokens <= k * delta.num_drafts


def test_a_restarted_server_counts_less_than_before_its_restart():
    after, restarted = read("draft_model_after"), read("draft_model_restarted")
    assert all(now < then for now, then in zip(
        (restarted.num_drafts, restarted.num_draft_tokens, restarted.num_accepted_tokens),
        (after.num_drafts, after.num_draft_tokens, after.num_accepted_tokens)))
    assert read("plain_after") == SpecDecodeMetrics()


CONFIGS = [
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    {"method": "ngram", "num_speculative_tokens": 4},
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 3},
    {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 2, "prompt_lookup_min": 3},
    {"method": "draft_model", "model": "DRAFT", "num_speculative_tokens": 4},
    {"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 2},
    {"method": "draft_model", "draft_model": "DRAFT", "num_speculative_tokens": 4},
    {"method": "draft_model", "model": "DRAFT", "num_speculative_tokens": 0},
    {"method": "draft_model", "num_speculative_tokens": 4},
    {"method": "medusa_typo", "num_speculative_tokens": 4},
    "not an object",
]
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
ARGVS = [
    ["TARGET", "--port", "8001", "--speculative-config", SPEC],
    ["TARGET", "--host", "127.0.0.1", "--port=8001", "--speculative_config", SPEC, "--enforce-eager"],
    ["TARGET", "--port", "8001", "--speculative-config", str({"method": "ngram"})],
    ["TARGET", "--port", "8001", "--speculative-model", "x", "--num-speculative-tokens", "4"],
    ["TARGET", "--port", "8001", "--speculative-config", "null"],
    ["TARGET", "--port", "eighty"],
    ["TARGET", "--port", 8001],
]


def rules(rule, value) -> dict:
    try:
        return {"ok": True, "read": rule(value)}
    except ValueError:
        return {"ok": False}


def test_the_rules_read_configs_and_command_lines():
    assert rules(course_config_reading, CONFIGS[1])["read"]["prompt_lookup_min"] == 5  # vLLM's default
    assert rules(course_config_reading, CONFIGS[2])["read"]["prompt_lookup_max"] == 3  # the other bound copied
    assert [rules(course_config_reading, c)["ok"] for c in CONFIGS] == [True] * 3 + [False] + [True] * 2 + [False] * 5
    assert course_argv_reading(ARGVS[1])["speculative_config"] == json.loads(SPEC)
    assert course_argv_reading(ARGVS[4])["speculative_config"] is None
    assert [rules(course_argv_reading, a)["ok"] for a in ARGVS] == [True, True, False, False, True, False, False]


@pytest.mark.vllm
@pytest.mark.slow
def test_the_rules_read_what_vllm_reads():
    if not course_vllm_python().exists():
        pytest.fail(f"no vLLM environment at {course_vllm_python()}: run scripts/setup_vllm_env.sh first")
    from specdec_ref import zoo

    target, draft = str(zoo.resolve("zoo:target")), str(zoo.resolve("zoo:draft"))
    configs = [{**c, "model": draft} if isinstance(c, dict) and c.get("model") == "DRAFT" else c for c in CONFIGS]
    configs = [{**c, "draft_model": draft} if isinstance(c, dict) and "draft_model" in c else c for c in configs]
    argvs = [[target if a == "TARGET" else a for a in argv] for argv in ARGVS]
    got = vllm_readings(configs, argvs, target_model=target, cache=False)
    mine = {"configs": [rules(course_config_reading, c) for c in configs],
            "argvs": [rules(course_argv_reading, a) for a in argvs]}
    for kind in ("configs", "argvs"):
        for theirs, ours in zip(got[kind], mine[kind]):
            assert theirs["ok"] == ours["ok"] and theirs.get("read") == ours.get("read"), (theirs, ours)


def test_a_missing_vllm_is_reported(tmp_path):
    with pytest.raises(VLLMUnavailable, match="not installed"):
        vllm_readings([], [], target_model="x", python=tmp_path / "bin" / "python")


@pytest.mark.vllm
@pytest.mark.slow
def test_readings_are_kept_and_only_new_inputs_start_vllm(tmp_path, monkeypatch):
    """A reading asked for again comes from the cache, without vLLM (here an interpreter that
    can only fail); a new input among known ones still goes to vLLM, and only it."""
    if not course_vllm_python().exists():
        pytest.fail(f"no vLLM environment at {course_vllm_python()}: run scripts/setup_vllm_env.sh first")
    from specdec_ref import zoo

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target, draft = str(zoo.resolve("zoo:target")), str(zoo.resolve("zoo:draft"))
    configs = [{"method": "ngram", "num_speculative_tokens": 3}, {"method": "draft_model", "model": draft,
                                                                  "num_speculative_tokens": 0}]
    argvs = [[target, "--port", "8001"]]
    first = vllm_readings(configs, argvs, target_model=target)
    assert first["configs"][0]["ok"] and not first["configs"][1]["ok"] and first["argvs"][0]["ok"]
    assert len(list((tmp_path / "cache" / "vllm_readings").glob("*.json"))) == 3
    # The same vLLM installation, seen through an interpreter beside it that always fails.
    failing = course_vllm_python().parent / "specdec-test-failing-python"
    failing.write_text("#!/bin/sh\nexit 3\n")
    failing.chmod(0o755)
    try:
        assert vllm_readings(configs[::-1], argvs, target_model=target, python=failing) == {
            "configs": first["configs"][::-1], "argvs": first["argvs"]}
        with pytest.raises(VLLMUnavailable, match="exit code 3"):
            vllm_readings(configs + [{"method": "ngram", "num_speculative_tokens": 4}], [], target_model=target,
                          python=failing)
    finally:
        failing.unlink()
