"""An EAGLE head's greedy chain of drafts as one C++ call (``eagle_chain.cpp``).

Drafting step by step from Python, each of SmolLM2's head steps is a few dozen small operations
around 0.7 ms of weights (its bf16 layer and 8,192 Q8_0 rows of the LM head): about 1.6 ms a draft
on a 2-core Ice Lake Xeon, a quarter of a one-call target step (:mod:`specdec_ref.kernels.llama_pass`).
:func:`one_call_chain` gives an :class:`~specdec_ref.eagle.EagleDrafter` on a fast target the same
chain in one operator call: the course's kernels for the head's layers, its LM head rows and its
attention, the rotary embedding from the head's own table, the argmax in C++. A fast model carries it
under :data:`~specdec_ref.modules.GREEDY_CHAIN` (:func:`specdec_ref.kernels.fast.prepare`).
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from . import attention, bf16, gguf
from .build import build_operator

SOURCE = Path(__file__).with_name("eagle_chain.cpp")
LAYERS = ("fc", "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # the operator's order


def _output_shapes(ids: torch.Tensor, features: torch.Tensor, embedding: torch.Tensor, keys: torch.Tensor,
                   values: torch.Tensor, cos, sin, num_tokens: int, candidates: int, *rest):
    total = keys.shape[2] + ids.shape[0] + num_tokens - 1
    return (ids.new_empty(num_tokens), ids.new_empty(candidates - 1), keys.new_empty(*keys.shape[:2], total, keys.shape[3]),
            values.new_empty(*values.shape[:2], total, values.shape[3]))


@cache
def available() -> tuple[bool, str]:
    """Whether the operator can run here (building it on first use): ``(ok, reason)``. It calls the
    bf16-weight, GGUF-code and attention operators, so it needs all three."""
    for kernel in (bf16, gguf, attention):
        ok, reason = kernel.available()
        if not ok:
            return False, reason
    return build_operator(SOURCE, ("eagle_greedy_chain",), "EAGLE chain operator", _output_shapes)


def _linear_layers(head) -> list[torch.nn.Module]:
    """An :class:`~specdec_ref.eagle.EagleHead`'s linear layers in :data:`LAYERS` order."""
    layer = head.layers[0]
    return [head.fc, *(getattr(layer.self_attn, name) for name in LAYERS[1:5]),
            *(getattr(layer.mlp, name) for name in LAYERS[5:])]


class OneCallChain:
    """:meth:`~specdec_ref.eagle.EagleDrafter.greedy_chain` as one operator call, for a drafter whose
    head layers are bf16-stored and whose LM head rows are GGUF-coded (the fast path's forms)."""

    def __init__(self, drafter) -> None:
        head, config = drafter.head, drafter.head.config
        layer = head.layers[0]
        self.layers = [t for module in _linear_layers(head) for t in (module.packed, module.weight.detach())]
        self.norm, self.eps = layer.post_attention_layernorm.weight.detach(), layer.post_attention_layernorm.eps
        self.lm_head, self.embedding = drafter.lm_head, drafter.embed.weight.detach()
        self.draft_vocab = drafter.draft_vocab if drafter.draft_vocab is not None else torch.empty(0, dtype=torch.long)
        self.heads, self.theta = config.num_attention_heads, config.rope_theta
        self.half = config.head_dim // 2
        self.cos = self.sin = torch.empty(0, self.half)

    @staticmethod
    def applies(drafter) -> bool:
        return (all(isinstance(m, bf16.Bf16WeightLinear) and m.bias is None for m in _linear_layers(drafter.head))
                and isinstance(drafter.lm_head, gguf.GgufWeightLinear) and drafter.lm_head.bias is None
                and drafter.embed.weight.dtype == torch.float32 and available()[0])

    def _rotary(self, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's rotary embedding (:func:`specdec_ref.eagle.rotate`'s cos and sin) at positions
        0 .. ``positions`` - 1, computed as it computes them, each position alone."""
        if positions > self.cos.shape[0]:
            size = max(positions, 2 * self.cos.shape[0], 256)
            freqs = self.theta ** (-torch.arange(self.half, dtype=torch.float32) / self.half)
            angles = torch.arange(size).float()[:, None] * freqs[None]
            self.cos, self.sin = angles.cos().contiguous(), angles.sin().contiguous()
        return self.cos, self.sin

    def __call__(self, ids: torch.Tensor, features: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                 position: int, num_tokens: int, candidates: int):
        """What :meth:`~specdec_ref.eagle.EagleDrafter.greedy_chain` returns, for the same arguments."""
        if keys.shape[2] != position:  # the operator reads the new tokens' positions off the cache
            raise ValueError(f"the head's cache holds {keys.shape[2]} positions; the chain starts at {position}")
        with torch.no_grad():
            cos, sin = self._rotary(position + ids.shape[0] + num_tokens)
            drafts, siblings, keys, values = torch.ops.specdec.eagle_greedy_chain(
                ids.contiguous(), features[0].float().contiguous(), self.embedding, keys.contiguous(),
                values.contiguous(), cos, sin, num_tokens, candidates, self.layers, self.norm, self.eps,
                self.lm_head.packed, self.lm_head.out_features, self.lm_head.bits, self.draft_vocab, self.heads)
        return drafts, siblings if candidates > 1 else None, keys, values


def one_call_chain(drafter) -> OneCallChain | None:
    """``drafter``'s greedy chain as one operator call, or None where its forms do not allow it."""
    return OneCallChain(drafter) if OneCallChain.applies(drafter) else None
