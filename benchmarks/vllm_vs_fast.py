"""vLLM's CPU server against the reference (eager and fast) on the same pair and prompts, greedy.

    python benchmarks/vllm_vs_fast.py                      # zoo:target + zoo:draft, 8 prompts, k = 4
    python benchmarks/vllm_vs_fast.py --prompts 4 --k 4 --json out/vllm_vs_fast.json
    python benchmarks/vllm_vs_fast.py --compile            # the fast reference compiled as well
    python benchmarks/vllm_vs_fast.py --vllm-eager         # vLLM without torch.compile: a check, not a race

Two servers run one after the other, float32 like the reference: plain decoding, then
draft-model speculation with k drafts per step. While a server is up, every prompt is
sent to it and decoded by the reference (eager model and ``specdec_ref.kernels.fast.prepare``d
model) in the same process, interleaved prompt by prompt with the order alternating, so
a change in machine load hits every method alike. Each request makes exactly
``--max-new-tokens`` tokens (EOS ignored); tokens/s counts the whole request, prefill
included, and vLLM's also includes its HTTP round trip and streaming (a few milliseconds
per request on loopback). The server stays idle, not stopped, while the reference runs.
Token ids are compared: vLLM, eager and fast should all produce the eager greedy output.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from specdec_ref import autoregressive_generate, speculative_generate, zoo
from specdec_ref.kernels import fast
from specdec_ref.vllm import VLLMServer, course_vllm_venv, cpu_env, venv_launcher
from specdec_ref.zoo.corpus import heldout_prompts

REPO = Path(__file__).resolve().parents[1]
API_KEY = "specdec-bench-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def compare(target: str, draft: str, venv: Path, prompts: list[str], k: int, max_new_tokens: int,
            log_dir: Path, compile: bool = False, vllm_eager: bool = False) -> dict:
    """Time vLLM and the reference on every prompt, for plain decoding and for draft-model speculation.
    ``compile``: the fast reference is ``fast.prepare(..., compile=True)`` (compiled during the warm-up).
    ``vllm_eager``: the servers run with ``--enforce-eager`` (no torch.compile while they start: about
    a minute less per server on a CPU, and slower decoding, so their tokens/s do not stand for vLLM's)."""
    target_model, tokenizer = zoo.load(target)
    draft_model, _ = zoo.load(draft)
    reference = {"eager": (target_model, draft_model),
                 "fast": (fast.prepare(target_model, compile=compile), fast.prepare(draft_model, compile=compile))}
    prompt_ids = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]

    def run_reference(version: str, ids: torch.LongTensor, speculative: bool) -> tuple[list[int], float]:
        model, drafter = reference[version]
        start = time.perf_counter()
        if speculative:
            out = speculative_generate(model, drafter, ids, max_new_tokens, k, eos_token_id=[])
        else:
            out = autoregressive_generate(model, ids, max_new_tokens, eos_token_id=[])
        return out.sequences[0, ids.shape[1]:].tolist(), time.perf_counter() - start

    results, outputs = {}, {}
    env = cpu_env(venv, kv_cache_gib=1)  # the course's compile cache: a second run skips compilation
    for method in (None, "draft_model"):
        label = "speculative" if method else "baseline"
        settings = {"method": "draft_model", "draft": draft, "num_speculative_tokens": k} if method else {"method": None}
        with VLLMServer.launch(target, **settings, api_key=API_KEY, port=free_port(), dtype="float32",
                               launcher=venv_launcher(venv), env=env, log_path=log_dir / f"{label}.log",
                               extra_args=["--enforce-eager"] if vllm_eager else (),
                               startup_timeout=900, progress=False) as server:
            client = server.client()

            def run_vllm(ids: torch.LongTensor) -> tuple[list[int], float]:
                completion = client.complete(ids[0].tolist(), max_tokens=max_new_tokens, temperature=0.0,
                                             extra={"ignore_eos": True})
                return completion.token_ids, completion.total_seconds

            methods = {"vllm": run_vllm, "eager": lambda ids: run_reference("eager", ids, bool(method)),
                       "fast": lambda ids: run_reference("fast", ids, bool(method))}
            for fn in methods.values():  # warm-up: a server's first requests are slow, kernels initialise
                fn(prompt_ids[0])
            runs = {name: [] for name in methods}
            for i, ids in enumerate(prompt_ids):
                order = list(methods) if i % 2 == 0 else list(reversed(methods))
                for name in order:
                    runs[name].append(methods[name](ids))
        outputs[label] = {name: [ids for ids, _ in r] for name, r in runs.items()}
        rates = {name: [max_new_tokens / seconds for _, seconds in r] for name, r in runs.items()}
        results[label] = {"server_startup_seconds": server.startup_seconds} | {
            name: {"tokens_per_second": statistics.median(tps), "tokens_per_second_range": [min(tps), max(tps)]}
            for name, tps in rates.items()}
    expected = outputs["baseline"]["eager"]
    for label, by_method in outputs.items():
        for name, ids in by_method.items():
            results[label][name]["identical_to_eager_baseline"] = sum(a == b for a, b in zip(ids, expected))
    return {"target": target, "draft": draft, "k": k, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
            "fast_path": fast.path_name(reference["fast"][0]), "vllm_compiled": not vllm_eager,
            "threads": torch.get_num_threads(), "load_average": os.getloadavg()} | results


