"""specdec_ref.kernels.fast: exact greedy output through every loop, the no-op paths, the guards, the tools.

Performance is measured by ``python -m specdec_ref bench --fast``, never asserted here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch

from torch._dynamo.utils import counters

from factories import build, noisy_copy, prompt
from specdec_ref import autoregressive_generate, bench, lesson_tools, speculative_generate, zoo
from specdec_ref.kernels import fast, packed
from specdec_ref.roofline import last_level_cache_bytes
from specdec_ref.drafters import ModelDrafter, draft_autoregressive
from specdec_ref.eagle import EagleConfig, EagleDrafter, init_head
from specdec_ref.modules import GREEDY_DRAFTS
from specdec_ref.kv_cache import new_cache, rollback
from specdec_ref.ngram import PromptLookupDrafter
from specdec_ref.sampling import Sampler
from specdec_ref.roofline import weight_bytes
from specdec_ref.zoo.corpus import heldout_prompts

NEW_TOKENS = 32


def greedy(model, ids, **kwargs):
    return autoregressive_generate(model, ids, NEW_TOKENS, eos_token_id=[], **kwargs).sequences


@pytest.fixture(scope="module")
def zoo_models():
    target, tokenizer = zoo.load("zoo:target")
    draft, _ = zoo.load("zoo:draft")
    xtok, xtok_tokenizer = zoo.load("zoo:draft-xtok")
    return {"target": target, "draft": draft, "xtok": xtok, "tokenizer": tokenizer, "xtok_tokenizer": xtok_tokenizer}


def test_available_here():
    ok, reason = fast.available()
    assert ok, reason


def test_prepare_packs_every_linear_and_shares_the_weights(zoo_models):
    target = zoo_models["target"]
    quick = fast.prepare(target, bf16_weights=False)
    assert quick is not target and fast.is_fast(quick) and not fast.is_fast(target)
    linears = [m for m in target.modules() if isinstance(m, torch.nn.Linear)]
    packed = [m for m in quick.modules() if isinstance(m, fast.PackedLinear)]
    assert len(packed) == len(linears) == 7 * 7 + 1  # 7 per layer and the lm_head
    assert not any(isinstance(m, torch.nn.Linear) for m in quick.modules())
    # The lm_head is tied to the embedding: still one tensor, shared with the eager model.
    assert quick.lm_head.weight is quick.model.embed_tokens.weight is target.model.embed_tokens.weight
    assert weight_bytes(quick) == weight_bytes(target)
    assert quick.state_dict().keys() == target.state_dict().keys()
    assert fast.prepare(quick) is quick
    assert fast.path_name(quick) == "prepacked oneDNN weights"


def test_decode_step_speedup_of_a_model_against_itself_is_about_one(zoo_models):
    target = zoo_models["target"]
    ratio = fast.decode_step_speedup(target, target, pairs=5)
    assert 0.5 < ratio < 2.0


def test_prepare_only_if_faster_keeps_whichever_decodes_faster_and_says_so(zoo_models):
    target = zoo_models["target"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chosen = fast.prepare(target, only_if_faster=True)
    notes = [str(w.message) for w in caught if issubclass(w.category, fast.FastPathWarning)]
    if chosen is target:  # packing lost on this machine: one line gives the measured ratio
        assert len(notes) == 1 and "using the eager model" in notes[0], notes
        assert float(notes[0].split("ran at ")[1].split("x")[0]) <= 1.0
    else:
        assert fast.is_fast(chosen) and not notes


def test_zoo_load_fast():
    model, _ = zoo.load("zoo:draft", fast=True)
    assert fast.is_fast(model)


@pytest.mark.parametrize("text", heldout_prompts(4))
def test_zoo_pair_greedy_identical_through_every_loop(zoo_models, text):
    target, tokenizer = zoo_models["target"], zoo_models["tokenizer"]
    ids = tokenizer(text, return_tensors="pt").input_ids
    expected = greedy(target, ids)
    quick, quick_draft, quick_xtok = (fast.prepare(zoo_models[name]) for name in ("target", "draft", "xtok"))
    assert torch.equal(greedy(quick, ids), expected)
    runs = {
        "draft model": speculative_generate(quick, quick_draft, ids, NEW_TOKENS, 4, eos_token_id=[]),
        "prompt lookup": speculative_generate(quick, PromptLookupDrafter(), ids, NEW_TOKENS, 4, eos_token_id=[]),
        "cross-tokenizer": speculative_generate(quick, quick_xtok, ids, NEW_TOKENS, 4, eos_token_id=[],
                                                target_tokenizer=tokenizer,
                                                draft_tokenizer=zoo_models["xtok_tokenizer"]),
    }
    for name, out in runs.items():
        assert torch.equal(out.sequences, expected), name
    assert runs["draft model"].stats.accepted_tokens > 0


def test_random_families_greedy_identical(family_pair):
    family, target, draft, small = family_pair
    quick, quick_draft, quick_small = fast.prepare(target), fast.prepare(draft), fast.prepare(small)
    assert fast.is_fast(quick)
    for seed in range(4):
        ids = prompt(12, seed=seed)
        expected = greedy(target, ids)
        assert torch.equal(greedy(quick, ids), expected), (family, seed)
        for drafter in (quick_draft, quick_small):
            out = speculative_generate(quick, drafter, ids, NEW_TOKENS, 3, eos_token_id=[])
            assert torch.equal(out.sequences, expected), (family, seed)


@pytest.mark.parametrize("kernel", ["few-query attention", "PyTorch's SDPA"])
def test_prepare_reads_grouped_query_heads_in_place_with_the_logits_of_sdpa(monkeypatch, kernel):
    """A verification pass (several tokens on a cache, so under a mask) must not copy the cached keys
    and values per query head (transformers' repeat_kv) on the fast path, and must give the logits
    transformers' own SDPA gives: bit for bit on PyTorch's kernel, to rounding on the course's
    (another order of sums); the eager model keeps transformers' attention."""
    from transformers.integrations import sdpa_attention

    from specdec_ref.kernels import attention

    model = build("qwen2", 64, 2, seed=3)  # 2 query heads sharing 1 key/value head
    quick = fast.prepare(model)
    assert quick.config._attn_implementation == fast.GQA_ATTENTION
    assert model.config._attn_implementation == "sdpa"
    monkeypatch.setattr(attention, "loaded", attention.loaded and kernel == "few-query attention")
    copies = []
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: copies.append(n) or x.repeat_interleave(n, 1))
    ids = prompt(16, seed=1)
    logits = {}
    with torch.inference_mode():
        for implementation in ("sdpa", fast.GQA_ATTENTION):
            quick.config._attn_implementation_internal = implementation
            copies.clear()
            cache = new_cache(quick)
            quick(ids[:, :12], past_key_values=cache, use_cache=True)
            logits[implementation] = [quick(ids[:, 12:12 + n], past_key_values=cache, use_cache=True).logits
                                      for n in (1, 3)]
            rollback(cache, 12)
            if implementation == "sdpa":
                assert copies, "transformers' SDPA no longer repeats grouped heads under a mask: this test is moot"
            else:
                assert not copies
    pairs = list(zip(logits["sdpa"], logits[fast.GQA_ATTENTION]))
    if kernel == "PyTorch's SDPA":
        assert all(torch.equal(a, b) for a, b in pairs)
    else:
        for a, b in pairs:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


