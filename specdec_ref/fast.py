"""An opt-in fast CPU path: the same model reading a fifth or half the weight bytes, on prepacked weights, or compiled.

Decoding one token at batch 1 reads every weight once, so its speed limit is weight bytes /
memory bandwidth (``specdec_ref.roofline``). PyTorch's default fp32 CPU kernel for a
one-row matmul can stream the weight well below that limit. oneDNN, the CPU library PyTorch
ships, can reorder a weight once into the blocked layout its kernel reads ("prepacking",
what ``torch.compile``'s freezing pass does for CPU linears), so that later calls need
no reordering. Whether that streams faster depends on the CPU, the thread count and what
else runs: ``python -m specdec_ref bench --fast`` measures it, eager and fast interleaved,
and :func:`matmul_bandwidth` measures one kernel. Nothing else changes: same weights,
same fp32 arithmetic (summed in another order), same loops.

Where a model's fp32 weights hold bfloat16 values (the course zoo stores bfloat16 and the
loader upcasts), half of every weight's bytes are zeros that a decode step still streams.
:mod:`specdec_ref.bf16_weights` keeps such layers as bfloat16 and widens each weight in
registers: the same numbers and fp32 arithmetic, half the bytes, so half the roofline bound.
:func:`prepare` uses it for every layer it can (``bf16_weights=True``, the default) and
prepacks the rest; :func:`streamed_weight_bytes` counts what a step then reads.

Where a model was de-quantised from a GGUF file (``zoo:smollm2``: Q4_1 linear layers, a Q8_0
LM head), its fp32 weights hold 5 or 9 bits of information each. :mod:`specdec_ref.gguf_weights`
recovers the codes, keeps a layer only where they rebuild every weight bit for bit, and decodes
them in registers: the same fp32 weights and arithmetic from about a fifth of the bytes
(``gguf_weights=True``, the default; tried before bf16).

A fast model's verification passes also read grouped-query attention heads in place
(:func:`gqa_sdpa_attention`): ``transformers`` copies every cached key and value once per query
head that shares it whenever SDPA gets a mask, as it does for several tokens on a cache.

A fast model's loops also get preallocated KV caches (:func:`kv_cache_capacity` positions,
:class:`~specdec_ref.kv_cache.PreallocatedLayer`): a ``DynamicCache`` copies the whole cache
at every step to append one token, these write only the new positions, and a rollback
costs nothing.

The same switch can compile as well (``prepare(model, compile=True)``): ``torch.compile``
fuses the small operators around the matmuls and removes most of the Python glue, the
fixed cost that :func:`profile_decode_step` shows is a large share of a small model's step.
A compiled draft model also drafts its k greedy tokens as one graph, argmax included, instead
of k calls of a one-step graph (one more graph to compile per k).

The eager model stays the default and the one the lessons step through; this module is
the switch, and the measuring tools lesson 2 uses to show why it helps:

- :func:`available` ``(model=None) -> (bool, reason)``: whether the fast path applies here.
- :func:`prepare` ``(model, only_if_faster=False, compile=False, bf16_weights=True, gguf_weights=True) -> model``:
  a copy that shares the weights, every ``nn.Linear`` (and GPT-2 ``Conv1D``) replaced by a
  :class:`~specdec_ref.gguf_weights.GgufWeightLinear` where its weights are a GGUF block code,
  a :class:`~specdec_ref.bf16_weights.Bf16WeightLinear` where they are bf16-exact, else
  by a :class:`PackedLinear`; each replaced layer is checked against the eager one first. Where the path does not apply
  (GPU, another dtype, no linear layers, an untested torch whose private ops moved), or with
  ``only_if_faster`` where a timed decode step is not faster packed, it warns once, in one
  line, and returns the model unchanged.
- :func:`decode_step_speedup` ``(model, fast_model) -> float``: eager / fast seconds of one
  decode step, median of paired runs.
- ``prepare(model, compile=True)``: bf16-stored layers where they apply, the rest on the default
  kernel, and the forward compiled by ``torch.compile`` (dynamic shapes);
  :func:`compile_available` says whether it can be here, :func:`is_compiled` whether a model was.
- :func:`gqa_sdpa_attention`: the attention a fast ``transformers`` model with SDPA runs (set by
  :func:`prepare`; not with ``compile=True``): grouped-query heads read in place under a mask.
- :func:`fast_layers` ``(module) -> module``: the same swap for any module (an EAGLE head and
  its LM head rows, when they draft for a fast target).
- :func:`is_fast` ``(model) -> bool``: whether a model runs on packed, coded or bf16-stored weights;
  :func:`path_name` ``(model) -> str`` says which, for reports.
- :func:`streamed_weight_bytes` ``(model) -> float``: the weight bytes one decode step reads.
- :func:`kv_cache_capacity` ``(model) -> int``: the positions a fast model's caches preallocate.
- :func:`profile_decode_step` ``(model, context=128, repeats=5) -> dict``: where one
  decode step's time goes (linear layers, attention, other ops, outside any op).
- :func:`matmul_bandwidth` ``(out_features, in_features, fast=False, tokens=1, bf16_weights=False) -> dict``:
  the weight bandwidth one linear kernel achieves, streaming from DRAM like a decode step.

Exactness: fp32 sums in another order round differently in the last bits, so logits are
not bit-identical to the eager model's. Greedy tokens are identical unless two logits
tie to within that rounding; ``tests/test_fast.py`` and ``bench --fast`` check and count.
"""
from __future__ import annotations

