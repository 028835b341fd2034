"""The benchmark harness and CLI, on small random models saved to disk and loaded back."""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from factories import build, noisy_copy
from specdec_ref import bench, roofline
from specdec_ref.kernels import build as kernel_build

PROMPTS = ["def decode(self, s):\n    ", "class JSONDecoder(object):\n", "    return  x + 123  # naïve\n"]


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, tokenizer_a, tokenizer_b):
    """target / same-tokenizer draft / cross-tokenizer draft, saved with their tokenizers."""
    root = tmp_path_factory.mktemp("models")
    target = build("llama", 64, 2, seed=0)
    models = {"target": (target, tokenizer_a), "draft": (noisy_copy(target, 0.05, seed=1), tokenizer_a),
              "draft-xtok": (build("llama", 32, 1, seed=5, vocab=tokenizer_b.vocab_size), tokenizer_b)}
    for name, (model, tokenizer) in models.items():
        model.save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
    return {name: str(root / name) for name in models}


@pytest.mark.parametrize("draft", ["draft", "draft-xtok", "ngram"])
def test_run_reports_every_method_and_checks_outputs(saved_models, draft, tmp_path):
    pair = bench.load_pair(saved_models["target"], saved_models.get(draft, draft))
    assert pair.cross_tokenizer == (draft == "draft-xtok") and pair.prompt_lookup == (draft == "ngram")
    prompts = bench.repetition_prompts(PROMPTS) if draft == "ngram" else PROMPTS
    summary = bench.run(pair, prompts, ks=[1, 3], max_new_tokens=16, progress=False)
    assert summary.prompts == 3 and [c.k for c in summary.configs] == [1, 3]
    assert summary.baseline.tokens_per_second > 0 and summary.baseline.bandwidth_achieved > 0
    assert len(summary.baseline.seconds) == 3 and all(len(ids) == 16 for ids in summary.baseline.new_token_ids)
    for config in summary.configs:
        assert set(config.methods) == {"speculative", "hf_assisted"} and config.dynamic_drafts is None
        assert all(method.identical_outputs is True and len(method.seconds) == 3 for method in config.methods.values())
        assert 0 <= config.drafts.acceptance_rate <= 1
        assert len(config.drafts.accepted_histogram) == config.k + 1
        assert sum(config.drafts.accepted) <= sum(config.drafts.drafted) and len(config.drafts.drafted) == 3
        assert config.predicted_speedup > 0 and config.speculative.speedup > 0
        assert config.predicted_speedup_from_tau > 0
        assert config.speed_check.ratio == config.speculative.speedup and config.speed_check.pairs == 3
        # the runs' own costs: prompt lookup runs no draft pass; the prediction is the model's formula on them
        c_run, v_run = config.in_run_cost_ratio, config.in_run_verify_cost
        assert (c_run == 0) == (draft == "ngram") and v_run > 0
        assert config.predicted_speedup_in_run == pytest.approx(
            roofline.expected_speedup(config.drafts.acceptance_probability, config.k, c_run, v_run))
        assert set(config.time_split_seconds) == {"prefill", "draft", "verify", "bookkeeping"}
    costs = summary.cost_model
    assert (costs.cost_ratio == 0) == (draft == "ngram") and set(costs.verify_costs) == {1, 3}
    written = json.loads(json.dumps(summary.to_json()))
    assert written["best_k"] == summary.best.k
    assert written["configs"][1]["methods"]["speculative"]["speedup"] == summary.configs[1].speculative.speedup
    assert written["configs"][0]["speed_check"]["verdict"] == summary.configs[0].speed_check.verdict
    bench.plot(summary, str(tmp_path / "bench.png"))
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"


