"""The real pair, SmolLM2-135M-Instruct + zoo:smollm2-draft, benchmarked by prompt kind.

    python benchmarks/smollm2_pair.py                       # 6 held-out prompts per kind, k = 3,4,6
    python benchmarks/smollm2_pair.py --per-kind 4 --k 4 --json out/smollm2_pair.json

One ``bench.run`` over prose, code and chat prompts interleaved (greedy, EOS ignored, so
every method makes exactly ``--max-new-tokens`` tokens): our baseline, our speculative
loop and transformers' assisted generation at each k, prompt by prompt after a warm-up.
Then, per kind: the draft's acceptance rate at each k (accepted / drafted over the kind's
prompts), the median speedup, and how many baseline generations end in a loop. Overall:
speedup at the best k against the baseline and against transformers at the same k, the
prediction from measured a, c and v(k), the target's per-token latency and its bandwidth
achieved against this machine's measured DRAM bandwidth.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from specdec_ref import bench
from specdec_ref.stats import loop_period
from specdec_ref.zoo.prompts import KINDS, heldout_prompts, interleave


def by_kind(summary: bench.BenchResult, kinds: tuple[str, ...], tokenizer) -> dict:
    """Acceptance, speedups and loops of each prompt kind, from the per-prompt figures."""
    base = summary.baseline
    out = {}
    for kind in KINDS:
        rows = [i for i, name in enumerate(kinds) if name == kind]
        texts = [tokenizer.decode(base.new_token_ids[i]) for i in rows]
        entry = {"prompts": len(rows), "looping": sum(loop_period(t, tail=80) is not None for t in texts)}
        for config in summary.configs:
            drafts, seconds = config.drafts, config.speculative.seconds
            entry[f"k={config.k}"] = {
                "acceptance_rate": sum(drafts.accepted[i] for i in rows) / max(1, sum(drafts.drafted[i] for i in rows)),
                "speedup": statistics.median(base.seconds[i] / seconds[i] for i in rows),
            }
        out[kind] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-kind", type=int, default=6, help="held-out prompts of each kind")
    parser.add_argument("--k", default="3,4,6", help="comma-separated draft lengths")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    parser.add_argument("--json", help="write the summary and the per-kind figures to this path")
    args = parser.parse_args()

    pair = bench.load_pair("zoo:smollm2", "zoo:smollm2-draft")
    kinds, texts = zip(*interleave(heldout_prompts(pair.target_tokenizer, per_kind=args.per_kind)))
    ks = [int(k) for k in args.k.split(",")]
    summary = bench.run(pair, list(texts), ks, args.max_new_tokens, hf_assisted=not args.no_hf)
    dram = bench.dram_bandwidth()
    kind_figures = by_kind(summary, kinds, pair.target_tokenizer)

    base = summary.baseline
    n_target = sum(p.numel() for p in pair.target.parameters())
    n_draft = sum(p.numel() for p in pair.draft.parameters())
    print(f"target zoo:smollm2 {n_target / 1e6:.1f}M, draft zoo:smollm2-draft {n_draft / 1e6:.1f}M "
          f"(1/{n_target / n_draft:.1f}); {len(texts)} prompts, {args.max_new_tokens} new tokens, greedy, "
          f"{torch.get_num_threads()} threads")
    print(f"baseline {base.tokens_per_second:.1f} tokens/s = {1e3 / base.tokens_per_second:.1f} ms/token; "
          f"bandwidth achieved {base.bandwidth_achieved / 1e9:.2f} GB/s = "
          f"{base.bandwidth_achieved / dram:.0%} of {dram / 1e9:.1f} GB/s "
          f"(DRAM triad here; bound {summary.target_weight_bytes / dram * 1e3:.1f} ms/token)")
    costs = summary.cost_model
    print(f"c = {costs.cost_ratio:.3f}; v(k) = " + ", ".join(f"{k}: {v:.2f}" for k, v in costs.verify_costs.items()))
    for config in summary.configs:
        spec, assisted = config.speculative, config.methods.get("hf_assisted")
        hf = (f"; transformers {assisted.speedup:.2f}x, ours/transformers "
              f"{statistics.median(h / s for h, s in zip(assisted.seconds, spec.seconds)):.2f}x" if assisted else "")
        print(f"k={config.k}: speedup {spec.speedup:.2f}x (predicted {config.predicted_speedup:.2f}x "
              f"from a = {config.drafts.acceptance_probability:.3f}){hf}; acceptance {config.drafts.acceptance_rate:.3f}, "
              f"tau {config.drafts.tokens_per_target_pass:.2f}; identical {spec.identical_outputs}")
    for kind, entry in kind_figures.items():
        print(f"  {kind:5s} ({entry['prompts']} prompts, {entry['looping']} loop): " + "; ".join(
            f"{k} acceptance {v['acceptance_rate']:.3f} speedup {v['speedup']:.2f}x"
            for k, v in entry.items() if k.startswith("k=")))
    print(f"best k = {summary.best.k}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        written = summary.to_json() | {"dram_bandwidth": dram, "by_kind": kind_figures}
        Path(args.json).write_text(json.dumps(written, indent=2))
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
