"""Linear layers on prepacked oneDNN weights: the weight reordered once into the blocked layout
oneDNN's kernel reads (what ``torch.compile``'s freezing pass does for CPU linears), so no call
reorders it again. Whether that streams faster than PyTorch's default fp32 kernel depends on the CPU.

:func:`check_layer` is the check every replacement layer of :mod:`specdec_ref.kernels` passes
before use: agreement with the eager layer within fp32 rounding.
"""
from __future__ import annotations

import torch

from ..modules import linear_layers

# The private oneDNN ops this path calls; checked by name before use.
REQUIRED_OPS = ("_reorder_linear_weight", "_linear_pointwise")
# Oldest torch with both ops and their current signatures that this path was checked on.
MIN_TORCH = (2, 2)
TORCH_VERSION = torch.__version__

def _version_tuple(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


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
    layers = [layer for _, _, layer in linear_layers(model)]
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