class CountingGreedyDrafts:
    """Wraps a compiled model's one-graph greedy drafting and counts its calls."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.inner, self.calls = getattr(model, GREEDY_DRAFTS), 0
        setattr(model, GREEDY_DRAFTS, self)

    def __call__(self, *args):
        self.calls += 1
        return self.inner(*args)


def test_compile_shares_the_weights_and_decodes_real_weights_exactly(zoo_models):
    draft, tokenizer = zoo_models["draft"], zoo_models["tokenizer"]
    ok, reason = fast.compile_available(draft)
    assert ok, reason
    compiled = fast.prepare(draft, compile=True)
    assert compiled is not draft and fast.is_compiled(compiled) and not fast.is_compiled(draft)
    assert fast.path_name(compiled).endswith("torch.compile")  # and bf16-stored where the kernel builds
    assert all(a is b for a, b in zip(compiled.parameters(), draft.parameters()))
    assert fast.prepare(compiled, compile=True) is compiled
    one_graph = CountingGreedyDrafts(compiled)
    target = fast.prepare(zoo_models["target"])
    # A one-token slice of a longer buffer (a verification with no drafts) runs on the decode
    # step's graph, whatever the buffer's row stride.
    ids = tokenizer(heldout_prompts(1)[0], return_tensors="pt").input_ids
    greedy(compiled, ids)  # the prefill's and the decode step's graphs
    decode_graphs, cache = counters["stats"]["unique_graphs"], new_cache(compiled)
    compiled(ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
    buffer = torch.cat([ids, ids], dim=1)
    compiled(buffer[:, ids.shape[1] - 1:ids.shape[1]], past_key_values=cache, use_cache=True, logits_to_keep=1)
    assert counters["stats"]["unique_graphs"] == decode_graphs
    graphs = []
    for text in heldout_prompts(3):
        ids = tokenizer(text, return_tensors="pt").input_ids
        expected = greedy(draft, ids)
        assert torch.equal(greedy(compiled, ids), expected)
        # Verifications of every length, then rollbacks: the cache's strides must not change.
        lookup = speculative_generate(compiled, PromptLookupDrafter(), ids, NEW_TOKENS, 4, eos_token_id=[])
        assert torch.equal(lookup.sequences, expected)
        # The compiled model drafting: k greedy steps in one graph, at the budget's end too.
        calls = one_graph.calls
        out = speculative_generate(target, compiled, ids, NEW_TOKENS, 4, eos_token_id=[])
        assert torch.equal(out.sequences, greedy(target, ids))
        # Every iteration drafted in one graph but a last one left no room for drafts.
        assert one_graph.calls - calls in (out.stats.iterations, out.stats.iterations - 1)
        assert out.stats.accepted_tokens > 0
        graphs.append(counters["stats"]["unique_graphs"])
    # The first prompt compiled every kind of pass; other prompt and cache lengths reuse them.
    assert graphs[0] == graphs[1] == graphs[2]
    # Caches that start at 8 positions grow before each call, never inside a graph: drafting
    # after full acceptances (k drafts and a token of the target's each time) adds no graph.
    small, full, exact = new_cache(compiled), new_cache(compiled), new_cache(compiled)
    for layer in small.layers:
        layer.capacity = 8
    tokens = ids[0]
    for layer in exact.layers:  # the prompt but 2, then 2 + 3 positions written: full to the last
        layer.capacity = tokens.numel() + 3
    assert torch.equal(one_graph(exact, tokens, 4, None)[0], one_graph(full, tokens, 4, None)[0])
    for _ in range(6):
        drafts, _ = one_graph(small, tokens, 4, None)
        assert torch.equal(drafts, one_graph(full, tokens, 4, None)[0])
        tokens = torch.cat([tokens, drafts, torch.tensor([5])])
    assert counters["stats"]["unique_graphs"] == graphs[0]
    assert 8 < small.layers[0].capacity < 2 * tokens.numel()  # grown, by doubling


def test_compiled_greedy_drafts_match_the_per_step_loop():
    """One graph for k steps against the per-step loop on the same compiled model: from the
    prompt, after a rejection (one token pending) and after a full acceptance (two pending),
    with the target's width equal, narrower and wider than the draft's logits."""
    compiled = fast.prepare(build("llama", 64, 2, seed=0), compile=True)
    greedy_drafts, sampler = getattr(compiled, GREEDY_DRAFTS), Sampler()
    vocab = compiled.config.vocab_size
    for vocab_size in (None, vocab - 3, vocab + 5):
        tokens = prompt(12, seed=1)[0]
        cache, reference_cache = new_cache(compiled), new_cache(compiled)
        for accepted in (None, 1, 4):  # None: the first draft, from the prompt
            if accepted is not None:  # the target keeps `accepted` drafts and adds a token of its own
                tokens = torch.cat([tokens, drafts[:accepted], torch.tensor([7])])
                rollback(cache, tokens.numel() - 1)
                rollback(reference_cache, tokens.numel() - 1)
            pending = tokens[reference_cache.get_seq_length():]
            expected, _ = draft_autoregressive(compiled, reference_cache, pending, 4, sampler, vocab_size)
            drafts, calls = greedy_drafts(cache, tokens, 4, vocab_size)
            assert torch.equal(drafts, expected), (vocab_size, accepted)
            assert calls == (5 if accepted is None else 4)  # the prompt is fed first, in its own pass
            assert cache.get_seq_length() == reference_cache.get_seq_length() == tokens.numel() + 3
        assert vocab_size is None or int(drafts.max()) < min(vocab, vocab_size)


def test_an_eagle_head_on_a_compiled_target_drafts_its_chain_in_one_compiled_call():
    """On a compiled target an EAGLE head's greedy chain is one compiled call per draft (all but
    the first, which fills the head's cache), proposing what its per-step loop proposes, the
    extra first candidates too; the output stays the target's greedy output."""
    compiled = fast.prepare(build("llama", 64, 2, seed=0), compile=True)
    head = init_head(EagleConfig.for_target(compiled.config), seed=0)
    ids = prompt(10, seed=4)
    expected = greedy(compiled, ids)
    for width in (1, 2):
        proposals, calls = {}, []
        for way in ("compiled", "per step"):
            drafter = EagleDrafter(head, compiled, first_candidates=width)
            chain, seen, propose = drafter.one_call_chain, [], drafter.propose
            assert chain is not None
            drafter.one_call_chain = (lambda *args: calls.append(args) or chain(*args)) if way == "compiled" else None
            drafter.propose = lambda *args: seen.append(propose(*args)) or seen[-1]
            out = speculative_generate(compiled, drafter, ids, NEW_TOKENS, 3, eos_token_id=[])
            assert torch.equal(out.sequences, expected), (width, way)
            proposals[way] = [(p.tokens.tolist(), p.parents if p.parents is None else p.parents.tolist()) for p in seen]
        assert proposals["compiled"] == proposals["per step"], width
        drafted = [tokens for tokens, _ in proposals["compiled"] if tokens]  # the budget's end proposes none
        assert len(calls) == len(drafted) - 1 > 0, width


