"""Drafters: anything that proposes tokens for the target to verify.

The speculative loop is written once against this small interface; a draft model,
a cross-tokenizer draft model (``specdec_ref.uag``) and prompt lookup
(``specdec_ref.ngram``) all plug into it, like ``transformers``' candidate generators.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .inputs import check_context
from .kv_cache import new_cache, rollback
from .sampling import Sampler


@dataclass
class Proposal:
    """What a drafter proposes for one iteration.

    ``tokens``: [n] target-vocabulary ids continuing the sequence (n may be 0).
    ``probs``: [n, V] the distribution each token was sampled from, for exact
    rejection sampling; ``None`` means the proposal was deterministic (greedy
    drafting, n-gram lookup), which the verifier treats as a one-hot q.
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None
    forward_calls: int = 0
    # Optional split of the drafting time, e.g. {"decode": s, "encode": s, "align": s}.
    seconds: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class Drafter(Protocol):
    """Propose tokens / learn from the verdict."""

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        """Begin a new generation for ``prompt`` (reset caches and state)."""

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        """Propose at most ``max_tokens`` tokens continuing ``tokens`` (1-D, prompt included)."""

    def update(self, tokens: torch.LongTensor, num_accepted: int) -> None:
        """The target kept ``num_accepted`` proposed tokens; ``tokens`` is the sequence now."""


class ModelDrafter:
    """Drafts autoregressively with a small causal LM that shares the target's tokenizer."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.cache = new_cache(model)

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        check_context(self.model, prompt.numel() + max_new_tokens, "draft model")
        self.cache = new_cache(self.model)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        drafts = torch.empty(max_tokens, dtype=torch.long, device=self.model.device)
        probs = []
        # Feed what the draft has not read yet: the prompt at first, then the target's last token(s).
        pending = tokens[self.cache.get_seq_length():].to(self.model.device)
        for i in range(max_tokens):
            logits = self.model(pending[None], past_key_values=self.cache, use_cache=True, logits_to_keep=1)
            logits = logits.logits[0, -1]
            if sampler.greedy:
                drafts[i] = logits.argmax()
            else:
                probs.append(sampler.probs(logits))
                drafts[i] = sampler.sample(probs[-1])
            pending = drafts[i : i + 1]
        return Proposal(drafts, torch.stack(probs) if probs else None, forward_calls=max_tokens)

    def update(self, tokens: torch.LongTensor, num_accepted: int) -> None:
        # The draft cache holds the old sequence plus all drafts but the last; everything up to
        # the target's own new token is still valid, the rest is cut off.
        rollback(self.cache, tokens.numel() - 1)


def as_drafter(draft: object, target: torch.nn.Module) -> Drafter:
    """Wrap a same-tokenizer draft model in :class:`ModelDrafter`; pass drafters through."""
    if isinstance(draft, Drafter):
        return draft
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "config"):
        raise TypeError(
            f"draft must be a transformers causal LM or a Drafter (start/propose/update), got {type(draft).__name__}"
        )
    draft_vocab, target_vocab = draft.config.vocab_size, target.config.vocab_size
    if draft_vocab != target_vocab:
        raise ValueError(
            f"the draft and target vocabularies differ ({draft_vocab} vs {target_vocab} tokens), so draft "
            "token ids mean different text to the target and cannot be verified directly. Pass "
            "target_tokenizer= and draft_tokenizer= to use the cross-tokenizer (UAG) path."
        )
    return ModelDrafter(draft)
