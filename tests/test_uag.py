"""Cross-tokenizer drafting (UAG): alignment primitives, hard cases, and greedy identity."""
from __future__ import annotations

import copy
import random

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from factories import VOCAB, build, prompt, train_tokenizer, training_text
from specdec_ref import CrossTokenizerDrafter, Sampler, compare_tokenizers, speculative_generate
from specdec_ref.uag import common_prefix, continue_ids, lcs_pairs, text_after


def brute_force_lcs_length(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            table[i + 1][j + 1] = table[i][j] + 1 if a[i] == b[j] else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_lcs_pairs_is_a_longest_common_subsequence():
    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 9))]
        b = [rng.randrange(4) for _ in range(rng.randrange(0, 9))]
        pairs = lcs_pairs(a, b)
        assert len(pairs) == brute_force_lcs_length(a, b)
        assert all(a[i] == b[j] for i, j in pairs)
        assert all(i1 < i2 and j1 < j2 for (i1, j1), (i2, j2) in zip(pairs, pairs[1:]))


@pytest.mark.parametrize("kind", ["bytelevel", "digits", "metaspace"])
def test_continue_ids_extends_the_text_exactly(kind):
    """decode(ids[:keep] + tail) == decode(ids) + text, for many cut points in real text."""
    tokenizer = train_tokenizer({"bytelevel": VOCAB, "digits": 320, "metaspace": 400}[kind], kind)
    text = "".join(training_text()[:1])[:3000] + "".join(training_text()[-2:])
    rng = random.Random(1)
    merges_seen = 0
    for _ in range(200):
        cut = rng.randrange(1, len(text) - 40)
        head, more = text[:cut], text[cut: cut + rng.randrange(1, 40)]
        ids = tokenizer.encode(head, add_special_tokens=False)
        keep, tail = continue_ids(tokenizer, ids, more, window=8)
        assert tokenizer.decode(ids[:keep] + tail) == tokenizer.decode(ids) + more
        merges_seen += keep < len(ids)
    assert merges_seen > 0  # boundary re-tokenisation really happened


def test_word_split_across_the_boundary_is_retokenised(tokenizer_a):
    ids = tokenizer_a.encode("    def decod", add_special_tokens=False)
    keep, tail = continue_ids(tokenizer_a, ids, "e(self):", window=8)
    assert keep < len(ids)  # "decod" + "e" merge into tokens that did not exist before
    assert ids[:keep] + tail == tokenizer_a.encode("    def decode(self):", add_special_tokens=False)


def test_text_after_keeps_leading_spaces_and_waits_for_whole_characters():
    metaspace = train_tokenizer(400, "metaspace")
    context = metaspace.encode("return", add_special_tokens=False)
    new = metaspace.encode("return value", add_special_tokens=False)[len(context):]
    assert text_after(metaspace, context, new) == " value"  # decoded alone it would lose the space

    byte_level = train_tokenizer(VOCAB, "bytelevel")
    ids = byte_level.encode("x = '東京'", add_special_tokens=False)
    whole = text_after(byte_level, [], ids)
    assert whole == "x = '東京'"
    partial = [i for i in range(1, len(ids)) if text_after(byte_level, [], ids[:i]) is None]
    assert partial, "some prefix must end inside a multi-byte character"


CHARS = [chr(c) for c in range(32, 127)] + ["\n", "\t"]


def char_tokenizer(seed: int | None = None) -> PreTrainedTokenizerFast:
    """One token per character (printable ASCII, newline, tab), ids shuffled by ``seed``.

    Every id sequence is the canonical encoding of its text, so a text round trip never
    changes it: the cleanest setting in which to check the UAG bookkeeping."""
    ids = list(range(len(CHARS)))
    if seed is not None:
        random.Random(seed).shuffle(ids)
    tok = Tokenizer(models.WordLevel(vocab=dict(zip(CHARS, ids)), unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def permuted_pair(target, seed: int = 0):
    """The target re-indexed to the char tokenizer shuffled by ``seed``: the same model in
    another vocabulary. Through UAG it must agree with the target on every token."""
    tokenizer_a, tokenizer_p = char_tokenizer(), char_tokenizer(seed)
    order = torch.tensor([tokenizer_a.convert_tokens_to_ids(tokenizer_p.convert_ids_to_tokens(i))
                          for i in range(len(CHARS))])
    draft = copy.deepcopy(target)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight[order])
        draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight[order])
    return draft, tokenizer_a, tokenizer_p


