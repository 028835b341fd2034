"""Drafters: anything that proposes tokens for the target to verify.

The speculative loop is written once against one interface, :class:`DrafterBase`; a draft model,
a cross-tokenizer draft model (``specdec_ref.uag``), prompt lookup (``specdec_ref.ngram``) and an
EAGLE head (``specdec_ref.eagle``) all implement it, like ``transformers``' candidate generators.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .inputs import check_context, context_length
from .kv_cache import new_cache, rollback
from .modules import GREEDY_DRAFTS, like
from .roofline import streamed_weight_bytes
from .timing import last_token_step
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
    """The least a drafter has: ``start`` / ``propose`` / ``update``. A class with these three
    (a learner's, say) plugs into the loop as it is: :func:`as_drafter_base` gives it the rest of
    :class:`DrafterBase`'s interface, with the defaults."""

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        """Begin a new generation for ``prompt`` (reset caches and state)."""

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        """Propose at most ``max_tokens`` tokens continuing ``tokens`` (1-D, prompt included)."""

    def update(self, tokens: torch.LongTensor, num_accepted: int) -> None:
        """The target kept ``num_accepted`` proposed tokens; ``tokens`` is the sequence now."""


class DrafterBase:
    """The drafter interface the loop, the cost measurement and the bench use; every drafter of
    the library derives from it (draft model, cross-tokenizer, prompt lookup, EAGLE, tracing).

    - ``reads_target_features``: when True, the loop asks the target for its last hidden states in
      the passes it runs anyway and hands them to :meth:`update` (EAGLE);
      ``target_feature_layers``: lower layers' hidden states (their ``hidden_states`` indices) it
      wants too, put before the last one's in each row (a multi-layer EAGLE-3 head).
    - :meth:`for_target`: the same drafter for another form of its target (its fast copy).
    - :attr:`weight_bytes` and :attr:`num_parameters`: what one draft step reads, for the roofline.
    - :meth:`draft_step`: one repeatable draft step, to time the draft's cost c.
    """

    reads_target_features: bool = False
    target_feature_layers: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        """The drafter's class name, for messages."""
        return type(self).__name__

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        """Begin a new generation for ``prompt`` (reset caches and state)."""

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        """Propose at most ``max_tokens`` tokens continuing ``tokens`` (1-D, prompt included).
        The one method every drafter writes itself: the base class has no way to draft."""
        raise NotImplementedError(f"{self.name} does not implement propose(), which every drafter must")

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        """The target kept ``num_accepted`` proposed tokens; ``tokens`` is the sequence now.

        ``features`` (only for ``reads_target_features``): the target's last hidden states [m, d]
        ([m, (layers + 1) d] with ``target_feature_layers``: :func:`drafter_features`) for the m
        positions its cache gained (after the prefill, the prompt's but the last; after a
        verification, the last token's and the accepted drafts'), from the pass the loop ran.
        """

    def check_target(self, target: torch.nn.Module) -> None:
        """Raise ``ValueError``, in one sentence naming the mismatch, if this drafter cannot draft
        for ``target`` (a head or a draft built for a model of another shape or vocabulary)."""

    def for_target(self, target: torch.nn.Module) -> DrafterBase:
        """The same drafter for ``target``, another form of the target it was built for (the
        fast or weights-first copy): its own layers put in the same form. Default: itself."""
        return self

    @property
    def weight_bytes(self) -> float:
        """Weight bytes one draft step reads (0: drafting reads no weights)."""
        return 0.0

    @property
    def num_parameters(self) -> int:
        """Parameters the drafter adds to the target's."""
        return 0

    @property
    def cache_length(self) -> int | None:
        """Positions in the drafter's own KV cache (``None``: it keeps none)."""
        return None

    def draft_step(self, target: torch.nn.Module, tokens: torch.LongTensor) -> Callable[[], None] | None:
        """A function that runs one draft step after ``tokens`` (1-D, random ids will do) and
        leaves the drafter as it found it, so that calls repeat; ``None`` where drafting runs no
        model (its cost is 0 target steps)."""
        return None


def drafter_features(hidden_states: tuple[torch.Tensor, ...], rows, layers: tuple[int, ...] = ()) -> torch.Tensor:
    """The features a drafter reads at ``rows`` of a one-sequence pass: the hidden states of its
    ``target_feature_layers``, then the last one's (after the final norm), side by side."""
    return torch.cat([hidden_states[i][0, rows] for i in (*layers, -1)], -1)


class _AdaptedDrafter(DrafterBase):
    """A :class:`Drafter` with only start/propose/update, given :class:`DrafterBase`'s defaults."""

    def __init__(self, drafter: Drafter) -> None:
        self.drafter = drafter
        # A learner's feature drafter says so with the class attribute, and takes features in update.
        self.reads_target_features = bool(getattr(drafter, "reads_target_features", False))
        self.target_feature_layers = tuple(getattr(drafter, "target_feature_layers", ()))

    @property
    def name(self) -> str:
        return type(self.drafter).__name__

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        self.drafter.start(prompt, max_new_tokens)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        return self.drafter.propose(tokens, max_tokens, sampler)

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        if self.reads_target_features:
            self.drafter.update(tokens, num_accepted, features)
        else:
            self.drafter.update(tokens, num_accepted)


def as_drafter_base(drafter: Drafter) -> DrafterBase:
    """``drafter`` with the whole :class:`DrafterBase` interface (itself if it has it)."""
    return drafter if isinstance(drafter, DrafterBase) else _AdaptedDrafter(drafter)


class DraftModelDrafter(DrafterBase):
    """What every drafter that runs a draft model (``model``, with its KV cache ``cache``) shares:
    the bytes and parameters it adds, its cache length, one draft step for the cost measurement."""

    model: torch.nn.Module
    cache: object

    @property
    def weight_bytes(self) -> float:
        return streamed_weight_bytes(self.model)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length()

    def draft_step(self, target: torch.nn.Module, tokens: torch.LongTensor) -> Callable[[], None]:
        # ids cut to the draft's vocabulary: random ones will do for timing
        return last_token_step(self.model, tokens.clamp_max(self.model.config.vocab_size - 1)[None])


class ModelDrafter(DraftModelDrafter):
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

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        # The draft cache holds the old sequence plus all drafts but the last; everything up to
        # the target's own new token is still valid, the rest is cut off.
        rollback(self.cache, tokens.numel() - 1)

    def check_target(self, target: torch.nn.Module) -> None:
        draft_vocab, target_vocab = self.model.config.vocab_size, target.config.vocab_size
        if self.vocab_size is None and draft_vocab != target_vocab:
            raise ValueError(f"this draft model has {draft_vocab} tokens and the target {target_vocab}: they do not "
                             "share a vocabulary (give ModelDrafter the target's vocab_size if only the padding differs)")

    def for_target(self, target: torch.nn.Module) -> ModelDrafter:
        return ModelDrafter(like(self.model, target), self.vocab_size, self.min_confidence)


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
