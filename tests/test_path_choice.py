"""Choosing how to run a model (specdec_ref.kernels.choice): every way that applies is measured and
the quickest kept; the bench and generate commands load on it and say which ran and why.
Which way wins is the machine's business: the tests check the choice follows the measurement."""
from __future__ import annotations

import pytest
import torch

from factories import build, noisy_copy, prompt
from specdec_ref import autoregressive_generate, bench, speculative_generate
from specdec_ref.kernels import fast
from specdec_ref.kernels.choice import PATHS, fastest_path, on_path
from specdec_ref.kernels.weights_first import is_weights_first


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, tokenizer_a):
    root = tmp_path_factory.mktemp("path-models")
    target = build("llama", hidden=64, layers=2, seed=0, vocab=tokenizer_a.vocab_size)
    for name, model in (("target", target), ("draft", noisy_copy(target, 0.05, seed=1))):
        model.save_pretrained(root / name)
        tokenizer_a.save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


def test_fastest_path_keeps_the_quickest_of_what_it_measured():
    model = build("llama", hidden=64, layers=2, seed=0)
    choice = fastest_path(model, rounds=2)
    measured = set(choice.seconds)
    assert {"eager", "weights-first"} <= measured <= set(PATHS)
    assert measured | set(choice.skipped) == set(PATHS)
    assert choice.seconds[choice.name] == min(choice.seconds.values())
    # the model returned runs the way chosen, and shares the original's weights
    assert is_weights_first(choice.model) == (choice.name == "weights-first")
    assert fast.is_fast(choice.model) == (choice.name == "fast")
    assert (choice.model is model) == (choice.name == "eager")
    reason = choice.reason()
    assert reason.startswith(f"{choice.name}: ") and all(name in reason for name in measured)


def test_on_path_names_the_way_or_refuses():
    model = build("llama", hidden=64, layers=2, seed=0)
    assert on_path(model, "eager") is model and is_weights_first(on_path(model, "weights-first"))
    with pytest.raises(ValueError, match="unknown path 'gpu'"):
        on_path(model, "gpu")


@pytest.mark.parametrize("path", ["auto", "weights-first"])
def test_a_pair_loads_both_models_on_one_path_and_stays_exact(saved_pair, path):
    pair = bench.load_pair(*saved_pair, path=path)
    assert pair.path in PATHS and (path == "auto" or pair.path == path)
    assert pair.path_reason.startswith(pair.path)
    # the draft follows its target's way of running
    assert is_weights_first(pair.draft_model) == is_weights_first(pair.target)
    ids = prompt(12)
    out = speculative_generate(pair.target, pair.drafter, ids, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[])
    plain = autoregressive_generate(pair.target, ids, max_new_tokens=24, eos_token_id=[])
    assert torch.equal(out.sequences, plain.sequences)
    assert out.stats.accepted_tokens > 0, "the draft should be used"
    with pytest.raises(ValueError, match="unknown path"):
        bench.load_pair(*saved_pair, path="fastest")


def test_bench_says_which_path_ran(saved_pair, capsys):
    from specdec_ref.__main__ import main

    target, draft = saved_pair
    main(["bench", "--target", target, "--draft", draft, "--k", "2", "--prompts", "1", "--max-new-tokens", "8",
          "--no-hf"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("path: "))
    assert any(line.startswith(f"path: {name}: ") for name in PATHS), line
    assert "identical True" in out
