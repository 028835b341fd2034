"""SmolLM2's eager target pass over a few tokens, stock linear layers against weights-first ones, paired.

    python benchmarks/eager_linear_forms.py
    python benchmarks/eager_linear_forms.py --model zoo:target --rounds 15 --json out/forms.json

One process holds both versions of the model (sharing their weights): PyTorch's stock
``nn.Linear`` (x @ Wᵀ) and :mod:`specdec_ref.kernels.weights_first` (W @ xᵀ, a few rows padded to an
even count). Every round times a pass of n tokens on a ``--context``-token KV cache for every n
and both forms back to back, the form that goes first alternating; one warm-up round is
discarded. Printed per n: the median milliseconds and their interquartile range, the bandwidth
achieved (weight bytes / median time, as gpt-fast reports it), v(n - 1) = time of n tokens /
time of one token of the same form, and stock / weights-first (the median of paired ratios).
The ratio is what carries over between runs; absolute times depend on the CPU and its load.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec_ref import roofline
from specdec_ref.kv_cache import new_cache, rollback
from specdec_ref.timing import quartiles, threads_for_timing
from specdec_ref.vllm.recorded import cpu_model as cpu_name
from specdec_ref.kernels.weights_first import weights_first
from specdec_ref.zoo import load


@torch.inference_mode()
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="zoo:smollm2", help="a zoo name or model folder")
    parser.add_argument("--context", type=int, default=120, help="tokens already in the KV cache")
    parser.add_argument("--max-tokens", type=int, default=5, help="time passes of 1 to this many tokens")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (after one warm-up round)")
    parser.add_argument("--json", help="write the figures to this path")
    args = parser.parse_args()

    stock, _ = load(args.model)
    forms = {"stock": stock, "weights-first": weights_first(stock)}
    print(threads_for_timing())
    ids = torch.randint(0, stock.config.vocab_size, (1, args.context + args.max_tokens),
                        generator=torch.Generator().manual_seed(0))
    caches = {}
    for name, model in forms.items():
        caches[name] = new_cache(model)
        model(ids[:, : args.context], past_key_values=caches[name], use_cache=True, logits_to_keep=1)
    sizes = range(1, args.max_tokens + 1)
    seconds = {(name, n): [] for name in forms for n in sizes}
    for round_ in range(args.rounds + 1):
        for n in sizes:
            for name in (forms if round_ % 2 else reversed(forms)):
                start = time.perf_counter()
                forms[name](ids[:, args.context: args.context + n], past_key_values=caches[name], use_cache=True)
                elapsed = time.perf_counter() - start
                rollback(caches[name], args.context)
                if round_:
                    seconds[name, n].append(elapsed)

    weight_bytes = roofline.weight_bytes(stock)
    print(f"{args.model} ({weight_bytes / 1e6:.0f} MB of fp32 weights), {cpu_name()}, {torch.get_num_threads()} "
          f"torch threads, {args.context} cached tokens, {args.rounds} rounds")
    print(f"{'tokens':>6s}  {'stock ms (IQR)':>20s} {'GB/s':>5s} {'v':>5s}  {'weights-first ms (IQR)':>24s} "
          f"{'GB/s':>5s} {'v':>5s}  stock / weights-first (IQR)")
    rows = []
    for n in sizes:
        row = {"tokens": n}
        for name in forms:
            times = seconds[name, n]
            row[name] = {"ms": 1e3 * statistics.median(times), "ms_iqr": [1e3 * q for q in quartiles(times)],
                         "bandwidth_gb_s": weight_bytes / statistics.median(times) / 1e9,
                         "v": statistics.median(t / one for t, one in zip(times, seconds[name, 1]))}
        ratios = [a / b for a, b in zip(seconds["stock", n], seconds["weights-first", n])]
        row["stock_over_weights_first"] = statistics.median(ratios)
        row["ratio_iqr"] = list(quartiles(ratios))
        rows.append(row)
        s, w = row["stock"], row["weights-first"]
        print(f"{n:6d}  {s['ms']:7.1f} ({s['ms_iqr'][0]:5.1f}-{s['ms_iqr'][1]:5.1f}) {s['bandwidth_gb_s']:5.1f} "
              f"{s['v']:5.2f}  {w['ms']:11.1f} ({w['ms_iqr'][0]:5.1f}-{w['ms_iqr'][1]:5.1f}) "
              f"{w['bandwidth_gb_s']:5.1f} {w['v']:5.2f}  {row['stock_over_weights_first']:.2f}x "
              f"({row['ratio_iqr'][0]:.2f}-{row['ratio_iqr'][1]:.2f})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"model": args.model, "cpu": cpu_name(),
                                               "threads": torch.get_num_threads(), "context": args.context,
                                               "rounds": args.rounds, "weight_bytes": weight_bytes,
                                               "rows": rows}, indent=2) + "\n")
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
