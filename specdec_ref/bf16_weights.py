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
PyTorch's kernel on the fp32 weight, which the layer keeps. :func:`specdec_ref.fast.prepare`
uses it where :func:`available` says it can and every weight of a layer is bf16-exact
(:func:`is_bf16_exact`); random fp32 weights are not, and keep the other kernels.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("bf16_weights.cpp")
ROWS = 4  # weight rows per packed block (ROWS in the C source)
COLUMNS = 16  # columns per packed tile: one AVX-512 register of fp32, two AVX2 ones
MAX_ROWS = 8  # longest pass the kernel serves (MAX_ROWS in the C++ source); prefills read the fp32 weight
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC")  # -fopenmp: at::parallel_for runs on threads only with it
# SPECDEC_BF16_KERNEL=avx2 builds the AVX2 variant of this kernel and of gguf_weights' on a CPU with
# AVX-512 too: to compare the two, and so that the tests check the AVX2 code on any machine that can run it.
KERNEL_VARIANTS = {"native": (), "avx2": ("-mno-avx512f",)}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_vector_units(cpu_flags: set[str]) -> bool:
    """Whether a CPU with these ``/proc/cpuinfo`` flags can run the kernel: AVX-512, or AVX2 and FMA."""
    return "avx512f" in cpu_flags or {"avx2", "fma"} <= cpu_flags


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _variant_flags() -> tuple[str, ...] | None:
    """The compiler flags that select the kernel variant ``SPECDEC_BF16_KERNEL`` asks for (None: unknown)."""
    return KERNEL_VARIANTS.get(os.environ.get("SPECDEC_BF16_KERNEL") or "native")


def _build_command(compiler: str, variant: tuple[str, ...], source: Path, target: Path) -> list[str]:
    from torch.utils.cpp_extension import include_paths, library_paths

    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    return [compiler, *FLAGS, *variant, abi, *(f"-I{path}" for path in include_paths()), str(source),
            *(f"-L{path}" for path in library_paths()), "-lc10", "-ltorch_cpu", "-o", str(target)]


def _output_shape(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, *options) -> torch.Tensor:
    """What torch.compile traces with: the operator's output, without computing it."""
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def build_operator(source: Path, operators: tuple[str, ...], kernel: str) -> tuple[bool, str]:
    """Build ``source`` (once per source, compiler, torch and CPU) into the course cache and load
    its ``specdec::`` operators: ``(ok, why not)``. ``kernel`` names it in the reason, with
    the instruction set it was built for (AVX-512 where the CPU and the variant have it, else AVX2)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, f"the kernel is written for x86-64 Linux, not {platform.system()} {platform.machine()}"
    cpu_flags = _cpu_flags()
    if not has_vector_units(cpu_flags):
        return False, "this CPU has neither AVX-512 nor AVX2 with FMA, which the kernel is written for"
    compiler = _compiler()
    if compiler is None:
        return False, "no C++ compiler (c++, g++ or clang++) on PATH to build the kernel"
    from .zoo.smollm2 import cache_root

    variant = _variant_flags()
    if variant is None:
        return False, (f"SPECDEC_BF16_KERNEL={os.environ['SPECDEC_BF16_KERNEL']!r} is not a kernel variant "
                       f"(choose from {', '.join(KERNEL_VARIANTS)})")
    key = hashlib.sha256("\n".join([source.read_text(), compiler, torch.__version__, *FLAGS, *variant,
                                    *sorted(cpu_flags)]).encode()).hexdigest()[:16]
    built = cache_root() / "kernels" / f"{source.stem}-{key}.so"
    if not built.exists():
        built.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=built.parent) as scratch:
            target = Path(scratch) / built.name
            result = subprocess.run(_build_command(compiler, variant, source, target), capture_output=True, text=True)
            if result.returncode:
                first = next((line for line in result.stderr.splitlines() if "error" in line), "no message")
                return False, f"building the kernel with {compiler} failed: {first.strip()}"
            os.replace(target, built)  # atomic: a concurrent build never sees half a file
    torch.ops.load_library(str(built))
    for name in operators:
        torch.library.register_fake(f"specdec::{name}")(_output_shape)
    isa = "AVX-512" if "avx512f" in cpu_flags and not variant else "AVX2"
    return True, f"the {kernel} is built ({isa}, {built.name})"


@cache
def _operator() -> tuple[bool, str]:
    """Build and load the bf16-weight operator: (ok, why not)."""
    return build_operator(SOURCE, ("bf16_weights_linear",), "bf16-weight kernel")


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
