"""Fixtures for the tests that run a real vLLM server (marker ``vllm``).

The server runs from the separate environment made by
``scripts/setup_vllm_env.sh`` (``.venv-vllm`` by default, or the folder named
by ``SPECDEC_VLLM_VENV``).  A missing environment is a failure, not a skip:
CI creates it first, and a silent skip would hide a broken install.

Models: the zoo pair by default.  ``SPECDEC_VLLM_MODELS=tiny`` builds a tiny
random Llama pair instead (seconds, no zoo needed), for working on the helpers
while the zoo is being trained; ``SPECDEC_VLLM_MODELS=TARGET,DRAFT`` takes any
other same-tokenizer pair (folders or Hub ids).  Greedy identity holds for any
weights.
"""
from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
import torch

from specdec_ref.vllm import course_vllm_venv, cpu_env, venv_launcher

REPO = Path(__file__).resolve().parents[2]
# Throughput and acceptance figures collected by the tests, printed at the end.
REPORT: list[str] = []


def vllm_venv() -> Path:
    """The vLLM environment: ``SPECDEC_VLLM_VENV``, else the setup script's default."""
    return course_vllm_venv()


@pytest.fixture(scope="session")
def vllm_launcher() -> list[str]:
    """The command prefix that starts vLLM's OpenAI server from its own environment."""
    if not (vllm_venv() / "bin" / "python").exists():
        pytest.fail(f"no vLLM environment at {vllm_venv()}: run scripts/setup_vllm_env.sh first")
    return venv_launcher(vllm_venv())


@pytest.fixture(scope="session")
def vllm_env() -> dict[str, str]:
    """Environment for the server: offline, with a 1 GiB KV cache and the course's compile cache."""
    return cpu_env(vllm_venv(), kv_cache_gib=1)


@pytest.fixture(scope="session")
def model_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """(target, draft) names or folders that both vLLM and transformers can load."""
    choice = os.environ.get("SPECDEC_VLLM_MODELS", "zoo")
    if choice == "tiny":
        return build_tiny_pair(tmp_path_factory.mktemp("tiny-pair"))
    if choice != "zoo":
        target, comma, draft = choice.partition(",")
        if not (comma and target and draft):
            pytest.fail(f"SPECDEC_VLLM_MODELS must be 'zoo', 'tiny' or 'TARGET,DRAFT', got {choice!r}")
        return target, draft
    from specdec_ref import zoo

    for name in ("zoo:target", "zoo:draft"):
        try:
            zoo.verify(zoo.resolve(name))
        except (FileNotFoundError, RuntimeError) as error:
            pytest.fail(f"{name} is not usable: {error}")
    return "zoo:target", "zoo:draft"


def build_tiny_pair(folder: Path) -> tuple[str, str]:
    """A random 2-layer Llama target and a slightly perturbed copy as its draft.

    head_dim 32 because vLLM's CPU attention needs >= 32; the wide init range
    spreads the logits so that greedy argmax ties (which two correct
    implementations may break differently) do not occur; the draft is the
    target plus noise so that some, not all, of its proposals are accepted.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [Path(module.__file__).read_text() for module in (os, json.decoder, textwrap)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>")

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512, initializer_range=0.2,
        eos_token_id=fast.eos_token_id, bos_token_id=fast.bos_token_id, tie_word_embeddings=False,
    )
    target = LlamaForCausalLM(config).eval()
    draft = LlamaForCausalLM(config).eval()
    draft.load_state_dict(target.state_dict())
    with torch.no_grad():
        for parameter in draft.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.01)
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(folder / name)
        fast.save_pretrained(folder / name)
    return str(folder / "target"), str(folder / "draft")


@pytest.fixture(scope="session")
def vllm_report() -> list[str]:
    """Lines of measurements to print in the terminal summary."""
    return REPORT


def pytest_terminal_summary(terminalreporter) -> None:
    """Print the measured figures even without ``-s``."""
    if REPORT:
        terminalreporter.section("vLLM measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
