"""What a generation run returns: the tokens and the speculative "health check"; and a health
check on the generated text itself (:func:`loop_period`)."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields

import torch


@dataclass
class GenerationStats:
    """Counters and timings of one generation run.

    Definitions (the same in the lessons, the benchmarks and the vLLM readers):
    acceptance rate = accepted draft tokens / drafted tokens; tokens per target
    pass = new tokens / verification passes, which counts the token the target
    contributes itself (the correction or the bonus token).

    The acceptance rate is *not* the per-token acceptance probability a of the
    i.i.d. model tau = (1 - a^(k+1)) / (1 - a): drafts after the first rejection are
    never judged, yet count as drafted. ``acceptance_probability`` estimates a from
    the drafts the target did judge: accepted / (accepted + rejections).
    """

    num_draft_tokens: int = 0
    new_tokens: int = 0
    iterations: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    rejections: int = 0  # iterations that ended in a rejected draft (at most one per iteration)
    # accepted_histogram[j] = iterations that accepted exactly j drafted tokens
    # (iterations that drafted nothing, e.g. an n-gram miss, are not counted here).
    accepted_histogram: list[int] = field(default_factory=list)
    target_forward_calls: int = 0
    draft_forward_calls: int = 0
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    total_seconds: float = 0.0
    # Finer split of draft_seconds reported by the drafter (e.g. UAG's decode / encode / align).
    draft_breakdown: dict[str, float] = field(default_factory=dict)

    def record_iteration(self, proposal, num_accepted: int, rejected: bool, draft_seconds: float,
                         verify_seconds: float) -> None:
        """Count one draft / verify iteration: its :class:`~specdec_ref.drafters.Proposal`, the
        drafts kept, whether one was rejected, and its draft and verification times."""
        self.iterations += 1
        self.target_forward_calls += 1
        self.draft_forward_calls += proposal.forward_calls
        self.drafted_tokens += proposal.tokens.numel()
        self.accepted_tokens += num_accepted
        self.rejections += rejected
        if proposal.tokens.numel():
            self.accepted_histogram[num_accepted] += 1
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds
        for name, seconds in proposal.seconds.items():
            self.draft_breakdown[name] = self.draft_breakdown.get(name, 0.0) + seconds

    @classmethod
    def combined(cls, runs: Iterable[GenerationStats]) -> GenerationStats:
        """The stats of several runs as one: counters, timings and histograms summed, so the
        derived figures are ratios of totals (not means of per-run ratios)."""
        total = cls()
        for run in runs:
            for f in fields(cls):
                mine, theirs = getattr(total, f.name), getattr(run, f.name)
                if f.name == "num_draft_tokens":
                    total.num_draft_tokens = max(mine, theirs)
                elif f.name == "accepted_histogram":
                    width = max(len(mine), len(theirs))
                    total.accepted_histogram = [sum(h[j] for h in (mine, theirs) if j < len(h)) for j in range(width)]
                elif f.name == "draft_breakdown":
                    total.draft_breakdown = {k: mine.get(k, 0.0) + theirs.get(k, 0.0) for k in mine | theirs}
                else:
                    setattr(total, f.name, mine + theirs)
        return total

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def acceptance_probability(self) -> float:
        """Estimate of a, the chance a judged draft is accepted (the i.i.d. model's a)."""
        judged = self.accepted_tokens + self.rejections
        return self.accepted_tokens / judged if judged else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        return self.new_tokens / self.iterations if self.iterations else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """For each draft position i = 1..k, the share of iterations that accepted draft i among
        those that accepted every draft before it (from the histogram: exact when every
        iteration drafts k tokens; a shorter draft counts as rejected past its end)."""
        reached = [sum(self.accepted_histogram[i:]) for i in range(len(self.accepted_histogram))]
        return [reached[i] / reached[i - 1] if reached[i - 1] else 0.0 for i in range(1, len(reached))]

    @property
    def drafted_per_iteration(self) -> float:
        """Tokens proposed per iteration: k for a fixed draft length, less when drafts stop early."""
        return self.drafted_tokens / self.iterations if self.iterations else 0.0

    @property
    def draft_forward_calls_per_iteration(self) -> float:
        """Draft passes per iteration (k + 1 on the UAG path, fewer when drafts stop early)."""
        return self.draft_forward_calls / self.iterations if self.iterations else 0.0

    @property
    def bookkeeping_seconds(self) -> float:
        """Time that is neither drafting nor a target forward: acceptance, cache rollback, streaming."""
        return max(0.0, self.total_seconds - self.prefill_seconds - self.draft_seconds - self.verify_seconds)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict:
        """A JSON-ready dict, derived figures included."""
        derived = ("acceptance_rate", "acceptance_probability", "acceptance_by_position", "tokens_per_target_pass",
                   "drafted_per_iteration",
                   "draft_forward_calls_per_iteration", "bookkeeping_seconds", "tokens_per_second")
        return asdict(self) | {name: getattr(self, name) for name in derived}

    def __str__(self) -> str:
        lines = [
            f"new tokens            {self.new_tokens} in {self.total_seconds:.3f} s "
            f"({self.tokens_per_second:.1f} tokens/s)",
            f"target forward calls  {self.target_forward_calls} ({self.iterations} verification passes)",
        ]
        if self.drafted_tokens or self.draft_forward_calls:
            lines += [
                f"draft forward calls   {self.draft_forward_calls}",
                f"acceptance rate       {self.acceptance_rate:.3f} "
                f"({self.accepted_tokens}/{self.drafted_tokens} drafted tokens accepted)",
                f"acceptance probability {self.acceptance_probability:.3f} "
                f"({self.accepted_tokens}/{self.accepted_tokens + self.rejections} judged drafts accepted)",
                f"tokens per target pass {self.tokens_per_target_pass:.2f}",
                f"accepted per iteration {self.accepted_histogram}",
            ]
        lines.append(
            f"time: prefill {self.prefill_seconds:.3f} s, draft {self.draft_seconds:.3f} s, "
            f"verify {self.verify_seconds:.3f} s, bookkeeping {self.bookkeeping_seconds:.3f} s"
        )
        lines += [f"  of drafting, {name}: {secs:.3f} s" for name, secs in self.draft_breakdown.items()]
        return "\n".join(lines)


@dataclass
class GenerationOutput:
    """``sequences``: LongTensor [1, prompt_len + new_tokens], prompt included."""

    sequences: torch.LongTensor
    stats: GenerationStats


def loop_period(text: str, tail: int = 160) -> int | None:
    """The shortest period (in characters) with which the last ``tail`` characters repeat,
    if they do at least twice over; ``None`` for text that does not end in a loop.

    Measured on text, not tokens, so the answer does not depend on the tokenizer."""
    end = text[-tail:]
    if len(end) < tail:
        return None
    return next((p for p in range(1, tail // 2 + 1) if end[p:] == end[:-p]), None)