def test_dynamic_drafting_is_benchmarked_beside_fixed_k(saved_models, tmp_path):
    pair = bench.load_pair(saved_models["target"], saved_models["draft"])
    summary = bench.run(pair, PROMPTS, ks=[4], max_new_tokens=16, hf_assisted=False, progress=False,
                        min_draft_confidence=0.9)
    config = summary.configs[0]
    assert config.methods["speculative_dynamic"].identical_outputs is True
    assert config.methods["speculative_dynamic"].speedup > 0
    dynamic = config.dynamic_drafts
    assert summary.min_draft_confidence == 0.9
    assert dynamic.drafted_per_iteration < 4  # the 0.9 bar stops drafts early
    assert dynamic.draft_forward_calls_per_iteration == pytest.approx(dynamic.drafted_per_iteration)
    assert 0 <= dynamic.acceptance_rate <= dynamic.acceptance_probability <= 1
    bench.plot(summary, str(tmp_path / "dynamic.png"))
    assert (tmp_path / "dynamic.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="needs a draft model"):
        bench.run(bench.load_pair(saved_models["target"], "ngram"), PROMPTS, ks=[2], min_draft_confidence=0.5)


def test_cli_writes_json_and_plot(saved_models, tmp_path):
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--target", saved_models["target"], "--draft",
         saved_models["draft"], "--k", "2", "--prompts", "2", "--max-new-tokens", "8", "--no-hf",
         "--json", str(tmp_path / "out.json"), "--plot", str(tmp_path / "out.png")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "out.json").read_text())
    assert summary["configs"][0]["k"] == 2 and set(summary["configs"][0]["methods"]) == {"speculative"}
    assert summary["target"] == saved_models["target"] and summary["dram_bandwidth"] > 0
    assert (tmp_path / "out.png").exists()
    assert "identical True" in result.stdout


def test_cli_rejects_bad_k(saved_models):
    result = subprocess.run([sys.executable, "-m", "specdec_ref", "bench", "--target", saved_models["target"],
                             "--draft", saved_models["draft"], "--k", "0,2"], capture_output=True, text=True)
    assert result.returncode != 0 and "every k must be >= 1" in result.stderr


@pytest.mark.slow
def test_demo_runs_on_the_shipped_zoo(tmp_path):
    """README's main command, shortened: streams, benchmarks, checks identity, writes the figure."""
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "demo", "--prompts", "2", "--max-new-tokens", "24",
         "--showcase-tokens", "24", "--plot", str(tmp_path / "demo.png")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    for line in ("SmolLM2-135M-Instruct with its EAGLE draft head", "with the EAGLE head",
                 "identical output: yes", "health check: ", "baseline (target alone)", "speculative (specdec_ref)", "dynamic k <= 4", "transformers assisted",
                 "acceptance rate", "predicted speedup", "bandwidth achieved",
                 "outputs identical to the target's greedy decoding: yes",
                 "eager vs fast on 2 prompts", "speculative k=4", "best k for the fast path = 4",
                 "fast outputs identical to the eager greedy decoding: yes"):
        assert line in result.stdout, line
    assert (tmp_path / "demo.png").read_bytes()[:4] == b"\x89PNG"
    # one DRAM figure per report: the roofline's and the fast path's (measured twice, they differed 2x)
    triads = re.findall(r"DRAM triad ([0-9.]+) GB/s", result.stdout)
    assert len(triads) == 2 and triads[0] == triads[1], triads
    if kernel_build.has_vector_units(kernel_build.cpu_flags()):  # the showcase runs SmolLM2 on its GGUF codes
        assert "k=2, greedy, on Q4_1-coded weights (210 of 211 linear layers)" in result.stdout


@pytest.mark.slow
def test_demo_runs_on_the_real_pair(tmp_path):
    """demo --pair real: SmolLM2-135M-Instruct and its distilled draft, shortened."""
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "demo", "--pair", "real", "--prompts", "1", "--max-new-tokens", "12",
         "--showcase-tokens", "0", "--no-hf", "--min-confidence", "0", "--fast-prompts", "0", "--plot", str(tmp_path / "real.png")],
        capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr
    assert "target: zoo:smollm2, 134.5M params; draft: zoo:smollm2-draft" in result.stdout
    assert "outputs identical to the target's greedy decoding: yes" in result.stdout


