"""One drafter interface: every drafter of the library implements DrafterBase, a learner's class with
start/propose/update plugs in as it is, tracing passes features through, and a drafter paired with
the wrong target says so in one sentence."""
from __future__ import annotations

import pytest
import torch

from factories import build, prompt
from specdec_ref import (CrossTokenizerDrafter, EagleDrafter, ModelDrafter, PromptLookupDrafter, autoregressive_generate,
                         speculative_generate, zoo)
from specdec_ref.costs import measure_costs
from specdec_ref.drafters import DrafterBase, as_drafter_base
from specdec_ref.eagle import EagleConfig, init_head
from specdec_ref.trace import trace_generate


def test_every_library_drafter_implements_the_whole_interface():
    for cls in (ModelDrafter, CrossTokenizerDrafter, PromptLookupDrafter, EagleDrafter):
        assert issubclass(cls, DrafterBase), cls


class Plain:
    """A learner's drafter: the three methods only, update without features."""

    def __init__(self) -> None:
        self.calls = 0

    def start(self, prompt, max_new_tokens):
        pass

    def propose(self, tokens, max_tokens, sampler):
        from specdec_ref import Proposal

        self.calls += 1
        return Proposal(tokens[-1:].repeat(min(max_tokens, 2)))

    def update(self, tokens, num_accepted):
        pass


def test_a_plain_drafter_gets_the_defaults_and_runs():
    target = build("llama", 64, 1, seed=0)
    plain = Plain()
    adapted = as_drafter_base(plain)
    assert not adapted.reads_target_features and adapted.for_target(target) is adapted
    assert adapted.weight_bytes == 0 and adapted.draft_step(target, torch.arange(5)) is None
    ids = prompt(8, 64)
    out = speculative_generate(target, plain, ids, max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, autoregressive_generate(target, ids, 12, eos_token_id=[]).sequences)
    assert plain.calls == out.stats.iterations


def test_tracing_an_eagle_drafter_passes_the_features_through():
    target = build("llama", 64, 2, seed=0)
    drafter = EagleDrafter(init_head(EagleConfig.for_target(target.config)), target)
    ids = prompt(10, 64)
    out, iterations = trace_generate(target, drafter, ids, max_new_tokens=16, num_draft_tokens=3, eos_token_id=[])
    assert torch.equal(out.sequences, autoregressive_generate(target, ids, 16, eos_token_id=[]).sequences)
    assert len(iterations) == out.stats.iterations
    # the head's own cache grows with the real features it was handed, iteration by iteration
    assert all(it.draft_cache is not None for it in iterations)
    assert iterations[-1].draft_cache[0] > iterations[0].draft_cache[0]


def test_the_costs_of_any_drafter_come_from_its_own_draft_step():
    target = build("llama", 64, 2, seed=0)
    head_costs = measure_costs(target, EagleDrafter(init_head(EagleConfig.for_target(target.config)), target), 16,
                               [2], rounds=2)
    lookup_costs = measure_costs(target, PromptLookupDrafter(), 16, [2], rounds=2)
    assert head_costs.cost_ratio > 0 and lookup_costs.cost_ratio == 0.0


@pytest.mark.slow
def test_pairing_mistakes_are_one_sentence_each():
    target, _ = zoo.load("zoo:target")
    smol_head, smol_vocab = zoo.load_eagle("zoo:smollm2-eagle")
    with pytest.raises(ValueError, match="reads features of size 576 and the target's are 512: the head was trained "
                                         "for another target model"):
        EagleDrafter(smol_head, target, smol_vocab)
    with pytest.raises(TypeError, match="draft is an EAGLE head.*pass EagleDrafter"):
        speculative_generate(target, smol_head, prompt(6, 100), max_new_tokens=4)
    with pytest.raises(TypeError, match="EagleDrafter drafts with an EagleHead"):
        EagleDrafter(target, target)
    # a drafter built for one target, passed with another
    wide = build("llama", 64, 1, seed=0)
    drafter = EagleDrafter(init_head(EagleConfig.for_target(wide.config)), wide)
    with pytest.raises(ValueError, match="reads features of size 64 and the target's are 512"):
        speculative_generate(target, drafter, prompt(6, 100), max_new_tokens=4)


class PlainFeatureReader(Plain):
    """A learner's feature drafter (exercise 9's shape): says so with the class attribute."""

    reads_target_features = True

    def __init__(self) -> None:
        super().__init__()
        self.features_seen = 0

    def update(self, tokens, num_accepted, features=None):
        self.features_seen += 0 if features is None else features.shape[0]


def test_a_plain_feature_reader_gets_the_features():
    target = build("llama", 64, 1, seed=0)
    reader = PlainFeatureReader()
    ids = prompt(8, 64)
    out = speculative_generate(target, reader, ids, max_new_tokens=10, num_draft_tokens=2, eos_token_id=[])
    # one feature per position the target's cache kept: the prompt's but the last, then each iteration's
    assert reader.features_seen == out.sequences.shape[1] - 1