def reference(target, ids, max_new_tokens, **kwargs):
    """The target's own greedy decoding (an explicit mask: id 0 is a real token here, not padding)."""
    return target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                           do_sample=False, pad_token_id=0, **kwargs)


def text_prompt(tokenizer, text="def decode(self, s):\n    "):
    return tokenizer(text, return_tensors="pt").input_ids


@pytest.fixture(scope="module")
def target():
    return build("llama", 64, 2, seed=0)


@pytest.fixture(scope="module")
def char_target():
    return build("llama", 64, 2, seed=0, vocab=len(CHARS))


def test_identical_model_in_another_vocabulary_is_always_accepted(char_target):
    target = char_target
    draft, tokenizer_a, tokenizer_p = permuted_pair(target)
    assert not compare_tokenizers(tokenizer_a, tokenizer_p).native_ok
    ids = text_prompt(tokenizer_a)
    expected = reference(target, ids, 40, eos_token_id=[])
    out = speculative_generate(target, draft, ids, max_new_tokens=40, num_draft_tokens=4, eos_token_id=[],
                               target_tokenizer=tokenizer_a, draft_tokenizer=tokenizer_p)
    assert torch.equal(out.sequences, expected)
    # Whatever the text round trips cost, they must not cost agreement: the models are the same.
    assert out.stats.acceptance_rate == 1.0, out.stats
    assert set(out.stats.draft_breakdown) == {"decode", "encode", "align"}


@pytest.mark.parametrize("k", [1, 3, 6])
@pytest.mark.parametrize("text", ["def decode(self, s):\n    ", "x = '東京' + 'naïve'  # €", " leading space"])
def test_greedy_identity_with_a_genuinely_different_tokenizer(target, tokenizer_a, tokenizer_b, k, text):
    draft = build("llama", 32, 1, seed=5, vocab=tokenizer_b.vocab_size)
    ids = text_prompt(tokenizer_a, text)
    expected = reference(target, ids, 32)
    out = speculative_generate(target, draft, ids, max_new_tokens=32, num_draft_tokens=k,
                               target_tokenizer=tokenizer_a, draft_tokenizer=tokenizer_b)
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted_tokens > 0


def test_eos_on_the_uag_path(char_target):
    target = char_target
    draft, tokenizer_a, tokenizer_p = permuted_pair(target)
    ids = text_prompt(tokenizer_a)
    free_run = reference(target, ids, 30, eos_token_id=[])
    eos = int(free_run[0, ids.shape[1] + 12])
    expected = reference(target, ids, 30, eos_token_id=eos)
    out = speculative_generate(target, draft, ids, max_new_tokens=30, num_draft_tokens=5, eos_token_id=eos,
                               target_tokenizer=tokenizer_a, draft_tokenizer=tokenizer_p)
    assert torch.equal(out.sequences, expected)


def test_sampling_on_the_uag_path_uses_deterministic_proposals(target, tokenizer_a, tokenizer_b):
    draft = build("llama", 32, 1, seed=5, vocab=tokenizer_b.vocab_size)
    drafter = CrossTokenizerDrafter(draft, tokenizer_b, tokenizer_a)
    runs = [speculative_generate(target, drafter, text_prompt(tokenizer_a), max_new_tokens=20, do_sample=True,
                                 generator=torch.Generator().manual_seed(3)).sequences for _ in range(2)]
    assert torch.equal(*runs)
    drafter.start(text_prompt(tokenizer_a)[0], 20)
    proposal = drafter.propose(text_prompt(tokenizer_a)[0], 4, Sampler(do_sample=True))
    assert proposal.probs is None and proposal.tokens.numel() > 0


