"""Building the course's C++ kernels (``*.cpp`` beside this file) into torch operators, once
per machine, with the system's C++ compiler against torch's headers, into the course cache."""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from ..paths import cache_root

FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC")  # -fopenmp: at::parallel_for runs on threads only with it
# SPECDEC_BF16_KERNEL=avx2 builds the AVX2 variant of every kernel on a CPU with AVX-512 too: to
# compare the two, and so that the tests check the AVX2 code on any machine that can run it.
KERNEL_VARIANTS = {"native": (), "avx2": ("-mno-avx512f",)}


def cpu_flags() -> set[str]:
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


def build_operator(source: Path, operators: tuple[str, ...], kernel: str,
                   output_shape: Callable[..., torch.Tensor]) -> tuple[bool, str]:
    """Build ``source`` (once per source, compiler, torch and CPU) into the course cache and load
    its ``specdec::`` operators: ``(ok, why not)``. ``kernel`` names it in the reason, with
    the instruction set it was built for (AVX-512 where the CPU and the variant have it, else AVX2).
    ``output_shape`` gives torch.compile an operator's output without computing it."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, f"the kernel is written for x86-64 Linux, not {platform.system()} {platform.machine()}"
    flags = cpu_flags()
    if not has_vector_units(flags):
        return False, "this CPU has neither AVX-512 nor AVX2 with FMA, which the kernel is written for"
    compiler = _compiler()
    if compiler is None:
        return False, "no C++ compiler (c++, g++ or clang++) on PATH to build the kernel"
    variant = _variant_flags()
    if variant is None:
        return False, (f"SPECDEC_BF16_KERNEL={os.environ['SPECDEC_BF16_KERNEL']!r} is not a kernel variant "
                       f"(choose from {', '.join(KERNEL_VARIANTS)})")
    headers = [header.read_text() for header in sorted(source.parent.glob("*.h"))]  # what a source may include
    key = hashlib.sha256("\n".join([source.read_text(), *headers, compiler, torch.__version__, *FLAGS, *variant,
                                    *sorted(flags)]).encode()).hexdigest()[:16]
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
        torch.library.register_fake(f"specdec::{name}")(output_shape)
    isa = "AVX-512" if "avx512f" in flags and not variant else "AVX2"
    return True, f"the {kernel} is built ({isa}, {built.name})"