def test_cli_rejects_min_confidence_without_a_draft_model(saved_models):
    result = subprocess.run([sys.executable, "-m", "specdec_ref", "bench", "--target", saved_models["target"],
                             "--draft", "ngram", "--k", "2", "--prompts", "1", "--min-confidence", "0.4"],
                            capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode != 0 and "error: min_draft_confidence needs a draft model" in result.stderr


def test_every_cli_option_has_a_help_line():
    from specdec_ref.__main__ import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, sub in commands.items():
        for action in sub._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and "\n" not in action.help, f"{name} {action.option_strings[0]} has no help"


def test_prompts_file_reads_lines_and_chat_jsonl(tmp_path, tokenizer_a):
    from specdec_ref.__main__ import read_prompts_file

    text = tmp_path / "prompts.txt"
    text.write_text("def add(a, b):\n\n   class Stack:\n")
    assert read_prompts_file(text, tokenizer_a) == ["def add(a, b):", "   class Stack:"]
    tokenizer_a.chat_template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}" \
                                "{% if add_generation_prompt %}<assistant>{% endif %}"
    chat = tmp_path / "prompts.jsonl"
    chat.write_text('{"prompt": "import os"}\n{"messages": [{"role": "user", "content": "hi"}]}\n')
    assert read_prompts_file(chat, tokenizer_a) == ["import os", "<user>hi<assistant>"]
    for body, message in [('{"prompt": "a"}\n{"messages": [\n', ":2: not valid JSON"),
                          ('{"text": "a"}\n', ':1: expected {"prompt": "..."}'),
                          ("\n\n", "no prompts")]:
        chat.write_text(body)
        with pytest.raises(ValueError, match=message):
            read_prompts_file(chat, tokenizer_a)
    tokenizer_a.chat_template = None
    chat.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    with pytest.raises(ValueError, match="has no chat template"):
        read_prompts_file(chat, tokenizer_a)
    with pytest.raises(ValueError, match="not found"):
        read_prompts_file(tmp_path / "missing.txt", tokenizer_a)


def test_cli_prompts_file_and_sampling(saved_models, tmp_path):
    """--prompts-file sets the prompts; --do-sample reports acceptance without claiming identity."""
    prompts = tmp_path / "p.txt"
    prompts.write_text("def f(x):\nclass A:\nimport sys\n")
    env = os.environ | {"HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--target", saved_models["target"], "--draft",
         saved_models["draft"], "--k", "2", "--prompts-file", str(prompts), "--max-new-tokens", "8",
         "--do-sample", "--temperature", "0.7", "--json", str(tmp_path / "s.json")],
        capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "s.json").read_text())
    config = summary["configs"][0]
    assert summary["prompts"] == 3 and summary["temperature"] == 0.7 and summary["prompts_file"] == str(prompts)
    assert [method["identical_outputs"] for method in config["methods"].values()] == [None, None]
    assert 1 < config["drafts"]["drafted_per_iteration"] <= 2 and 0 <= config["drafts"]["acceptance_rate"] <= 1
    assert len(config["drafts"]["accepted"]) == 3 and all(len(ids) == 8 for ids in summary["baseline"]["new_token_ids"])
    assert "exact in distribution" in result.stdout and "identical" not in result.stdout.split("exact")[1]
    assert "ms/token" in result.stdout and "DRAM triad measured here" in result.stdout
    bad = subprocess.run([sys.executable, "-m", "specdec_ref", "bench", "--temperature", "0.7"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode != 0 and "--temperature needs --do-sample" in bad.stderr


def test_sampled_runs_repeat_with_the_same_seed(saved_models):
    pair = bench.load_pair(saved_models["target"], saved_models["draft"])
    runs = [bench.run(pair, PROMPTS[:2], ks=[3], max_new_tokens=12, hf_assisted=False, progress=False,
                      temperature=1.0, seed=seed) for seed in (5, 5, 6)]
    accepted = [run.configs[0].drafts.accepted for run in runs]
    assert accepted[0] == accepted[1]  # same seed, same draws
    with pytest.raises(ValueError, match="temperature must be > 0"):
        bench.run(pair, PROMPTS[:1], ks=[2], temperature=0.0)


def test_a_padded_draft_runs_natively_and_transformers_says_why_it_will_not(saved_models):
    """A draft whose embedding has spare rows shares the target's tokenizer: our loop cuts its logits
    and drafts natively; transformers decides by vocabulary size and asks for the tokenizers."""
    pair = bench.load_pair(saved_models["target"], saved_models["draft"])
    pair.draft.resize_token_embeddings(pair.draft.config.vocab_size + 8, mean_resizing=False)
    pair = bench.Pair(pair.target, pair.draft, pair.target_tokenizer, pair.draft_tokenizer)
    assert not pair.cross_tokenizer and not pair.prompt_lookup
    assert type(pair.drafter).__name__ == "ModelDrafter"
    assert pair.drafter.vocab_size == pair.target.config.vocab_size
    ids = pair.target_tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with pytest.raises(ValueError, match="assistant_tokenizer"):
        bench.hf_assisted_generate(pair, ids, k=2, max_new_tokens=4)