def test_missing_tokenizer_arguments(target, tokenizer_a):
    other = build("llama", 32, 1, seed=5, vocab=320)
    with pytest.raises(ValueError, match="target_tokenizer= and draft_tokenizer="):
        speculative_generate(target, other, prompt(5))
    with pytest.raises(ValueError, match="pass both target_tokenizer= and draft_tokenizer="):
        speculative_generate(target, other, prompt(5), target_tokenizer=tokenizer_a)


def test_unknown_tokenizer_objects(target, tokenizer_a):
    other = build("llama", 32, 1, seed=5, vocab=320)
    with pytest.raises(TypeError, match="must be a transformers tokenizer"):
        speculative_generate(target, other, prompt(5), target_tokenizer=tokenizer_a, draft_tokenizer="gpt2")


def test_lossy_tokenizer_is_refused(target, tokenizer_a):
    from tokenizers import normalizers

    lossy = train_tokenizer(320, "digits")
    lossy.backend_tokenizer.normalizer = normalizers.Lowercase()
    other = build("llama", 32, 1, seed=5, vocab=320)
    with pytest.raises(ValueError, match="does not reproduce text through encode -> decode"):
        speculative_generate(target, other, prompt(5), target_tokenizer=tokenizer_a, draft_tokenizer=lossy)


def test_padded_draft_vocabulary_with_the_same_tokenizer_stays_native(target, tokenizer_a):
    """Same tokenizer, embeddings padded to another size (as in Qwen2.5 0.5B vs 7B)."""
    padded_draft = build("llama", 32, 1, seed=5, vocab=400)
    ids = text_prompt(tokenizer_a)
    for do_sample in (False, True):
        out = speculative_generate(target, padded_draft, ids, max_new_tokens=24, num_draft_tokens=3,
                                   do_sample=do_sample, generator=torch.Generator().manual_seed(0),
                                   target_tokenizer=tokenizer_a, draft_tokenizer=tokenizer_a)
        assert out.stats.draft_breakdown == {}  # the native path: no text round trips
        if not do_sample:
            assert torch.equal(out.sequences, reference(target, ids, 24))


@pytest.mark.parametrize("text", ["def decode(self, s):\n    return", "x = '東京' + 'naïve'  # €", "for i in range(3):"])
def test_proposal_holds_only_target_tokens_the_drafted_text_has_closed(target, tokenizer_a, tokenizer_b, text):
    """The last target token of a text may still merge with what follows it, so the drafter
    drafts one token more than asked and proposes only tokens followed by more drafted text."""
    draft = build("llama", 32, 1, seed=5, vocab=tokenizer_b.vocab_size)
    drafter = CrossTokenizerDrafter(draft, tokenizer_b, tokenizer_a)
    ids = text_prompt(tokenizer_a, text)
    drafter.start(ids[0], 20)
    proposal = drafter.propose(ids[0], 3, Sampler())
    assert proposal.forward_calls == 4
    # The draft's own greedy text, recomputed independently of the drafter.
    draft_ids = torch.tensor([tokenizer_b.encode(text)])
    drafted = reference(draft, draft_ids, 4, eos_token_id=[])[0, draft_ids.shape[1]:].tolist()
    # (cut to whole characters: a random draft may stop inside a multi-byte one)
    draft_text = next(t for n in range(4, 0, -1) if (t := text_after(tokenizer_b, draft_ids[0].tolist(), drafted[:n])))
    full = tokenizer_a.encode(text + draft_text, add_special_tokens=False)
    shown = ids[0].tolist() + proposal.tokens.tolist()
    assert 0 < proposal.tokens.numel() <= 3
    assert full[: len(shown)] == shown and len(full) > len(shown)


def test_common_prefix_counts_the_leading_ids_two_sequences_share():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [6]) == 0
