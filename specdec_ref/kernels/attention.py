"""Attention for a few query rows on a KV cache, each row computed alone (``attention.cpp``).

A decode step attends with one query row, a verification pass with k + 1 (or a tree's nodes).
PyTorch's CPU flash attention took 30-50 microseconds a layer on SmolLM2's shapes (1.3 ms of a 10 ms
compiled step, Zen 3), and its verification passes' logits differ from the one-token steps' in the
last bits. The course's kernel computes each query row's scores, softmax and weighted sum in one
fixed order, so a verification pass gives every position exactly what a one-token step at that
position gives, and costs about 10 microseconds a layer. Built like the GGUF-code kernel
(:mod:`specdec_ref.kernels.build`).
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from .build import build_operator

SOURCE = Path(__file__).with_name("attention.cpp")
MAX_QUERIES = 16  # most query rows a call serves (MAX_QUERIES in the C++ source)
MAX_HEAD_DIM = 256
loaded = False  # whether available() has loaded the operator (read where a compiled graph cannot build it)


def _output_shape(query: torch.Tensor, *rest) -> torch.Tensor:
    b, heads, t, d = query.shape
    return query.new_empty(b, t, heads, d)


@cache
def available() -> tuple[bool, str]:
    """Whether the kernel can run here (building it on first use): ``(ok, reason)``."""
    global loaded
    ok, reason = build_operator(SOURCE, ("few_query_attention",), "attention kernel", _output_shape)
    loaded = ok
    return ok, reason


def serves(query: torch.Tensor, key: torch.Tensor, attention_mask: torch.Tensor | None) -> bool:
    """Whether :func:`few_query_attention` takes this call: float32 on the CPU, 1 to
    :data:`MAX_QUERIES` query rows, a head size that is a multiple of 8, a 4-d boolean or float mask."""
    d = query.shape[-1]
    return (query.device.type == "cpu" and query.dtype == key.dtype == torch.float32
            and 1 <= query.shape[2] <= MAX_QUERIES and d % 8 == 0 and d <= MAX_HEAD_DIM
            and (attention_mask is None or (attention_mask.dim() == 4
                                            and attention_mask.dtype in (torch.bool, torch.float32))))


def few_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scale: float, causal: bool) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v, one query row at a time: [B, T, Hq, D] (heads after rows,
    as ``transformers`` wants an attention's output) for q [B, Hq, T, D] and k, v [B, Hkv, S, D]
    (grouped heads read in place). ``attention_mask``: booleans (True: the row reads the key) or
    floats added to the scores, broadcast to [B, Hq, T, S]; ``causal`` (no mask): row t reads the
    first S - T + t + 1 keys."""
    return torch.ops.specdec.few_query_attention(query, key, value, attention_mask, scale, causal)
