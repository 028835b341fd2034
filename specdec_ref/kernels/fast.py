"""The fast CPU path: the same model reading a fifth or half the weight bytes, on prepacked weights, or compiled.

Decoding one token at batch 1 reads every weight once, so its speed limit is weight bytes /
memory bandwidth (:mod:`specdec_ref.roofline`). :func:`prepare` returns a copy of a model (sharing
its weights) whose linear layers read faster forms of the same numbers, each checked against the
eager layer first (:func:`~specdec_ref.kernels.packed.check_layer`):

- GGUF codes (:mod:`specdec_ref.kernels.gguf`), where a model was de-quantised from a GGUF file
  (``zoo:smollm2``: Q4_1 layers, a Q8_0 LM head): the same fp32 weights from about a fifth of the
  bytes, a layer's q, k and v projections (an MLP's gate and up) read in one call;
- bfloat16 copies (:mod:`specdec_ref.kernels.bf16`), where fp32 weights hold bfloat16 values (the
  course zoo's): half the bytes;
- prepacked oneDNN weights (:mod:`specdec_ref.kernels.packed`) for the rest;
- where every projection is GGUF-coded (``zoo:smollm2``), a decode step or verification pass as one
  C++ call over those kernels, never back in Python between layers (:mod:`specdec_ref.kernels.llama_pass`);
- with ``compile=True``, ``torch.compile`` on top (:mod:`specdec_ref.kernels.compiled`) instead.

A fast model's decode steps and verification passes attend with the course's kernel
(:mod:`specdec_ref.kernels.attention`: grouped-query heads read in place, each token computed as
if alone, a few microseconds a layer; :func:`gqa_sdpa_attention`), and its loops get preallocated
KV caches (:func:`kv_cache_capacity` positions, :class:`~specdec_ref.kv_cache.PreallocatedLayer`).
On GGUF-coded weights every row of a pass is computed as if alone, so a verification pass gives
each position the logits a one-token step gives, bit for bit. A drafter's own layers (an EAGLE head)
go on the same kernels through :func:`specdec_ref.modules.like`.

The eager model stays the default the lessons step through; ``python -m specdec_ref bench --fast``
measures the two interleaved. Exactness: fp32 sums in another order round differently in the last
bits, so greedy tokens are identical unless two logits tie to within that rounding;
``tests/test_fast.py`` and ``bench --fast`` check and count.
"""
from __future__ import annotations

import warnings

import torch
from transformers import PretrainedConfig

from ..kv_cache import CAPACITY_ATTRIBUTE
from ..modules import GREEDY_CHAIN, copy_sharing_weights, linear_layers, mark_form
from ..timing import decode_step, time_paired
from . import attention, bf16, eagle_chain, gguf, llama_pass
from .compiled import compile_available, compile_model, is_compiled
from .packed import TORCH_VERSION, PackedLinear, available, check_layer
from .weights_first import is_weights_first


class FastPathWarning(UserWarning):
    """The fast path does not apply; the eager model is used instead."""

GQA_ATTENTION = "specdec_gqa_sdpa"


