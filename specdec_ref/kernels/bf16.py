"""Half the weight bytes, the same arithmetic: linear layers that keep bfloat16-valued weights as bfloat16.

The course zoo stores its weights in bfloat16 and the loader upcasts them to float32, so each
fp32 weight carries 16 zero bits that a decode step still reads from memory. A bfloat16 is
the top half of a float32: stored as bfloat16 and widened in registers (a shift), every
weight is the same number, every product the fp32 model's product, and the sums fp32 sums
in another order, as in any other kernel. A one-token decode step, which is bound by weight
bytes, reads half as many.

``bf16_weights.cpp`` is that kernel (AVX-512, or AVX2 with FMA where the CPU has no AVX-512, as
most laptops do; on torch's own threads), a torch operator
``torch.ops.specdec.bf16_weights_linear`` built once per machine with the system's C++
compiler against torch's headers (about 20 s) into the course cache folder. It serves passes
of up to :data:`MAX_ROWS` tokens (decode steps, verifications); longer ones (a prefill) go to
PyTorch's kernel on the fp32 weight, which the layer keeps. :func:`specdec_ref.kernels.fast.prepare`
uses it where :func:`available` says it can and every weight of a layer is bf16-exact
(:func:`is_bf16_exact`); random fp32 weights are not, and keep the other kernels.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from .build import build_operator

SOURCE = Path(__file__).with_name("bf16_weights.cpp")
ROWS = 4  # weight rows per packed block (ROWS in the C source)
COLUMNS = 16  # columns per packed tile: one AVX-512 register of fp32, two AVX2 ones
MAX_ROWS = 16  # longest pass the kernel serves (MAX_ROWS in the C++ source); prefills read the fp32 weight


def _output_shape(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What torch.compile traces with: the operator's output, without computing it."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])


@cache
def _operator() -> tuple[bool, str]:
    """Build and load the bf16-weight operator: (ok, why not)."""
    return build_operator(SOURCE, ("bf16_weights_linear",), "bf16-weight kernel", _output_shape)


def available() -> tuple[bool, str]:
    """Whether the kernel can run here (building it on first use): ``(ok, reason)``, the reason one line."""
    return _operator()


def is_bf16_exact(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 tensor is a bfloat16 (so storing it as one loses nothing)."""
    return weight.dtype == torch.float32 and bool(torch.equal(weight.to(torch.bfloat16).float(), weight))


def fits(out_features: int, in_features: int) -> bool:
    """Whether the kernel's blocking covers a weight of this shape."""
    return out_features % ROWS == 0 and in_features % COLUMNS == 0


def pack(matrix: torch.Tensor) -> torch.Tensor:
    """An [out, in] float32 matrix of bf16 values in the kernel's layout, as int16 bits:
    blocks of ROWS rows, each stored tile by tile (16 columns of its ROWS rows in turn)."""
    out_features, in_features = matrix.shape
    bits = matrix.to(torch.bfloat16).view(torch.int16)
    tiles = bits.reshape(out_features // ROWS, ROWS, in_features // COLUMNS, COLUMNS)
    return tiles.permute(0, 2, 1, 3).contiguous().reshape(-1)


class Bf16WeightLinear(torch.nn.Module):
    """A linear layer whose bf16-valued fp32 weight is read as bfloat16 (inference only).

    ``weight`` and ``bias`` stay the original parameters (shared, not copied), so parameter
    counts, ``state_dict`` and tied embeddings see the model as it was; ``packed`` is the
    half-size copy the kernel reads.
    """

    streams_packed = True  # a decode step reads ``packed``, not ``weight`` (roofline.streamed_weight_bytes)

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter | None) -> None:
        super().__init__()
        self.weight, self.bias = weight, bias
        self.out_features, self.in_features = weight.shape
        ok, reason = available()
        if not ok:
            raise RuntimeError(f"the bf16-weight kernel is not available: {reason}")
        self.register_buffer("packed", pack(weight.detach()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.specdec.bf16_weights_linear(x, self.packed, self.weight)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
