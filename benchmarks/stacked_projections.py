"""SmolLM2's fast decode step with q/k/v and gate/up read in one kernel call each, against one call
per layer, paired step by step.

    python benchmarks/stacked_projections.py             # the fast path as bench --fast runs it
    python benchmarks/stacked_projections.py --compile   # compiled (several minutes of compilation first)

Two copies of ``fast.prepare(zoo:smollm2)``, one with ``gguf.StackedCodes`` (the default) and one
without, decode the same prompt greedily, called in turns: each step of one is timed next to the
same step of the other, the order alternating, so a busy moment slows both. Prints each copy's
median step, the median of the per-step ratios with its interquartile range, and whether the two
decoded the same tokens.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specdec_ref import zoo  # noqa: E402
from specdec_ref.kernels import fast, gguf  # noqa: E402
from specdec_ref.kv_cache import new_cache  # noqa: E402
from specdec_ref.timing import threads_for_timing  # noqa: E402

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
def paired_steps(models: dict[str, torch.nn.Module], ids: torch.Tensor, rounds: int, steps: int):
    """Per-step seconds and the tokens chosen, for each model; the models step in turns."""
    seconds = {name: [] for name in models}
    tokens = {name: [] for name in models}
    names = list(models)
    for _ in range(rounds + 1):  # the first round warms up (and compiles) and is not kept
        caches = {name: new_cache(model) for name, model in models.items()}
        logits = {name: model(ids, past_key_values=caches[name], use_cache=True, logits_to_keep=1).logits[0, -1]
                  for name, model in models.items()}
        for step in range(steps):
            for name in (names if step % 2 else names[::-1]):
                token = logits[name].argmax().view(1, 1)
                start = time.perf_counter()
                logits[name] = models[name](token, past_key_values=caches[name], use_cache=True,
                                            logits_to_keep=1).logits[0, -1]
                seconds[name].append(time.perf_counter() - start)
                tokens[name].append(int(token))
    return {n: s[steps:] for n, s in seconds.items()}, {n: t[steps:] for n, t in tokens.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compile", action="store_true", help="compile both copies (fast.prepare(compile=True))")
    parser.add_argument("--rounds", type=int, default=8, help="decodes of the prompt per copy (default 8)")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per round (default 64)")
    args = parser.parse_args()
    found = threads_for_timing()
    model, tokenizer = zoo.load("zoo:smollm2")
    models = {"one call per layer": prepared(model, False, args.compile),
              "stacked": prepared(model, True, args.compile)}
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    seconds, tokens = paired_steps(models, ids, args.rounds, args.steps)
    ratios = [a / b for a, b in zip(seconds["one call per layer"], seconds["stacked"])]
    low, _, high = statistics.quantiles(ratios, n=4)
    print(f"SmolLM2 decode step on {fast.path_name(models['stacked'])}, {args.rounds} x {args.steps} steps per copy; "
          f"{found}")
    for name, values in seconds.items():
        print(f"  {name:20s} median {1e3 * statistics.median(values):.2f} ms")
    print(f"  one call per layer / stacked, per step: {statistics.median(ratios):.3f}x (IQR {low:.3f}-{high:.3f}); "
          f"same tokens: {tokens['stacked'] == tokens['one call per layer']}")


if __name__ == "__main__":
    main()
