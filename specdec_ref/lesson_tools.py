"""Measuring and reporting helpers that lessons 2 and 4 call, kept here so each lesson cell stays short.

- :func:`measure_batch_costs`: the cost of one decode step for ``B`` sequences, in one-sequence
  steps, as paired ratios (the protocol of :func:`specdec_ref.costs.measure_costs`, applied to
  batch size instead of draft length).
- :func:`profile_step`: where one decode step's time goes, at any batch size, as parts of one
  total (the parts' medians add up to the total the shares are taken of).
- :func:`matmul_bandwidth`: the weight bandwidth one linear kernel achieves, streaming from DRAM.
- :func:`whole_percentages`: shares rounded to whole percents that still add up to 100.
- :func:`rejection_output_distribution`: the exact distribution of the first token the
  speculative-sampling rule emits when the draft samples from one distribution and the verifier
  is told another (equal to the target's when the two are the same).
"""
from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from .inputs import check_context, clock as device_clock
from .kernels import bf16, packed
from .kv_cache import new_cache, rollback
from .roofline import last_level_cache_bytes
from .timing import decode_step, quartiles

# The parts profile_step splits a step into, in display order.
STEP_PARTS = ("weight matmuls", "attention", "concatenation", "other ops", "outside ops")
# Top-level profiler op names that are a weight matmul (eager nn.Linear, GPT-2 Conv1D, the fast kernels).
LINEAR_OPS = frozenset({"aten::linear", "aten::addmm", "mkldnn::_linear_pointwise", "specdec::bf16_weights_linear",
                        "specdec::gguf_weights_linear"})
ATTENTION_OPS = frozenset({"specdec::few_query_attention"})  # besides PyTorch's scaled_dot_product_* ops
# Operators that run a whole pass (or an EAGLE head's drafts) in C++, calling the ones above inside.
ONE_CALL_OPS = frozenset({"specdec::llama_layers", "specdec::eagle_greedy_chain"})


@dataclass(frozen=True)
class BatchCosts:
    """Decode-step costs at several batch sizes, in units of one one-sequence step."""

    context: int
    step_seconds: float  # median one-sequence step (one new token on a ``context``-token cache)
    cost: dict[int, float]  # batch -> median of (B-sequence step / one-sequence step), paired
    spread: dict[int, tuple[float, float]]  # batch -> interquartile range of those ratios

    def tokens_per_second(self, batch: int) -> float:
        """Tokens per second at ``batch``: B tokens per step, a step of ``cost[B]`` one-sequence steps."""
        return batch / (self.cost[batch] * self.step_seconds)


@torch.inference_mode()
def measure_batch_costs(model: torch.nn.Module, context: int, batches: Iterable[int], rounds: int = 5,
                        warmup: int = 1, clock: Callable[[], float] | None = None) -> BatchCosts:
    """Time one decode step for each batch size in ``batches`` against a one-sequence step.

    Each round times, for every batch size, a one-sequence step and the B-sequence step back to
    back (alternating which goes first from round to round) and keeps their ratio, so load that
    slows a moment slows both passes of a pair; ``warmup`` rounds are discarded. An untimed
    one-sequence step precedes each pair, so that neither of its passes pays for the caches the
    previous pair's larger step evicted (use an even ``rounds`` for equally many of each order). Every sequence
    has its own ``context``-token KV cache (random ids), rolled back after each step.
    ``clock`` is injectable so the protocol can be tested without real time.
    """
    batches = sorted(set(batches))
    if not batches or any(not isinstance(b, int) or b < 1 for b in batches):
        raise ValueError(f"batches must be integers >= 1, got {batches!r}")
    if rounds < 1 or warmup < 0 or context < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0 and context >= 1 (got {rounds}, {warmup}, {context})")
    check_context(model, context + 1, "model")
    now = clock or device_clock(model.device)

    def step_for(batch: int) -> Callable[[], None]:
        return decode_step(model, context, seed=batch, batch=batch)

    def seconds(run: Callable[[], None]) -> float:
        start = now()
        run()
        return now() - start

    one = step_for(1)
    steps = {b: (one if b == 1 else step_for(b)) for b in batches}
    ratios: dict[int, list[float]] = {b: [] for b in batches}
    one_step: list[float] = []
    for round_ in range(warmup + rounds):
        for batch, run in steps.items():
            one()  # untimed: both timed passes start from the same state
            if round_ % 2 == 0:
                base, other = seconds(one), seconds(run)
            else:
                other = seconds(run)
                base = seconds(one)
            if round_ >= warmup:
                ratios[batch].append(other / base)
                one_step.append(base)
    return BatchCosts(context=context, step_seconds=statistics.median(one_step),
                      cost={b: statistics.median(r) for b, r in ratios.items()},
                      spread={b: quartiles(r) for b, r in ratios.items()})