import contextlib
import copy
import math
import os
import shutil
import statistics
import sys
import time
import warnings
from itertools import chain

import torch

from . import bf16_weights as bf16
from . import gguf_weights as gguf
from .drafters import GREEDY_DRAFTS
from .kv_cache import CAPACITY_ATTRIBUTE, PreallocatedLayer, new_cache, reserve, rollback
from .roofline import last_level_cache_bytes, weight_bytes
from .timing import time_paired

# The private oneDNN ops this path calls; checked by name before use.
REQUIRED_OPS = ("_reorder_linear_weight", "_linear_pointwise")
# Oldest torch with both ops and their current signatures that this path was checked on.
MIN_TORCH = (2, 2)
TORCH_VERSION = torch.__version__

# Top-level profiler op names that are a weight matmul (eager nn.Linear, GPT-2 Conv1D, packed).
LINEAR_OPS = frozenset({"aten::linear", "aten::addmm", "mkldnn::_linear_pointwise", "specdec::bf16_weights_linear",
                        "specdec::gguf_weights_linear"})


class FastPathWarning(UserWarning):
    """The fast path does not apply; the eager model is used instead."""


def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _linear_layers(model: torch.nn.Module):
    """(parent, attribute name, layer) for every nn.Linear and GPT-2 Conv1D in ``model``."""
    from transformers.pytorch_utils import Conv1D

    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, (torch.nn.Linear, Conv1D)):
                yield parent, name, child


def available(model: torch.nn.Module | None = None) -> tuple[bool, str]:
    """Whether :func:`prepare` can speed up ``model`` here (or, without a model, this torch).

    Returns ``(ok, reason)``: the reason is one line saying why not, or what will be packed.
    """
    version = _version_tuple(TORCH_VERSION)
    if version < MIN_TORCH:
        return False, (f"torch {TORCH_VERSION} is older than {'.'.join(map(str, MIN_TORCH))}, "
                       "the oldest this path was checked on")
    for name in REQUIRED_OPS:
        try:
            getattr(torch.ops.mkldnn, name)
        except (AttributeError, RuntimeError):
            return False, f"torch {TORCH_VERSION} has no torch.ops.mkldnn.{name} (private ops move between releases)"
    if not torch.backends.mkldnn.is_available():
        return False, f"this torch build ({TORCH_VERSION}) has no oneDNN (mkldnn) backend"
    if model is None:
        return True, f"torch {TORCH_VERSION} has the oneDNN ops"
    layers = [layer for _, _, layer in _linear_layers(model)]
    if not layers:
        return False, f"{type(model).__name__} has no torch.nn.Linear (or Conv1D) layers to pack"
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        return False, f"the model is on {', '.join(sorted(devices))}; the oneDNN path is for CPU weights only"
    dtypes = {layer.weight.dtype for layer in layers}
    if dtypes != {torch.float32}:
        names = ", ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))
        return False, (f"the linear weights are {names}; the fast path packs float32 only (reduced-precision "
                       "kernels round differently and change greedy output)")
    return True, (f"its {len(layers)} linear layers can go on the fast kernels (GGUF codes, bf16 copies or "
                  "prepacked oneDNN weights; path_name of the prepared model says which)")


