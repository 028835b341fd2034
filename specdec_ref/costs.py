"""The draft cost ratio c and the verification cost v(k), measured as paired ratios.

The speedup model divides tokens per target pass by k * c + v(k), so both costs must be measured
on the machine at hand. Dividing two medians taken at different moments lets a busy machine bend
the ratio; here every ratio comes from two passes timed back to back (a one-token target pass and
the pass being measured, their order alternating from round to round), and the median over the
rounds is reported with its interquartile range.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .inputs import check_context, clock as device_clock
from .kv_cache import new_cache, rollback
from .timing import quartiles


@dataclass(frozen=True)
class Costs:
    """Forward-pass costs in units of one one-token target pass on a ``context``-token KV cache."""

    context: int
    target_forward_seconds: float  # median one-token target pass
    cost_ratio: float  # c: one draft pass (one token) / one target pass (one token)
    cost_ratio_spread: tuple[float, float]  # interquartile range of the per-round ratios
    verify_costs: dict[int, float]  # v(k): a target pass over k + 1 tokens / a one-token pass
    verify_spread: dict[int, tuple[float, float]]


@torch.inference_mode()
def measure_costs(target: torch.nn.Module, draft: torch.nn.Module | None, context: int, ks: Iterable[int],
                  rounds: int = 7, warmup: int = 1, clock: Callable[[], float] | None = None) -> Costs:
    """Measure c and v(k) for each k in ``ks`` on top of ``context`` cached tokens.

    Each round times, for the draft and for every k, a one-token target pass and the measured pass
    back to back (alternating which goes first) and keeps their ratio; ``warmup`` rounds are
    discarded. ``clock`` is injectable so the protocol can be tested without real time.
    ``draft=None`` (a drafter without a model, e.g. prompt lookup) measures only v(k); c is 0.
    A drafter that reads the target's features (:class:`~specdec_ref.eagle.EagleDrafter`) is
    timed for one draft step after the context's features, as it drafts in the loop.
    """
    ks = sorted(set(ks))
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be integers >= 1, got {ks!r}")
    if rounds < 1 or warmup < 0 or context < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0 and context >= 1 (got {rounds}, {warmup}, {context})")
    total = context + max(ks) + 1
    check_context(target, total, "target")
    reads_features = getattr(draft, "reads_target_features", False)
    models = [target] if draft is None or reads_features else [target, draft]
    if draft is not None and not reads_features:
        check_context(draft, total, "draft model")
    now = clock or device_clock(target.device)
    vocab = min(model.config.vocab_size for model in models)
    ids = torch.randint(0, vocab, (1, total), generator=torch.Generator().manual_seed(0))
    caches = {}
    for model in models:
        caches[model] = new_cache(model)
        model(ids[:, :context].to(model.device), past_key_values=caches[model], use_cache=True, logits_to_keep=1)

    def target_pass(model: torch.nn.Module, tokens: int) -> Callable[[], None]:
        def run() -> None:
            model(ids[:, context: context + tokens].to(model.device), past_key_values=caches[model], use_cache=True)
            rollback(caches[model], context)
        return run

    def seconds(run: Callable[[], None]) -> float:
        start = now()
        run()
        return now() - start

    one_token_pass = target_pass(target, 1)
    passes = {k: target_pass(target, k + 1) for k in ks}
    if draft is not None:
        passes = {"draft": _feature_draft_step(target, draft, ids[0, : context + 1]) if reads_features
                  else target_pass(draft, 1)} | passes
    ratios: dict[str | int, list[float]] = {name: [] for name in passes}
    one_token: list[float] = []
    for round_ in range(warmup + rounds):
        for name, run in passes.items():
            if round_ % 2 == 0:
                base = seconds(one_token_pass)
                other = seconds(run)
            else:
                other = seconds(run)
                base = seconds(one_token_pass)
            if round_ >= warmup:
                ratios[name].append(other / base)
                one_token.append(base)
    return Costs(
        context=context,
        target_forward_seconds=statistics.median(one_token),
        cost_ratio=statistics.median(ratios["draft"]) if draft is not None else 0.0,
        cost_ratio_spread=quartiles(ratios["draft"]) if draft is not None else (0.0, 0.0),
        verify_costs={k: statistics.median(ratios[k]) for k in ks},
        verify_spread={k: quartiles(ratios[k]) for k in ks},
    )


def _feature_draft_step(target: torch.nn.Module, drafter, tokens: torch.LongTensor) -> Callable[[], None]:
    """One draft step of a feature-reading drafter after ``tokens``: it reads the last real
    feature and drafts one token; the drafter is rewound after each call, so calls repeat."""
    from .sampling import Sampler

    context = tokens.numel() - 1
    features = target(tokens[None, :context].to(target.device), output_hidden_states=True).hidden_states[-1][0]
    drafter.start(tokens[:context], 1)
    drafter.update(tokens[:context], 0, features[:-1])
    greedy = Sampler()

    def step() -> None:
        drafter.rewind(context - 1)
        drafter.update(tokens, 0, features[-1:])
        drafter.propose(tokens, 1, greedy)
    return step