def test_compiled_models_alike_in_shape_each_run_their_own_graphs():
    """The compiled copies skip the guards on their modules, so each has code of its own: two
    Llamas of one shape and weights but for their activation function, called in turns, each
    decode as they do eagerly."""
    models = [build("llama", 64, 2, seed=3) for _ in range(2)]
    for layer in models[1].model.layers:
        layer.mlp.act_fn = torch.nn.GELU()
    ids = prompt(9, seed=2)
    assert not torch.equal(greedy(models[0], ids), greedy(models[1], ids))
    compiled = [fast.prepare(model, compile=True) for model in models]
    for _ in range(2):
        for model, fast_model in zip(models, compiled):
            assert torch.equal(greedy(fast_model, ids), greedy(model, ids))


def test_model_drafter_drafts_in_one_graph_only_greedy_and_without_a_confidence_stop(zoo_models):
    compiled = fast.prepare(zoo_models["draft"], compile=True)
    one_graph = CountingGreedyDrafts(compiled)
    tokens = zoo_models["tokenizer"]("def add(a, b):", return_tensors="pt").input_ids[0]
    for sampler, min_confidence, fused in ((Sampler(), None, True), (Sampler(), 0.5, False),
                                           (Sampler(do_sample=True, generator=torch.Generator().manual_seed(0)),
                                            None, False)):
        drafter = ModelDrafter(compiled, min_confidence=min_confidence)
        drafter.start(tokens, 16)
        calls = one_graph.calls
        proposal = drafter.propose(tokens, 4, sampler)  # k = 4, as above: the graph is in torch's cache
        assert one_graph.calls - calls == fused and proposal.tokens.numel() <= 4
        # The budget's end: all k drafted in the same graph, the extra ones dropped.
        tokens_now = torch.cat([tokens, proposal.tokens[:1], torch.tensor([11])])
        drafter.update(tokens_now, 1)
        shorter = drafter.propose(tokens_now, 2, sampler)
        assert one_graph.calls - calls == 2 * fused and shorter.tokens.numel() <= 2
        if fused:
            assert shorter.forward_calls == 4
            drafter.update(torch.cat([tokens_now, shorter.tokens[:2], torch.tensor([12])]), 2)
            assert drafter.propose(torch.cat([tokens_now, shorter.tokens[:2], torch.tensor([12])]), 0,
                                   sampler).tokens.numel() == 0
            assert one_graph.calls - calls == 2  # no room for drafts: nothing run