def gqa_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """``transformers``' SDPA attention, with grouped-query heads read in place under a mask too,
    and the course's attention kernel for passes of a few tokens.

    For a pass of several tokens on top of a KV cache (a verification) ``transformers`` gives SDPA
    a mask, and then, to keep GPU kernels fast, repeats every cached key and value once per query
    head sharing it (3x for SmolLM2): a copy of the whole cache per layer per pass. Here grouped
    heads are read as they are. A decode step or a verification pass (up to
    :data:`~specdec_ref.kernels.attention.MAX_QUERIES` tokens) runs
    :func:`~specdec_ref.kernels.attention.few_query_attention`, which gives each token what a
    one-token step gives; a prefill runs PyTorch's kernel (``enable_gqa``).
    """
    causal = query.shape[2] > 1 and attention_mask is None and (
        is_causal if is_causal is not None else getattr(module, "is_causal", True))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention.loaded and dropout == 0.0 and attention.serves(query, key, attention_mask):
        return attention.few_query_attention(query, key, value, attention_mask, scale, causal), None
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scale, is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _read_grouped_heads_in_place(model: torch.nn.Module) -> None:
    """Switch a ``transformers`` model that uses SDPA to :func:`gqa_sdpa_attention` (its own config)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    attention.available()  # builds the kernel once, outside any compiled graph
    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_attention)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    config._attn_implementation_internal = GQA_ATTENTION


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
    parts += ["a pass of a few tokens in one C++ call"] if llama_pass.runs(model) else []
    eager = "the eager model" + (", few-row linear layers weights-first" if is_weights_first(model) else "")
    return " + ".join(parts) or eager


@torch.inference_mode()
def decode_step_speedup(model: torch.nn.Module, fast_model: torch.nn.Module, context: int = 32,
                        pairs: int = 9, seed: int = 0) -> float:
    """How much faster ``fast_model`` runs one decode step than ``model``: the median of
    ``pairs`` paired ratios (eager seconds / fast seconds, alternating which goes first, after
    a warm-up pair), each step one token on a ``context``-token cache, rolled back after."""
    steps = [decode_step(version, context, seed) for version in (model, fast_model)]
    return time_paired(*steps, warmup=1, repeats=pairs)["median_ratio"]


# Small at first: a compiled graph that writes a cache more than once (the one-graph greedy
# drafts) copies the whole buffer at each later write, so its cost grows with the capacity (a
# 2-layer draft's 4 drafts: 2.7 ms at 1024 positions, 1.9 ms at 128). Doubling keeps the
# capacity within twice the sequence, at one copy of the filled positions per doubling.
INITIAL_PREALLOCATED = 128


def kv_cache_capacity(model: torch.nn.Module) -> int:
    """Positions the caches of a fast model preallocate (:func:`specdec_ref.kv_cache.new_cache`):
    :data:`INITIAL_PREALLOCATED`, or the context length if shorter; a longer sequence doubles them."""
    return min(getattr(model.config, "max_position_embeddings", 0) or INITIAL_PREALLOCATED, INITIAL_PREALLOCATED)


def _coded_layers(model: torch.nn.Module) -> list:
    """(parent, name, layer, coded layer) for every ``nn.Linear`` whose float32 weight is a GGUF
    block code that :mod:`specdec_ref.kernels.gguf` can serve here."""
    if not gguf.available()[0]:
        return []
    coded = [(parent, name, layer, gguf.GgufWeightLinear.from_layer(layer))
             for parent, name, layer in linear_layers(model) if isinstance(layer, torch.nn.Linear)]
    return [entry for entry in coded if entry[3] is not None]


def _bf16_layers(model: torch.nn.Module) -> list:
    """(parent, name, layer, bf16-stored layer) for every ``nn.Linear`` that :mod:`specdec_ref.kernels.bf16`
    can serve here (bf16-exact float32 weights of a shape its blocking covers)."""
    if not bf16.available()[0]:
        return []
    return [(parent, name, layer, bf16.Bf16WeightLinear(layer.weight, layer.bias))
            for parent, name, layer in linear_layers(model)
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
                                    for parent, name, layer in linear_layers(module)
                                    if not isinstance(layer, FAST_LAYERS)])
    return problem


@torch.no_grad()
def fast_layers(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of any module (a draft head, an LM head) sharing its weights, its linear layers on the
    kernels :func:`prepare` would choose; ``module`` itself, with a one-line
    :class:`FastPathWarning`, where they do not apply. For the parts a drafter adds to a fast target."""
    if is_fast(module):
        return module
    if isinstance(module, torch.nn.Linear):  # a bare layer: swapped as the only child of a holder
        return fast_layers(torch.nn.Sequential(module))[0]
    ok, reason = available(module)
    problem = None
    if ok:
        fast_module = copy_sharing_weights(module)
        problem = _swap_linear_layers(fast_module)
        if not problem:
            return fast_module
    warnings.warn(f"specdec_ref.kernels.fast: {problem or reason}; using the eager layers", FastPathWarning, stacklevel=2)
    return module


