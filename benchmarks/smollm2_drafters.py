"""SmolLM2-135M-Instruct with three drafters, by prompt kind, in one paired run.

    python benchmarks/smollm2_drafters.py                      # 4 held-out prompts per kind, k = 2,3,4
    python benchmarks/smollm2_drafters.py --per-kind 2 --k 3 --json out/drafters.json
    python benchmarks/smollm2_drafters.py --fast               # everything on specdec_ref.kernels.fast's kernels
    python benchmarks/smollm2_drafters.py --fast --k 2,4 --eagle-min-confidence 0.5   # also the head, stopping early
    python benchmarks/smollm2_drafters.py --fast --eagle zoo:smollm2-eagle --eagle RUN/smollm2-eagle  # two heads, paired
    python benchmarks/smollm2_drafters.py --fast --k 2,3 --eagle-first-candidates 2   # also a tree: 2 first drafts

Drafters: the EAGLE head (``zoo:smollm2-eagle``, reads SmolLM2's features; its draft cost c
is also measured without its draft vocabulary), the distilled 16M draft model
(``zoo:smollm2-draft``) and prompt lookup (n-grams of the context). Prompts
are held out from both drafts' training (no shared topic, task or source file), prose, code
and chat interleaved. Every prompt runs the baseline and every drafter at every k, greedy,
EOS ignored (so each run makes exactly ``--max-new-tokens`` tokens), the order reversed on
every other prompt, after one warm-up of each. Reported per kind and k: acceptance rate
(accepted / drafted), tokens per target pass (tau), the median of per-prompt speedups over
the baseline, and whether every output equals the baseline's. For the EAGLE head, also the
acceptance rate by draft position. For every drafter, the cost model's prediction from the
measured a (or tau), c and v(k), set beside the measured speedup, twice: with c and v(k) from
isolated passes timed after the runs (``specdec_ref.costs``), and with c and v as the runs
themselves paid them, in their baselines' decode step (``specdec_ref.paired.in_run_costs``;
the machine's speed drifts during a long run, which the first cannot follow). The in-run
prediction is also made prompt by prompt, from each prompt's own tau and costs, and the median of
those is set beside the measured median, once more with the prefill both runs pay, which the
cost model leaves out (the JSON keeps every prompt's figures). With ``--fast``
the target, the distilled draft and the head run on :func:`specdec_ref.kernels.fast.prepare`'s kernels
(SmolLM2 on its GGUF codes), and the baseline is that fast SmolLM2. ``--eagle-min-confidence P`` adds the head
once more, ending each draft after a token it gives less than probability P (at most k drafts).
``--eagle-first-candidates M`` adds the head once more, proposing its best M tokens for the
first position (the chain goes on from the best; a tree of k + M - 1 drafts, verified in one
pass and predicted from its tau with v(k + M - 1)). ``--eagle HEAD`` (repeatable) names the
heads to run, a zoo name or a folder the recipe wrote: a retrained head set beside the shipped
one on the same prompts, in the same run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from specdec_ref import GenerationStats, PromptLookupDrafter, roofline
from specdec_ref.kernels import fast
from specdec_ref.bench import compare_drafters
from specdec_ref.costs import measure_costs
from specdec_ref.eagle import EagleDrafter
from specdec_ref.paired import in_run_costs
from specdec_ref.timing import threads_for_timing
from specdec_ref.vllm.recorded import cpu_model as cpu_name
from specdec_ref.zoo import load, load_eagle
from specdec_ref.zoo.prompts import KINDS, heldout_prompts, interleave


def predictions(total: GenerationStats, k: int, c: float, v: float, chain: bool) -> tuple[float | None, float]:
    """The cost model's speedup for draft cost c and verification cost v: from a (the i.i.d. model,
    which knows chains only: None for a tree) and from the measured tau and draft passes per iteration."""
    from_a = roofline.expected_speedup(total.acceptance_probability, k, c, v) if chain else None
    return from_a, from_tau(total, c, v)


def from_tau(stats: GenerationStats, c: float, v: float) -> float:
    """The cost model's speedup from the runs' measured tau and draft passes per iteration."""
    return roofline.speedup_from_tokens_per_pass(stats.tokens_per_target_pass, stats.draft_forward_calls_per_iteration, c, v)


def per_prompt(base: dict, run: dict) -> dict:
    """One prompt's speedup and tau, the prediction from its own tau and the costs its two runs
    paid, and that prediction for the whole run: the cost model speeds up the baseline's decoding
    only, and both runs also pay a prefill (the prompt in one pass), measured here."""
    stats, base_stats = run["output"].stats, base["output"].stats
    predicted = from_tau(stats, *in_run_costs([base_stats], [stats]))
    decoding = base["seconds"] - base_stats.prefill_seconds
    return {"speedup": base["seconds"] / run["seconds"], "tau": stats.tokens_per_target_pass,
            "prefill_seconds": stats.prefill_seconds, "baseline_prefill_seconds": base_stats.prefill_seconds,
            "predicted_in_run_from_tau": predicted,
            "predicted_with_prefill": base["seconds"] / (stats.prefill_seconds + decoding / predicted)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-kind", type=int, default=4, help="held-out prompts of each kind")
    parser.add_argument("--k", default="2,3,4", help="comma-separated draft lengths")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="tokens generated per prompt")
    parser.add_argument("--json", help="write every figure to this path")
    parser.add_argument("--fast", action="store_true", help="target and drafts on specdec_ref.kernels.fast's kernels")
    parser.add_argument("--weights-first", action="store_true",
                        help="eager target and drafts, few-row linear layers computed as W @ x^T (specdec_ref.kernels.weights_first)")
    parser.add_argument("--eagle", action="append", metavar="HEAD",
                        help="an EAGLE head to run (zoo name or folder; repeat for several; default zoo:smollm2-eagle)")
    parser.add_argument("--eagle-min-confidence", type=float,
                        help="also run the head ending a draft below this probability (dynamic draft length)")
    parser.add_argument("--eagle-first-candidates", type=int, metavar="M",
                        help="also run the head proposing its best M tokens for the first position (a small tree)")
    args = parser.parse_args()
    ks = [int(k) for k in args.k.split(",")]

    if args.fast and args.weights_first:
        parser.error("--fast and --weights-first are two kernel choices for the linear layers; pick one")
    target, tokenizer = load("zoo:smollm2", fast=args.fast, weights_first=args.weights_first)
    head_names = args.eagle or ["zoo:smollm2-eagle"]
    heads = [load_eagle(name) for name in head_names]
    head, vocab = heads[0]
    draft, _ = load("zoo:smollm2-draft", fast=args.fast, weights_first=args.weights_first)
    print(f"SmolLM2 on {fast.path_name(target)}")
    # the first head is "eagle"; others are named by the path given, so the JSON says which is which
    drafters = {"eagle": EagleDrafter(head, target, vocab)}
    drafters |= {f"eagle {name}": EagleDrafter(other, target, other_vocab)
                 for name, (other, other_vocab) in zip(head_names[1:], heads[1:])}
    drafters |= {"distilled": draft, "prompt lookup": PromptLookupDrafter()}
    if args.eagle_min_confidence is not None:
        dynamic = f"eagle, p >= {args.eagle_min_confidence:g}"
        drafters[dynamic] = EagleDrafter(head, target, vocab, min_confidence=args.eagle_min_confidence)
    extra_rows = {}  # per method: tokens verified beyond k (a tree's other first candidates)
    if args.eagle_first_candidates:
        tree = f"eagle, {args.eagle_first_candidates} first candidates"
        drafters[tree] = EagleDrafter(head, target, vocab, first_candidates=args.eagle_first_candidates)
        extra_rows[tree] = args.eagle_first_candidates - 1
    kinds, texts = zip(*interleave(heldout_prompts(tokenizer, per_kind=args.per_kind)))
    encoded = [tokenizer(t, return_tensors="pt").input_ids for t in texts]
    n = args.max_new_tokens
    print(threads_for_timing())

    start = time.time()
    records = compare_drafters(target, drafters, encoded, n, ks)
    methods = list(records)
    print(f"{len(encoded)} prompts x {len(methods)} methods in {time.time() - start:.0f} s")

    context = int(statistics.median(ids.shape[1] for ids in encoded)) + n // 2
    costs = {name: measure_costs(target, None if name == "prompt lookup" else d, context,
                                 [k + extra_rows.get(name, 0) for k in ks])
             for name, d in drafters.items()}
    result = {"cpu": cpu_name(), "threads": torch.get_num_threads(), "max_new_tokens": n,
              "target_path": fast.path_name(target), "draft_path": fast.path_name(draft),
              "per_kind": args.per_kind, "ks": ks, "heads": head_names, "kinds": {},
              "costs": {}}
    # the draft vocabulary's saving: the same head drafting over all 49,152 rows of the LM head
    full = measure_costs(target, EagleDrafter(head, target), context, ks[:1])
    result["costs"]["eagle, full vocabulary"] = {"c": full.cost_ratio, "c_spread": full.cost_ratio_spread}
    for name, c in costs.items():
        result["costs"][name] = {"c": c.cost_ratio, "c_spread": c.cost_ratio_spread, "v": c.verify_costs}
    print(f"CPU: {result['cpu']}; {result['threads']} torch threads; {n} new tokens, greedy")
    print("costs (one-token target passes): " + "; ".join(
        f"{name} c = {c.cost_ratio:.3f}" for name, c in costs.items()) + f" ({full.cost_ratio:.3f} with the "
        f"head's full-vocabulary LM head, against {vocab.numel():,} rows)" + "; v(k) = " + ", ".join(
        f"{k}: {v:.2f}" for k, v in costs["eagle"].verify_costs.items()))
    for kind in (*KINDS, "all"):
        rows = [i for i, name in enumerate(kinds) if kind in (name, "all")]
        base = [records[None][i] for i in rows]
        entry = {"baseline_tokens_per_second": statistics.median(n / r["seconds"] for r in base)}
        for method in methods[1:]:
            runs = [records[method][i] for i in rows]
            total = GenerationStats.combined(r["output"].stats for r in runs)
            name, k = method
            figures = {
                "acceptance_rate": total.acceptance_rate, "acceptance_probability": total.acceptance_probability,
                "tau": total.tokens_per_target_pass,
                "speedup": statistics.median(b["seconds"] / r["seconds"] for b, r in zip(base, runs)),
                "identical": all(torch.equal(b["output"].sequences, r["output"].sequences) for b, r in zip(base, runs)),
                "by_position": total.acceptance_by_position,
            }
            c, chain = costs[name], name not in extra_rows
            figures["predicted"], figures["predicted_from_tau"] = predictions(
                total, k, c.cost_ratio, c.verify_costs[k + extra_rows.get(name, 0)], chain)
            # the same model with c and v as these runs paid them, in their baselines' decode step
            c_run, v_run = in_run_costs((r["output"].stats for r in base), (r["output"].stats for r in runs))
            figures["in_run_costs"] = {"c": c_run, "v": v_run}
            figures["predicted_in_run"], figures["predicted_in_run_from_tau"] = predictions(
                total, k, c_run, v_run, chain)
            # prompt by prompt: the measured speedup is a median of these ratios, while the predictions
            # above pool tau and the costs over the kind's prompts; the same prediction per prompt
            # (its own tau, its own in-run costs) has a median to set beside the measured one
            figures["per_prompt"] = [per_prompt(b, r) for b, r in zip(base, runs)]
            for key in ("predicted_in_run_from_tau", "predicted_with_prefill"):
                figures[f"{key}_median_over_prompts"] = statistics.median(p[key] for p in figures["per_prompt"])
            entry[f"{name} k={k}"] = figures
        result["kinds"][kind] = entry
        print(f"\n{kind} ({len(rows)} prompts): baseline {entry['baseline_tokens_per_second']:.1f} tokens/s")
        for method in methods[1:]:
            f = entry[f"{method[0]} k={method[1]}"]
            from_a = "" if f["predicted"] is None else (
                f"{f['predicted']:.2f}x from a = {f['acceptance_probability']:.3f}; ")
            in_run = "" if f["predicted_in_run"] is None else f"{f['predicted_in_run']:.2f}x from a, "
            print(f"  {method[0]:16s} k={method[1]}: acceptance {f['acceptance_rate']:.3f}, tau {f['tau']:.2f}, "
                  f"speedup {f['speedup']:.2f}x (predicted {from_a}{f['predicted_from_tau']:.2f}x from tau; "
                  f"with the runs' own c {f['in_run_costs']['c']:.3f}, v {f['in_run_costs']['v']:.2f}: "
                  f"{in_run}{f['predicted_in_run_from_tau']:.2f}x from tau, median over prompts "
                  f"{f['predicted_in_run_from_tau_median_over_prompts']:.2f}x, "
                  f"{f['predicted_with_prefill_median_over_prompts']:.2f}x with the prefill), "
                  f"identical {f['identical']}; by position " + " ".join(f"{p:.2f}" for p in f["by_position"]))
        best = max((m for m in methods[1:] if m[0] == "eagle"), key=lambda m: entry[f"eagle k={m[1]}"]["speedup"])
        entry["eagle_best_k"] = best[1]
        print(f"  eagle's best k here: {best[1]}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"JSON written to {args.json}")


if __name__ == "__main__":
    main()
