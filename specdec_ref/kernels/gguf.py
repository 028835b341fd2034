"""A fifth of the weight bytes, the same arithmetic: linear layers whose weights are a GGUF block code.

``zoo:smollm2`` comes from a GGUF file: its linear weights are Q4_1 (each 32 weights of a row
stored as 4-bit codes q with a float16 scale d and offset m: w = d * q + m) and its embedding,
tied to the LM head, is Q8_0 (8-bit signed codes, w = d * q). The loader de-quantises them to
float32, so a decode step streams 32 bits per weight that hold 5 (or 9) bits of information.

``d * q`` is exact in float32, so ``fma(d, q, m)`` in a register rebuilds the very float32
weight the de-quantised model holds: a kernel that streams the codes and decodes them computes
the fp32 model's products, summed in another order, from about a fifth of the bytes.
:func:`block_code` recovers a layer's codes from its float32 weight and keeps them only if every
weight is rebuilt bit for bit; ``gguf_weights.cpp`` is the kernel (AVX-512, or AVX2 with FMA,
on torch's threads), built like :mod:`specdec_ref.kernels.bf16`'s into the course cache folder. It serves
passes of up to :data:`MAX_ROWS` tokens (decode steps, verifications), each token's output the
same whatever the pass's length; longer passes (a prefill) use PyTorch's kernel on the fp32
weight, which the layer keeps. :func:`specdec_ref.kernels.fast.prepare` uses it wherever it applies,
and reads the layers that share an input (a Llama layer's q, k and v; its MLP's gate and up) in one
call each (:class:`StackedCodes`, :func:`stack_projections`).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from .build import build_operator

SOURCE = Path(__file__).with_name("gguf_weights.cpp")
ROWS = 4  # weight rows per packed block (ROWS in the C++ source)
GROUP = 32  # weights per code block along a row, as in GGUF's Q4_1 and Q8_0
MAX_ROWS = 16  # longest pass the kernel serves (MAX_ROWS in the C++ source): a tree of 15 drafts
# At 4 bits, byte b of a row's 16 code bytes holds columns NIBBLE_ORDER[b] and NIBBLE_ORDER[b] + 16:
# the order in which the AVX-512 kernel's lanes pick their byte out of one broadcast load.
NIBBLE_ORDER = [4 * (b % 4) + b // 4 for b in range(GROUP // 2)]
CODES = {4: "Q4_1", 8: "Q8_0"}  # code width in bits -> the GGUF type it matches


def _output_shape(x: torch.Tensor, packed: torch.Tensor, out_features: int, bits: int) -> torch.Tensor:
    """What torch.compile traces with: the operator's output, without computing it."""
    return x.new_empty(*x.shape[:-1], out_features)


@cache
def available() -> tuple[bool, str]:
    """Whether the kernel can run here (building it on first use): ``(ok, reason)``, the reason one line."""
    return build_operator(SOURCE, ("gguf_weights_linear",), "GGUF-code kernel", _output_shape)


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1]


def fits(out_features: int, in_features: int) -> bool:
    """Whether the kernel's blocking covers a weight of this shape."""
    return out_features % ROWS == 0 and in_features % GROUP == 0


@dataclass(frozen=True)
class BlockCode:
    """A weight as codes: ``weight[r, 32g + j] == scale[r, g] * codes[r, 32g + j] + offset[r, g]``."""

    bits: int  # 4 (Q4_1: unsigned codes 0-15, with an offset) or 8 (Q8_0: signed codes, offset 0)
    codes: torch.Tensor  # [out, in] int16
    scale: torch.Tensor  # [out, in / 32] float32, float16 values
    offset: torch.Tensor  # [out, in / 32] float32, float16 values


def _rebuilds(groups: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, codes: torch.Tensor) -> bool:
    # scale * code is exact in float32, so adding the offset rounds once, as the kernel's fma does.
    return bool(torch.equal(scale[..., None] * codes + offset[..., None], groups))


