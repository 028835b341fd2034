"""Streaming: tokens reach a transformers streamer as they are accepted, and add up to the output."""
from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import PreTrainedTokenizerFast, TextStreamer
from transformers.generation.streamers import BaseStreamer

from factories import VOCAB, build, noisy_copy, prompt
from specdec_ref import autoregressive_generate, speculative_generate


class RecordingStreamer(BaseStreamer):
    """Keeps every ``put`` call, to check what arrived and in which bursts."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value):
        self.puts.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.fixture(scope="module")
def pair():
    target = build("llama", 64, 2, seed=0)
    return target, noisy_copy(target, 0.05, seed=1)


def test_speculative_streams_accepted_bursts(pair):
    target, draft = pair
    ids = prompt(7)
    streamer = RecordingStreamer()
    out = speculative_generate(target, draft, ids, max_new_tokens=40, num_draft_tokens=4, streamer=streamer)
    assert streamer.puts[0] == ids[0].tolist()  # the prompt first, as generate() does
    streamed = [token for burst in streamer.puts[1:] for token in burst]
    assert streamed == out.sequences[0, 7:].tolist()
    assert len(streamer.puts) - 1 == out.stats.iterations  # one burst per verification pass
    assert max(len(burst) for burst in streamer.puts[1:]) > 1  # bursts, not one by one
    assert streamer.ended


def test_baseline_streams_one_token_at_a_time(pair):
    target, _ = pair
    streamer = RecordingStreamer()
    out = autoregressive_generate(target, prompt(7), max_new_tokens=12, streamer=streamer, eos_token_id=[])
    assert streamer.puts[1:] == [[token] for token in out.sequences[0, 7:].tolist()]
    assert streamer.ended


@pytest.fixture(scope="module")
def tokenizer():
    """A real byte-level BPE tokenizer with exactly the test models' vocabulary size."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    text = ["def speculative_step(target, draft):\n    return accept(verify(draft(tokens)))\n"] * 50
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<pad>", "<s>", "</s>"])
    bpe.train_from_iterator(text, trainer)
    assert bpe.get_vocab_size() <= VOCAB
    return PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")


def test_text_streamer_works_unchanged(pair, tokenizer, capsys):
    target, draft = pair
    ids = tokenizer("def speculative_step(", return_tensors="pt").input_ids
    streamer = TextStreamer(tokenizer, skip_prompt=True)
    out = speculative_generate(target, draft, ids, max_new_tokens=30, num_draft_tokens=3, streamer=streamer,
                               eos_token_id=[])
    printed = capsys.readouterr().out
    assert printed == tokenizer.decode(out.sequences[0, ids.shape[1]:]) + "\n"
