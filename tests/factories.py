"""Model, prompt and tokenizer factories shared by the tests (fixtures are re-exported by conftest.py)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Test models are tiny: one thread each avoids oversubscribing the 2-core CI machine.
torch.set_num_threads(1)

VOCAB = 384
# A large init range spreads the logits, so greedy argmax ties (where batched and
# one-token passes could round differently) are vanishingly rare in random models.
INIT = 0.3


def build(family: str, hidden: int, layers: int, seed: int, vocab: int = VOCAB, context: int = 256):
    """A random-init causal LM of ``family`` ("llama", "gpt2" or "qwen2"), in eval mode."""
    torch.manual_seed(seed)
    heads = max(2, hidden // 32)
    if family == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                             max_position_embeddings=context, initializer_range=INIT,
                             bos_token_id=1, eos_token_id=2)
        model = LlamaForCausalLM(config)
    elif family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads, n_positions=context,
                            initializer_range=INIT, bos_token_id=1, eos_token_id=2)
        model = GPT2LMHeadModel(config)
    elif family == "qwen2":
        config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                             num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                             max_position_embeddings=context, initializer_range=INIT,
                             bos_token_id=1, eos_token_id=2)
        model = Qwen2ForCausalLM(config)
    else:
        raise ValueError(family)
    return model.eval()


def noisy_copy(model: torch.nn.Module, noise: float, seed: int) -> torch.nn.Module:
    """The model with Gaussian noise on its weights: a draft that agrees with it *sometimes*,
    so iterations accept every possible number of drafts and the rollback paths all run."""
    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * param.std() * torch.randn_like(param))
    return draft.eval()


@pytest.fixture(scope="session", params=["llama", "gpt2", "qwen2"])
def family_pair(request):
    """(family, target, noisy-copy draft, small independent draft) for each model family."""
    target = build(request.param, hidden=64, layers=2, seed=0)
    return request.param, target, noisy_copy(target, 0.05, seed=1), build(request.param, 32, 1, seed=2)


def prompt(length: int, seed: int = 0, vocab: int = VOCAB) -> torch.LongTensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (1, length), generator=generator)


# ---- tokenizers trained locally, for the cross-tokenizer tests ----------------------------

UNICODE_LINES = ["naïve café — 東京 costs 5 € ✓\n", "  # größer, señor, 你好\n"]


def training_text() -> list[str]:
    """A small deterministic corpus: a few standard-library modules plus some non-ASCII lines."""
    import inspect
    import json
    import textwrap

    return [inspect.getsource(json.decoder), inspect.getsource(textwrap)] + UNICODE_LINES * 20


def train_tokenizer(vocab_size: int, kind: str = "bytelevel"):
    """A ``PreTrainedTokenizerFast`` of exactly ``vocab_size`` entries.

    ``bytelevel``: byte-level BPE (GPT-2 style); ``digits``: byte-level BPE that also splits
    every digit apart (other merges, other ids); ``metaspace``: SentencePiece-style BPE that
    marks spaces with "▁" (leading-space handling differs).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>"]
    if kind == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        alphabet = sorted(set("".join(training_text())) - {" "}) + ["▁"]
        specials = specials + ["<unk>"]
    else:
        tok = Tokenizer(models.BPE())
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                             if kind == "digits" else byte_level)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, special_tokens=specials,
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>" if kind == "metaspace" else None)


@pytest.fixture(scope="session")
def tokenizer_a():
    return train_tokenizer(VOCAB, "bytelevel")


@pytest.fixture(scope="session")
def tokenizer_b():
    return train_tokenizer(320, "digits")


def assert_passes_on_the_avx2_build(check: str, kernel: str) -> None:
    """Run ``check`` (Python; ``tests/`` on its path) in a fresh process whose kernels are built as
    their AVX2 variants (an AVX-512 CPU's default build never runs that code; one process can load
    only one build of an operator), and assert it passed on the AVX2 build of ``kernel``."""
    result = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1])\n" + check,
                             str(Path(__file__).parent)], capture_output=True, text=True,
                            env={**os.environ, "SPECDEC_BF16_KERNEL": "avx2"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"the {kernel} is built (AVX2, " in result.stdout