def _part(name: str) -> str:
    if name in LINEAR_OPS:
        return "weight matmuls"
    if "scaled_dot_product" in name or name in ATTENTION_OPS:
        return "attention"
    if name == "aten::cat":
        return "concatenation"
    return "other ops"


@torch.inference_mode()
def profile_step(model: torch.nn.Module, context: int = 64, batch: int = 1, repeats: int = 3,
                 seed: int = 0) -> dict[str, float]:
    """Where one decode step of ``batch`` sequences goes, in seconds per step (medians of ``repeats``).

    One token per sequence on a ``context``-token KV cache, under ``torch.profiler``, after a
    warm-up step. Top-level ops are counted once, children included (the operators inside a
    one-call pass, :data:`ONE_CALL_OPS`, as if called from Python): ``weight matmuls``
    (``nn.Linear`` and the fast path's kernels), ``attention`` (fused scaled-dot-product
    attention, or the fast path's attention kernel), ``concatenation`` (``aten::cat``: transformers' dynamic KV cache appends each
    new key and value by concatenating it to the whole cache, which copies the cache; rotary
    embeddings concatenate a little too), ``other ops``, and ``outside ops`` (wall time in no op:
    Python and ``transformers`` glue). ``total`` is the sum of those five medians, so the shares
    ``part / total`` add up to 1; the profiler adds a little time to every op.
    """
    from torch.profiler import ProfilerActivity, profile

    if batch < 1 or repeats < 1 or context < 1:
        raise ValueError(f"need batch, repeats and context >= 1 (got {batch}, {repeats}, {context})")
    check_context(model, context + 1, "model")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, context + 1), generator=generator).to(model.device)
    cache = new_cache(model)
    model(ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
    steps = []
    for i in range(repeats + 1):  # the first step is the warm-up
        with silenced_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            model(ids[:, context:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            wall = time.perf_counter() - start
        rollback(cache, context)
        if not i:
            continue
        step = dict.fromkeys(STEP_PARTS, 0.0)
        for event in prof.events():
            parent = event.cpu_parent
            if parent is None and event.name in ONE_CALL_OPS:  # its own loops; its operators below
                step["other ops"] += event.self_cpu_time_total / 1e6
            elif parent is None or (parent.cpu_parent is None and parent.name in ONE_CALL_OPS):
                step[_part(event.name)] += event.cpu_time_total / 1e6
        step["outside ops"] = max(0.0, wall - sum(step.values()))
        steps.append(step)
    parts = {part: statistics.median(s[part] for s in steps) for part in STEP_PARTS}
    return parts | {"total": sum(parts.values())}


@contextlib.contextmanager
def silenced_stderr():
    """Send file descriptor 2 to /dev/null: the profiler's C++ side logs a line at every start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@torch.inference_mode()
def matmul_bandwidth(out_features: int, in_features: int, fast: bool = False, tokens: int = 1,
                     repeats: int = 5, seed: int = 0, bf16_weights: bool = False) -> dict[str, float]:
    """The weight bandwidth one linear kernel achieves on ``tokens`` input rows.

    ``fast=False`` times ``nn.Linear`` (PyTorch's default CPU kernel), ``fast=True`` the
    prepacked oneDNN kernel (:mod:`specdec_ref.kernels.packed`), ``bf16_weights=True`` the bf16-stored
    kernel (:mod:`specdec_ref.kernels.bf16`, on bf16-valued weights; it reads 2 bytes per weight).
    Either raises ``RuntimeError`` where it is not available. Like a decode step, which
    streams weights far larger than the cache, the calls cycle through enough copies of the
    weight to overflow the last-level cache, so the figure is DRAM bandwidth, not cache
    bandwidth.

    Returns ``seconds`` (median per call), ``bytes_per_second`` (weight bytes read / seconds),
    ``weight_bytes`` (as the kernel reads them) and ``copies`` (distinct weights cycled through).
    """
    if fast and bf16_weights:
        raise ValueError("choose one kernel: fast=True (prepacked) or bf16_weights=True")
    ok, reason = bf16.available() if bf16_weights else packed.available() if fast else (True, "")
    if not ok:
        raise RuntimeError(f"the {'bf16-weight kernel' if bf16_weights else 'fast path'} is not available: {reason}")
    weight_bytes = out_features * in_features * (2 if bf16_weights else 4)
    llc = last_level_cache_bytes() or 32 * 2**20
    copies = max(1, math.ceil(2 * llc / weight_bytes))
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(copies):
        layer = torch.nn.Linear(in_features, out_features, bias=False)
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator))
        if bf16_weights:
            layer.weight.copy_(layer.weight.to(torch.bfloat16).float())  # bf16 values, like the zoo's
            layer = bf16.Bf16WeightLinear(layer.weight, None)
        elif fast:
            layer = packed.PackedLinear.from_layer(layer)
        layers.append(layer)
    x = torch.randn(1, tokens, in_features, generator=generator)
    rounds = max(1, math.ceil(50 / copies))  # at least ~50 calls per timing
    times = []
    for i in range(repeats + 1):  # the first pass is the warm-up
        start = time.perf_counter()
        for _ in range(rounds):
            for layer in layers:
                layer(x)
        if i:
            times.append((time.perf_counter() - start) / (rounds * copies))
    seconds = statistics.median(times)
    return {"seconds": seconds, "bytes_per_second": weight_bytes / seconds, "weight_bytes": float(weight_bytes),
            "copies": float(copies)}


def whole_percentages(values: Sequence[float]) -> list[int]:
    """Each value's share of their sum in whole percents, rounded so that the shares add up to
    exactly 100 (largest remainder: the shares that lost most to rounding down get the rest)."""
    if not values or any(v < 0 for v in values) or sum(values) <= 0:
        raise ValueError(f"need non-negative values with a positive sum, got {list(values)!r}")
    exact = [100 * v / sum(values) for v in values]
    shares = [int(e) for e in exact]
    for i in sorted(range(len(exact)), key=lambda i: shares[i] - exact[i])[: 100 - sum(shares)]:
        shares[i] += 1
    return shares


def rejection_output_distribution(p: torch.Tensor, q_sampled: torch.Tensor,
                                  q_told: torch.Tensor | None = None) -> torch.Tensor:
    """The exact distribution of the first token one round of speculative sampling emits.

    The draft samples ``x ~ q_sampled``; the verifier, told ``q_told`` (default: ``q_sampled``),
    keeps ``x`` with probability ``min(1, p(x) / q_told(x))`` and otherwise emits a sample of the
    normalised residual ``max(0, p - q_told)``. With ``q_told == q_sampled`` the result is ``p``;
    with another ``q_told`` it shows exactly where the output goes wrong.
    """
    p, q_sampled = p.double(), q_sampled.double()
    q_told = q_sampled if q_told is None else q_told.double()
    ratio = torch.where(q_told > 0, p / q_told.clamp_min(1e-300), torch.ones_like(p))
    kept = q_sampled * ratio.clamp(max=1.0)
    residual = (p - q_told).clamp_min(0.0)
    rejected = 1.0 - kept.sum()
    if residual.sum() <= 0:
        return kept
    return kept + rejected * residual / residual.sum()