@torch.no_grad()
def block_code(weight: torch.Tensor) -> BlockCode | None:
    """The Q4_1 or Q8_0 code of a float32 ``[out, in]`` weight, or None where no code rebuilds
    every weight exactly (a weight that was never quantised, or another format)."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or not fits(*weight.shape):
        return None
    out_features, in_features = weight.shape
    groups = weight.reshape(out_features, in_features // GROUP, GROUP)
    if not bool(torch.isfinite(groups).all()):
        return None
    low, high = groups.amin(-1), groups.amax(-1)
    # Q4_1 quantises a group's minimum to code 0 and its maximum to 15, so they give m and d.
    scale = ((high - low) / 15).half().float()
    codes = torch.where(scale[..., None] > 0, (groups - low[..., None]) / scale[..., None], 0).round().clamp(0, 15)
    if bool(torch.isfinite(scale).all()) and _rebuilds(groups, scale, low, codes):
        return BlockCode(4, codes.short().reshape(weight.shape), scale, low)
    # Q8_0 codes the group's largest magnitude as +-127.
    scale = (groups.abs().amax(-1) / 127).half().float()
    codes = torch.where(scale[..., None] > 0, groups / scale[..., None], 0).round().clamp(-127, 127)
    zero = torch.zeros_like(scale)
    if bool(torch.isfinite(scale).all()) and _rebuilds(groups, scale, zero, codes):
        return BlockCode(8, codes.short().reshape(weight.shape), scale, zero)
    return None


def pack(code: BlockCode) -> torch.Tensor:
    """``code`` in the kernel's layout, one uint8 stream: blocks of ROWS rows; each block, group by
    group of 32 columns, its rows' (scale, offset) as float32 (at 8 bits the scale only: the offset is
    0), then each row's codes for the group
    (at 4 bits, 16 bytes: byte b holds column c = :data:`NIBBLE_ORDER` [b] in its low half and
    column c + 16 in its high half)."""
    if code.bits == 8 and bool(code.offset.any()):
        raise ValueError("a Q8_0 code has no offset (w = d * q); this one has one")
    out_features, in_features = code.codes.shape
    blocks, groups = out_features // ROWS, in_features // GROUP
    parts = [code.scale, code.offset] if code.bits == 4 else [code.scale]
    scales = torch.stack(parts, -1).reshape(blocks, ROWS, groups, len(parts)).transpose(1, 2)
    scale_bytes = scales.contiguous().view(torch.uint8).reshape(blocks, groups, -1)
    rows = code.codes.reshape(blocks, ROWS, groups, GROUP)
    if code.bits == 4:
        rows = (rows[..., :GROUP // 2] | (rows[..., GROUP // 2:] << 4))[..., NIBBLE_ORDER]
    code_bytes = rows.to(torch.int8 if code.bits == 8 else torch.uint8).transpose(1, 2).contiguous()
    code_bytes = code_bytes.view(torch.uint8).reshape(blocks, groups, -1)
    return torch.cat([scale_bytes, code_bytes], -1).reshape(-1)


class GgufWeightLinear(torch.nn.Module):
    """A linear layer whose fp32 weight is a GGUF block code, read as that code (inference only).

    ``weight`` and ``bias`` stay the original parameters (shared, not copied), so parameter
    counts, ``state_dict`` and tied embeddings see the model as it was; ``packed`` is the coded
    copy the kernel reads. :meth:`from_layer` returns None where the weight is no such code.
    """

    streams_packed = True  # a decode step reads ``packed``, not ``weight`` (roofline.streamed_weight_bytes)

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None, code: BlockCode) -> None:
        super().__init__()
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"the GGUF-code kernel is not available: {reason}")
        self.weight, self.bias, self.bits = weight, bias, code.bits
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", pack(code), persistent=False)

    @classmethod
    def from_layer(cls, layer: torch.nn.Linear) -> GgufWeightLinear | None:
        code = block_code(layer.weight.detach())
        return None if code is None else cls(layer.weight, layer.bias, code)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not 1 <= _rows(x) <= MAX_ROWS:  # a prefill: the fp32 weight, PyTorch's kernel
            return torch.nn.functional.linear(x, self.weight, self.bias)
        out = torch.ops.specdec.gguf_weights_linear(x, self.packed, self.out_features, self.bits)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"code={CODES[self.bits]}")


class StackedCodes(torch.nn.Module):
    """GGUF-coded layers that read the same input (an attention's q, k and v projections, an MLP's
    gate and up), read in one kernel call: one stream of their codes, of which each layer's
    ``packed`` becomes a part (no copy is kept). Returns the layers' outputs, each bit for bit what
    the layer's own call gives; a pass of more than :data:`MAX_ROWS` rows calls PyTorch's kernel
    once per layer. One call instead of two or three saves its dispatch and its threads' start
    and end, a measurable part of a SmolLM2 decode step's 211 calls."""

    def __init__(self, layers: list[GgufWeightLinear]) -> None:
        super().__init__()
        if not self.stackable(layers):
            raise ValueError("stacked layers must be GGUF-coded in one code, without a bias, and read one input width")
        self.bits, self.sizes = layers[0].bits, [layer.out_features for layer in layers]
        self.in_features, self.out_features = layers[0].in_features, sum(self.sizes)
        self.weights = [layer.weight for layer in layers]  # a pass too long for the kernel reads them
        self.register_buffer("packed", torch.cat([layer.packed for layer in layers]), persistent=False)
        start = 0
        for layer in layers:
            layer.packed, start = self.packed[start:start + layer.packed.numel()], start + layer.packed.numel()

    @staticmethod
    def stackable(layers: list[torch.nn.Module]) -> bool:
        return (all(isinstance(layer, GgufWeightLinear) and layer.bias is None for layer in layers)
                and len({(layer.bits, layer.in_features) for layer in layers}) == 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not 1 <= _rows(x) <= MAX_ROWS:
            return tuple(torch.nn.functional.linear(x, weight) for weight in self.weights)
        return torch.ops.specdec.gguf_weights_linear(x, self.packed, self.out_features, self.bits).split(self.sizes, -1)


def _attention_with_stacked_qkv(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                                attention_mask: torch.Tensor | None = None, past_key_values=None, **kwargs):
    """``LlamaAttention.forward`` with q, k and v from one :class:`StackedCodes` call (inference only)."""
    from transformers.models.llama.modeling_llama import ALL_ATTENTION_FUNCTIONS, apply_rotary_pos_emb, eager_attention_forward

    heads = (*hidden_states.shape[:-1], -1, self.head_dim)
    query, key, value = (states.view(heads).transpose(1, 2) for states in self.qkv_proj(hidden_states))
    query, key = apply_rotary_pos_emb(query, key, *position_embeddings)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, self.layer_idx)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
    output, weights = attention(self, query, key, value, attention_mask, dropout=0.0, scaling=self.scaling, **kwargs)
    return self.o_proj(output.reshape(*hidden_states.shape[:-1], -1).contiguous()), weights


def _mlp_with_stacked_gate_up(self, x: torch.Tensor) -> torch.Tensor:
    """``LlamaMLP.forward`` with gate and up from one :class:`StackedCodes` call."""
    gate, up = self.gate_up_proj(x)
    return self.down_proj(self.act_fn(gate) * up)


def stack_projections(model: torch.nn.Module) -> int:
    """Give every Llama attention and MLP of ``model`` whose q, k, v (gate, up) layers are
    :class:`StackedCodes`-able one call for them, in place; returns how many were stacked. The
    layers stay where they were (parameter names, counts and weight bytes unchanged)."""
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP

    stacked = 0
    for module in model.modules():
        if type(module) is LlamaAttention and StackedCodes.stackable([module.q_proj, module.k_proj, module.v_proj]):
            module.qkv_proj = StackedCodes([module.q_proj, module.k_proj, module.v_proj])
            module.forward = _attention_with_stacked_qkv.__get__(module)
        elif type(module) is LlamaMLP and StackedCodes.stackable([module.gate_proj, module.up_proj]):
            module.gate_up_proj = StackedCodes([module.gate_proj, module.up_proj])
            module.forward = _mlp_with_stacked_gate_up.__get__(module)
        else:
            continue
        stacked += 1
    return stacked
