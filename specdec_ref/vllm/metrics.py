"""Read ``/metrics`` (Prometheus text) and vLLM's speculative-decoding counters."""

from __future__ import annotations

import re
from dataclasses import dataclass

@dataclass(frozen=True)
class PrometheusSample:
    """One line of the Prometheus text format: ``name{labels} value``."""

    name: str
    labels: dict[str, str]
    value: float


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def parse_prometheus_text(text: str) -> list[PrometheusSample]:
    """Parse the Prometheus text exposition format (``GET /metrics``).

    Comments (``# HELP``, ``# TYPE``) and blank lines are skipped; label values
    are unescaped; an optional timestamp after the value is ignored.

    Raises:
        ValueError: a line that is not a sample.
    """
    samples = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"line {number} is not a Prometheus sample: {line!r}")
        labels = {}
        for label in _LABEL.finditer(match["labels"] or ""):
            labels[label[1]] = re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m[0]], label[2])
        samples.append(PrometheusSample(match["name"], labels, float(match["value"])))
    return samples


_PREFIX = "vllm:spec_decode_"


@dataclass(frozen=True)
class SpecDecodeMetrics:
    """vLLM's speculative-decoding counters, summed over engines and models.

    A reading counts from server start; subtract two readings
    (``after - before``) to get the figures of the requests in between.
    Definitions match :class:`specdec_ref.stats.GenerationStats`.
    """

    #: Speculation steps that proposed tokens (one target verification each).
    num_drafts: int = 0
    #: Tokens proposed.
    num_draft_tokens: int = 0
    #: Proposed tokens the target accepted.
    num_accepted_tokens: int = 0
    #: accepted_per_position[i]: drafts whose token at position i was accepted.
    accepted_per_position: tuple[int, ...] = ()

    @classmethod
    def from_prometheus_text(cls, text: str) -> SpecDecodeMetrics:
        """Read the counters from ``/metrics`` text; all zero when speculation is off."""
        totals = {"num_drafts": 0.0, "num_draft_tokens": 0.0, "num_accepted_tokens": 0.0}
        per_position: dict[int, float] = {}
        for sample in parse_prometheus_text(text):
            if not sample.name.startswith(_PREFIX) or not sample.name.endswith("_total"):
                continue  # the _created timestamps of the same counters
            counter = sample.name[len(_PREFIX) : -len("_total")]
            if counter == "num_accepted_tokens_per_pos":
                position = int(sample.labels["position"])
                per_position[position] = per_position.get(position, 0.0) + sample.value
            elif counter in totals:
                totals[counter] += sample.value
        accepted = tuple(int(per_position.get(i, 0)) for i in range(max(per_position, default=-1) + 1))
        return cls(**{key: int(value) for key, value in totals.items()}, accepted_per_position=accepted)

    def __sub__(self, earlier: SpecDecodeMetrics) -> SpecDecodeMetrics:
        # Positions appear on /metrics as drafts reach them, so one reading may list fewer.
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        now = list(self.accepted_per_position) + [0] * (width - len(self.accepted_per_position))
        before = list(earlier.accepted_per_position) + [0] * (width - len(earlier.accepted_per_position))
        return SpecDecodeMetrics(
            num_drafts=self.num_drafts - earlier.num_drafts,
            num_draft_tokens=self.num_draft_tokens - earlier.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens - earlier.num_accepted_tokens,
            accepted_per_position=tuple(a - b for a, b in zip(now, before)),
        )

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / drafted tokens (0.0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def acceptance_probability(self) -> float | None:
        """Estimate of the i.i.d. model's a: accepted / judged drafts, as ``GenerationStats`` has it.

        A draft that was not accepted to its last position ended in one rejection; the last
        position's count says how many were accepted whole. That needs every draft to have
        the same length (a draft model's k); ``None`` when they vary (n-gram misses are short).
        """
        k = len(self.accepted_per_position)
        if not self.num_drafts or self.num_draft_tokens != k * self.num_drafts:
            return None
        whole = self.accepted_per_position[-1]
        return self.num_accepted_tokens / (self.num_accepted_tokens + self.num_drafts - whole)

    @property
    def mean_accepted_tokens(self) -> float:
        """Accepted draft tokens per draft (per verification pass)."""
        return self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def tokens_per_target_pass(self) -> float:
        """1 + accepted per draft: the target adds one token of its own per pass.

        vLLM logs this as "Mean acceptance length".  It is the course's tau
        up to the ends of requests: vLLM drafts k tokens at every step, also
        when fewer are left before ``max_tokens``.
        """
        return 1.0 + self.mean_accepted_tokens if self.num_drafts else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        """Fraction of drafts whose i-th proposed token was accepted."""
        if not self.num_drafts:
            return [0.0] * len(self.accepted_per_position)
        return [count / self.num_drafts for count in self.accepted_per_position]

    def __str__(self) -> str:
        if not self.num_drafts:
            return "no speculative drafts"
        by_position = ", ".join(f"{rate:.2f}" for rate in self.acceptance_by_position)
        a = self.acceptance_probability
        return (
            f"acceptance rate {self.acceptance_rate:.3f} "
            f"({self.num_accepted_tokens}/{self.num_draft_tokens} drafted tokens accepted), "
            + ("" if a is None else f"acceptance probability {a:.3f}, ")
            + f"{self.num_drafts} drafts, {self.tokens_per_target_pass:.2f} tokens per target pass, "
            f"acceptance by position [{by_position}]"
        )