def report(summary: dict) -> list[str]:
    """Lines that show :func:`compare`'s summary."""
    n = summary["prompts"]
    lines = [f"{summary['target']} + {summary['draft']}, greedy, {summary['max_new_tokens']} new tokens, {n} prompts, "
             f"k = {summary['k']}, fast path: {summary['fast_path']}, reference threads {summary['threads']}, "
             "load average at the end "
             + ", ".join(f"{x:.1f}" for x in summary["load_average"]),
             "tokens/s, medians per request (range); vLLM's include its HTTP round trip and streaming"
             + ("" if summary["vllm_compiled"] else "; vLLM ran without torch.compile (--enforce-eager), "
                "so its figures are not its best")]
    for label in ("baseline", "speculative"):
        row = summary[label]
        cells = [f"{name} {row[name]['tokens_per_second']:6.1f} ({row[name]['tokens_per_second_range'][0]:.0f}-"
                 f"{row[name]['tokens_per_second_range'][1]:.0f}, identical {row[name]['identical_to_eager_baseline']}/{n})"
                 for name in ("vllm", "eager", "fast")]
        lines.append(f"{label:12s} " + "   ".join(cells)
                     + f"   fast/vLLM {row['fast']['tokens_per_second'] / row['vllm']['tokens_per_second']:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="zoo:target", help="target model: zoo name, local folder or Hub id")
    parser.add_argument("--draft", default="zoo:draft", help="draft model for speculation (same tokenizer)")
    parser.add_argument("--prompts", type=int, default=8, help="how many held-out course prompts to time")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per speculative iteration")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--venv", type=Path, default=course_vllm_venv(),
                        help="vLLM's environment (scripts/setup_vllm_env.sh makes .venv-vllm)")
    parser.add_argument("--json", help="also write the summary to this JSON file")
    parser.add_argument("--compile", action="store_true", help="compile the fast reference as well (torch.compile)")
    parser.add_argument("--vllm-eager", action="store_true",
                        help="start vLLM with --enforce-eager: quicker starts, slower decoding (for checks)")
    args = parser.parse_args(argv)
    if not (args.venv / "bin" / "python").exists():
        sys.exit(f"error: no vLLM environment at {args.venv}: run scripts/setup_vllm_env.sh first")
    with tempfile.TemporaryDirectory(prefix="vllm-vs-fast-") as tmp:
        summary = compare(args.target, args.draft, args.venv, heldout_prompts(args.prompts), args.k,
                          args.max_new_tokens, Path(tmp), compile=args.compile, vllm_eager=args.vllm_eager)
    print("\n".join(report(summary)))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2))
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
