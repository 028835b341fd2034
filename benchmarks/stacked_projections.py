"""SmolLM2's fast decode step with q/k/v and gate/up read in one kernel call each, against one call
per layer, paired.

    python benchmarks/stacked_projections.py             # the fast path as bench --fast runs it
    python benchmarks/stacked_projections.py --compile   # compiled (several minutes of compilation first)

Two copies of ``fast.prepare(zoo:smollm2)``, one with ``gguf.StackedCodes`` (the default) and one
without, each run one decode step on the same cache (``timing.last_token_step``), timed in
alternating pairs (``timing.time_paired``), so a busy moment slows both. Prints each copy's median
step, the median of the per-pair ratios with its interquartile range, and whether the two copies'
logits are bit for bit the same.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specdec_ref import zoo  # noqa: E402
from specdec_ref.kernels import fast, gguf  # noqa: E402
from specdec_ref.kv_cache import new_cache  # noqa: E402
from specdec_ref.timing import last_token_step, threads_for_timing, time_paired  # noqa: E402

PROMPT = "The history of the printing press begins"


def prepared(model: torch.nn.Module, stacked: bool, compile: bool) -> torch.nn.Module:
    stack = gguf.stack_projections
    if not stacked:
        gguf.stack_projections = lambda module: 0
    try:
        return fast.prepare(model, compile=compile)
    finally:
        gguf.stack_projections = stack


@torch.inference_mode()
def step_logits(model: torch.nn.Module, ids: torch.LongTensor) -> torch.Tensor:
    cache = new_cache(model)
    model(ids[:, :-1], past_key_values=cache, use_cache=True)
    return model(ids[:, -1:], past_key_values=cache, use_cache=True).logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="compile both copies (fast.prepare(compile=True))")
    parser.add_argument("--pairs", type=int, default=200, help="timed pairs of steps (default 200)")
    args = parser.parse_args()
    found = threads_for_timing()
    model, tokenizer = zoo.load("zoo:smollm2")
    separate, stacked = prepared(model, False, args.compile), prepared(model, True, args.compile)
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.inference_mode():
        timing = time_paired(last_token_step(separate, ids), last_token_step(stacked, ids), warmup=3,
                             repeats=args.pairs)
    low, high = timing["ratio_spread"]
    print(f"SmolLM2 decode step on {fast.path_name(stacked)}, {args.pairs} pairs; {found}")
    print(f"  one call per layer   median {1e3 * timing['median_seconds_a']:.2f} ms")
    print(f"  stacked              median {1e3 * timing['median_seconds_b']:.2f} ms")
    print(f"  one call per layer / stacked: {timing['median_ratio']:.3f}x (IQR {low:.3f}-{high:.3f}); "
          f"same logits: {torch.equal(step_logits(separate, ids), step_logits(stacked, ids))}")


if __name__ == "__main__":
    main()
