"""Watch speculative decoding one iteration at a time, without changing it.

:func:`trace_generate` runs :func:`~specdec_ref.speculative_generate` itself and records,
for every call of :func:`~specdec_ref.speculative_step`, what was drafted, how much the
target kept, the target's own token, and the KV-cache length of both models before and
after each phase. It only observes: a wrapper around the drafter (which the loop calls
before drafting and after the rollback) and a forward hook on the target (which sees the
cache the loop verifies with). The tokens produced are exactly those of
``speculative_generate`` with the same arguments.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .drafters import Drafter, Proposal
from .sampling import Sampler
from .speculative import as_drafter, speculative_generate
from .stats import GenerationOutput


@dataclass
class Iteration:
    """One draft / verify / accept iteration as the loop saw it.

    ``drafts``: the proposed token ids. ``accepted``: how many of them the target kept
    (a prefix). ``target_token``: the token the target adds itself, the correction of the
    first rejected draft, or the bonus token when every draft was kept.
    ``target_cache``: the target's cache length (before verifying, after verifying, after
    the rollback). ``draft_cache``: the draft model's (before drafting, after drafting,
    after the update); ``None`` for drafters without a cache (prompt lookup).
    """

    drafts: list[int]
    accepted: int
    target_token: int
    target_cache: tuple[int, int, int]
    draft_cache: tuple[int, int, int] | None

    @property
    def rejected(self) -> list[int]:
        """The drafts after the accepted prefix: the first was rejected, the rest never judged."""
        return self.drafts[self.accepted:]

    @property
    def bonus(self) -> bool:
        """True when every draft was kept, so the target's token is a bonus, not a correction."""
        return self.accepted == len(self.drafts)

    @property
    def emitted(self) -> list[int]:
        """The tokens this iteration appended: the accepted drafts, then the target's token."""
        return self.drafts[: self.accepted] + [self.target_token]


def _cache_length(cache) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


class TracingDrafter:
    """A :class:`~specdec_ref.drafters.Drafter` that passes every call through to ``inner``
    and records each iteration in ``iterations``.

    ``target_cache`` is a one-element list the target's forward hook fills with the cache
    object the loop verifies with (the loop creates it, so it is seen on first use).
    """

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.iterations: list[Iteration] = []
        self.target_cache: list = [None]
        self.target_cache_after_forward = 0
        self._pending: tuple[list[int], int, int | None, int | None] | None = None

    def _draft_cache_length(self) -> int | None:
        cache = getattr(self.inner, "cache", None)
        return None if cache is None else _cache_length(cache)

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        self.iterations.clear()
        self.target_cache[0] = None
        self.inner.start(prompt, max_new_tokens)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        target_before = _cache_length(self.target_cache[0])
        draft_before = self._draft_cache_length()
        proposal = self.inner.propose(tokens, max_tokens, sampler)
        self._pending = (proposal.tokens.tolist(), target_before, draft_before, self._draft_cache_length())
        return proposal

    def update(self, tokens: torch.LongTensor, num_accepted: int) -> None:
        # The loop calls this right after rolling the target cache back.
        drafts, target_before, draft_before, draft_drafted = self._pending
        target_after = _cache_length(self.target_cache[0])
        self.inner.update(tokens, num_accepted)
        draft_cache = None if draft_before is None else (draft_before, draft_drafted, self._draft_cache_length())
        self.iterations.append(Iteration(
            drafts=drafts, accepted=num_accepted, target_token=int(tokens[-1]),
            target_cache=(target_before, self.target_cache_after_forward, target_after), draft_cache=draft_cache,
        ))


def trace_generate(
    target: torch.nn.Module,
    draft: torch.nn.Module | Drafter,
    input_ids: torch.LongTensor,
    *,
    target_tokenizer=None,
    draft_tokenizer=None,
    min_draft_confidence: float | None = None,
    **generate_kwargs,
) -> tuple[GenerationOutput, list[Iteration]]:
    """Run :func:`~specdec_ref.speculative_generate` and return its output with one
    :class:`Iteration` per verification pass.

    Takes the same arguments as ``speculative_generate``. The iterations record what each
    step produced before the loop cuts at EOS, so the last one may hold tokens past an EOS
    the output does not include.
    """
    drafter = TracingDrafter(as_drafter(draft, target, target_tokenizer, draft_tokenizer, min_draft_confidence))

    def see_cache(module, args, kwargs):
        drafter.target_cache[0] = kwargs.get("past_key_values", drafter.target_cache[0])

    def after_forward(module, args, kwargs, output):
        drafter.target_cache_after_forward = _cache_length(drafter.target_cache[0])

    handles = [target.register_forward_pre_hook(see_cache, with_kwargs=True),
               target.register_forward_hook(after_forward, with_kwargs=True)]
    try:
        output = speculative_generate(target, drafter, input_ids, **generate_kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return output, drafter.iterations
