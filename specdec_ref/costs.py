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

from .drafters import DrafterBase, ModelDrafter, as_drafter_base
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
def measure_costs(target: torch.nn.Module, draft: torch.nn.Module | DrafterBase | None, context: int, ks: Iterable[int],
                  rounds: int = 7, warmup: int = 1, clock: Callable[[], float] | None = None) -> Costs:
    """Measure c and v(k) for each k in ``ks`` on top of ``context`` cached tokens.

    Each round times, for the draft and for every k, a one-token target pass and the measured pass
    back to back (alternating which goes first) and keeps their ratio; ``warmup`` rounds are
    discarded. ``clock`` is injectable so the protocol can be tested without real time.
    ``draft``: a draft model, or any drafter, timed for one step of its own
    (:meth:`~specdec_ref.drafters.DrafterBase.draft_step`: an EAGLE head after the context's
    features, as it drafts in the loop); ``None``, or a drafter that runs no model (prompt
    lookup), measures only v(k), and c is 0.
    """
    ks = sorted(set(ks))
    if not ks or any(not isinstance(k, int) or k < 1 for k in ks):
        raise ValueError(f"ks must be integers >= 1, got {ks!r}")
    if rounds < 1 or warmup < 0 or context < 1:
        raise ValueError(f"need rounds >= 1, warmup >= 0 and context >= 1 (got {rounds}, {warmup}, {context})")
    total = context + max(ks) + 1
    check_context(target, total, "target")
    if isinstance(draft, torch.nn.Module):
        check_context(draft, total, "draft model")
        draft = ModelDrafter(draft)
    elif draft is not None:
        draft = as_drafter_base(draft)
    now = clock or device_clock(target.device)
    ids = torch.randint(0, target.config.vocab_size, (1, total), generator=torch.Generator().manual_seed(0))
    draft_step = None if draft is None else draft.draft_step(target, ids[0, : context + 1])
    cache = new_cache(target)
    target(ids[:, :context].to(target.device), past_key_values=cache, use_cache=True, logits_to_keep=1)

    def target_pass(tokens: int) -> Callable[[], None]:
        def run() -> None:
            target(ids[:, context: context + tokens].to(target.device), past_key_values=cache, use_cache=True)
            rollback(cache, context)
        return run

    def seconds(run: Callable[[], None]) -> float:
        start = now()
        run()
        return now() - start

    one_token_pass = target_pass(1)
    passes = ({} if draft_step is None else {"draft": draft_step}) | {k: target_pass(k + 1) for k in ks}
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
        cost_ratio=statistics.median(ratios["draft"]) if draft_step is not None else 0.0,
        cost_ratio_spread=quartiles(ratios["draft"]) if draft_step is not None else (0.0, 0.0),
        verify_costs={k: statistics.median(ratios[k]) for k in ks},
        verify_spread={k: quartiles(ratios[k]) for k in ks},
    )
