"""Benchmark harness: baseline vs our speculative loop vs transformers' assisted generation.

All methods run on the same pair, prompts and k, in one process, interleaved prompt by
prompt (so drift in machine load hits every method alike), after a warm-up. Speedups
are medians of per-prompt ratios to the baseline; outputs are compared, not assumed equal.
The cost model's prediction is given twice: with c and v(k) from isolated passes timed after the
runs (:func:`specdec_ref.costs.measure_costs`), and with c and v as the runs themselves paid them
(:func:`specdec_ref.paired.in_run_costs`), which a machine whose speed drifts cannot pull apart.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property

import torch
from tqdm.auto import tqdm

from . import roofline
from .kernels import fast
from .baseline import autoregressive_generate
from .costs import Costs, measure_costs
from .drafters import DrafterBase
from .eagle import TREE_SIZES, DraftTree, EagleDrafter, drafts_chain_in_one_call, measured_tree
from .ngram import PromptLookupDrafter
from .paired import SpeedCheck, check_speed, in_run_costs, time_rotated
from .inputs import clock
from .modules import like
from .speculative import as_drafter, speculative_generate
from .stats import GenerationStats
from .timing import quartiles
from .tokenizer_compat import compare_tokenizers


@dataclass
class Pair:
    """A target and what drafts for it: a draft model (with its tokenizer when it may differ from
    the target's) or any drafter (prompt lookup, an EAGLE head; ``draft_tokenizer`` None)."""

    target: torch.nn.Module
    draft: torch.nn.Module | DrafterBase
    target_tokenizer: object
    draft_tokenizer: object | None
    path: str = "eager"  # how both models run (specdec_ref.kernels.choice.PATHS)
    path_reason: str = "the stock model, as asked"  # why, in one line
    draft_note: str = ""  # how the drafter drafts, in one line, where there is a choice (an EAGLE head's shape)
    cross_tokenizer: bool = field(init=False)

    def __post_init__(self) -> None:
        self.cross_tokenizer = self.draft_tokenizer is not None and not compare_tokenizers(
            self.target_tokenizer, self.draft_tokenizer).native_ok

    @cached_property
    def drafter(self) -> DrafterBase:
        """The drafter the loop runs, checked against the target; built on first use (a pair made
        only to compare with transformers never needs one)."""
        return as_drafter(self.draft, self.target, **self.tokenizer_kwargs)

    @property
    def prompt_lookup(self) -> bool:
        """Whether transformers' own prompt lookup decoding is the method to compare with."""
        return isinstance(self.draft, PromptLookupDrafter)

    @property
    def draft_model(self) -> torch.nn.Module | None:
        """The draft as a causal LM (what transformers' assisted generation takes), else None."""
        return self.draft if isinstance(self.draft, torch.nn.Module) else None

    @property
    def tokenizer_kwargs(self) -> dict:
        """What speculative_generate needs for this pair's draft model: the tokenizers on the UAG path, and
        where a same-tokenizer draft's vocabulary is padded (as_drafter then cuts its logits); else none."""
        padded = self.draft_model is not None and self.draft.config.vocab_size != self.target.config.vocab_size
        if not (self.cross_tokenizer or padded):
            return {}
        return {"target_tokenizer": self.target_tokenizer, "draft_tokenizer": self.draft_tokenizer}


def load_pair(target: str, draft: str, device: str = "cpu", dtype: torch.dtype = torch.float32,
              path: str = "eager", eagle_tree: bool | None = None, greedy: bool = True) -> Pair:
    """Load a pair by zoo name (``zoo:target``), local path or Hub id; ``draft="ngram"`` is prompt
    lookup; an EAGLE head (``zoo:smollm2-eagle`` or its folder) drafts from the target's features.
    ``path``: how both models run, one of :data:`specdec_ref.kernels.choice.PATHS` ("eager",
    "weights-first", "fast"), or "auto" for the quickest on this machine, measured at load
    (:func:`specdec_ref.kernels.choice.fastest_path`); the draft runs the way its target does.
    ``eagle_tree``: an EAGLE head drafts a dynamic tree (EAGLE-2) sized from the draft and
    verification costs measured at load on the chosen path (:func:`specdec_ref.eagle.measured_tree`);
    False: a chain; ``None`` (default): a chain where the path runs the head's greedy chain as one
    call and decoding is ``greedy`` (there the chain beat the tree, whose head steps run one by one
    from Python, on every prompt kind: docs/BENCHMARKS.md, 2026-12-08), the tree elsewhere."""
    from . import zoo
    from .kernels.choice import PATHS, fastest_path, on_path

    if path not in (*PATHS, "auto"):
        raise ValueError(f"unknown path {path!r}; choose auto or one of {', '.join(PATHS)}")
    target_model, target_tokenizer = zoo.load(target, dtype=dtype, device=device)
    if path == "auto":
        choice = fastest_path(target_model)
        target_model, path, reason = choice.model, choice.name, choice.reason()
    else:
        target_model, reason = on_path(target_model, path), f"{path}, as asked"
    if draft == "ngram":
        return Pair(target_model, PromptLookupDrafter(), target_tokenizer, None, path, reason)
    if zoo.is_eagle_head(draft):
        head, vocab = zoo.load_eagle(draft, dtype=dtype, device=device)
        drafter, note = eagle_drafter(head, target_model, vocab, eagle_tree, greedy)
        return Pair(target_model, drafter, target_tokenizer, None, path, reason, note)
    draft_model, draft_tokenizer = zoo.load(draft, dtype=dtype, device=device)
    return Pair(target_model, like(draft_model, target_model), target_tokenizer, draft_tokenizer, path, reason)


def eagle_drafter(head, target: torch.nn.Module, vocab: torch.LongTensor | None, tree: bool | None = None,
                  greedy: bool = True) -> tuple[EagleDrafter, str]:
    """An EAGLE head's drafter for ``target`` in the shape :func:`load_pair`'s ``eagle_tree`` names
    (``tree``), and a sentence saying which shape and why."""
    if tree is None and greedy and drafts_chain_in_one_call(target):
        return EagleDrafter(head, target, vocab), ("the EAGLE head drafts a chain: on this path its k greedy draft "
                                                   "steps run as one call, where a dynamic tree's run one by one "
                                                   "(--eagle-tree drafts the tree)")
    if tree is False:
        return EagleDrafter(head, target, vocab), "the EAGLE head drafts a chain, as asked"
    measured = measured_tree(target, head, vocab)
    note = (f"the EAGLE head drafts a dynamic tree (EAGLE-2): each depth grows the best {measured.top_k} nodes' best "
            f"{measured.top_k} tokens; the nodes verified per pass (at most {measured.max_nodes}) are chosen from the "
            f"costs measured at load on this path, c = {measured.draft_cost:.3f}, v(n) = "
            + ", ".join(f"{v:.2f}" for v in measured.verify_costs.values())
            + f" for n = {', '.join(map(str, measured.verify_costs))}")
    return EagleDrafter(head, target, vocab, tree=measured), note


def repetition_prompts(prompts: Sequence[str]) -> list[str]:
    """Prompts whose continuation repeats earlier text: each snippet, then the start of it again
    (the shape of "edit or continue the code above"), where prompt lookup shines."""
    return [f"{p}\n\n{p[: len(p) // 2]}" for p in prompts]


def hf_assisted_generate(pair: Pair, input_ids: torch.LongTensor, k: int, max_new_tokens: int,
                         temperature: float | None = None) -> torch.LongTensor:
    """transformers' assisted generation at a constant k (no adaptive schedule, no early stop),
    or its prompt lookup decoding for an n-gram pair; greedy, or sampling at ``temperature``
    (no top-k or top-p: the same rule as ours; seed torch's global generator first)."""
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else dict(do_sample=False)
    common = dict(attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                  eos_token_id=[], pad_token_id=pair.target_tokenizer.pad_token_id, **sampling)
    if pair.prompt_lookup:
        return pair.target.generate(input_ids, prompt_lookup_num_tokens=k,
                                    max_matching_ngram_size=pair.draft.max_ngram, **common)
    config = pair.draft.generation_config
    saved = (config.num_assistant_tokens, config.num_assistant_tokens_schedule, config.assistant_confidence_threshold)
    config.num_assistant_tokens, config.num_assistant_tokens_schedule = k, "constant"
    config.assistant_confidence_threshold = 0.0
    try:
        extra = {"tokenizer": pair.target_tokenizer, "assistant_tokenizer": pair.draft_tokenizer} \
            if pair.cross_tokenizer else {}
        return pair.target.generate(input_ids, assistant_model=pair.draft, **common, **extra)
    finally:
        (config.num_assistant_tokens, config.num_assistant_tokens_schedule,
         config.assistant_confidence_threshold) = saved


@dataclass
class BaselineResult:
    """The target alone on every prompt."""

    tokens_per_second: float  # median over prompts
    tokens_per_second_spread: tuple[float, float]  # interquartile range
    bandwidth_achieved: float  # bytes/s of target weights read, median over prompts
    seconds: list[float]  # per prompt, in the order given
    new_token_ids: list[list[int]]  # per prompt: what the target generated


@dataclass
class MethodResult:
    """One method at one k on every prompt, against the baseline prompt by prompt."""

    tokens_per_second: float  # median over prompts
    tokens_per_second_spread: tuple[float, float]  # interquartile range
    speedup: float  # median of per-prompt ratios: baseline seconds / this method's seconds
    identical_outputs: bool | None  # every output equal to the baseline's; None when sampling
    seconds: list[float]  # per prompt, in the order given


@dataclass
class DraftFigures:
    """What a speculative method's drafts did: over every prompt (its stats combined), and per prompt."""

    acceptance_rate: float  # accepted / drafted
    acceptance_probability: float  # the i.i.d. model's a: accepted / judged
    tokens_per_target_pass: float  # tau
    drafted_per_iteration: float
    draft_forward_calls_per_iteration: float  # k for a draft model; k + 1 on the UAG path
    accepted_histogram: list[int]  # [j]: iterations that accepted exactly j drafts
    drafted: list[int]  # per prompt, in the order given: for grouping prompts afterwards (e.g. by kind)
    accepted: list[int]  # per prompt

    @classmethod
    def of(cls, stats: Sequence[GenerationStats]) -> DraftFigures:
        """From the method's stats, one per prompt in the order given."""
        total = GenerationStats.combined(stats)
        return cls(acceptance_rate=total.acceptance_rate, acceptance_probability=total.acceptance_probability,
                   tokens_per_target_pass=total.tokens_per_target_pass,
                   drafted_per_iteration=total.drafted_per_iteration,
                   draft_forward_calls_per_iteration=total.draft_forward_calls_per_iteration,
                   accepted_histogram=total.accepted_histogram,
                   drafted=[s.drafted_tokens for s in stats], accepted=[s.accepted_tokens for s in stats])


@dataclass
class KResult:
    """Every method at one draft length k, and what the speculative loop's drafts and costs say of its speedup."""

    k: int
    methods: dict[str, MethodResult]  # "speculative"; "speculative_dynamic" and "hf_assisted" when run
    drafts: DraftFigures  # the speculative loop's
    dynamic_drafts: DraftFigures | None  # speculative_dynamic's, when run
    speed_check: SpeedCheck  # the speculative speedup read against the cost model (paired.check_speed)
    # from a, and the cost model's c and v(k); None for a tree of drafts, whose tokens per pass the
    # chain's formula in a does not give
    predicted_speedup: float | None
    predicted_speedup_from_tau: float  # from tau, and the cost model's c and v (a tree's: v at its mean size)
    in_run_cost_ratio: float  # c as these runs paid it (paired.in_run_costs)
    in_run_verify_cost: float  # v as these runs paid it
    predicted_speedup_in_run: float | None  # from a, and the c and v these runs paid (None for a tree)
    bandwidth_achieved: float  # bytes/s of target and draft weights read by the speculative loop, median over prompts
    time_split_seconds: dict[str, float]  # the speculative loop's median prefill, draft, verify, bookkeeping seconds

    @property
    def speculative(self) -> MethodResult:
        """Our speculative loop's result (always run)."""
        return self.methods["speculative"]


@dataclass
class BenchResult:
    """What :func:`run` measured: the baseline, every method at every k, and the cost model."""

    max_new_tokens: int
    prompts: int
    cross_tokenizer: bool
    temperature: float | None  # None: greedy
    min_draft_confidence: float | None  # the speculative_dynamic method's bar; None: not run
    target_weight_bytes: float  # read per target pass (roofline.streamed_weight_bytes: as the path stores them)
    draft_weight_bytes: float
    cost_model: Costs  # c and v(k) from isolated passes timed after the runs
    baseline: BaselineResult
    configs: list[KResult]  # one per k, in the order given

    @property
    def best(self) -> KResult:
        """The k whose speculative speedup is highest."""
        return max(self.configs, key=lambda c: c.speculative.speedup)

    def to_json(self) -> dict:
        """Every field as plain JSON values, with each speed check's verdict and the best k."""
        out = asdict(self) | {"best_k": self.best.k}
        for config, result in zip(out["configs"], self.configs):
            config["speed_check"]["verdict"] = result.speed_check.verdict
        return out


def run(pair: Pair, prompts: Sequence[str], ks: Sequence[int], max_new_tokens: int = 128,
        hf_assisted: bool = True, progress: bool = True, min_draft_confidence: float | None = None,
        temperature: float | None = None, seed: int = 0) -> BenchResult:
    """Benchmark every method on every prompt (``BenchResult.to_json`` gives it as JSON).

    ``min_draft_confidence`` adds a method, ``speculative_dynamic``: our loop with k as the
    most drafts per iteration and the draft stopping early below that confidence.
    ``temperature`` switches every method from greedy to sampling at that temperature (each
    call seeded from ``seed`` and the prompt's index). Sampled outputs are not compared:
    speculative sampling keeps the target's *distribution*, not its individual samples, so
    their ``identical_outputs`` are None.
    """
    if min_draft_confidence is not None and pair.draft_model is None:
        raise ValueError("min_draft_confidence needs a draft model; prompt lookup and EAGLE heads take "
                         "it on their drafter instead")
    if hf_assisted and pair.draft_model is None and not pair.prompt_lookup:
        raise ValueError("transformers has no assisted generation for this drafter; pass hf_assisted=False")
    if temperature is not None and not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling (got {temperature})")
    encoded = [pair.target_tokenizer(p, return_tensors="pt").input_ids.to(pair.target.device)
               for p in prompts]
    rule = dict(do_sample=temperature is not None, temperature=temperature or 1.0)

    def rng(index: int) -> torch.Generator:
        torch.manual_seed(seed + index)  # transformers' generate samples from the global generator
        return torch.Generator(pair.target.device).manual_seed(seed + index)

    # EOS is off for every method, so each produces exactly max_new_tokens.
    generate = {
        "baseline": lambda ids, k, i: autoregressive_generate(pair.target, ids, max_new_tokens, eos_token_id=[],
                                                              generator=rng(i), **rule),
        "speculative": lambda ids, k, i: speculative_generate(pair.target, pair.drafter, ids, max_new_tokens, k,
                                                              eos_token_id=[], generator=rng(i), **rule),
    }
    if min_draft_confidence is not None:
        generate["speculative_dynamic"] = lambda ids, k, i: speculative_generate(
            pair.target, pair.draft, ids, max_new_tokens, k, eos_token_id=[], generator=rng(i), **rule,
            min_draft_confidence=min_draft_confidence, **pair.tokenizer_kwargs)
    if hf_assisted:
        def assisted(ids: torch.LongTensor, k: int, i: int) -> torch.LongTensor:
            rng(i)  # seeds the global generator transformers samples from
            return hf_assisted_generate(pair, ids, k, max_new_tokens, temperature)

        generate["hf_assisted"] = assisted

    for name, fn in generate.items():  # warm-up: allocator, kernels, tokenizer caches
        fn(encoded[0], ks[0], 0)

    now = clock(pair.target.device)
    baseline = []
    runs = {k: {name: [] for name in generate if name != "baseline"} for k in ks}
    bar = tqdm(encoded, desc="prompts", disable=not progress)
    for i, ids in enumerate(bar):
        # Every method at every k on this prompt, the order rotating from prompt to prompt.
        outputs: dict[tuple, object] = {}
        methods = {("baseline", None): None} | {(name, k): None for k in ks for name in runs[k]}
        calls = {method: (lambda m=method: outputs.__setitem__(m, generate[m[0]](ids, m[1], i))) for method in methods}
        seconds = time_rotated(calls, warmup=0, repeats=1, clock=now, first_round=i)
        for (name, k), out in outputs.items():
            sequences = out if isinstance(out, torch.Tensor) else out.sequences  # transformers returns a tensor
            record = {"sequences": sequences, "seconds": seconds[name, k][0],
                      "stats": None if isinstance(out, torch.Tensor) else out.stats}
            (baseline if name == "baseline" else runs[k][name]).append(record)
        bar.set_postfix(baseline_tok_s=f"{max_new_tokens / baseline[-1]['seconds']:.0f}")

    context = int(statistics.median(ids.shape[1] for ids in encoded)) + max_new_tokens // 2
    # c = 0 for a drafter that runs no model; a tree verifies more than k drafts: v over its sizes too
    tree = getattr(pair.drafter, "tree", None)
    costs = measure_costs(pair.target, pair.drafter, context, sorted(set(ks) | set(TREE_SIZES if tree else ())))
    target_bytes = roofline.streamed_weight_bytes(pair.target)  # the codes or bf16 copy a fast layer reads
    draft_bytes = pair.drafter.weight_bytes
    base_tps = [max_new_tokens / r["seconds"] for r in baseline]
    base = BaselineResult(
        tokens_per_second=statistics.median(base_tps),
        tokens_per_second_spread=quartiles(base_tps),
        bandwidth_achieved=statistics.median(
            roofline.bandwidth_achieved(target_bytes, r["stats"].target_forward_calls, r["seconds"])
            for r in baseline),
        seconds=[r["seconds"] for r in baseline],
        new_token_ids=[r["sequences"][0, ids.shape[1]:].tolist() for r, ids in zip(baseline, encoded)],
    )
    configs = []
    for k in ks:
        speculative, dynamic = runs[k]["speculative"], runs[k].get("speculative_dynamic")
        stats = [r["stats"] for r in speculative]
        drafts = DraftFigures.of(stats)
        # c and v as these very runs paid them (in their baselines' decode step): no drift between
        # the runs and a separate measurement, and the contexts the loop really had
        c_run, v_run = in_run_costs([b["stats"] for b in baseline], stats)
        # a tree's pass verifies its nodes, on average drafted_per_iteration of them
        verify = costs.verify_costs[k] if tree is None else DraftTree(
            verify_costs=costs.verify_costs).verify_cost(drafts.drafted_per_iteration)
        configs.append(KResult(
            k=k,
            methods={name: _method_result(baseline, method_runs, max_new_tokens, greedy=temperature is None)
                     for name, method_runs in runs[k].items()},
            drafts=drafts,
            dynamic_drafts=DraftFigures.of([r["stats"] for r in dynamic]) if dynamic else None,
            speed_check=check_speed([b["seconds"] / r["seconds"] for b, r in zip(baseline, speculative)],
                                    drafts.tokens_per_target_pass, verify_cost=verify),
            predicted_speedup=None if tree else roofline.expected_speedup(
                drafts.acceptance_probability, k, costs.cost_ratio, verify),
            predicted_speedup_from_tau=roofline.speedup_from_tokens_per_pass(
                drafts.tokens_per_target_pass, drafts.draft_forward_calls_per_iteration, costs.cost_ratio, verify),
            in_run_cost_ratio=c_run,
            in_run_verify_cost=v_run,
            predicted_speedup_in_run=None if tree else roofline.expected_speedup(
                drafts.acceptance_probability, k, c_run, v_run),
            bandwidth_achieved=statistics.median(
                roofline.bandwidth_achieved(target_bytes, s.target_forward_calls, r["seconds"])
                + roofline.bandwidth_achieved(draft_bytes, s.draft_forward_calls, r["seconds"])
                for s, r in zip(stats, speculative)),
            time_split_seconds={part: statistics.median(getattr(s, f"{part}_seconds") for s in stats)
                                for part in ("prefill", "draft", "verify", "bookkeeping")},
        ))
    return BenchResult(max_new_tokens=max_new_tokens, prompts=len(prompts), cross_tokenizer=pair.cross_tokenizer,
                       temperature=temperature, min_draft_confidence=min_draft_confidence,
                       target_weight_bytes=target_bytes, draft_weight_bytes=draft_bytes, cost_model=costs,
                       baseline=base, configs=configs)


def _method_result(baseline: list[dict], runs: list[dict], max_new_tokens: int, greedy: bool) -> MethodResult:
    """One method's runs against the baseline's, prompt by prompt (outputs compared only when greedy)."""
    tps = [max_new_tokens / r["seconds"] for r in runs]
    return MethodResult(
        tokens_per_second=statistics.median(tps),
        tokens_per_second_spread=quartiles(tps),
        speedup=statistics.median(b["seconds"] / r["seconds"] for b, r in zip(baseline, runs)),
        identical_outputs=all(torch.equal(b["sequences"].cpu(), r["sequences"].cpu())
                              for b, r in zip(baseline, runs)) if greedy else None,
        seconds=[r["seconds"] for r in runs],
    )


def compare_drafters(target: torch.nn.Module, drafters: dict[str, object], prompts: Sequence[torch.LongTensor],
                     max_new_tokens: int, ks: Sequence[int]) -> dict:
    """The baseline and every drafter at every k on every prompt, greedy, EOS ignored (so every
    run makes exactly ``max_new_tokens`` tokens). One warm-up run of each method first; then
    prompt by prompt, the methods in an order that rotates from prompt to prompt
    (:func:`specdec_ref.paired.time_rotated`), so drift in the machine's load hits them alike. ``drafters`` maps a name to anything ``speculative_generate``
    takes as its draft. Returns ``{None: runs, (name, k): runs}``, each run ``{"seconds",
    "output"}`` in prompt order: speedups are then medians of per-prompt ratios."""
    def generate(method, ids):
        if method is None:
            return autoregressive_generate(target, ids, max_new_tokens, eos_token_id=[])
        return speculative_generate(target, drafters[method[0]], ids, max_new_tokens, method[1], eos_token_id=[])

    methods = [None] + [(name, k) for name in drafters for k in ks]
    for method in methods:
        generate(method, prompts[0])
    now = clock(target.device)
    runs: dict = {method: [] for method in methods}
    for i, ids in enumerate(prompts):
        outputs: dict = {}
        calls = {method: (lambda m=method: outputs.__setitem__(m, generate(m, ids))) for method in methods}
        seconds = time_rotated(calls, warmup=0, repeats=1, clock=now, first_round=i)
        for method in methods:
            runs[method].append({"seconds": seconds[method][0], "output": outputs[method]})
    return runs


def dram_bandwidth(rounds: int = 3) -> float:
    """This machine's DRAM bandwidth (bytes/s): STREAM triad on arrays twice the last-level cache,
    the best of ``rounds`` measurements (other work on the machine can only lower it)."""
    llc = roofline.last_level_cache_bytes() or 32 * 2**20
    return max(roofline.measure_memory_bandwidth(2 * llc, repeats=3)["triad"] for _ in range(rounds))


@dataclass
class VersionResult:
    """One method run one way, eager or on the fast path, on every prompt."""

    tokens_per_second: float  # median over prompts
    tokens_per_second_spread: tuple[float, float]  # interquartile range
    bandwidth_achieved: float  # bytes/s of the weights this version reads, median over prompts
    bandwidth_share: float  # bandwidth_achieved / the DRAM bandwidth
    speedup_over_own_baseline: float  # median of per-prompt ratios to this version's baseline
    speedup_over_eager: float  # median of per-prompt ratios to the same method run eagerly
    identical_prompts: int  # prompts whose output equals the eager baseline's


@dataclass
class EagerVsFast:
    """One method, the baseline or speculative decoding at one k, eager and on the fast path."""

    k: int | None  # None: the baseline
    eager: VersionResult
    fast: VersionResult


@dataclass
class FastBenchResult:
    """What :func:`run_fast` measured: the baseline and every k, eager and fast side by side."""

    max_new_tokens: int
    prompts: int
    threads: int  # torch threads
    fast_path: str  # what the fast path runs (kernels.fast.path_name)
    compiled: bool  # whether it runs under torch.compile
    warmup_seconds: dict[str, float]  # per version ("eager", "fast"), compilation included
    dram_bandwidth: float  # bytes/s
    target_weight_bytes: float  # read per eager target pass
    draft_weight_bytes: float  # read per eager draft step
    fast_target_weight_bytes: float  # read per fast target pass
    seconds_per_token_bound: float  # eager target weights / DRAM bandwidth
    fast_seconds_per_token_bound: float  # fast target weights / DRAM bandwidth
    baseline: EagerVsFast
    configs: list[EagerVsFast]  # one per k, in the order given

    @property
    def best(self) -> EagerVsFast:
        """The k whose fast speculative decoding gains most over the fast baseline."""
        return max(self.configs, key=lambda c: c.fast.speedup_over_own_baseline)

    def to_json(self) -> dict:
        """Every field as plain JSON values, with the best k."""
        return asdict(self) | {"best_k": self.best.k}


def run_fast(pair: Pair, prompts: Sequence[str], ks: Sequence[int], max_new_tokens: int = 128,
             progress: bool = True, compile: bool = False, bandwidth: float | None = None) -> FastBenchResult:
    """The eager pair against its :func:`specdec_ref.kernels.fast.prepare` version, side by side.

    Baseline and speculative decoding at every k run for both versions on every prompt,
    interleaved (the order rotating from prompt to prompt), after a warm-up whose
    seconds are reported (with ``compile=True`` they include the compilation). Speedups
    are medians of per-prompt ratios; outputs are compared with the eager baseline's, prompt
    by prompt. Bandwidth achieved is also given as a share of the DRAM bandwidth measured
    here, with the torch threads used (or ``bandwidth``, bytes/s, if the caller measured it
    already: one figure per report); each version's bytes are those it reads
    (:func:`specdec_ref.roofline.streamed_weight_bytes`). Raises ``ValueError`` where the fast path does not apply.
    """
    ok, reason = (fast.compile_available if compile else fast.available)(pair.target)
    if not ok:
        raise ValueError(f"the fast path does not apply: {reason}")
    fast_target = fast.prepare(pair.target, compile=compile)
    fast_pair = Pair(fast_target, pair.drafter.for_target(fast_target), pair.target_tokenizer, pair.draft_tokenizer)
    versions = {"eager": pair, "fast": fast_pair}
    encoded = [pair.target_tokenizer(p, return_tensors="pt").input_ids.to(pair.target.device) for p in prompts]

    def generate(version: str, ids: torch.LongTensor, k: int | None):
        p = versions[version]
        if k is None:
            return autoregressive_generate(p.target, ids, max_new_tokens, eos_token_id=[])
        return speculative_generate(p.target, p.drafter, ids, max_new_tokens, k, eos_token_id=[])

    methods = [None, *ks]  # None: the baseline
    warmup_seconds = {}
    for version in versions:  # warm-up: allocator, kernels, tokenizer caches, compilation (a graph per k)
        start = time.perf_counter()
        for k in methods:
            generate(version, encoded[0], k)
        warmup_seconds[version] = time.perf_counter() - start
    bandwidth = bandwidth or dram_bandwidth()
    now = clock(pair.target.device)
    runs = {(version, k): [] for version in versions for k in methods}
    for i, ids in enumerate(tqdm(encoded, desc="prompts", disable=not progress)):
        outputs: dict = {}
        calls = {(version, k): (lambda v=version, k=k: outputs.__setitem__((v, k), generate(v, ids, k)))
                 for k in methods for version in versions}
        seconds = time_rotated(calls, warmup=0, repeats=1, clock=now, first_round=i)
        for key, out in outputs.items():
            runs[key].append({"sequences": out.sequences, "seconds": seconds[key][0], "stats": out.stats})

    # Bytes each version reads per pass: bf16-stored layers read half their fp32 weight's.
    streamed = {version: (roofline.streamed_weight_bytes(p.target), p.drafter.weight_bytes)
                for version, p in versions.items()}
    eager_baseline = runs["eager", None]

    def figures(version: str, k: int | None) -> VersionResult:
        results = runs[version, k]
        tps = [max_new_tokens / r["seconds"] for r in results]
        target_bytes, draft_bytes = streamed[version]
        achieved = statistics.median(
            roofline.bandwidth_achieved(target_bytes, r["stats"].target_forward_calls, r["seconds"])
            + roofline.bandwidth_achieved(draft_bytes, r["stats"].draft_forward_calls, r["seconds"])
            for r in results)
        own_baseline = runs[version, None]
        return VersionResult(
            tokens_per_second=statistics.median(tps),
            tokens_per_second_spread=quartiles(tps),
            bandwidth_achieved=achieved,
            bandwidth_share=achieved / bandwidth,
            # per-prompt ratios: the same version's baseline, and the same method run eagerly
            speedup_over_own_baseline=statistics.median(b["seconds"] / r["seconds"]
                                                        for b, r in zip(own_baseline, results)),
            speedup_over_eager=statistics.median(e["seconds"] / r["seconds"]
                                                 for e, r in zip(runs["eager", k], results)),
            identical_prompts=sum(torch.equal(b["sequences"].cpu(), r["sequences"].cpu())
                                  for b, r in zip(eager_baseline, results)),
        )

    def side_by_side(k: int | None) -> EagerVsFast:
        return EagerVsFast(k, figures("eager", k), figures("fast", k))

    return FastBenchResult(
        max_new_tokens=max_new_tokens,
        prompts=len(prompts),
        threads=torch.get_num_threads(),
        fast_path=fast.path_name(fast_pair.target),
        compiled=compile,
        warmup_seconds=warmup_seconds,
        dram_bandwidth=bandwidth,
        target_weight_bytes=streamed["eager"][0],
        draft_weight_bytes=streamed["eager"][1],
        fast_target_weight_bytes=streamed["fast"][0],
        seconds_per_token_bound=roofline.seconds_per_token_bound(streamed["eager"][0], bandwidth),
        fast_seconds_per_token_bound=roofline.seconds_per_token_bound(streamed["fast"][0], bandwidth),
        baseline=side_by_side(None),
        configs=[side_by_side(k) for k in ks],
    )


def plot(summary: BenchResult, path: str) -> None:
    """Measured vs predicted speedup over k, and the accepted-per-iteration histogram at the best k."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = summary.configs
    ks = [c.k for c in configs]

    def measured(method: str) -> list[float]:
        return [c.methods[method].speedup for c in configs]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.plot(ks, measured("speculative"), "o-", label="specdec_ref (measured)")
    if all(c.predicted_speedup is not None for c in configs):
        left.plot(ks, [c.predicted_speedup for c in configs], "s--", label="predicted from measured a, c, v(k)")
    left.plot(ks, [c.predicted_speedup_from_tau for c in configs], "d:", label="predicted from measured tau, c, v(k)")
    if summary.min_draft_confidence is not None:
        left.plot(ks, measured("speculative_dynamic"), "v-",
                  label=f"specdec_ref, dynamic k (confidence >= {summary.min_draft_confidence})")
    if "hf_assisted" in configs[0].methods:
        left.plot(ks, measured("hf_assisted"), "^-", label="transformers assisted (measured)")
    left.axhline(1.0, color="grey", lw=1, label="baseline (break-even)")
    left.set(xlabel="k (draft tokens per iteration)", ylabel="speedup over the baseline",
             title=f"{summary.prompts} prompts, {summary.max_new_tokens} new tokens")
    left.set_xticks(ks)  # k is a whole number of drafts
    left.legend(fontsize="small")
    best = summary.best
    histogram = best.drafts.accepted_histogram
    right.bar(range(len(histogram)), histogram)
    right.set_xticks(range(len(histogram)))
    right.set(xlabel="drafts accepted in the iteration", ylabel="iterations",
              title=f"k = {best.k}: acceptance {best.drafts.acceptance_rate:.2f}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