class _SameForm:
    """What :func:`specdec_ref.modules.like` does for a prepared model: a draft model gets
    :func:`prepare` with the same options; a drafter's own layers (an EAGLE head, its LM head rows)
    the same kernels (:func:`fast_layers`), unless the model kept its eager layers (compiled only)."""

    def __init__(self, compile: bool, bf16_weights: bool, gguf_weights: bool, eager_layers: bool) -> None:
        self.options = dict(compile=compile, bf16_weights=bf16_weights, gguf_weights=gguf_weights)
        self.eager_layers = eager_layers

    def __call__(self, module: torch.nn.Module) -> torch.nn.Module:
        if isinstance(getattr(module, "config", None), PretrainedConfig):
            return prepare(module, **self.options)
        return module if self.eager_layers else fast_layers(module)


@torch.no_grad()
def prepare(model: torch.nn.Module, only_if_faster: bool = False, compile: bool = False,
            bf16_weights: bool = True, gguf_weights: bool = True) -> torch.nn.Module:
    """The fast version of ``model``: a copy sharing its weights, its linear layers on faster kernels.

    With ``gguf_weights=True`` (the default), every linear layer whose fp32 weight is exactly a
    GGUF Q4_1 or Q8_0 block code (``zoo:smollm2``'s, de-quantised from its GGUF file) reads
    that code (:mod:`specdec_ref.kernels.gguf`): the same arithmetic on about a fifth of the
    bytes. With ``bf16_weights=True`` (the default), every other linear layer whose fp32 weight
    holds bfloat16 values (the course zoo's) reads a bfloat16 copy
    (:mod:`specdec_ref.kernels.bf16`): the same arithmetic on half the bytes. The other layers
    are prepacked for oneDNN.
    :func:`specdec_ref.kv_cache.new_cache` gives the copy preallocated caches. A Llama whose
    projections are all GGUF-coded runs each pass of up to 16 tokens on them as one C++ call
    (:class:`~specdec_ref.kernels.llama_pass.PassForward`; not with ``compile=True``).

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
        warnings.warn(f"specdec_ref.kernels.fast: {reason}; using the eager model", FastPathWarning, stacklevel=2)
        return model
    fast_model = copy_sharing_weights(model)
    problem = _swap_linear_layers(fast_model, bf16_weights, gguf_weights, pack=not compile)
    if problem:
        warnings.warn(f"specdec_ref.kernels.fast: {problem} (torch {TORCH_VERSION}); using the eager model",
                      FastPathWarning, stacklevel=2)
        return model
    gguf.stack_projections(fast_model)
    _read_grouped_heads_in_place(fast_model)
    if compile:
        fast_model = compile_model(fast_model)
    else:
        if llama_pass.applies(fast_model):
            fast_model.forward = llama_pass.PassForward(fast_model, fast_model.forward)
        setattr(fast_model, GREEDY_CHAIN, eagle_chain.one_call_chain)
    setattr(fast_model, CAPACITY_ATTRIBUTE, kv_cache_capacity(fast_model))
    mark_form(fast_model, _SameForm(compile, bf16_weights, gguf_weights, eager_layers=not is_fast(fast_model)))
    if only_if_faster:
        speedup = decode_step_speedup(model, fast_model)
        if speedup <= 1.0:
            warnings.warn(f"specdec_ref.kernels.fast: a decode step on {path_name(fast_model)} ran at {speedup:.2f}x the "
                          "eager model's speed on this machine; using the eager model", FastPathWarning, stacklevel=2)
            return model
    return fast_model
