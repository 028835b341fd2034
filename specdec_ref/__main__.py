"""Command line: ``python -m specdec_ref {demo,bench,generate,roofline}``."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # bench loads models' kernels: the CLI imports it when a command runs
    from .bench import FastBenchResult
    from .paired import SpeedCheck

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# demo --pair: (target, draft, what the prompts are)
DEMO_PAIRS = {"course": ("zoo:target", "zoo:draft"), "real": ("zoo:smollm2", "zoo:smollm2-draft"),
              "eagle": ("zoo:smollm2", "zoo:smollm2-eagle")}
SHOWCASE_PROMPT = "How do I read a CSV file in Python? Show a short example."
# What the bench's and the demo's symbols mean (lesson 3's cost model), printed above their figures.
LEGEND = ("tau: tokens per target pass; a: acceptance probability (accepted / judged drafts); "
          "c: draft step / target step; v(k): verify pass of k+1 tokens / target step")
# Set to see the traceback behind an `error: ...` line.
TRACEBACK_VARIABLE = "SPECDEC_TRACEBACK"


class CommandError(SystemExit):
    """A mistake in the command: ``main`` prints ``error: <message>`` on one line of stderr and the
    process exits with status 2, argparse's convention (``str()`` gives that line)."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return f"error: {self.message}"


def _number(kind: type, low: float, low_ok: bool, high: float | None = None, high_ok: bool = False,
            what: str | None = None):
    """An argparse ``type=``: ``kind`` within the bounds, checked while the arguments are parsed
    (before any model loads)."""
    bounds = (f"{'>=' if low_ok else '>'} {low}" if high is None else
              f"in {'[' if low_ok else '('}{low}, {high}{']' if high_ok else ')'}")
    name = what or f"{'an integer' if kind is int else 'a number'} {bounds}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}") from None
        if (value < low or (value == low and not low_ok)
                or (high is not None and (value > high or (value == high and not high_ok)))):
            raise argparse.ArgumentTypeError(f"expected {name}, got {text!r}")
        return value
    return parse


positive_int = _number(int, 1, True)
nonnegative_int = _number(int, 0, True)
positive_float = _number(float, 0, False)
probability = _number(float, 0, False, 1, False)  # a draft confidence bar: strictly between 0 and 1
top_p_value = _number(float, 0, False, 1, True)
confidence_or_zero = _number(float, 0, True, 1, False, "a probability in (0, 1), or 0 to skip")


def _check_zoo_names(*names: str) -> None:
    """Refuse an unknown ``zoo:`` name before any model loads (``zoo.resolve``'s message lists the names)."""
    from . import zoo

    for name in names:
        if name.startswith(zoo.PREFIX) and name[len(zoo.PREFIX):] not in zoo.NAMES:
            zoo.resolve(name)