class PackedLinear(torch.nn.Module):
    """A linear layer computed by oneDNN on a prepacked copy of its weight (inference only).

    ``weight`` and ``bias`` stay the original parameters (shared, not copied), so parameter
    counts, ``state_dict``, tied embeddings and ``roofline.weight_bytes`` see the model as it
    was. The packed copy is an opaque oneDNN tensor held as a plain attribute: it is what
    the kernel reads, and it cannot be moved to another device or deep-copied.
    """

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None, transposed: bool = False) -> None:
        super().__init__()
        self.weight, self.bias, self.transposed = weight, bias, transposed
        matrix = self.matrix()
        self.out_features, self.in_features = matrix.shape
        # The batch-size hint picks the layout for one-token decode steps.
        self.packed_weight = torch.ops.mkldnn._reorder_linear_weight(matrix.contiguous(), 1)

    def matrix(self) -> torch.Tensor:
        """The weight as [out_features, in_features] (GPT-2's Conv1D stores it as [in, out])."""
        return self.weight.detach().t() if self.transposed else self.weight.detach()

    @classmethod
    def from_layer(cls, layer: torch.nn.Module) -> PackedLinear:
        """Pack an ``nn.Linear`` or a GPT-2 ``Conv1D``."""
        return cls(layer.weight, layer.bias, transposed=not isinstance(layer, torch.nn.Linear))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@torch.no_grad()
def check_layer(layer: torch.nn.Module, packed: torch.nn.Module, tokens: int = 3, seed: int = 0) -> str | None:
    """Compare a replacement layer (packed or bf16-stored) with the eager one on random inputs
    of 1 and ``tokens`` rows.

    The tolerance is the worst-case rounding of a K-term fp32 dot product in any summation
    order (K * eps * sum |x_i w_i|): a correct kernel always passes, a kernel reading a wrong
    layout fails by orders of magnitude. Returns None, or what went wrong.
    """
    generator = torch.Generator().manual_seed(seed)
    eps = torch.finfo(torch.float32).eps
    # The eager layer's own [out, in] matrix: nn.Linear stores it so, GPT-2's Conv1D transposed.
    matrix = layer.weight.detach() if isinstance(layer, torch.nn.Linear) else layer.weight.detach().t()
    out_features, in_features = matrix.shape
    for rows in (1, tokens):
        x = torch.randn(1, rows, in_features, generator=generator)
        want = layer(x)
        try:
            got = packed(x)
        except RuntimeError as error:  # e.g. a signature or a layout that changed
            return f"the packed kernel failed on a {out_features}x{in_features} layer: {str(error).splitlines()[0]}"
        bound = in_features * eps * (x.abs() @ matrix.abs().t() + (0 if layer.bias is None else layer.bias.abs()))
        if got.shape != want.shape or not bool(((got - want).abs() <= bound).all()):
            return (f"the packed kernel disagrees with the eager linear ({out_features}x{in_features}, "
                    f"{rows} row(s)) beyond fp32 rounding")
    return None


GQA_ATTENTION = "specdec_gqa_sdpa"


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``transformers``' SDPA attention, with grouped-query heads read in place under a mask too.

    For a pass of several tokens on top of a KV cache (a verification) ``transformers`` gives SDPA
    a mask, and then, to keep GPU kernels fast, repeats every cached key and value once per query
    head sharing it (3x for SmolLM2): a copy of the whole cache per layer per pass. PyTorch's CPU
    kernel reads grouped heads under a mask as they are (``enable_gqa``); the result is the same,
    bit for bit. A one-token step and a prefill, which have no mask, run as they did.
    """
    causal = query.shape[2] > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _read_grouped_heads_in_place(model: torch.nn.Module) -> None:
    """Switch a ``transformers`` model that uses SDPA to :func:`gqa_sdpa_attention` (its own config)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    config._attn_implementation_internal = GQA_ATTENTION


