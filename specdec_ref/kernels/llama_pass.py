"""A Llama model's decode step or verification pass as one C++ call (``llama_pass.cpp``).

Layer by layer, each operation of a fast-path decode step is a call from Python: several hundred for
SmolLM2's 30 layers, most a few microseconds of work inside tens of microseconds of Python and dispatch,
so three quarters of a step (SmolLM2 on a 2-core Ice Lake Xeon: 21-24 ms, of which the GGUF-code kernels
about 6) is not reading weights.
:class:`PassForward` gives a model whose linear layers are all GGUF-coded (``zoo:smollm2`` from
:func:`specdec_ref.kernels.fast.prepare`) a forward that runs a pass of 1 to
:data:`~specdec_ref.kernels.gguf.MAX_ROWS` tokens on its preallocated cache in one operator call:
the same kernels, the same per-row arithmetic (each position's logits what a one-token step gives),
the small operations (RMSNorm, the rotary embedding, SiLU, residual adds) as loops in C++. A short
prompt is read in such passes; a long one, or any call it does not take, runs the model's own forward.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..kv_cache import PreallocatedLayer
from . import attention, gguf
from .build import build_operator

SOURCE = Path(__file__).with_name("llama_pass.cpp")
# A prompt of up to this many tokens is read in passes of MAX_ROWS: on SmolLM2 (2-core Xeon) 20 tokens
# took 50 ms that way and 162 ms on the fp32 weights, 48 tokens 76 and 183; they broke even near 100.
PREFILL_TOKENS = 64


def _output_shape(ids: torch.Tensor, embedding: torch.Tensor, cos, sin, mask, keys,
                  *rest) -> tuple[torch.Tensor, torch.Tensor]:
    keep_inputs = rest[-1]
    return (embedding.new_empty(ids.shape[0], embedding.shape[1]),
            embedding.new_empty(len(keys) if keep_inputs else 0, ids.shape[0], embedding.shape[1]))


@cache
def available() -> tuple[bool, str]:
    """Whether the operator can run here (building it on first use): ``(ok, reason)``. It calls
    the GGUF-code and attention operators, so it needs both."""
    for kernel in (gguf, attention):
        ok, reason = kernel.available()
        if not ok:
            return False, reason
    return build_operator(SOURCE, ("llama_layers",), "Llama pass operator", _output_shape)


def _layer_parts(model: torch.nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int]] | None:
    """Each decoder layer's RMSNorm weights (then the final norm's), packed codes and code widths,
    or None where the model is not a Llama whose every projection the operator can read: q, k and v
    (gate and up) stacked into one GGUF-coded call, o and down GGUF-coded, no biases, RMSNorms, SiLU,
    a rotary embedding fixed per position."""
    from transformers.models.llama.modeling_llama import LlamaForCausalLM, LlamaRMSNorm

    if type(model) is not LlamaForCausalLM:
        return None
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    # A rotary embedding that changes with the sequence's length cannot come from a table of positions.
    if (config.hidden_act != "silu" or getattr(config, "head_dim", head_dim) != head_dim
            or getattr(model.model.rotary_emb, "rope_type", "default") in ("dynamic", "longrope")):
        return None
    norms, codes, bits = [], [], []
    for layer in model.model.layers:
        attention_module, mlp = layer.self_attn, layer.mlp
        parts = [getattr(attention_module, "qkv_proj", None), attention_module.o_proj,
                 getattr(mlp, "gate_up_proj", None), mlp.down_proj]
        if not (isinstance(parts[0], gguf.StackedCodes) and isinstance(parts[2], gguf.StackedCodes)
                and all(isinstance(part, gguf.GgufWeightLinear) and part.bias is None for part in parts[1::2])
                and type(layer.input_layernorm) is LlamaRMSNorm and type(layer.post_attention_layernorm) is LlamaRMSNorm):
            return None
        norms += [layer.input_layernorm.weight.detach(), layer.post_attention_layernorm.weight.detach()]
        codes += [part.packed for part in parts]
        bits += [part.bits for part in parts]
    if type(model.model.norm) is not LlamaRMSNorm:
        return None
    return norms + [model.model.norm.weight.detach()], codes, bits


def applies(model: torch.nn.Module) -> bool:
    """Whether :class:`PassForward` can run ``model``'s passes (the operator builds here too)."""
    return _layer_parts(model) is not None and available()[0]