def test_compile_without_a_cxx_compiler_is_a_noop_with_a_message(monkeypatch):
    model = build("llama", 64, 1, seed=0)
    monkeypatch.setenv("PATH", "")
    monkeypatch.delenv("CXX", raising=False)
    ok, reason = fast.compile_available(model)
    assert not ok and "no C++ compiler" in reason
    with pytest.warns(fast.FastPathWarning, match="no C\\+\\+ compiler"):
        assert fast.prepare(model, compile=True) is model


def test_compile_of_another_dtype_is_a_noop_with_a_message():
    model = build("llama", 64, 1, seed=0).to(torch.bfloat16)
    with pytest.warns(fast.FastPathWarning, match="not float32"):
        assert fast.prepare(model, compile=True) is model


def test_another_dtype_is_a_noop_with_a_message():
    model = build("llama", 64, 1, seed=0).to(torch.bfloat16)
    with pytest.warns(fast.FastPathWarning, match="bfloat16; the fast path packs float32 only"):
        assert fast.prepare(model) is model
    assert not fast.is_fast(model)


def test_another_device_is_a_noop_with_a_message():
    model = build("llama", 64, 1, seed=0).to("meta")
    ok, reason = fast.available(model)
    assert not ok and "on meta" in reason and "CPU weights only" in reason
    with pytest.warns(fast.FastPathWarning, match="on meta"):
        assert fast.prepare(model) is model