def _copy_sharing_weights(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of the module tree whose parameters and buffers are the original tensors."""
    memo = {id(t): t for t in chain(model.parameters(), model.buffers())}
    return copy.deepcopy(model, memo)


FAST_LAYERS = (PackedLinear, bf16.Bf16WeightLinear, gguf.GgufWeightLinear)


def is_fast(model: torch.nn.Module) -> bool:
    """Whether ``model`` has layers on packed, GGUF-coded or bf16-stored weights (i.e. came from :func:`prepare`)."""
    return any(isinstance(m, FAST_LAYERS) for m in model.modules())


def path_name(model: torch.nn.Module) -> str:
    """What a model from :func:`prepare` runs on, in a few words, for reports."""
    layers = [m for m in model.modules() if isinstance(m, (*FAST_LAYERS, torch.nn.Linear))]
    coded = [m for m in layers if isinstance(m, gguf.GgufWeightLinear)]
    halved = sum(isinstance(m, bf16.Bf16WeightLinear) for m in layers)
    packed = sum(isinstance(m, PackedLinear) for m in layers)
    parts = []
    for bits, name in gguf.CODES.items():
        count = sum(m.bits == bits for m in coded)
        parts += [f"{name}-coded weights ({count} of {len(layers)} linear layers)"] if count else []
    parts += [f"bf16-stored weights ({halved} of {len(layers)} linear layers)"] if halved else []
    parts += ["prepacked oneDNN weights" + (f" ({packed} of {len(layers)})" if halved or coded else "")] if packed else []
    parts += ["torch.compile"] if is_compiled(model) else []
    from .weights_first import is_weights_first  # that module builds on this one

    eager = "the eager model" + (", few-row linear layers weights-first" if is_weights_first(model) else "")
    return " + ".join(parts) or eager


def streamed_weight_bytes(model: torch.nn.Module) -> float:
    """Weight bytes one decode step reads: ``roofline.weight_bytes(model)``, with each
    bf16-stored layer's half-size copy, and each GGUF-coded layer's codes and scales, in place
    of its fp32 weight."""
    total = weight_bytes(model)
    for layer in model.modules():
        if isinstance(layer, (bf16.Bf16WeightLinear, gguf.GgufWeightLinear)):
            total -= layer.weight.numel() * layer.weight.element_size()
            total += layer.packed.numel() * layer.packed.element_size()
    return total


@torch.inference_mode()
def decode_step_speedup(model: torch.nn.Module, fast_model: torch.nn.Module, context: int = 32,
                        pairs: int = 9, seed: int = 0) -> float:
    """How much faster ``fast_model`` runs one decode step than ``model``: the median of
    ``pairs`` paired ratios (eager seconds / fast seconds, alternating which goes first, after
    a warm-up pair), each step one token on a ``context``-token cache, rolled back after."""
    steps = [decode_step(version, context, seed) for version in (model, fast_model)]
    return time_paired(*steps, warmup=1, repeats=pairs)["median_ratio"]


def decode_step(model: torch.nn.Module, context: int, seed: int = 0, batch: int = 1):
    """A function that decodes one (seeded random) token per sequence on a ``context``-token
    cache of ``batch`` sequences and rolls the cache back, so that every call does the same work."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, context + 1), generator=generator).to(model.device)
    cache = new_cache(model)
    model(ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)

    def step() -> None:
        model(ids[:, context:], past_key_values=cache, use_cache=True, logits_to_keep=1)
        rollback(cache, context)
    return step


def compile_available(model: torch.nn.Module | None = None) -> tuple[bool, str]:
    """Whether :func:`prepare` ``(model, compile=True)`` can compile here: ``(ok, reason)``.

    torch.compile's CPU backend (inductor) writes C++ and builds it with the system's compiler.
    """
    if model is not None:
        devices = {p.device.type for p in model.parameters()}
        if devices != {"cpu"}:
            return False, f"the model is on {', '.join(sorted(devices))}; this switch compiles for CPU only"
        dtypes = {p.dtype for p in model.parameters()}
        if dtypes != {torch.float32}:
            return False, "the model is not float32; the fast path keeps float32 arithmetic"
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not compiler:
        return False, "no C++ compiler (g++, c++ or clang++) on PATH: torch.compile's CPU backend needs one"
    return True, f"torch.compile (inductor) can build with {compiler}"


# Compiled graphs are cached per Python function, and every Llama's forward is the same
# function: a target, its draft and their pass kinds (prefill, one token, k + 1 tokens) need
# more entries than torch's default of 8, past which it silently runs the rest uncompiled.
RECOMPILE_LIMIT = 64


class _CompiledForward:
    """A model's forward compiled by torch.compile, fed inputs in one canonical form.

    Each compiled graph is guarded by its inputs' properties; three that the loops vary
    without meaning anything would recompile again and again: whether a tensor was made
    under inference mode, the strides of the ids (a one-token slice of the loop's token
    buffer keeps the buffer's row stride), and the strides of cache tensors that a rollback
    left as views of longer ones. Cloning the ids under inference mode to contiguous strides
    fixes the first two. The caches the loops make for a fast model
    (:class:`~specdec_ref.kv_cache.PreallocatedLayer`) keep their strides; a plain
    ``DynamicCache`` passed in has such tensors made contiguous (a copy only after a rollback).
    Preallocated caches grow before the call, never inside the graph.
    """

    def __init__(self, forward) -> None:
        self.compiled = torch.compile(forward, dynamic=True)

    def __call__(self, input_ids: torch.Tensor | None = None, *args, **kwargs):
        cache = kwargs.get("past_key_values")
        with torch.inference_mode():
            if input_ids is not None:
                input_ids = input_ids.clone(memory_format=torch.contiguous_format)
                reserve(cache, input_ids.shape[-1])
            for layer in getattr(cache, "layers", ()):
                if isinstance(layer, PreallocatedLayer):
                    continue
                for name in ("keys", "values"):
                    tensor = getattr(layer, name, None)
                    if isinstance(tensor, torch.Tensor) and not tensor.is_contiguous():
                        setattr(layer, name, tensor.contiguous())
            return self.compiled(input_ids, *args, **kwargs)


class _CompiledGreedyDrafts:
    """A draft model's k greedy steps as one compiled graph (:data:`~specdec_ref.drafters.GREEDY_DRAFTS`).

    Called one graph at a time, each draft step pays the compiled forward's entry (guards,
    wrappers, the output object) and an eager argmax. One graph for the k steps, the argmax
    inside, pays that once per draft. Its input always has two tokens (the cache is rolled back
    by one, or fed what precedes them), so one graph per k serves every iteration, after a
    full acceptance too; the first step recomputes one cache position, which costs next to
    nothing where the step is bound by weight bytes.
    """

    def __init__(self, forward, compiled_forward: _CompiledForward) -> None:
        self.forward, self.compiled_forward = forward, compiled_forward
        self.compiled = torch.compile(self._steps, dynamic=True)

    def _steps(self, input_ids: torch.LongTensor, cache, num_tokens: int, vocab_size: int | None) -> torch.Tensor:
        drafts = []
        for _ in range(num_tokens):
            logits = self.forward(input_ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1]
            # Cut to the target's width; padding with -inf (a wider target) never changes the argmax.
            input_ids = logits[:vocab_size].argmax().view(1, 1)
            drafts.append(input_ids)
        return torch.cat(drafts).view(-1)

    def __call__(self, cache, tokens: torch.LongTensor, num_tokens: int, vocab_size: int | None) -> tuple[torch.Tensor, int]:
        """Draft ``num_tokens`` greedy tokens after ``tokens`` (1-D, at least two); the cache
        ends one token short, as the loop expects. Returns the drafts and the forward calls made."""
        with torch.inference_mode():
            read, start = cache.get_seq_length(), tokens.numel() - 2
            calls = num_tokens
            if read > start:
                rollback(cache, start)
            elif read < start:  # the prompt at first: feed all but its last two tokens
                self.compiled_forward(tokens[None, read:start], past_key_values=cache, use_cache=True,
                                      logits_to_keep=1)
                calls += 1
            reserve(cache, num_tokens + 1)  # the two tokens fed, then each draft but the last
            return self.compiled(tokens[None, start:].clone(memory_format=torch.contiguous_format), cache, num_tokens, vocab_size), calls


def _compiled(model: torch.nn.Module) -> torch.nn.Module:
    """A copy sharing ``model``'s weights whose forward is compiled by torch.compile.

    Dynamic shapes: one graph serves every cache length and every number of new tokens
    above one (the prefill, the k + 1 tokens of a verification), so a run compiles a few
    graphs once instead of one per length. Greedy drafting with the copy compiles one more
    graph per k (:class:`_CompiledGreedyDrafts`). bf16-stored layers stay one opaque call
    each in the graph. Raises torch's recompile limit to
    :data:`RECOMPILE_LIMIT` (a process-wide setting).
    """
    import torch._dynamo

    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    compiled = _copy_sharing_weights(model)
    forward = compiled.forward
    compiled.forward = _CompiledForward(forward)
    setattr(compiled, GREEDY_DRAFTS, _CompiledGreedyDrafts(forward, compiled.forward))
    compiled._specdec_compiled = True
    return compiled


# Small at first: a compiled graph that writes a cache more than once (the one-graph greedy
# drafts) copies the whole buffer at each later write, so its cost grows with the capacity (a
# 2-layer draft's 4 drafts: 2.7 ms at 1024 positions, 1.9 ms at 128). Doubling keeps the
# capacity within twice the sequence, at one copy of the filled positions per doubling.
INITIAL_PREALLOCATED = 128


def kv_cache_capacity(model: torch.nn.Module) -> int:
    """Positions the caches of a fast model preallocate (:func:`specdec_ref.kv_cache.new_cache`):
    :data:`INITIAL_PREALLOCATED`, or the context length if shorter; a longer sequence doubles them."""
    return min(getattr(model.config, "max_position_embeddings", 0) or INITIAL_PREALLOCATED, INITIAL_PREALLOCATED)


def is_compiled(model: torch.nn.Module) -> bool:
    """Whether ``model`` came from :func:`prepare` ``(..., compile=True)``."""
    return getattr(model, "_specdec_compiled", False)


def _coded_layers(model: torch.nn.Module) -> list:
    """(parent, name, layer, coded layer) for every ``nn.Linear`` whose float32 weight is a GGUF
    block code that :mod:`gguf_weights` can serve here."""
    if not gguf.available()[0]:
        return []
    coded = [(parent, name, layer, gguf.GgufWeightLinear.from_layer(layer))
             for parent, name, layer in _linear_layers(model) if isinstance(layer, torch.nn.Linear)]
    return [entry for entry in coded if entry[3] is not None]


def _bf16_layers(model: torch.nn.Module) -> list:
    """(parent, name, layer, bf16-stored layer) for every ``nn.Linear`` that :mod:`bf16_weights`
    can serve here (bf16-exact float32 weights of a shape its blocking covers)."""
    if not bf16.available()[0]:
        return []
    return [(parent, name, layer, bf16.Bf16WeightLinear(layer.weight, layer.bias))
            for parent, name, layer in _linear_layers(model)
            if isinstance(layer, torch.nn.Linear) and bf16.fits(*layer.weight.shape)
            and bf16.is_bf16_exact(layer.weight)]


def _replace(model: torch.nn.Module, swaps: list) -> str | None:
    """Put each (parent, name, layer, fast layer)'s fast layer in place after :func:`check_layer`;
    a problem stops it."""
    for parent, name, layer, fast_layer in swaps:
        problem = check_layer(layer, fast_layer)
        if problem:
            return problem
        setattr(parent, name, fast_layer)
    return None


def _swap_linear_layers(module: torch.nn.Module, bf16_weights: bool = True, gguf_weights: bool = True,
                        pack: bool = True) -> str | None:
    """Put ``module``'s linear layers on the fast kernels, in place: GGUF-coded, else bf16-stored,
    else (with ``pack``) prepacked. Returns the first problem :func:`check_layer` finds, or None."""
    problem = _replace(module, _coded_layers(module)) if gguf_weights else None
    if not problem and bf16_weights:
        problem = _replace(module, _bf16_layers(module))
    if not problem and pack:
        problem = _replace(module, [(parent, name, layer, PackedLinear.from_layer(layer))
                                    for parent, name, layer in _linear_layers(module)
                                    if not isinstance(layer, FAST_LAYERS)])
    return problem


@torch.no_grad()
def fast_layers(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of any module (a draft head, an LM head) sharing its weights, its linear layers on the
    kernels :func:`prepare` would choose; ``module`` itself, with a one-line
    :class:`FastPathWarning`, where they do not apply. For the parts a drafter adds to a fast target."""
    if isinstance(module, torch.nn.Linear):  # a bare layer: swapped as the only child of a holder
        return fast_layers(torch.nn.Sequential(module))[0]
    ok, reason = available(module)
    problem = None
    if ok:
        fast_module = _copy_sharing_weights(module)
        problem = _swap_linear_layers(fast_module)
        if not problem:
            return fast_module
    warnings.warn(f"specdec_ref.fast: {problem or reason}; using the eager layers", FastPathWarning, stacklevel=2)
    return module


@torch.no_grad()
def prepare(model: torch.nn.Module, only_if_faster: bool = False, compile: bool = False,
            bf16_weights: bool = True, gguf_weights: bool = True) -> torch.nn.Module:
    """The fast version of ``model``: a copy sharing its weights, its linear layers on faster kernels.

    With ``gguf_weights=True`` (the default), every linear layer whose fp32 weight is exactly a
    GGUF Q4_1 or Q8_0 block code (``zoo:smollm2``'s, de-quantised from its GGUF file) reads
    that code (:mod:`specdec_ref.gguf_weights`): the same arithmetic on about a fifth of the
    bytes. With ``bf16_weights=True`` (the default), every other linear layer whose fp32 weight
    holds bfloat16 values (the course zoo's) reads a bfloat16 copy
    (:mod:`specdec_ref.bf16_weights`): the same arithmetic on half the bytes. The other layers
    are prepacked for oneDNN.
    :func:`specdec_ref.kv_cache.new_cache` gives the copy preallocated caches.

    The original model is left as it was (both can be used side by side; each replaced layer
    adds a copy of its weight, half-size for bf16). Every replaced layer is checked against
    the eager one (:func:`check_layer`) before use. Where the path does not apply, a one-line
    :class:`FastPathWarning` says why and ``model`` itself is returned, so callers can use
    the result unconditionally. A model already prepared is returned as it is.

    Whether prepacked kernels are faster depends on the CPU: on one whose default fp32 kernel
    already streams weights well (an Intel Xeon with AMX measured 0.78x), packing slows
    decoding down. ``only_if_faster=True`` times a decode step both ways
    (:func:`decode_step_speedup`, about a second for the course target) and returns ``model``
    itself, with a one-line :class:`FastPathWarning` giving the ratio, unless the fast copy wins.

    ``compile=True`` also compiles the model with ``torch.compile`` (layers that are not
    bf16-stored stay on the default kernel: packed oneDNN tensors are opaque to the
    compiler): operators fused into C++ loops, most of the Python and ``transformers`` glue
    of a decode step gone. The compilation itself runs on the first calls, once per new kind
    of input (prefill, one token, k + 1 tokens): about 45 s for the course pair on 2 cores, a
    few minutes the first time (before torch's on-disk kernel cache is warm), which
    ``bench --fast --compile`` reports. Every fast kernel sums in another order and so rounds
    differently in the last bits: greedy output is identical except at near-ties, which the
    bench counts.
    """
    if is_fast(model) or is_compiled(model):
        return model
    ok, reason = (compile_available if compile else available)(model)
    if not ok:
        warnings.warn(f"specdec_ref.fast: {reason}; using the eager model", FastPathWarning, stacklevel=2)
        return model
    fast_model = _copy_sharing_weights(model)
    problem = _swap_linear_layers(fast_model, bf16_weights, gguf_weights, pack=not compile)
    if problem:
        warnings.warn(f"specdec_ref.fast: {problem} (torch {TORCH_VERSION}); using the eager model",
                      FastPathWarning, stacklevel=2)
        return model
    if compile:
        fast_model = _compiled(fast_model)
    else:
        _read_grouped_heads_in_place(fast_model)
    setattr(fast_model, CAPACITY_ATTRIBUTE, kv_cache_capacity(fast_model))
    if only_if_faster:
        speedup = decode_step_speedup(model, fast_model)
        if speedup <= 1.0:
            warnings.warn(f"specdec_ref.fast: a decode step on {path_name(fast_model)} ran at {speedup:.2f}x the "
                          "eager model's speed on this machine; using the eager model", FastPathWarning, stacklevel=2)
            return model
    return fast_model


# ---- measuring tools for lesson 2 ------------------------------------------------------------

def _classify(name: str) -> str:
    if name in LINEAR_OPS:
        return "linear"
    if "scaled_dot_product" in name:
        return "attention"
    return "other_ops"


@contextlib.contextmanager
def _silenced_stderr():
    """Send file descriptor 2 to /dev/null: the profiler's C++ side logs a line at every start and stop."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


@torch.inference_mode()
def profile_decode_step(model: torch.nn.Module, context: int = 128, repeats: int = 5,
                        seed: int = 0) -> dict[str, float]:
    """Where one decode step's time goes: seconds per step, medians over ``repeats`` steps.

    One token is decoded on top of a ``context``-token KV cache (rolled back after each
    step) under ``torch.profiler``. Each top-level op is counted once, children included:

    - ``linear``: the weight matmuls (``nn.Linear``, GPT-2 ``Conv1D``, or packed ones);
    - ``attention``: PyTorch's fused scaled-dot-product attention (the zoo models use it;
      with ``attn_implementation="eager"`` its matmuls and softmax land in ``other_ops``);
    - ``other_ops``: every other op (norms, rotary embedding, activations, cache updates, ...);
    - ``outside_ops``: wall time in no op at all: Python and ``transformers`` glue;
    - ``total``: the step's wall time under the profiler, which adds a few microseconds per
      op, so compare shares, or ``roofline.measure_forward_seconds`` for the clean time.

    Also ``linear_calls``: weight matmuls per step.
    """
    from torch.profiler import ProfilerActivity, profile

    decode = decode_step(model, context, seed)
    steps = []
    for i in range(repeats + 1):  # the first step is the warm-up
        with _silenced_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            decode()
            total = time.perf_counter() - start
        if not i:
            continue
        step = {"linear": 0.0, "attention": 0.0, "other_ops": 0.0, "linear_calls": 0.0}
        for event in prof.events():
            if event.cpu_parent is None:
                part = _classify(event.name)
                step[part] += event.cpu_time_total / 1e6
                step["linear_calls"] += part == "linear"
        in_ops = step["linear"] + step["attention"] + step["other_ops"]
        step |= {"outside_ops": max(0.0, total - in_ops), "total": total}
        steps.append(step)
    return {key: statistics.median(s[key] for s in steps) for key in steps[0]}


@torch.inference_mode()
def matmul_bandwidth(out_features: int, in_features: int, fast: bool = False, tokens: int = 1,
                     repeats: int = 5, seed: int = 0, bf16_weights: bool = False) -> dict[str, float]:
    """The weight bandwidth one linear kernel achieves on ``tokens`` input rows.

    ``fast=False`` times ``nn.Linear`` (PyTorch's default CPU kernel), ``fast=True`` the
    prepacked oneDNN kernel of :func:`prepare`, ``bf16_weights=True`` the bf16-stored kernel
    (:mod:`specdec_ref.bf16_weights`, on bf16-valued weights; it reads 2 bytes per weight).
    Either raises ``RuntimeError`` where it is not available. Like a decode step, which
    streams weights far larger than the cache, the calls cycle through enough copies of the
    weight to overflow the last-level cache, so the figure is DRAM bandwidth, not cache
    bandwidth.

    Returns ``seconds`` (median per call), ``bytes_per_second`` (weight bytes read / seconds),
    ``weight_bytes`` (as the kernel reads them) and ``copies`` (distinct weights cycled through).
    """
    if fast and bf16_weights:
        raise ValueError("choose one kernel: fast=True (prepacked) or bf16_weights=True")
    ok, reason = bf16.available() if bf16_weights else available() if fast else (True, "")
    if not ok:
        raise RuntimeError(f"the {'bf16-weight kernel' if bf16_weights else 'fast path'} is not available: {reason}")
    weight_bytes = out_features * in_features * (2 if bf16_weights else 4)
    llc = last_level_cache_bytes() or 32 * 2**20
    copies = max(1, math.ceil(2 * llc / weight_bytes))
    generator = torch.Generator().manual_seed(seed)
    layers = []
    for _ in range(copies):
        layer = torch.nn.Linear(in_features, out_features, bias=False)
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator))
        if bf16_weights:
            layer.weight.copy_(layer.weight.to(torch.bfloat16).float())  # bf16 values, like the zoo's
            layer = bf16.Bf16WeightLinear(layer.weight, None)
        elif fast:
            layer = PackedLinear.from_layer(layer)
        layers.append(layer)
    x = torch.randn(1, tokens, in_features, generator=generator)
    rounds = max(1, math.ceil(50 / copies))  # at least ~50 calls per timing
    times = []
    for i in range(repeats + 1):  # the first pass is the warm-up
        start = time.perf_counter()
        for _ in range(rounds):
            for layer in layers:
                layer(x)
        if i:
            times.append((time.perf_counter() - start) / (rounds * copies))
    seconds = statistics.median(times)
    return {"seconds": seconds, "bytes_per_second": weight_bytes / seconds, "weight_bytes": float(weight_bytes),
            "copies": float(copies)}
