"""benchmarks/llamacpp_vs_fast.py without llama.cpp: its argument checks, its arithmetic on given
numbers, and the worker's JSON protocol end to end against a stand-in ``llama_cpp`` module (a
few lines below, put on the worker's path), so none of it needs .venv-llamacpp or a build.
The live comparison itself is not part of the suite: it is run by hand and recorded in
benchmarks/results/ (docs/BENCHMARKS.md)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and annotations resolve through sys.modules
    spec.loader.exec_module(module)
    return module


bench = load_module("llamacpp_vs_fast")
worker_module = load_module("llamacpp_worker")

# A stand-in for llama-cpp-python: "generates" the prompt's last id + 1, + 2, ...; the lookup
# context says so by adding 1000, so the test can tell which context answered.
FAKE_LLAMA_CPP = '''
__version__ = "0.0-fake"
def llama_print_system_info():
    return b"CPU : FAKE = 1 |"
def llama_model_size(model):
    return 1234
def llama_model_n_params(model):
    return 56
class _Params:
    flash_attn = False
class Llama:
    def __init__(self, model_path, draft_model=None, n_batch=512, **kwargs):
        print("llama.cpp chatter on stdout")  # must not reach the protocol's channel
        self.model, self.n_batch, self.context_params = object(), n_batch, _Params()
        self.offset = 1000 if draft_model is not None else 0
        self.draft = draft_model
    def reset(self):
        pass
    def tokenize(self, text, add_bos=True, special=False):
        return list(text)  # bytes: their values
    def generate(self, tokens, **kwargs):
        assert kwargs["temp"] == 0.0
        last = tokens[-1] + self.offset
        while True:
            last += 1
            yield last
'''
FAKE_SPECULATIVE = '''
class LlamaPromptLookupDecoding:
    def __init__(self, max_ngram_size=2, num_pred_tokens=10):
        self.num_pred_tokens = num_pred_tokens
'''


# ------------------------------------------------------------------ arguments

def test_defaults_are_the_issue_setup(tmp_path):
    args = bench.build_parser().parse_args([])
    assert (args.per_kind, args.kinds, args.max_new_tokens, args.threads, args.k) == (4, ("prose", "code"), 128, 2, 3)
    assert args.venv == REPO / ".venv-llamacpp"


@pytest.mark.parametrize("argv, message", [
    (["--per-kind", "0"], "must be at least 1"),
    (["--max-new-tokens", "-5"], "must be at least 1"),
    (["--k", "two"], "expected a whole number"),
    (["--kinds", "prose,poetry"], "subset of prose,code,chat"),
    (["--kinds", "code,code"], "named twice"),
    (["--kinds", ","], "subset of prose,code,chat"),
    (["--threads", "4096"], "more than this machine"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys, tmp_path):
    fake_venv = tmp_path / "venv"
    with pytest.raises(SystemExit) as exit_info:
        bench.parse_args([*argv, "--venv", str(fake_venv)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_environment_names_the_setup_script(capsys, tmp_path):
    with pytest.raises(SystemExit):
        bench.parse_args(["--venv", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert "no llama.cpp environment" in err and "scripts/setup_llamacpp_env.sh" in err
    (tmp_path / "half" / "bin").mkdir(parents=True)
    (tmp_path / "half" / "bin" / "python").symlink_to(sys.executable)
    assert "no llama_cpp package" in bench.venv_problem(tmp_path / "half")


def test_command_line_is_typed_from_the_repository_root():
    assert bench.command_line(["--json", "out/a b.json"]) == "python benchmarks/llamacpp_vs_fast.py --json 'out/a b.json'"


# ------------------------------------------------------------------ arithmetic

def test_quartiles():  # the course's quartile rule (specdec_ref.timing.quartiles), through summarize
    def spread(rates):
        row = bench.summarize({"llama.cpp": rates, "fast": rates}, {"llama.cpp": 1.0, "fast": 1.0}, dram=1.0)["fast"]
        return (row["tokens_per_second_iqr"][0], row["tokens_per_second"], row["tokens_per_second_iqr"][1])

    assert spread([5.0]) == (5.0, 5.0, 5.0)
    assert spread([1.0, 2.0, 3.0, 4.0, 5.0]) == (2.0, 3.0, 4.0)
    with pytest.raises(ValueError):
        spread([])


def test_summary_ratios_are_medians_of_per_prompt_ratios_and_bandwidth_is_bytes_times_rate():
    rates = {"llama.cpp": [60.0, 80.0, 100.0], "llama.cpp lookup": [30.0, 80.0, 50.0],
             "fast": [30.0, 60.0, 40.0], "fast + EAGLE chain": [45.0, 60.0, 120.0],
             "fast + EAGLE tree": [60.0, 60.0, 60.0]}
    per_token = {"llama.cpp": 100e6, "llama.cpp lookup": 100e6, "fast": 115e6,
                 "fast + EAGLE chain": 115e6, "fast + EAGLE tree": 115e6}
    out = bench.summarize(rates, per_token, dram=20e9)
    fast = out["fast"]
    assert fast["tokens_per_second"] == 40.0 and fast["tokens_per_second_iqr"] == [35.0, 50.0]
    # per prompt 0.5, 0.75, 0.4 -> 0.5; not 40 / 80
    assert fast["ratio_to_llama.cpp"] == pytest.approx(0.5)
    assert fast["ratio_to_own_plain"] == 1.0
    assert fast["bandwidth_share"] == pytest.approx(115e6 * 40 / 20e9)
    assert fast["bandwidth_gb_per_s"] == pytest.approx(4.6)
    assert out["fast + EAGLE chain"]["ratio_to_own_plain"] == pytest.approx(1.5)  # 1.5, 1.0, 3.0
    assert out["llama.cpp lookup"]["ratio_to_own_plain"] == pytest.approx(0.5)  # 0.5, 1.0, 0.5
    assert out["llama.cpp"]["bandwidth_share"] == pytest.approx(100e6 * 80 / 20e9)
    with pytest.raises(ValueError, match="same, non-zero number"):
        bench.summarize({"llama.cpp": [1.0], "fast": [1.0, 2.0]}, per_token, dram=1e9)
    with pytest.raises(ValueError, match="positive"):
        bench.summarize(rates, per_token, dram=0)


def test_outputs_compared_prompt_by_prompt():
    assert bench.count_equal([[1, 2], [3, 4]], [[1, 2], [3, 5]]) == 1
    with pytest.raises(ValueError):
        bench.count_equal([[1]], [])


def test_every_method_leads_in_turn():
    methods = list(bench.METHODS)
    orders = [bench.rotation(methods, i) for i in range(len(methods))]
    assert [order[0] for order in orders] == methods
    assert all(sorted(order) == sorted(methods) for order in orders)
    assert bench.PLAIN == {"llama.cpp": "llama.cpp", "fast": "fast", "compiled": "compiled"}


def test_report_shows_every_method():
    methods = {m: {"tokens_per_second": 50.0, "tokens_per_second_iqr": [45.0, 55.0], "ratio_to_llama.cpp": 1.0,
                   "ratio_to_own_plain": 1.0, "bandwidth_share": 0.3, "identical_to_own_plain": 2,
                   "identical_to_eager_greedy": 1} for m in bench.METHODS}
    record = {"prompts": 2, "machine": {"cpu": "Some CPU", "cores": 2, "avx512": ["avx512f"], "amx": []},
              "gguf": {"file": "x.gguf", "tensor_bytes": 96.6e6}, "max_new_tokens": 128, "kinds": ["prose"],
              "threads": 2, "k": 3, "lookup_tokens": 4, "versions": {"llama-cpp-python": "0.3", "torch": "2"},
              "fast_path": "codes", "load_average": {"start": [0.1, 0.1, 0.1], "end": [0.2, 0.2, 0.2]},
              "dram_triad_bytes_per_second": 20e9, "fast_streamed_weight_bytes": 115e6, "methods": methods,
              "llama_cpp_tokenizer_agrees": 2}
    text = "\n".join(bench.report(record))
    assert all(method in text for method in bench.METHODS)
    assert "Some CPU, 2 cores (avx512f)" in text and "20.0 GB/s" in text


# ------------------------------------------------------------------ the worker's protocol

@pytest.fixture
def fake_worker(tmp_path, monkeypatch):
    """The real worker script, run by this Python with the stand-in llama_cpp on its path."""
    package = tmp_path / "fake" / "llama_cpp"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_LLAMA_CPP)
    (package / "llama_speculative.py").write_text(FAKE_SPECULATIVE)
    shim = tmp_path / "python"  # the worker drops PYTHONPATH: a launcher that sets it
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'fake'} exec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    worker = bench.Worker(shim, tmp_path / "worker.log")
    yield worker, tmp_path / "worker.log"
    worker.close()


def test_worker_protocol_round_trip(fake_worker):
    worker, log = fake_worker
    assert worker.request("ping")["ok"]
    with pytest.raises(bench.WorkerError, match="before load"):
        worker.request("generate", method="plain", prompt_ids=[1], max_new_tokens=2)
    loaded = worker.request("load", model_path="/m.gguf", n_threads=2, n_ctx=256, lookup_tokens=3)
    assert loaded["llama_cpp_version"] == "0.0-fake" and loaded["model_size_bytes"] == 1234
    assert loaded["settings"]["lookup"] == {"num_pred_tokens": 3, "max_ngram_size": 2}
    plain = worker.request("generate", method="plain", prompt_ids=[5, 7], max_new_tokens=4)
    assert plain["ids"] == [8, 9, 10, 11] and plain["seconds"] >= 0
    assert worker.request("generate", method="lookup", prompt_ids=[7], max_new_tokens=2)["ids"] == [1008, 1009]
    assert worker.request("tokenize", text="ab")["ids"] == [97, 98]  # the stand-in: bytes
    for bad, message in [({"method": "beam"}, "method must be"), ({"prompt_ids": []}, "prompt_ids"),
                         ({"max_new_tokens": 0}, "max_new_tokens")]:
        fields = {"method": "plain", "prompt_ids": [1], "max_new_tokens": 1} | bad
        with pytest.raises(bench.WorkerError, match=message):
            worker.request("generate", **fields)
    with pytest.raises(bench.WorkerError, match="unknown op"):
        worker.request("train")
    assert worker.request("ping")["ok"]  # errors leave the worker serving
    worker.close()
    assert worker.process.returncode == 0
    assert "llama.cpp chatter on stdout" in log.read_text()  # sent to the log, not into the protocol


def test_a_worker_that_dies_is_reported(tmp_path):
    worker = bench.Worker(sys.executable, script=tmp_path / "missing_worker.py")
    with pytest.raises(bench.WorkerError, match="stopped"):
        worker.request("ping")
    worker.close()


def test_worker_checks_generate_requests_without_llama_cpp():
    assert worker_module.check_generate({"method": "lookup", "prompt_ids": [0, 3], "max_new_tokens": 1}) == \
        ("lookup", [0, 3], 1)
    with pytest.raises(ValueError):
        worker_module.check_generate({"method": "plain", "prompt_ids": [1], "max_new_tokens": True})
    assert json.loads(json.dumps(worker_module.handle({"op": "ping"}, {})))["ok"]


RECORDED_RUNS = sorted((REPO / "benchmarks" / "results").glob("llamacpp_vs_fast_*.json"))


@pytest.mark.parametrize("path", RECORDED_RUNS, ids=lambda path: path.stem)
def test_the_recorded_runs_read_without_llama_cpp(path):
    """Each committed run (docs/BENCHMARKS.md) carries what it was measured on, and its figures
    agree with its own per-prompt numbers."""
    assert len(RECORDED_RUNS) >= 2  # the Xeon's and the Zen 3's
    record = json.loads(path.read_text())
    assert record["command"].startswith("python benchmarks/llamacpp_vs_fast.py")
    assert record["date"] and record["machine"]["cpu"] and record["load_average"]["start"]
    assert record["versions"]["llama-cpp-python"] and record["versions"]["torch"]
    assert set(record["methods"]) == set(bench.METHODS)
    rates = {m: row["tokens_per_second_per_prompt"] for m, row in record["methods"].items()}
    per_token = {m: row["weight_bytes_per_token"] for m, row in record["methods"].items()}
    again = bench.summarize(rates, per_token, record["dram_triad_bytes_per_second"])
    for method, row in record["methods"].items():
        assert again[method]["ratio_to_llama.cpp"] == pytest.approx(row["ratio_to_llama.cpp"])
        assert again[method]["bandwidth_share"] == pytest.approx(row["bandwidth_share"])
        plain = record["outputs"][bench.PLAIN[row["engine"]]]
        assert bench.count_equal(record["outputs"][method], plain) == row["identical_to_own_plain"]
    assert len(bench.report(record)) == 6 + len(bench.METHODS)


def test_no_compile_leaves_out_the_compiled_engine_only():
    parser = bench.build_parser()  # parse_args would also ask for .venv-llamacpp
    assert parser.parse_args(["--no-compile"]).no_compile and not parser.parse_args([]).no_compile
    assert bench.methods_run(compiled=True) == list(bench.METHODS)
    without = bench.methods_run(compiled=False)
    assert without == [m for m in bench.METHODS if bench.METHODS[m][0] != "compiled"]
    assert {bench.METHODS[m][0] for m in without} == {"llama.cpp", "fast"}