def test_a_model_without_linear_layers_is_a_noop_with_a_message():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.LayerNorm(4))
    with pytest.warns(fast.FastPathWarning, match="Sequential has no torch.nn.Linear"):
        assert fast.prepare(model) is model


def test_old_torch_is_refused(monkeypatch):
    model = build("llama", 64, 1, seed=0)
    monkeypatch.setattr(packed, "TORCH_VERSION", "2.1.2+cpu")
    ok, reason = fast.available(model)
    assert not ok and "torch 2.1.2+cpu is older than 2.2" in reason
    with pytest.warns(fast.FastPathWarning, match="older than"):
        assert fast.prepare(model) is model
    with pytest.raises(RuntimeError, match="not available"):
        lesson_tools.matmul_bandwidth(64, 64, fast=True)
    with pytest.raises(ValueError, match="choose one kernel"):
        lesson_tools.matmul_bandwidth(64, 64, fast=True, bf16_weights=True)


def test_a_missing_private_op_is_refused(monkeypatch):
    monkeypatch.setattr(packed, "REQUIRED_OPS", (*packed.REQUIRED_OPS, "_op_that_moved"))
    ok, reason = fast.available()
    assert not ok and "torch.ops.mkldnn._op_that_moved" in reason


def test_a_kernel_that_disagrees_with_eager_falls_back(monkeypatch):
    """Simulates a private op whose weight layout changed: packing the transposed matrix."""
    model = build("llama", 64, 1, seed=0)
    monkeypatch.setattr(fast.PackedLinear, "matrix", lambda self: self.weight.detach().t())
    with pytest.warns(fast.FastPathWarning, match="the packed kernel (disagrees with the eager linear|failed)"):
        assert fast.prepare(model) is model
    assert not fast.is_fast(model)
    square = torch.nn.Linear(64, 64)
    assert "disagrees with the eager linear (64x64" in fast.check_layer(square, fast.PackedLinear.from_layer(square))


def test_check_layer_passes_a_correct_kernel():
    layer = torch.nn.Linear(96, 40)
    assert fast.check_layer(layer, fast.PackedLinear.from_layer(layer)) is None


def test_the_step_profile_counts_the_fast_kernels_as_weight_matmuls(zoo_models):
    target = zoo_models["target"]
    for model in (target, fast.prepare(target)):
        profile = lesson_tools.profile_step(model, context=32, repeats=2)
        assert profile["weight matmuls"] > 0 and profile["attention"] > 0
        assert sum(profile[p] for p in lesson_tools.STEP_PARTS) == pytest.approx(profile["total"])


def test_the_step_profile_knows_every_course_kernel():
    """Each of the course's operators is counted as what it is (a weight matmul or attention), not
    as one of the "other ops"."""
    from specdec_ref.kernels import attention, bf16, eagle_chain, gguf, llama_pass

    for kernel in (attention, bf16, gguf, llama_pass, eagle_chain):
        assert kernel.available()[0]
    names = {name for name in torch._C._dispatch_get_all_op_names() if name.startswith("specdec::")}
    assert names >= {"specdec::few_query_attention", "specdec::gguf_weights_linear", "specdec::bf16_weights_linear"}
    assert names <= lesson_tools.LINEAR_OPS | lesson_tools.ATTENTION_OPS | lesson_tools.ONE_CALL_OPS