def k_list(text: str) -> list[int]:
    """``--k 1,2,4``: comma-separated draft lengths, each >= 1."""
    try:
        ks = [int(k) for k in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if any(k < 1 for k in ks):
        raise argparse.ArgumentTypeError(f"every k must be >= 1 (got {text})")
    return ks


def _prompts(n: int) -> list[str]:
    from .zoo.corpus import heldout_prompts

    return heldout_prompts(n)


def _mixed_prompts(n: int, tokenizer) -> list[str]:
    """``n`` held-out prompts of the real pair, alternating prose, code and chat."""
    from .zoo.prompts import KINDS, heldout_prompts, interleave

    return [text for _, text in interleave(heldout_prompts(tokenizer, per_kind=-(-n // len(KINDS))))][:n]


def read_prompts_file(path: str | Path, tokenizer) -> list[str]:
    """Prompts from a file: one per line, or JSON Lines (``*.jsonl``, or every line a JSON
    object) with either ``{"prompt": text}`` or ``{"messages": [{"role": ..., "content": ...}]}``,
    the latter rendered with the tokenizer's chat template (generation prompt added).
    Blank lines are skipped; a bad line raises ``ValueError`` naming its number."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"prompts file not found: {path}")
    lines = [(i, line) for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    jsonl = path.suffix == ".jsonl" or (bool(lines) and all(line.lstrip().startswith("{") for _, line in lines))
    prompts = []
    for number, line in lines:
        if not jsonl:
            prompts.append(line)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not valid JSON ({error.msg})") from None
        if isinstance(record, dict) and isinstance(record.get("prompt"), str):
            prompts.append(record["prompt"])
        elif isinstance(record, dict) and isinstance(record.get("messages"), list):
            if not getattr(tokenizer, "chat_template", None):
                raise ValueError(f"{path}:{number}: chat messages, but the target's tokenizer has no chat template")
            try:
                prompts.append(tokenizer.apply_chat_template(record["messages"], tokenize=False,
                                                             add_generation_prompt=True))
            except Exception as error:  # the template's own check, e.g. a message without "content"
                raise ValueError(f"{path}:{number}: the chat template rejected these messages ({error})") from None
        else:
            raise ValueError(f'{path}:{number}: expected {{"prompt": "..."}} or {{"messages": [...]}}')
    if not prompts:
        raise ValueError(f"no prompts in {path}")
    return prompts


def _print_roofline(target_bytes: float, measured: dict[str, float] | None = None) -> None:
    from . import roofline

    print("\nRoofline: the fastest batch-1 decode step is weight bytes / memory bandwidth")
    for params, dtype in ((70e9, "bfloat16"), (8e9, "bfloat16")):
        size = roofline.weight_bytes(params, dtype)
        bounds = ", ".join(f"{a.name} {roofline.seconds_per_token_bound(size, a.memory_bandwidth) * 1e3:.1f} ms"
                           for a in roofline.ACCELERATORS.values())
        print(f"  {params / 1e9:.0f}B params in {dtype} = {size / 1e9:.0f} GB per token: {bounds}")
    if measured:
        llc = roofline.last_level_cache_bytes()
        print(f"  this machine: DRAM triad {measured['dram'] / 1e9:.1f} GB/s, last-level-cache triad "
              f"{measured['cache'] / 1e9:.1f} GB/s (LLC {llc / 2**20:.0f} MiB)" if llc else "")
        fits = llc is not None and target_bytes < llc
        print(f"  zoo target weights: {target_bytes / 1e6:.0f} MB -> bound "
              f"{target_bytes / measured['dram'] * 1e3:.2f} ms/token from DRAM"
              + (f", {target_bytes / measured['cache'] * 1e3:.2f} ms/token from the cache it fits in" if fits else ""))


def measure_this_machine() -> dict[str, float]:
    """DRAM bandwidth (arrays 2x the last-level cache) and cache bandwidth (arrays 1/8 of it)."""
    from . import bench, roofline

    llc = roofline.last_level_cache_bytes() or 32 * 2**20
    return {"dram": bench.dram_bandwidth(),
            "cache": roofline.measure_memory_bandwidth(llc // 8, repeats=5)["triad"]}


def fast_report(summary: FastBenchResult) -> list[str]:
    """The lines that show a ``bench.run_fast`` result: eager and fast side by side."""
    n = summary.prompts
    bound, fast_bound = summary.seconds_per_token_bound, summary.fast_seconds_per_token_bound
    warmup = summary.warmup_seconds
    lines = [f"fast path: {summary.fast_path}; warm-up {warmup['eager']:.1f} s eager, {warmup['fast']:.1f} s fast"
             + (" (compilation included)" if summary.compiled else ""),
             f"threads {summary.threads}; DRAM triad {summary.dram_bandwidth / 1e9:.1f} GB/s measured here: "
             f"{summary.target_weight_bytes / 1e6:.0f} MB of target weights per step -> bound "
             f"{bound * 1e3:.2f} ms/token ({1 / bound:.0f} tokens/s)"]
    if fast_bound != bound:
        lines.append(f"the fast path reads {summary.fast_target_weight_bytes / 1e6:.0f} MB of them per step "
                     f"-> bound {fast_bound * 1e3:.2f} ms/token ({1 / fast_bound:.0f} tokens/s)")
    lines += [f"{'':17s}{'eager tok/s':>12s}{'fast tok/s':>12s}{'fast/eager':>11s}   weights streamed eager -> fast"
              f"{'':14s}identical to eager greedy"]
    rows = [("baseline", summary.baseline)] + [(f"speculative k={c.k}", c) for c in summary.configs]
    for label, row in rows:
        eager, quick = row.eager, row.fast
        lines.append(f"{label:17s}{eager.tokens_per_second:12.1f}{quick.tokens_per_second:12.1f}"
                     f"{quick.speedup_over_eager:10.2f}x   "
                     f"{eager.bandwidth_achieved / 1e9:5.1f} -> {quick.bandwidth_achieved / 1e9:5.1f} GB/s "
                     f"({eager.bandwidth_share:4.0%} -> {quick.bandwidth_share:4.0%} of DRAM)   "
                     f"eager {eager.identical_prompts}/{n}, fast {quick.identical_prompts}/{n}")
    best = summary.best
    lines.append(f"best k for the fast path = {best.k}: speculative {best.fast.speedup_over_own_baseline:.2f}x "
                 f"the fast baseline (eager: {best.eager.speedup_over_own_baseline:.2f}x the eager baseline)")
    if summary.fast_path.startswith("prepacked"):
        gain = summary.baseline.fast.speedup_over_eager
        lines.append(f"prepacking {'pays' if gain > 1 else 'does not pay'} on this machine ({gain:.2f}x at baseline); "
                     "fast.prepare(model, only_if_faster=True) times a decode step and keeps the eager model where "
                     "packing loses")
    return lines


def _all_identical(summary: FastBenchResult) -> bool:
    """Whether every output, eager and fast, equals the eager baseline's."""
    rows = [summary.baseline, *summary.configs]
    return all(version.identical_prompts == summary.prompts for row in rows for version in (row.eager, row.fast))


def showcase(k: int, max_new_tokens: int, rounds: int = 2) -> None:
    """A real model's text, decoded speculatively: SmolLM2-135M-Instruct answers a chat question
    through its EAGLE head, streamed as tokens are accepted; then the same generation timed
    against the target alone (paired, alternating) and the health check. Both run on the fast
    path where it applies (SmolLM2 reads its GGUF codes, :mod:`specdec_ref.kernels.fast`): on an
    AVX2-only CPU the eager path's verification passes cost about two one-token steps, and the
    head does not pay there. Whether it is faster is measured and printed, not assumed."""
    from transformers import TextStreamer

    from . import autoregressive_generate, bench, speculative_generate
    from .kernels import fast
    from .timing import threads_for_timing, time_paired

    pair = bench.load_pair("zoo:smollm2", "zoo:smollm2-eagle", eagle_tree=False)
    target = fast.prepare(pair.target)
    drafter, _ = bench.eagle_drafter(pair.drafter.head, target, pair.drafter.draft_vocab)  # bench's shape here
    tokenizer = pair.target_tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": SHOWCASE_PROMPT}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, return_tensors="pt").input_ids
    print(f"--- SmolLM2-135M-Instruct with its EAGLE draft head (zoo:smollm2-eagle), k={k}, greedy, "
          f"on {fast.path_name(target)}, drafting {'a chain' if drafter.tree is None else 'a dynamic tree'}, streamed as "
          f"tokens are accepted ---\nuser: {SHOWCASE_PROMPT}\n"
          "assistant: ", end="", flush=True)
    out = speculative_generate(target, drafter, ids, max_new_tokens=max_new_tokens, num_draft_tokens=k,
                               streamer=TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    print("\n(SmolLM2-135M is a small model: fluent, but often wrong on facts, and it can repeat itself.)")
    new = out.sequences.shape[1] - ids.shape[1]
    print(threads_for_timing())
    runs = {}

    def baseline() -> None:
        runs["base"] = autoregressive_generate(target, ids, max_new_tokens=new, eos_token_id=[])

    def speculative() -> None:
        runs["spec"] = speculative_generate(target, drafter, ids, max_new_tokens=new, num_draft_tokens=k,
                                            eos_token_id=[])
    # The streamed run above warmed up the target and the head: no separate warm-up pair.
    timed = time_paired(baseline, speculative, warmup=0, repeats=rounds)
    q1, q3 = timed["ratio_spread"]
    identical = torch.equal(runs["base"].sequences, runs["spec"].sequences)
    verdict = "faster" if timed["median_ratio"] > 1 else "not faster"
    print(f"{new} tokens, {rounds} alternating runs each: target alone "
          f"{new / timed['median_seconds_a']:.1f} tokens/s, with the EAGLE head "
          f"{new / timed['median_seconds_b']:.1f} tokens/s: {timed['median_ratio']:.2f}x (median of paired "
          f"ratios, IQR {q1:.2f}-{q3:.2f}), {verdict} on this machine; identical output: "
          f"{'yes' if identical else 'NO'}")
    print(f"health check: {runs['spec'].stats}\n")
    if not identical:
        sys.exit("error: speculative output differs from the target's greedy decoding")


def _reading(check: SpeedCheck) -> str:
    """What a bench speedup check says: its verdict, or why the timing cannot be read."""
    if check.problems:
        return "not read: " + "; ".join(check.problems)
    return f"{check.verdict} over {check.pairs} prompts"


def demo(args: argparse.Namespace) -> None:
    from transformers import TextStreamer

    from . import bench, speculative_generate
    from .tokenizer_compat import compare_tokenizers

    args.min_confidence = args.min_confidence or None  # 0 skips the dynamic run
    if args.showcase_tokens:
        showcase(2, args.showcase_tokens)

    target_name, draft_name = DEMO_PAIRS[args.pair]
    pair = bench.load_pair(target_name, draft_name)
    if pair.draft_model is None:  # transformers has no EAGLE, and no confidence to stop on
        args.no_hf, args.min_confidence = True, None
    tokenizer = pair.target_tokenizer
    n_target = sum(p.numel() for p in pair.target.parameters())
    n_draft = pair.drafter.num_parameters
    print(f"target: {target_name}, {n_target / 1e6:.1f}M params; draft: {draft_name}, {n_draft / 1e6:.2f}M params")
    if pair.draft_tokenizer is not None:
        print(compare_tokenizers(pair.target_tokenizer, pair.draft_tokenizer).verdict)

    prompts = _prompts(args.prompts) if args.pair == "course" else _mixed_prompts(args.prompts, tokenizer)
    print(f"\n--- speculative decoding, k={args.k}, streamed as tokens are accepted ---")
    ids = tokenizer(prompts[0], return_tensors="pt").input_ids
    print(prompts[0], end="")
    out = speculative_generate(pair.target, pair.draft, ids, max_new_tokens=args.max_new_tokens,
                               num_draft_tokens=args.k, streamer=TextStreamer(tokenizer, skip_prompt=True))
    print("\n--- health check ---")
    print(out.stats)

    print(f"\n--- benchmark: {len(prompts)} held-out prompts, {args.max_new_tokens} new tokens each ---")
    summary = bench.run(pair, prompts, [args.k], args.max_new_tokens, hf_assisted=not args.no_hf,
                        min_draft_confidence=args.min_confidence)
    result = summary.configs[0]
    spec, drafts = result.speculative, result.drafts
    print(f"baseline (target alone)      {summary.baseline.tokens_per_second:7.1f} tokens/s")
    print(f"speculative (specdec_ref)    {spec.tokens_per_second:7.1f} tokens/s  speedup {spec.speedup:.2f}x")
    if args.min_confidence is not None:
        dynamic = result.methods["speculative_dynamic"]
        print(f"  dynamic k <= {args.k}           {dynamic.tokens_per_second:7.1f} tokens/s  "
              f"speedup {dynamic.speedup:.2f}x  (the draft stops below confidence "
              f"{args.min_confidence}: {result.dynamic_drafts.drafted_per_iteration:.2f} drafts per iteration, "
              f"acceptance rate {result.dynamic_drafts.acceptance_rate:.3f})")
    if not args.no_hf:
        assisted = result.methods["hf_assisted"]
        print(f"transformers assisted        {assisted.tokens_per_second:7.1f} tokens/s  "
              f"speedup {assisted.speedup:.2f}x")
    costs = summary.cost_model
    print(LEGEND)
    # a is the chain's i.i.d. model; a tree's drafts are siblings, not a chain, so only its tau counts.
    a = "" if result.predicted_speedup is None else \
        f"acceptance probability a = {drafts.acceptance_probability:.3f} (accepted / judged), "
    print(f"acceptance rate {drafts.acceptance_rate:.3f} (accepted / drafted), {a}tokens per target pass "
          f"{drafts.tokens_per_target_pass:.2f}")
    if result.predicted_speedup is None:  # a tree of drafts: only its measured tau feeds the model
        print(f"predicted speedup {result.predicted_speedup_from_tau:.2f}x from the measured tokens per pass, "
              f"c={costs.cost_ratio:.3f} and the verify cost of the tree's mean "
              f"{drafts.drafted_per_iteration:.1f} drafts; measured {spec.speedup:.2f}x")
    else:
        print(f"predicted speedup {result.predicted_speedup:.2f}x from a={drafts.acceptance_probability:.2f}, "
              f"c={costs.cost_ratio:.3f}, verify cost v({args.k})={costs.verify_costs[args.k]:.2f}; "
              f"{result.predicted_speedup_from_tau:.2f}x from the measured tokens per pass; "
              f"measured {spec.speedup:.2f}x")
    print(f"reading of the measured speedup: {_reading(result.speed_check)}")
    identical = all(method.identical_outputs for method in result.methods.values())  # greedy: never None
    print(f"outputs identical to the target's greedy decoding: {'yes' if identical else 'NO'}")

    machine = measure_this_machine()  # once: the roofline and the fast path's shares use the same figure
    _print_roofline(summary.target_weight_bytes, machine)
    print(f"  bandwidth achieved: baseline {summary.baseline.bandwidth_achieved / 1e9:.1f} GB/s, "
          f"speculative {result.bandwidth_achieved / 1e9:.1f} GB/s of weights read")
    Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
    bench.plot(summary, args.plot)
    print(f"\nfigure written to {args.plot}")

    from .kernels import fast

    fast_prompts = prompts[: args.fast_prompts]
    print("\n--- the fast path (specdec_ref.kernels.fast: GGUF codes and bf16-valued weights read as stored, others "
          f"prepacked), eager vs fast on {len(fast_prompts)} prompts, interleaved ---")
    usable, reason = fast.available(pair.target)
    if not usable or not fast_prompts:
        print(f"skipped: {reason if not usable else '--fast-prompts 0'}")
    else:
        fast_summary = bench.run_fast(pair, fast_prompts, [args.k], args.max_new_tokens, bandwidth=machine["dram"])
        print("\n".join(fast_report(fast_summary)))
        # Not an error when it fails: fp32 sums in another order may break a near-tie differently.
        print(f"fast outputs identical to the eager greedy decoding: "
              f"{'yes' if _all_identical(fast_summary) else 'NO (a near-tie rounded the other way)'}")
    if not identical:
        sys.exit("error: speculative output differs from the baseline")


def run_bench(args: argparse.Namespace) -> None:
    from . import bench

    ks = args.k
    if args.temperature is not None and not args.do_sample:
        raise CommandError("--temperature needs --do-sample (the default is greedy decoding)")
    if args.do_sample and args.fast:
        raise CommandError("--fast compares greedy outputs; it takes no --do-sample")
    if args.compile and not args.fast:
        raise CommandError("--compile chooses the --fast path's kind; use it with --fast")
    if args.fast and (args.plot or args.min_confidence is not None):
        raise CommandError("--fast compares eager and fast at fixed k; it draws no plot and takes no --min-confidence")
    _check_zoo_names(args.target, args.draft)
    path, reason = _bench_path(args)
    pair = bench.load_pair(args.target, args.draft, device=args.device, dtype=DTYPES[args.dtype], path=path,
                           eagle_tree=eagle_shape(args), greedy=not args.do_sample)
    print(f"path: {reason or pair.path_reason}")
    if pair.draft_note:
        print(f"draft: {pair.draft_note}")
    if pair.draft_model is None and not pair.prompt_lookup and not args.no_hf:
        print(f"{args.draft} drafts from the target's features; transformers has no such drafter, so its "
              "assisted generation is left out (as with --no-hf)")
        args.no_hf = True
    if args.prompts_file:
        try:
            prompts = read_prompts_file(args.prompts_file, pair.target_tokenizer)
        except ValueError as error:
            raise CommandError(str(error)) from None
        prompts = prompts[: args.prompts] if args.prompts else prompts
    else:
        prompts = _prompts(args.prompts or 20)
    if args.repeat_prompts:
        prompts = bench.repetition_prompts(prompts)
    if args.fast:
        run_fast_bench(args, pair, prompts, ks)
        return
    try:
        summary = bench.run(pair, prompts, ks, args.max_new_tokens, hf_assisted=not args.no_hf,
                            min_draft_confidence=args.min_confidence,
                            temperature=(args.temperature or 1.0) if args.do_sample else None, seed=args.seed)
    except ValueError as error:  # e.g. --min-confidence with prompt lookup
        raise CommandError(str(error)) from None
    if args.do_sample:
        print(f"sampling at temperature {summary.temperature}: outputs are not compared token by token. "
              "Speculative sampling is exact in distribution (each token is drawn from the target's "
              "distribution), not sample by sample, so its samples differ from the baseline's; lesson 4 "
              "tests the distribution.")
    print(LEGEND)
    for c in summary.configs:
        spec, drafts = c.speculative, c.drafts
        hf = f"  hf {c.methods['hf_assisted'].speedup:.2f}x" if "hf_assisted" in c.methods else ""
        from_a = "" if c.predicted_speedup is None else f"{c.predicted_speedup:.2f}x, "
        print(f"k={c.k:2d}  speedup {spec.speedup:.2f}x (predicted {from_a}"
              f"{c.predicted_speedup_from_tau:.2f}x from tau; {_reading(c.speed_check)})"
              f"{hf}  acceptance {drafts.acceptance_rate:.3f}"
              + ("" if c.predicted_speedup is None else f" (a {drafts.acceptance_probability:.3f})") + "  "
              f"tau {drafts.tokens_per_target_pass:.2f}"
              + ("" if args.do_sample else f"  identical {spec.identical_outputs}"))
        if c.dynamic_drafts is not None:
            d = c.dynamic_drafts
            print(f"      dynamic (min confidence {summary.min_draft_confidence}): speedup "
                  f"{c.methods['speculative_dynamic'].speedup:.2f}x  acceptance {d.acceptance_rate:.3f} "
                  f"(a {d.acceptance_probability:.3f})  tau {d.tokens_per_target_pass:.2f}  "
                  f"drafts/iteration {d.drafted_per_iteration:.2f}  "
                  f"identical {c.methods['speculative_dynamic'].identical_outputs}")
    base = summary.baseline
    dram = bench.dram_bandwidth() if args.device == "cpu" else None
    latency = 1e3 / base.tokens_per_second
    bound = (f" = {base.bandwidth_achieved / dram:.0%} of the {dram / 1e9:.1f} GB/s DRAM triad measured here "
             f"(bound {summary.target_weight_bytes / dram * 1e3:.2f} ms/token)" if dram else "")
    print(f"baseline {base.tokens_per_second:.1f} tokens/s ({latency:.1f} ms/token), bandwidth achieved "
          f"{base.bandwidth_achieved / 1e9:.2f} GB/s of {summary.target_weight_bytes / 1e6:.0f} MB target "
          f"weights{bound}; best k = {summary.best.k}")
    if args.json:
        settings = {"target": args.target, "draft": args.draft, "device": args.device, "dtype": args.dtype,
                    "repeat_prompts": args.repeat_prompts, "prompts_file": args.prompts_file,
                    "path": pair.path, "dram_bandwidth": dram}
        Path(args.json).write_text(json.dumps(summary.to_json() | settings, indent=2))
        print(f"JSON written to {args.json}")
    if args.plot:
        bench.plot(summary, args.plot)
        print(f"figure written to {args.plot}")


def run_fast_bench(args: argparse.Namespace, pair, prompts: list[str], ks: list[int]) -> None:
    from . import bench

    try:
        if args.compile:
            print("compiling with torch.compile during the warm-up (a minute or more per model on 2 cores)...",
                  flush=True)
        summary = bench.run_fast(pair, prompts, ks, args.max_new_tokens, compile=args.compile)
    except ValueError as error:  # the fast path does not apply (device, dtype, torch, compiler)
        raise CommandError(str(error)) from None
    print("\n".join(fast_report(summary)))
    if args.json:
        settings = {"target": args.target, "draft": args.draft, "device": args.device, "dtype": args.dtype,
                    "repeat_prompts": args.repeat_prompts, "path": pair.path}
        Path(args.json).write_text(json.dumps(summary.to_json() | settings, indent=2))
        print(f"JSON written to {args.json}")


def _check_path(path: str, device: str) -> None:
    if path in ("weights-first", "fast") and device != "cpu":
        raise CommandError(f"--path {path} is a choice of CPU kernels; use it with --device cpu")


def _bench_path(args: argparse.Namespace) -> tuple[str, str | None]:
    """The path ``bench`` loads the pair on (--path, except where a comparison needs the stock
    model), and why when it is not --path's."""
    from . import zoo

    _check_path(args.path, args.device)
    if args.fast:  # eager against the fast path, side by side: the pair loads eager
        if args.path not in ("auto", "eager"):
            raise CommandError("--fast compares the eager model with the fast path; it takes no --path")
        return "eager", "eager beside fast (--fast)"
    hf_compared = not args.no_hf and not zoo.is_eagle_head(args.draft)
    if hf_compared and args.path != "eager":
        if args.path != "auto":
            raise CommandError(f"--path {args.path}: transformers' assisted generation, compared by default, runs "
                               "the stock model; add --no-hf to time our loop on another path")
        return "eager", ("eager, since transformers' assisted generation is compared (--no-hf lets bench choose "
                         "the quickest path)")
    return args.path, None


def run_generate(args: argparse.Namespace) -> None:
    """Stream one speculative generation to stdout; then the health check, one line on stderr."""
    from transformers import TextStreamer
    from transformers.utils import logging as hf_logging

    from . import autoregressive_generate, bench, speculative_generate, zoo

    sampling = {"--temperature": args.temperature, "--top-k": args.top_k, "--top-p": args.top_p}
    given = [flag for flag, value in sampling.items() if value is not None]
    if given and not args.do_sample:
        raise CommandError(f"{' and '.join(given)} {'needs' if len(given) == 1 else 'need'} --do-sample "
                           "(the default is greedy decoding)")
    _check_path(args.path, args.device)
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise CommandError("the prompt is empty")
    _check_zoo_names(args.target, args.draft)
    hf_logging.disable_progress_bar()  # stderr carries the health check, not loading bars
    if args.chat and not getattr(zoo.load_tokenizer(args.target), "chat_template", None):
        raise CommandError(f"--chat: the tokenizer of {args.target} has no chat template"
                           + ("; zoo:target-chat is zoo:target with one" if args.target == "zoo:target" else ""))

    pair = bench.load_pair(args.target, args.draft, device=args.device, dtype=DTYPES[args.dtype], path=args.path,
                           eagle_tree=eagle_shape(args), greedy=not args.do_sample)
    print(f"path: {pair.path_reason}", file=sys.stderr)
    if pair.draft_note:
        print(f"draft: {pair.draft_note}", file=sys.stderr)
    target, drafter = pair.target, pair.drafter
    tokenizer = pair.target_tokenizer
    if args.chat:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt").input_ids.to(target.device)
    rule = {"do_sample": args.do_sample}
    if args.do_sample:
        rule |= {"temperature": args.temperature or 1.0, "top_k": args.top_k, "top_p": args.top_p}

    def seeded() -> torch.Generator | None:
        return torch.Generator(target.device).manual_seed(args.seed) if args.do_sample else None

    def speculative(max_new_tokens: int, streamer=None, **kwargs):
        return speculative_generate(target, drafter, ids, max_new_tokens, args.k, generator=seeded(),
                                    streamer=streamer, **rule, **kwargs)

    # A short warm-up of both ways of decoding first, so neither timing pays the first passes' costs.
    speculative(min(2, args.max_new_tokens), eos_token_id=[])
    if not args.no_baseline:
        autoregressive_generate(target, ids, min(2, args.max_new_tokens), eos_token_id=[], generator=seeded(), **rule)
    out = speculative(args.max_new_tokens, TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True))
    stats = out.stats
    a = "" if getattr(drafter, "tree", None) is not None else \
        f"acceptance probability {stats.acceptance_probability:.2f}, "  # a chain's i.i.d. a; a tree has none
    line = (f"health check: {stats.tokens_per_target_pass:.2f} tokens per target pass, acceptance rate "
            f"{stats.acceptance_rate:.2f}, {a}{stats.new_tokens} tokens at {stats.tokens_per_second:.1f} tokens/s")
    if args.no_baseline:
        line += "; the target alone not timed (--no-baseline)"
    elif stats.new_tokens:
        alone = autoregressive_generate(target, ids, stats.new_tokens, eos_token_id=[], generator=seeded(), **rule)
        ratio = stats.tokens_per_second / alone.stats.tokens_per_second
        verdict = ("helped" if ratio > 1.05 else "did not help" if ratio < 0.95
                   else "made no clear difference (one timed run each)")
        line += f"; the target alone {alone.stats.tokens_per_second:.1f} tokens/s: the draft {verdict} ({ratio:.2f}x)"
    print(line, file=sys.stderr)


def run_roofline(args: argparse.Namespace) -> None:
    from . import roofline

    size = roofline.weight_bytes(args.params, args.dtype)
    print(f"{args.params:.3g} params in {args.dtype}: {size / 1e9:.2f} GB of weights per decode step")
    for a in roofline.ACCELERATORS.values():
        bound = roofline.seconds_per_token_bound(size, a.memory_bandwidth)
        print(f"  {a.name:10s} {a.memory_bandwidth / 1e12:5.2f} TB/s -> >= {bound * 1e3:8.2f} ms/token "
              f"(<= {1 / bound:8.1f} tokens/s)   [{a.source}]")
    measured = measure_this_machine()
    bound = size / measured["dram"]
    print(f"  this CPU   {measured['dram'] / 1e12:5.3f} TB/s (measured DRAM triad) -> >= {bound * 1e3:8.2f} ms/token")


PATH_CHOICES = ("auto", "eager", "weights-first", "fast")
PATH_HELP = ("how both models run: auto (default) times a decode step and a verification pass each way that applies "
             "and keeps the quickest; eager is PyTorch's stock layers (what the lessons teach first); weights-first "
             "computes few-row layers as W @ x^T (specdec_ref.kernels.weights_first); fast reads GGUF codes or bf16 "
             "copies as stored (specdec_ref.kernels.fast). The baseline runs the same way")
EAGLE_CHAIN_HELP = ("an EAGLE head drafts a chain of k tokens (the default for greedy decoding where the path runs "
                    "the chain as one call: the fast and compiled paths)")
EAGLE_TREE_HELP = ("an EAGLE head drafts a dynamic tree of depth k (EAGLE-2; the default elsewhere), its size chosen "
                   "from the costs measured at load on the path")


def eagle_shape(args: argparse.Namespace) -> bool | None:
    """``load_pair``'s ``eagle_tree``: as the flags ask, or ``None`` (the path decides)."""
    return True if args.eagle_tree else False if args.eagle_chain else None


def add_eagle_shape(p: argparse.ArgumentParser) -> None:
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--eagle-chain", action="store_true", help=EAGLE_CHAIN_HELP)
    shape.add_argument("--eagle-tree", action="store_true", help=EAGLE_TREE_HELP)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: every option carries a one-line help."""
    parser = argparse.ArgumentParser(prog="python -m specdec_ref", description=__doc__,
                                     epilog=f"A mistake in a command ends in one 'error: ...' line and exit status 2; "
                                            f"set {TRACEBACK_VARIABLE}=1 to see its traceback.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="stream a generation and compare baseline vs speculative on the zoo pair")
    p.add_argument("--pair", choices=sorted(DEMO_PAIRS), default="course",
                   help="course: the zoo's 23M target and its draft (fast); real: SmolLM2-135M-Instruct "
                        "and its distilled draft (about 6x slower per token); eagle: SmolLM2 and its EAGLE head")
    p.add_argument("--showcase-tokens", type=nonnegative_int, default=64,
                   help="first, SmolLM2 answering a question through its EAGLE head, streamed and timed "
                        "against the target alone: this many new tokens (0 skips it)")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per iteration (the showcase uses 2, its best k)")
    p.add_argument("--prompts", type=positive_int, default=12, help="number of held-out prompts for the benchmark")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens generated per prompt")
    p.add_argument("--min-confidence", type=confidence_or_zero, default=0.4,
                   help="also show dynamic draft length with this confidence bar (0 skips it)")
    p.add_argument("--plot", default="out/demo.png", help="where to write the speedup figure (PNG)")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--fast-prompts", type=nonnegative_int, default=4,
                   help="prompts for the last section, eager vs the fast path (0 skips it)")
    p.set_defaults(func=demo)

    p = sub.add_parser("bench", help="baseline vs speculative vs transformers over a k sweep")
    p.add_argument("--target", default="zoo:target",
                   help="target model: a zoo name (zoo:target, zoo:smollm2), a local folder or a Hub id")
    p.add_argument("--draft", default="zoo:draft",
                   help='draft model (zoo name, folder or Hub id; another tokenizer goes through UAG), '
                        'or "ngram" for prompt lookup')
    p.add_argument("--k", type=k_list, default=[1, 2, 3, 4, 6, 8], help="comma-separated draft lengths (default 1,2,3,4,6,8)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="tokens generated per prompt (EOS ignored)")
    p.add_argument("--prompts", type=positive_int,
                   help="number of prompts: held-out course prompts (default 20), or the first N of --prompts-file")
    p.add_argument("--prompts-file",
                   help='prompts, one per line; or JSON Lines with {"prompt": ...} or {"messages": [...]} '
                        "(chat messages get the target's chat template)")
    p.add_argument("--do-sample", action="store_true",
                   help="sample instead of greedy decoding (outputs are then not compared; see --temperature)")
    p.add_argument("--temperature", type=positive_float, help="sampling temperature with --do-sample (default 1.0)")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (each prompt gets seed + its index)")
    p.add_argument("--device", default="cpu", help="torch device for both models")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="weights' dtype for both models")
    p.add_argument("--repeat-prompts", action="store_true",
                   help="prompts whose continuation repeats earlier text (where prompt lookup shines)")
    p.add_argument("--min-confidence", type=probability,
                   help="also run dynamic drafting: stop a draft after a token below this draft probability")
    p.add_argument("--json", help="also write the full summary as JSON to this path")
    p.add_argument("--plot", help="write the speedup-vs-k figure (PNG) to this path")
    p.add_argument("--no-hf", action="store_true", help="skip transformers' assisted generation")
    p.add_argument("--fast", action="store_true",
                   help="eager vs the fast path (specdec_ref.kernels.fast), baseline and speculative, side by side")
    p.add_argument("--compile", action="store_true",
                   help="with --fast: the fast path also compiles the models with torch.compile (instead of prepacking)")
    p.add_argument("--path", choices=PATH_CHOICES, default="auto", help=PATH_HELP)
    add_eagle_shape(p)
    p.set_defaults(func=run_bench)

    p = sub.add_parser("generate", help="stream one speculative generation, then its health check",
                       description="Streams the target's output to stdout as drafted tokens are accepted, then "
                                   "prints one line on stderr: tokens per target pass, acceptance, tokens/s, and "
                                   "whether the draft helped (the target alone is timed on the same prompt).")
    p.add_argument("prompt", help='the prompt ("-" reads it from stdin)')
    p.add_argument("--target", default="zoo:smollm2",
                   help="target model: a zoo name, a local folder or a Hub id (default zoo:smollm2, SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default="zoo:smollm2-eagle",
                   help='draft: a draft model or an EAGLE head (zoo name, folder or Hub id), or "ngram" for prompt '
                        "lookup (default zoo:smollm2-eagle, the target's EAGLE head)")
    p.add_argument("--k", type=positive_int, default=4, help="draft tokens per iteration (default 4)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128,
                   help="the most tokens generated; it stops earlier at EOS (default 128)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the target tokenizer's chat template (SmolLM2 is an "
                        "instruct model: ask it questions this way)")
    p.add_argument("--do-sample", action="store_true", help="sample instead of decoding greedily (greedy is the default)")
    p.add_argument("--temperature", type=positive_float, help="sampling temperature with --do-sample (default 1.0)")
    p.add_argument("--top-k", type=positive_int, help="with --do-sample: sample among the k most likely tokens")
    p.add_argument("--top-p", type=top_p_value, help="with --do-sample: nucleus sampling's probability mass")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (default 0)")
    p.add_argument("--device", default="cpu", help="torch device for both models (default cpu)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES),
                   help="weights' dtype for both models (default float32)")
    p.add_argument("--path", choices=PATH_CHOICES, default="auto", help=PATH_HELP)
    p.add_argument("--no-baseline", action="store_true",
                   help="do not time the target alone afterwards (the health check then says nothing of speed-up)")
    add_eagle_shape(p)
    p.set_defaults(func=run_generate)

    p = sub.add_parser("roofline", help="bandwidth lower bounds per token for a model size")
    p.add_argument("--params", type=positive_float, default=70e9, help="parameter count, e.g. 8e9")
    p.add_argument("--dtype", default="bfloat16", help="weights' dtype (sets bytes per parameter)")
    p.set_defaults(func=run_roofline)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Run a command. A mistake in it (a bad pair, an unknown zoo name, a file that is not there)
    ends in one line, ``error: <message>``, on stderr and exit status 2, not a traceback: the
    library's ``ValueError`` and ``OSError`` are its user-facing errors (set SPECDEC_TRACEBACK=1
    to see the traceback instead). Arguments are checked as they are parsed, before any model loads."""
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except CommandError as error:
        print(error, file=sys.stderr)
        raise
    except BrokenPipeError:  # e.g. `generate ... | head -1`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
    except (ValueError, OSError) as error:
        if os.environ.get(TRACEBACK_VARIABLE):
            raise
        message = (str(error).strip() or type(error).__name__).splitlines()[0]
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
