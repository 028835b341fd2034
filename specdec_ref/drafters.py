"""Drafters: anything that proposes tokens for the target to verify.

The speculative loop is written once against this small interface; a draft model,
a cross-tokenizer draft model (``specdec_ref.uag``) and prompt lookup
(``specdec_ref.ngram``) all plug into it, like ``transformers``' candidate generators.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .inputs import check_context, context_length
from .kv_cache import new_cache, rollback
from .modules import GREEDY_DRAFTS
from .sampling import Sampler


@dataclass
class Proposal:
    """What a drafter proposes for one iteration.

    ``tokens``: [n] target-vocabulary ids continuing the sequence (n may be 0).
    ``probs``: [n, V] the distribution each token was sampled from, for exact
    rejection sampling; ``None`` means the proposal was deterministic (greedy
    drafting, n-gram lookup), which the verifier treats as a one-hot q.
    ``parents``: ``None`` for a chain (token i continues token i - 1), or, for a tree of
    greedy drafts, [n] the index in ``tokens`` of each token's parent (-1: it continues the
    sequence itself), parents listed before their children and siblings distinct. One
    verification pass reads the whole tree (each token attends to the sequence and its own
    ancestors); the longest branch the target agrees with is kept.
    """

    tokens: torch.LongTensor
    probs: torch.Tensor | None = None
    parents: torch.LongTensor | None = None
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
        """The target kept ``num_accepted`` proposed tokens; ``tokens`` is the sequence now.

        A drafter with ``reads_target_features = True`` (EAGLE, :mod:`specdec_ref.eagle`) is
        also passed ``features``: the target's last hidden states [m, d] for the m positions
        its cache gained (after the prefill, the prompt's but the last; after a verification,
        the last token's and the accepted drafts'), taken from the pass the loop ran anyway.
        """


class ModelDrafter:
    """Drafts autoregressively with a small causal LM that shares the target's tokenizer.

    ``vocab_size``: the target's logits width, when the draft's embedding matrix is padded
    to another size (same tokenizer, e.g. Qwen2.5 0.5B vs 7B): draft logits are cut or
    padded to it so draft and target distributions line up.
    ``min_confidence``: stop drafting early, after a token the draft itself gave less than
    this probability (``transformers`` calls it ``assistant_confidence_threshold``): such
    a token is likely rejected, so drafting past it wastes draft and verify work.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int | None = None,
                 min_confidence: float | None = None) -> None:
        check_min_confidence(min_confidence)
        self.model = model
        self.vocab_size = vocab_size
        self.min_confidence = min_confidence
        self.cache = new_cache(model)
        self.draft_length = None

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        check_context(self.model, prompt.numel() + max_new_tokens, "draft model")
        self.cache = new_cache(self.model)
        self.draft_length = None

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        # The first request is k; only the budget's end asks for fewer. A model with GREEDY_DRAFTS
        # drafts all k there too and the extra drafts are dropped: one graph serves every request.
        self.draft_length = self.draft_length or max_tokens
        greedy_drafts = getattr(self.model, GREEDY_DRAFTS, None)
        limit = context_length(self.model)
        if (greedy_drafts and max_tokens and sampler.greedy and self.min_confidence is None and tokens.numel() >= 2
                and (limit is None or tokens.numel() + self.draft_length - 1 <= limit)):
            drafts, calls = greedy_drafts(self.cache, tokens, self.draft_length, self.vocab_size)
            return Proposal(drafts[:max_tokens], None, forward_calls=calls)
        # Feed what the draft has not read yet: the prompt at first, then the target's last token(s).
        pending = tokens[self.cache.get_seq_length():]
        drafts, probs = draft_autoregressive(self.model, self.cache, pending, max_tokens, sampler,
                                             self.vocab_size, self.min_confidence)
        return Proposal(drafts, probs, forward_calls=drafts.numel())

    def update(self, tokens: torch.LongTensor, num_accepted: int) -> None:
        # The draft cache holds the old sequence plus all drafts but the last; everything up to
        # the target's own new token is still valid, the rest is cut off.
        rollback(self.cache, tokens.numel() - 1)


def check_min_confidence(min_confidence: float | None) -> None:
    """Raise unless ``min_confidence`` is ``None`` or a probability strictly between 0 and 1."""
    if min_confidence is not None and not (isinstance(min_confidence, (int, float)) and 0 < min_confidence < 1):
        raise ValueError(f"min_confidence must be a probability in (0, 1) or None, got {min_confidence!r}")


def draft_autoregressive(
    model: torch.nn.Module, cache, pending: torch.LongTensor, num_tokens: int, sampler: Sampler,
    vocab_size: int | None = None, min_confidence: float | None = None,
) -> tuple[torch.LongTensor, torch.Tensor | None]:
    """Run ``model`` for up to ``num_tokens`` steps from ``pending`` (ids its cache has not read).

    Returns the drafted ids [n] and, when sampling, the distributions they came from [n, V].
    The last drafted token is not fed: the cache ends one token short, as the loop expects.
    ``vocab_size`` cuts or pads (with -inf) the logits to that width. ``min_confidence``
    ends the draft after the first token whose draft probability is below it.
    """
    drafts = torch.empty(num_tokens, dtype=torch.long, device=model.device)
    probs = []
    pending = pending.to(model.device)
    for i in range(num_tokens):
        logits = model(pending[None], past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
        if vocab_size is not None and vocab_size != logits.shape[-1]:
            logits = torch.nn.functional.pad(logits[:vocab_size], (0, max(0, vocab_size - logits.shape[-1])),
                                             value=float("-inf"))
        if sampler.greedy:
            drafts[i] = logits.argmax()
        else:
            probs.append(sampler.probs(logits))
            drafts[i] = sampler.sample(probs[-1])
        if min_confidence is not None and i + 1 < num_tokens:
            q = torch.softmax(logits.float(), dim=-1) if sampler.greedy else probs[-1]
            if q[drafts[i]] < min_confidence:
                drafts = drafts[: i + 1]
                break
        pending = drafts[i : i + 1]
    return drafts, torch.stack(probs) if probs else None