@pytest.mark.parametrize("use_fast, halve, bytes_per_weight", [(False, False, 4), (True, False, 4), (False, True, 2)])
def test_matmul_bandwidth_reports_weight_bytes_over_time(use_fast, halve, bytes_per_weight):
    result = lesson_tools.matmul_bandwidth(256, 512, fast=use_fast, repeats=2, bf16_weights=halve)
    assert result["weight_bytes"] == 256 * 512 * bytes_per_weight
    assert result["bytes_per_second"] == pytest.approx(result["weight_bytes"] / result["seconds"])
    assert result["copies"] * result["weight_bytes"] >= 2 * (last_level_cache_bytes() or 32 * 2**20)


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory, tokenizer_a):
    root = tmp_path_factory.mktemp("fast-models")
    target = build("llama", 64, 2, seed=0)
    for name, model in (("target", target), ("draft", noisy_copy(target, 0.05, seed=1))):
        model.save_pretrained(root / name)
        tokenizer_a.save_pretrained(root / name)
    return str(root / "target"), str(root / "draft")


def test_run_fast_reports_both_versions(saved_pair):
    pair = bench.load_pair(*saved_pair)
    summary = bench.run_fast(pair, ["def f(x):\n    ", "class A:\n"], ks=[1, 3], max_new_tokens=12, progress=False)
    assert summary.threads == torch.get_num_threads() and summary.dram_bandwidth > 0
    assert summary.baseline.k is None and [c.k for c in summary.configs] == [1, 3]
    for row in [summary.baseline, *summary.configs]:
        for figures in (row.eager, row.fast):
            assert figures.identical_prompts == 2
            assert figures.tokens_per_second > 0 and 0 < figures.bandwidth_share
            assert figures.bandwidth_share == pytest.approx(figures.bandwidth_achieved / summary.dram_bandwidth)
    assert summary.baseline.eager.speedup_over_eager == 1.0
    assert summary.best.k in (1, 3)
    assert json.loads(json.dumps(summary.to_json()))["best_k"] == summary.best.k
    given = bench.run_fast(pair, ["x = 1\n"], ks=[1], max_new_tokens=4, progress=False, bandwidth=12.5e9)
    assert given.dram_bandwidth == 12.5e9  # the caller's figure, not a second measurement


def test_run_fast_refuses_a_model_it_does_not_apply_to(saved_pair):
    pair = bench.load_pair(*saved_pair, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="the fast path does not apply: .*bfloat16"):
        bench.run_fast(pair, ["x = 1\n"], ks=[2], max_new_tokens=4, progress=False)


def test_bench_fast_cli(saved_pair, tmp_path):
    target, draft = saved_pair
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--fast", "--target", target, "--draft", draft, "--k", "2",
         "--prompts", "2", "--max-new-tokens", "8", "--json", str(tmp_path / "fast.json")],
        capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr
    for line in ("threads ", "DRAM triad", "eager tok/s", "fast tok/s", "baseline", "speculative k=2",
                 "eager 2/2, fast 2/2", "best k for the fast path = 2", "at baseline); fast.prepare(model, "
                 "only_if_faster=True)"):
        assert line in result.stdout, line
    summary = json.loads((tmp_path / "fast.json").read_text())
    assert summary["baseline"]["fast"]["identical_prompts"] == 2 and summary["target"] == target


def test_bench_fast_compile_cli(saved_pair, tmp_path):
    target, draft = saved_pair
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--fast", "--compile", "--target", target, "--draft", draft,
         "--k", "3", "--prompts", "2", "--max-new-tokens", "8", "--json", str(tmp_path / "compiled.json")],
        capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=900)
    assert result.returncode == 0, result.stderr
    for line in ("compiling with torch.compile", "fast path: torch.compile; warm-up", "(compilation included)",
                 "eager 2/2, fast 2/2", "best k for the fast path = 3"):
        assert line in result.stdout, line
    summary = json.loads((tmp_path / "compiled.json").read_text())
    assert summary["fast_path"] == "torch.compile" and summary["warmup_seconds"]["fast"] > 0
    assert summary["configs"][0]["fast"]["identical_prompts"] == 2


def test_bench_compile_needs_fast(saved_pair):
    target, draft = saved_pair
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--compile", "--target", target, "--draft", draft],
        capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode != 0 and "--compile chooses the --fast path's kind" in result.stderr


def test_bench_fast_cli_rejects_a_plot(saved_pair):
    target, draft = saved_pair
    result = subprocess.run(
        [sys.executable, "-m", "specdec_ref", "bench", "--fast", "--target", target, "--draft", draft,
         "--plot", "x.png"], capture_output=True, text=True, env=os.environ | {"HF_HUB_OFFLINE": "1"}, timeout=600)
    assert result.returncode != 0 and "--fast compares eager and fast" in result.stderr
