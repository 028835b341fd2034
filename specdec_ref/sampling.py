"""The decoding rule shared by the baseline, the drafters and the verifier.

Speculative sampling is exact only if the draft and the target apply the *same*
warping (temperature, top-k, top-p) to their logits, so the rule lives in one
place: :class:`Sampler`.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Sampler:
    """Greedy or sampled token choice, with transformers' warping order.

    Args:
        do_sample: sample from the warped distribution instead of taking the argmax.
        temperature: divides the logits (sampling only); must be > 0.
        top_k: keep only the k most likely tokens (sampling only).
        top_p: keep the smallest set of tokens whose mass reaches top_p (sampling only); see
            :meth:`probs` for the exact rule, ties included.
        generator: a seeded ``torch.Generator`` for reproducible runs.

    Greedy decoding ignores ``temperature``, ``top_k`` and ``top_p``, as ``transformers`` does;
    setting any of them with ``do_sample=False`` gives one ``UserWarning`` that says so.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if self.do_sample and not self.temperature > 0:
            raise ValueError(
                f"temperature must be > 0 when sampling (got {self.temperature}); "
                "use do_sample=False for greedy decoding"
            )
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be a positive integer or None (got {self.top_k})")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None (got {self.top_p})")
        if not self.do_sample:
            ignored = [f"{name}={value}" for name, value, default in (
                ("temperature", self.temperature, 1.0), ("top_k", self.top_k, None), ("top_p", self.top_p, None))
                if value is not None and value != default and not (name == "top_p" and value == 1.0)]
            if ignored:
                # stacklevel 3: past __post_init__ and the dataclass's __init__, to whoever built the Sampler
                named = ignored[0] if len(ignored) == 1 else f"{', '.join(ignored[:-1])} and {ignored[-1]}"
                warnings.warn(f"{named} {'is' if len(ignored) == 1 else 'are'} ignored when "
                              "do_sample=False (greedy decoding): pass do_sample=True to sample with "
                              f"{'it' if len(ignored) == 1 else 'them'}", UserWarning, stacklevel=3)

    @property
    def greedy(self) -> bool:
        return not self.do_sample

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped probabilities for each row of ``logits`` ([..., V] -> [..., V], float32).

        The rule, in ``transformers``' order (``TemperatureLogitsWarper``, ``TopKLogitsWarper``,
        ``TopPLogitsWarper``):

        1. temperature: the logits are divided by ``temperature``;
        2. top-k: every logit below the k-th largest is dropped (probability 0); logits equal
           to the k-th largest are kept, so ties can keep more than k tokens;
        3. top-p, on the softmax of what is left: the tokens are ordered most probable first,
           and among equal probabilities the *higher* token id first (``transformers`` sorts
           ascending with a stable sort and drops from the front). A token is kept while the
           mass of the tokens before it in that order is below ``top_p``: the token that
           crosses ``top_p`` is kept, and the most probable token always is. ``top_p = 1``
           keeps everything;
        4. the result is renormalised to sum to 1.
        """
        logits = logits.float() / self.temperature
        if self.top_k is not None and self.top_k < logits.shape[-1]:
            kth_largest = logits.topk(self.top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth_largest, float("-inf"))
        probs = logits.softmax(dim=-1)
        if self.top_p is not None and self.top_p < 1:
            # Most probable first, ties by higher id first: a stable ascending sort, reversed.
            ascending, order = probs.sort(dim=-1, stable=True)
            sorted_probs, order = ascending.flip(-1), order.flip(-1)
            # Keep a token while the mass strictly before it is below top_p: the top token always stays.
            mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop_sorted = mass_before >= self.top_p
            drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
            probs = probs.masked_fill(drop, 0.0)
            probs = probs / probs.sum(dim=-1, keepdim=True)
        return probs

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """One token id per row of ``probs`` ([..., V] -> [...])."""
        flat = probs.reshape(-1, probs.shape[-1])
        return torch.multinomial(flat, 1, generator=self.generator).reshape(probs.shape[:-1])

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        """The next token for each row of ``logits``: argmax when greedy, else a sample."""
        if self.greedy:
            return logits.argmax(dim=-1)
        return self.sample(self.probs(logits))