def runs(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward is a :class:`PassForward`."""
    return isinstance(getattr(model, "forward", None), PassForward)


class PassForward:
    """A model's forward whose decode steps and verification passes are one operator call.

    It takes a call of 1 to :data:`~specdec_ref.kernels.gguf.MAX_ROWS` tokens of one sequence on a
    cache of :class:`~specdec_ref.kv_cache.PreallocatedLayer` s, with no mask or a 4-d one (a tree's)
    and optional ``position_ids``, and a prompt of up to :data:`PREFILL_TOKENS` in passes of
    ``MAX_ROWS`` (so each of its positions too gets what a one-token step gives); anything else (a
    longer prompt, ``inputs_embeds``, a plain ``DynamicCache``) goes to the model's own ``forward``.
    ``hidden_states`` (when asked for) are the model's own: each layer's input, then the last layer's
    output after the final norm (what drafters read: ``hidden_states[-1]``, and a multi-layer head
    lower ones too).
    """

    TAKES = {"past_key_values", "use_cache", "logits_to_keep", "output_hidden_states", "attention_mask",
             "position_ids"}

    def __init__(self, model: torch.nn.Module, forward) -> None:
        parts = _layer_parts(model)
        if parts is None:
            raise ValueError("PassForward needs a Llama whose projections are all GGUF-coded and stacked "
                             "(specdec_ref.kernels.fast.prepare on zoo:smollm2)")
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"the Llama pass operator is not available: {reason}")
        self.forward = forward
        self.norms, self.codes, self.bits = parts
        config = model.config
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.intermediate, self.eps = config.intermediate_size, config.rms_norm_eps
        self.embedding, self.lm_head, self.rotary = model.model.embed_tokens.weight.detach(), model.lm_head, model.model.rotary_emb
        self.cos = self.sin = torch.empty(0)

    def _rotary(self, start: int, tokens: int, positions: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions`` ([T]; None: ``start`` onwards), from a table of every position so
        far: the model's own rotary embedding computes each position's values alone, so a table row is
        what it gives."""
        needed = start + tokens if positions is None else int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            table = torch.arange(max(needed, 2 * self.cos.shape[0], 256))[None]
            cos, sin = self.rotary(self.embedding[:1], table)
            half = cos.shape[-1] // 2  # Llama's tables repeat their first half
            self.cos, self.sin = cos[0, :, :half].contiguous(), sin[0, :, :half].contiguous()
        if positions is None:
            return self.cos[start:start + tokens], self.sin[start:start + tokens]
        return self.cos[positions], self.sin[positions]

    def _takes(self, input_ids, args, kwargs) -> bool:
        cache = kwargs.get("past_key_values")
        mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")
        # Longer than a pass: a prompt in chunks, in causal order (no mask, no positions given).
        longest = gguf.MAX_ROWS if mask is not None or positions is not None else PREFILL_TOKENS
        return (not args and input_ids is not None and input_ids.dim() == 2 and input_ids.shape[0] == 1
                and 1 <= input_ids.shape[1] <= longest and kwargs.keys() <= self.TAKES
                and cache is not None and all(type(layer) is PreallocatedLayer for layer in getattr(cache, "layers", [None]))
                and (mask is None or mask.dim() == 4) and isinstance(kwargs.get("logits_to_keep", 0), int)
                and kwargs.get("use_cache") is not False)

    def __call__(self, input_ids: torch.LongTensor | None = None, *args, **kwargs):
        if not self._takes(input_ids, args, kwargs):
            return self.forward(input_ids, *args, **kwargs)
        cache, tokens = kwargs["past_key_values"], input_ids.shape[1]
        # Not inference mode: a cache made here may be written by the layer-by-layer forward later.
        with torch.no_grad():
            start = cache.get_seq_length()
            positions = kwargs.get("position_ids")
            for layer in cache.layers:
                if not layer.is_initialized:
                    empty = self.embedding.new_empty(1, self.kv_heads, 0, self.embedding.shape[1] // self.heads)
                    layer.lazy_initialization(empty, empty)
                layer.reserve(start + tokens)
            keys, values = [layer.key_buffer for layer in cache.layers], [layer.value_buffer for layer in cache.layers]
            ids = input_ids[0].contiguous()
            keep_inputs = bool(kwargs.get("output_hidden_states"))
            normed, inputs = [], []
            for first in range(0, tokens, gguf.MAX_ROWS):
                size = min(gguf.MAX_ROWS, tokens - first)
                cos, sin = self._rotary(start + first, size, None if positions is None else positions.view(-1))
                last, layer_inputs = torch.ops.specdec.llama_layers(
                    ids[first:first + size], self.embedding, cos, sin, kwargs.get("attention_mask"), keys, values,
                    start + first, self.norms, self.codes, self.bits, self.heads, self.kv_heads, self.intermediate,
                    self.eps, keep_inputs)
                normed.append(last)
                inputs.append(layer_inputs)
            normed = normed[0] if len(normed) == 1 else torch.cat(normed)
            for layer in cache.layers:
                layer.length = start + tokens
            keep = kwargs.get("logits_to_keep", 0) or tokens
            logits = self.lm_head(normed[tokens - keep:])
        hidden_states = None
        if keep_inputs:
            inputs = inputs[0] if len(inputs) == 1 else torch.cat(inputs, 1)
            hidden_states = (*inputs[:, None], normed[None])
        return CausalLMOutputWithPast(logits=logits[None], past_key_values=cache, hidden_states=hidden_states)
