"""specdec_ref.kernels.llama_pass: SmolLM2's decode steps and verification passes in one C++ call,
against the layer-by-layer forward on the same kernels, position by position, and what it leaves
to that forward. Speed is measured by ``benchmarks/llamacpp_vs_fast.py``, never asserted here."""
from __future__ import annotations

import pytest
import torch

from specdec_ref import autoregressive_generate, lesson_tools, speculative_generate, zoo
from specdec_ref.eagle import EagleDrafter, widen_head
from specdec_ref.kernels import build as kernel_build, eagle_chain, fast, gguf, llama_pass
from specdec_ref.kv_cache import new_cache
from specdec_ref.drafters import drafter_features
from specdec_ref.speculative import tree_verification_inputs

pytestmark = pytest.mark.skipif(not kernel_build.has_vector_units(kernel_build.cpu_flags()),
                                reason="the kernels are AVX2 code; this CPU has no AVX2 with FMA")


@pytest.fixture(scope="module")
def smollm2():
    target, tokenizer = zoo.load("zoo:smollm2")
    quick = fast.prepare(target)
    text = ("A lighthouse keeper counts the ships that pass at night. She writes each one in a book: its flag, its "
            "lights, the hour it rounded the point, and whether it answered her signal. In forty years the book has")
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids.shape[1] > 32
    return target, quick, ids


class Counting:
    """The layer-by-layer forward behind a :class:`~specdec_ref.kernels.llama_pass.PassForward`, counted."""

    def __init__(self, forward) -> None:
        self.forward, self.calls = forward, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.forward(*args, **kwargs)


def prefilled(model, ids, length, forward=None):
    cache = new_cache(model)
    (forward or model)(ids[:, :length], past_key_values=cache, use_cache=True)
    return cache


def test_prepare_runs_smollm2s_passes_in_one_call_and_says_so(smollm2):
    _, quick, _ = smollm2
    assert llama_pass.runs(quick)
    assert fast.path_name(quick).endswith(" + a pass of a few tokens in one C++ call")


