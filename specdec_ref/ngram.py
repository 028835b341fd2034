"""Prompt lookup: draft by copying what followed the last n tokens earlier in the context.

No draft model at all. It shines when the output repeats its input (editing code,
summaries that quote, retrieval answers) and costs almost nothing when it finds no match.
"""
from __future__ import annotations

import torch

from .drafters import DrafterBase, Proposal
from .sampling import Sampler


class PromptLookupDrafter(DrafterBase):
    """Proposes the continuation of the most recent earlier match of the context's last n-gram.

    Tries n = ``max_ngram`` down to ``min_ngram``; the longest n-gram with a match wins.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram (got min_ngram={min_ngram}, max_ngram={max_ngram})")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        """Stateless: the context itself is the draft."""

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        for n in range(min(self.max_ngram, tokens.numel() - 1), self.min_ngram - 1, -1):
            # Every earlier window of n tokens (the final one, the n-gram itself, excluded).
            windows = tokens[:-1].unfold(0, n, 1)
            hits = (windows == tokens[-n:]).all(dim=1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match wins: it is the most relevant
                return Proposal(tokens[start : start + max_tokens])
        return Proposal(tokens.new_empty(0))

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        """Nothing to learn: the next lookup sees the accepted tokens in the context."""
