"""Universal Assisted Generation: drafting with a model whose tokenizer differs from the target's.

Draft ids mean nothing to the target, so every iteration goes through text:

    draft ids --decode (draft tokenizer)--> text --encode (target tokenizer)--> target ids

Re-encoding the text near the end of the sequence can split it differently from the ids
already there (a word may merge across the boundary). A longest-common-subsequence
alignment of a short look-behind window finds where the new ids really start. The
target then verifies the proposal in its own token space, so greedy output is exactly
the target's, however the two tokenizers disagree.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager

import torch

from .drafters import DraftModelDrafter, Proposal, check_min_confidence, draft_autoregressive
from .inputs import context_length, eos_ids
from .kv_cache import new_cache, rollback
from .modules import like
from .sampling import Sampler
from .tokenizer_compat import check_tokenizer

REPLACEMENT_CHAR = "\ufffd"  # what decoding yields for an incomplete multi-byte character
# Text must survive encode -> decode to carry tokens between vocabularies; a normaliser that
# lowercases or collapses whitespace would silently change what the draft "said".
ROUND_TRIP_PROBE = "def Speculate(x):\n\treturn  [x, 'Draft'] + str(42)  # OK\n"


def lcs_pairs(a: list[int], b: list[int]) -> list[tuple[int, int]]:
    """Index pairs (i, j) of a longest common subsequence of ``a`` and ``b``, in order.

    Dynamic programming over the two (short, look-behind) windows: O(len(a) * len(b)).
    """
    rows, cols = len(a), len(b)
    # suffix[i][j] = LCS length of a[i:] and b[j:]
    suffix = [[0] * (cols + 1) for _ in range(rows + 1)]
    for i in range(rows - 1, -1, -1):
        for j in range(cols - 1, -1, -1):
            suffix[i][j] = suffix[i + 1][j + 1] + 1 if a[i] == b[j] else max(suffix[i + 1][j], suffix[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < rows and j < cols:
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif suffix[i + 1][j] >= suffix[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def text_after(tokenizer, context: list[int], new: list[int]) -> str | None:
    """The text ``new`` adds after ``context``; ``None`` if it ends inside a character.

    Decoding ``new`` together with its context (and cutting the context's text off)
    keeps leading spaces that a tokenizer drops at the start of a decode.
    """
    before = tokenizer.decode(context, skip_special_tokens=True)
    after = tokenizer.decode(context + new, skip_special_tokens=True)
    if not after.startswith(before) or after.endswith(REPLACEMENT_CHAR):
        return None
    return after[len(before):]


def continue_ids(tokenizer, ids: list[int], text: str, window: int,
                 seconds: dict[str, float] | None = None) -> tuple[int, list[int]]:
    """Tokenise ``text`` as a continuation of ``ids``, re-tokenising the look-behind window.

    Returns ``(keep, tail)``: the ids of the extended text are ``ids[:keep] + tail``.
    ``keep`` is less than ``len(ids)`` when the new text changes how the last ids split
    (for example "foo" + "bar" becomes "foobar"). ``seconds`` collects encode/align time.
    """
    seconds = seconds if seconds is not None else defaultdict(float)
    start = max(0, len(ids) - window)
    old = ids[start:]
    with timed(seconds, "decode"):
        # The window's own text, decoded in context so a leading space is not lost.
        old_text = text_after(tokenizer, ids[max(0, start - window): start], old)
    if old_text is None:  # the window starts inside a multi-byte character
        old_text = tokenizer.decode(old, skip_special_tokens=True)
    with timed(seconds, "encode"):
        reencoded = tokenizer.encode(old_text + text, add_special_tokens=False)
    with timed(seconds, "align"):
        # The LCS lines the old ids up with the start of the re-encoding (the part that can
        # cover the old text: repeated text further on must not attract the match). A pair
        # (i, j) is the boundary if what follows spells the same text on both sides,
        # old[i+1:] + text == reencoded[j+1:]; comparing the ends, not the starts, matters:
        # a window can re-encode differently at its start (a leading "▁" added), and an id
        # can match a look-alike (a space the new text merged into " and").
        for i, j in reversed(lcs_pairs(old, reencoded[: len(old) + 2])):
            dropped = text_after(tokenizer, old[: i + 1], old[i + 1:])
            if dropped is not None and text_after(tokenizer, reencoded[: j + 1], reencoded[j + 1:]) == dropped + text:
                return start + i + 1, reencoded[j + 1:]
    return start, reencoded  # no clean boundary: re-tokenise the whole window


class CrossTokenizerDrafter(DraftModelDrafter):
    """Drafts with a model that has its own tokenizer (UAG), proposing target-vocabulary ids.

    The draft model drafts greedily in its own vocabulary; the proposal in target ids is
    then deterministic, so sampling mode stays exact (the verifier uses a one-hot q).
    ``min_confidence`` stops the draft model early, as for :class:`ModelDrafter`.
    """

    def __init__(self, model: torch.nn.Module, draft_tokenizer, target_tokenizer, look_behind: int = 8,
                 min_confidence: float | None = None) -> None:
        check_tokenizer(draft_tokenizer, "draft_tokenizer")
        check_tokenizer(target_tokenizer, "target_tokenizer")
        for role, tokenizer in (("draft_tokenizer", draft_tokenizer), ("target_tokenizer", target_tokenizer)):
            round_trip = tokenizer.decode(tokenizer.encode(ROUND_TRIP_PROBE, add_special_tokens=False))
            if round_trip != ROUND_TRIP_PROBE:
                raise ValueError(
                    f"{role} does not reproduce text through encode -> decode ({ROUND_TRIP_PROBE!r} came back as "
                    f"{round_trip!r}), so text cannot carry tokens between the two vocabularies: the "
                    "cross-tokenizer path needs lossless tokenizers"
                )
        check_min_confidence(min_confidence)
        self.model = model
        self.min_confidence = min_confidence
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer
        self.look_behind = look_behind
        self.greedy = Sampler()
        self.draft_eos = set(eos_ids(model, None).tolist())
        self.cache = new_cache(model)

    def start(self, prompt: torch.LongTensor, max_new_tokens: int) -> None:
        text = self.target_tokenizer.decode(prompt.tolist(), skip_special_tokens=True)
        self.draft_ids: list[int] = self.draft_tokenizer.encode(text, add_special_tokens=True)
        self.fed: list[int] = []  # draft ids the draft cache holds, in order
        self.synced = prompt.numel()  # target tokens whose text draft_ids already covers
        self.cache = new_cache(self.model)
        self.context = context_length(self.model)

    def propose(self, tokens: torch.LongTensor, max_tokens: int, sampler: Sampler) -> Proposal:
        seconds = {"decode": 0.0, "encode": 0.0, "align": 0.0}
        nothing = Proposal(tokens.new_empty(0), seconds=seconds)
        target_ids = tokens.tolist()

        # 1. Bring the draft's context up to the target's sequence, through text.
        with timed(seconds, "decode"):
            new_text = text_after(self.target_tokenizer, target_ids[max(0, self.synced - self.look_behind): self.synced],
                                  target_ids[self.synced:])
        if new_text is not None:  # None: the newest tokens end mid-character; sync them next time
            keep, tail = continue_ids(self.draft_tokenizer, self.draft_ids, new_text, self.look_behind, seconds)
            self.draft_ids = self.draft_ids[:keep] + tail
            self.synced = len(target_ids)
        # One draft token more than asked for: the last target token of a text can change
        # with the text that follows it (" re" + "turn" is " return"), so only target tokens
        # the draft's own text has already closed are proposed.
        n_draft = max_tokens + 1
        draft_full = self.context is not None and len(self.draft_ids) + n_draft > self.context
        if max_tokens == 0 or not self.draft_ids or draft_full:
            return nothing  # the target continues alone this iteration

        # 2. Draft in the draft's own vocabulary, the cache rolled back to what still matches
        #    (at least one id is re-fed: the model needs an input to predict from).
        common = min(common_prefix(self.fed, self.draft_ids), len(self.draft_ids) - 1)
        rollback(self.cache, common)
        pending = torch.tensor(self.draft_ids[common:], device=self.model.device)
        drafts, _ = draft_autoregressive(self.model, self.cache, pending, n_draft, self.greedy,
                                         min_confidence=self.min_confidence)
        drafted = drafts.tolist()
        self.fed = self.draft_ids + drafted[:-1]
        ends = next((i for i, t in enumerate(drafted) if t in self.draft_eos), None)
        drafted = drafted[:ends]

        # 3. Draft ids -> text -> target ids, aligned to the accepted target sequence.
        with timed(seconds, "decode"):
            draft_text = _whole_characters(self.draft_tokenizer, self.draft_ids[-self.look_behind:], drafted)
        if not draft_text:
            return Proposal(tokens.new_empty(0), forward_calls=len(drafts), seconds=seconds)
        keep, proposal = continue_ids(self.target_tokenizer, target_ids, draft_text, self.look_behind, seconds)
        if keep < len(target_ids):
            # The draft's text merges with the last accepted token(s), which cannot change:
            # propose the text's own tokens instead, still a valid continuation to verify.
            with timed(seconds, "encode"):
                proposal = self.target_tokenizer.encode(draft_text, add_special_tokens=False)
        # A text that ends in the draft's EOS is final: its last token is closed too.
        closed = len(proposal) if ends is not None else len(proposal) - 1
        return Proposal(torch.tensor(proposal[:min(max_tokens, closed)], dtype=torch.long, device=tokens.device),
                        forward_calls=len(drafts), seconds=seconds)

    def update(self, tokens: torch.LongTensor, num_accepted: int, features: torch.Tensor | None = None) -> None:
        """Nothing to do here: the next ``propose`` re-syncs through text and rolls the cache back."""

    def for_target(self, target: torch.nn.Module) -> CrossTokenizerDrafter:
        return CrossTokenizerDrafter(like(self.model, target), self.draft_tokenizer, self.target_tokenizer,
                                     self.look_behind, self.min_confidence)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids two sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _whole_characters(tokenizer, context: list[int], drafted: list[int]) -> str:
    """The text of the longest prefix of ``drafted`` that ends on a whole character."""
    for end in range(len(drafted), 0, -1):
        text = text_after(tokenizer, context, drafted[:end])
        if text is not None:
            return text
    return ""


@contextmanager
def timed(seconds: dict[str, float], name: str):
    """Add the duration of the ``with`` block to ``seconds[name]``."""
    start = time.perf_counter()
    yield
    seconds[name] += time.perf_counter() - start
