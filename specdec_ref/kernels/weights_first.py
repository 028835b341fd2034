"""The eager model with its few-row linear layers computed weights-first: W @ xᵀ instead of x @ Wᵀ.

A decode step pushes one row of activations through every weight matrix and a verification pass
pushes k + 1 rows. Both read each weight once, so where a step is bound by memory bandwidth they
should take about as long: the premise of speculative decoding, v(k) near 1 (lesson 2). With the
MKL that PyTorch's x86 wheels ship, ``F.linear(x, W)`` broke it on the AMD EPYC CPUs measured (Zen 3,
Zen 5): for 2 or 3 rows, SmolLM2's linear layers took about twice as long as for one, so eager v(2)
was about 2. The same product with the weight as the left operand, ``(W @ xᵀ)ᵀ``, is another MKL
call, and on a Zen 5 (the only CPU it has been measured on) it took about as long for 2-4 rows as
for one; one row padded with a zero row to two took less than the one-row call itself. Its product
comes out column-major and is copied back to row-major (a few kilobytes): left column-major, it sent
SDPA from its fused kernel to the unfused one on a masked verification pass, and speculative
decoding ran 7 % slower (``zoo/MODELS.md``).
``benchmarks/eager_linear_forms.py`` measures both forms per row count on the machine at hand.

:func:`weights_first` returns a copy of a model (sharing its weights) whose float32 CPU
``nn.Linear`` layers are :class:`WeightsFirstLinear`: up to :data:`MAX_ROWS` rows, padded to an
even count, go weights-first; more rows (a prefill) go through ``F.linear`` as before. The weights
and the fp32 arithmetic are the same, summed in another order, so logits differ from the stock
layers' in the last bits and greedy tokens only at near-ties (which the bench counts). The course's
eager path stays PyTorch's stock layers; ``zoo.load(..., weights_first=True)`` and ``bench
--weights-first`` choose this one; a drafter puts its own layers on the same form as its target
(:func:`specdec_ref.modules.like`).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..modules import copy_sharing_weights, linear_layers, mark_form

# Zen 5, benchmarks/eager_linear_forms.py: weights-first took 1.0-1.2 one-row times for 2-4 rows and
# was still 1.2-1.8x faster than F.linear for 5-8 (two runs); about even for 9-12, slower for 13-14 (one).
MAX_ROWS = 8


class WeightsFirstLinear(torch.nn.Linear):
    """An ``nn.Linear`` (same parameters, same ``state_dict``) that multiplies up to :data:`MAX_ROWS`
    rows as ``(W @ xᵀ)ᵀ``, the rows padded to an even count; other inputs as ``F.linear``."""

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear) -> WeightsFirstLinear:
        """The same layer (its weight and bias objects, not copies) computed weights-first."""
        swapped = cls(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
        swapped.weight, swapped.bias = layer.weight, layer.bias
        return swapped

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        count = rows.shape[0]
        if count > MAX_ROWS or x.device.type != "cpu" or x.dtype != torch.float32:
            return F.linear(x, self.weight, self.bias)
        if count % 2:  # one zero row: MKL's two-row call streams the weight faster than its one-row call
            rows = torch.cat([rows, rows.new_zeros(1, self.in_features)])
        # Back to row-major, as F.linear returns it: handed on column-major, the product sent SDPA
        # to its unfused kernel on a masked (verification) pass.
        out = (self.weight @ rows.T).T[:count].contiguous()
        if self.bias is not None:
            out += self.bias  # in place: the copy above is already this call's own row-major tensor
        return out.reshape(*x.shape[:-1], self.out_features)


def is_weights_first(module: torch.nn.Module) -> bool:
    """Whether ``module`` computes its linear layers weights-first (came from :func:`weights_first`)."""
    return any(isinstance(m, WeightsFirstLinear) for m in module.modules())


def _stock_fp32_cpu_linear(layer: torch.nn.Module) -> bool:
    return type(layer) is torch.nn.Linear and layer.weight.device.type == "cpu" and layer.weight.dtype == torch.float32


@torch.no_grad()
def weights_first(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``module`` sharing its parameters (tied embeddings stay tied), every float32
    ``nn.Linear`` on the CPU a :class:`WeightsFirstLinear`; ``module`` itself if it already is one
    or has no such layer. A bare ``nn.Linear`` (a drafter's LM head rows) is swapped itself."""
    if is_weights_first(module) or not any(map(_stock_fp32_cpu_linear, module.modules())):
        return module
    if _stock_fp32_cpu_linear(module):
        return WeightsFirstLinear.from_linear(module)
    copy = copy_sharing_weights(module)
    for parent, name, layer in list(linear_layers(copy)):
        if _stock_fp32_cpu_linear(layer):
            setattr(parent, name, WeightsFirstLinear.from_linear(layer))
    mark_form(copy, weights_first)
    return copy