@torch.inference_mode()
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_a_pass_gives_the_logits_features_and_cache_of_the_layer_by_layer_forward(smollm2, monkeypatch, tokens):
    _, quick, ids = smollm2
    layer_by_layer = quick.forward.forward
    counting = Counting(layer_by_layer)
    monkeypatch.setattr(quick.forward, "forward", counting)
    start = ids.shape[1] - 16
    one_call, reference = prefilled(quick, ids, start, layer_by_layer), prefilled(quick, ids, start, layer_by_layer)
    part = ids[:, start:start + tokens]
    got = quick(part, past_key_values=one_call, use_cache=True, output_hidden_states=True)
    assert counting.calls == 0, "a pass of a few tokens ran the layer-by-layer forward"
    want = layer_by_layer(part, past_key_values=reference, use_cache=True, output_hidden_states=True)
    # The same kernels; RMSNorm, the rotary embedding and the residual adds sum in another order.
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)
    # Every layer's input too (a multi-layer EAGLE head reads lower ones), then the final norm's output.
    assert len(got.hidden_states) == len(want.hidden_states) == quick.config.num_hidden_layers + 1
    for ours, theirs in zip(got.hidden_states, want.hidden_states):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-3)
    assert one_call.get_seq_length() == reference.get_seq_length() == start + tokens
    for ours, theirs in zip(one_call.layers, reference.layers):
        torch.testing.assert_close(ours.keys, theirs.keys, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(ours.values, theirs.values, rtol=1e-4, atol=1e-4)


@torch.inference_mode()
def test_every_position_of_a_pass_gets_what_a_one_token_step_gives_bit_for_bit(smollm2):
    _, quick, ids = smollm2
    start = ids.shape[1] - 5
    whole = quick(ids[:, start:], past_key_values=prefilled(quick, ids, start), use_cache=True).logits[0]
    cache = prefilled(quick, ids, start)
    steps = [quick(ids[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, 0] for i in range(start, ids.shape[1])]
    assert all(torch.equal(row, step) for row, step in zip(whole, steps))


@torch.inference_mode()
def test_a_short_prompt_is_read_in_passes_each_position_as_a_one_token_step_reads_it(smollm2, monkeypatch):
    _, quick, ids = smollm2
    counting = Counting(quick.forward.forward)
    monkeypatch.setattr(quick.forward, "forward", counting)
    assert 2 * gguf.MAX_ROWS < ids.shape[1] <= llama_pass.PREFILL_TOKENS
    whole = quick(ids, past_key_values=new_cache(quick), use_cache=True, output_hidden_states=True)
    assert counting.calls == 0 and whole.logits.shape[1] == ids.shape[1]
    reference = counting.forward(ids, past_key_values=new_cache(quick), use_cache=True)
    torch.testing.assert_close(whole.logits, reference.logits, rtol=1e-4, atol=1e-4)
    cache = new_cache(quick)
    steps = [quick(ids[:, i:i + 1], past_key_values=cache, use_cache=True, output_hidden_states=True)
             for i in range(ids.shape[1])]
    assert all(torch.equal(whole.hidden_states[-1][0, i], step.hidden_states[-1][0, 0]) for i, step in enumerate(steps))
    last = quick(ids, past_key_values=new_cache(quick), use_cache=True, logits_to_keep=1).logits[0, -1]
    assert torch.equal(last, steps[-1].logits[0, 0])  # (all 40 rows' logits are one fp32 matmul, not the kernel)


@torch.inference_mode()
def test_a_tree_pass_gives_the_logits_of_the_layer_by_layer_forward_under_its_mask(smollm2):
    _, quick, ids = smollm2
    start = ids.shape[1] - 3
    nodes = torch.cat([ids[:, start:start + 1], torch.tensor([[11, 22, 33, 44]])], 1)
    tree = tree_verification_inputs([-1, -1, 0, 1], start, torch.float32, ids.device)  # two branches of two
    got = quick(nodes, past_key_values=prefilled(quick, ids, start), use_cache=True, **tree).logits[0]
    want = quick.forward.forward(nodes, past_key_values=prefilled(quick, ids, start), use_cache=True, **tree).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # The last token and the first node read no masked key: each gets what a one-token step gives.
    cache = prefilled(quick, ids, start)
    steps = [quick(nodes[:, i:i + 1], past_key_values=cache, use_cache=True).logits[0, 0] for i in range(2)]
    assert torch.equal(got[0], steps[0]) and torch.equal(got[1], steps[1])


@torch.inference_mode()
def test_what_a_pass_does_not_take_runs_the_layer_by_layer_forward(smollm2, monkeypatch):
    target, quick, ids = smollm2
    counting = Counting(quick.forward.forward)
    monkeypatch.setattr(quick.forward, "forward", counting)
    longer = torch.cat([ids, ids], 1)[:, :llama_pass.PREFILL_TOKENS + 1]
    quick(longer, past_key_values=new_cache(quick), use_cache=True)  # a prompt longer than those read in passes
    quick(ids[:, :3], past_key_values=new_cache(target), use_cache=True)  # a cache that is not preallocated
    quick(ids[:, :3])  # no cache at all
    quick(ids[:, :3], past_key_values=new_cache(quick), attention_mask=torch.ones(1, 3))  # a 2-d padding mask
    quick(ids[:, :3], past_key_values=new_cache(quick), use_cache=False)  # a cache not to be written
    assert counting.calls == 5
    quick(ids[:, :3], past_key_values=new_cache(quick), use_cache=True)  # an empty preallocated cache: taken
    tree = tree_verification_inputs(list(range(-1, gguf.MAX_ROWS - 1)), 0, torch.float32, ids.device)
    quick(ids[:, :gguf.MAX_ROWS + 1], past_key_values=new_cache(quick), use_cache=True, **tree)  # a mask: one pass at most
    assert counting.calls == 6


def test_only_an_all_gguf_llama_gets_a_one_call_pass(smollm2):
    target, _, _ = smollm2
    with pytest.raises(ValueError, match="all GGUF-coded and stacked"):
        llama_pass.PassForward(target, target.forward)
    course_target, _ = zoo.load("zoo:target")  # bf16-valued weights: no GGUF code
    assert fast.is_fast(fast.prepare(course_target)) and not llama_pass.runs(fast.prepare(course_target))


def test_the_operator_refuses_a_cache_too_short_for_the_pass(smollm2):
    _, quick, ids = smollm2
    cache = prefilled(quick, ids, 4)
    one = quick.forward
    short = [layer.key_buffer[:, :, :4].contiguous() for layer in cache.layers]
    cos, sin = one._rotary(4, 2, None)
    with pytest.raises(RuntimeError, match="capacity >= start \\+ T"):
        torch.ops.specdec.llama_layers(ids[0, 4:6].contiguous(), one.embedding, cos, sin, None, short, short, 4,
                                       one.norms, one.codes, one.bits, one.heads, one.kv_heads, one.intermediate, one.eps,
                                       False)


def test_the_step_profile_sees_the_kernels_inside_the_one_call_pass(smollm2):
    _, quick, _ = smollm2
    profile = lesson_tools.profile_step(quick, context=16, repeats=2)
    assert profile["weight matmuls"] > 0.5 * profile["total"] and profile["attention"] > 0
    assert sum(profile[p] for p in lesson_tools.STEP_PARTS) == pytest.approx(profile["total"])


def test_an_eagle_head_on_the_fast_target_drafts_its_chain_in_one_call(smollm2):
    """SmolLM2's EAGLE head on the fast target drafts its greedy chain as one C++ call per draft (all
    but the first, which fills the head's cache), proposing what its per-step loop proposes, the extra
    first candidates too; the output stays SmolLM2's greedy output."""
    target, quick, ids = smollm2
    head, vocab = zoo.load_eagle("zoo:smollm2-eagle")
    expected = autoregressive_generate(target, ids, 40, eos_token_id=[]).sequences
    for width in (1, 2):
        proposals, calls = {}, []
        for way in ("one call", "per step"):
            drafter = EagleDrafter(head, target, vocab, first_candidates=width).for_target(quick)
            chain, seen, propose = drafter.one_call_chain, [], drafter.propose
            assert isinstance(chain, eagle_chain.OneCallChain)
            drafter.one_call_chain = (lambda *args: calls.append(args) or chain(*args)) if way == "one call" else None
            drafter.propose = lambda *args: seen.append(propose(*args)) or seen[-1]
            out = speculative_generate(quick, drafter, ids, 40, 3, eos_token_id=[])
            assert torch.equal(out.sequences, expected), (width, way)
            proposals[way] = [(p.tokens.tolist(), p.parents if p.parents is None else p.parents.tolist()) for p in seen]
        assert proposals["one call"] == proposals["per step"], width
        drafted = [tokens for tokens, _ in proposals["one call"] if tokens]
        assert len(calls) == len(drafted) - 1 > 0, width


def test_a_multi_layer_head_on_the_fast_target_reads_the_lower_layers_of_the_one_call_pass(smollm2):
    """A multi-layer head (SmolLM2's head widened to read layers 2 and 15, their fuse columns random)
    gets from the one-call passes the features the layer-by-layer forward gives; the output stays
    SmolLM2's greedy output."""
    target, quick, ids = smollm2
    head, vocab = zoo.load_eagle("zoo:smollm2-eagle")
    wide = widen_head(head, (2, 15))
    d = head.config.hidden_size
    with torch.no_grad():
        wide.fuse.weight[:, :2 * d] = 0.02 * torch.randn(d, 2 * d, generator=torch.Generator().manual_seed(0))
    received = []

    class Recording(EagleDrafter):
        def update(self, tokens, num_accepted, features=None):
            if features is not None:
                received.append(features.clone())
            super().update(tokens, num_accepted, features)

    drafter = Recording(wide, quick, vocab)
    out = speculative_generate(quick, drafter, ids, 24, 3, eos_token_id=[])
    assert torch.equal(out.sequences, autoregressive_generate(target, ids, 24, eos_token_id=[]).sequences)
    assert llama_pass.runs(quick) and torch.cat(received).shape == (out.sequences.shape[1] - 1, 3 * d)
    with torch.inference_mode():
        states = quick.forward.forward(out.sequences[:, :-1], output_hidden_states=True).hidden_states
    torch.testing.assert_close(torch.cat(received), drafter_features(states, slice(None), (2, 15)),
                               rtol=1e-4, atol=1e-3)
