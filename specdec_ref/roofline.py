"""The memory-bandwidth roofline and the speculative speedup model.

Decoding one token reads every weight once, so at batch 1 the time per token is bounded
below by weight bytes / memory bandwidth. Speculative decoding buys several tokens per
read of the target's weights; how many, and at what price, is the model below.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .inputs import clock
from .kv_cache import new_cache, rollback


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_bandwidth: float  # bytes/s
    bf16_flops: float  # dense (no sparsity) peak, FLOP/s
    source: str


# Vendor datasheet figures (dense bf16, i.e. without the 2:4-sparsity doubling).
ACCELERATORS = {
    a.name: a
    for a in [
        Accelerator("H100 SXM", 3.35e12, 989e12, "NVIDIA H100 Tensor Core GPU datasheet (SXM5 80GB)"),
        Accelerator("H100 PCIe", 2.0e12, 756e12, "NVIDIA H100 Tensor Core GPU datasheet (PCIe 80GB)"),
        Accelerator("H200", 4.8e12, 989e12, "NVIDIA H200 Tensor Core GPU datasheet (SXM 141GB)"),
        Accelerator("A100 80GB", 2.039e12, 312e12, "NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB)"),
        Accelerator("L4", 300e9, 121e12, "NVIDIA L4 Tensor Core GPU datasheet"),
    ]
}

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1, "int4": 0.5}


def weight_bytes(model_or_params: torch.nn.Module | float, dtype: str | None = None) -> float:
    """Bytes of weights: of a model as loaded (or in ``dtype``), or of a parameter count in ``dtype``."""
    if isinstance(model_or_params, torch.nn.Module):
        params = list(model_or_params.parameters())
        if dtype is None:
            return float(sum(p.numel() * p.element_size() for p in params))
        model_or_params = sum(p.numel() for p in params)
    if dtype is None:
        raise ValueError("give the dtype of a bare parameter count, e.g. weight_bytes(70e9, 'bfloat16')")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return float(model_or_params) * DTYPE_BYTES[dtype]


def streamed_weight_bytes(model: torch.nn.Module) -> float:
    """Weight bytes one decode step reads: :func:`weight_bytes`, with the copy each layer that
    ``streams_packed`` reads (a bf16 copy, GGUF codes and scales: :mod:`specdec_ref.kernels`) in
    place of its fp32 weight."""
    total = weight_bytes(model)
    for layer in model.modules():
        if getattr(layer, "streams_packed", False):
            total += layer.packed.numel() * layer.packed.element_size() - layer.weight.numel() * layer.weight.element_size()
    return total


def seconds_per_token_bound(weight_bytes: float, bandwidth: float) -> float:
    """The memory-bandwidth lower bound on one batch-1 decode step: every weight read once."""
    return weight_bytes / bandwidth


def bandwidth_achieved(bytes_per_pass: float, passes: int, seconds: float) -> float:
    """Weight bytes actually streamed per second by a measured run (bytes/s)."""
    return bytes_per_pass * passes / seconds


def last_level_cache_bytes() -> int | None:
    """This CPU's last-level cache size, from sysfs (Linux), if it says."""
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
    sizes = []
    for cache in caches:
        text = (cache / "size").read_text().strip() if (cache / "size").exists() else ""
        if text:
            units = {"K": 1024, "M": 1024**2, "G": 1024**3}
            sizes.append(int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text))
    return max(sizes) if sizes else None


def measure_memory_bandwidth(array_bytes: int, repeats: int = 5) -> dict[str, float]:
    """STREAM-style copy and triad bandwidth (bytes/s, medians after a warm-up) with float32 arrays.

    Arrays much larger than the last-level cache measure DRAM; smaller ones measure the cache.
    """
    n = array_bytes // 4
    a, b, c = torch.zeros(n), torch.ones(n), torch.full((n,), 2.0)
    copy_times, triad_times = [], []
    for i in range(repeats + 1):  # the first round is the warm-up
        t0 = time.perf_counter()
        a.copy_(b)
        t1 = time.perf_counter()
        torch.add(b, c, alpha=3.0, out=a)
        t2 = time.perf_counter()
        if i:
            copy_times.append(t1 - t0)
            triad_times.append(t2 - t1)
    # copy reads one array and writes one; triad reads two and writes one.
    return {"copy": 2 * n * 4 / statistics.median(copy_times), "triad": 3 * n * 4 / statistics.median(triad_times)}


def expected_tokens_per_pass(acceptance: float, k: int) -> float:
    """E[new tokens per target pass] = (1 - a^(k+1)) / (1 - a), each judged draft accepted
    with probability ``a``, independently.

    It counts the target's own token, so it runs from 1 (a = 0) to k + 1 (a = 1).
    (Leviathan et al. 2023, eq. 1; not 1 + a*k.) ``a`` is the per-draft acceptance
    probability (``GenerationStats.acceptance_probability``), not the acceptance rate
    accepted / drafted, which also counts the drafts a rejection threw away unjudged.
    """
    if not 0 <= acceptance <= 1:
        raise ValueError(f"acceptance must be in [0, 1] (got {acceptance})")
    if acceptance == 1:
        return k + 1.0
    return (1 - acceptance ** (k + 1)) / (1 - acceptance)


def expected_speedup(acceptance: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup over plain decoding.

    One iteration costs k draft passes (``cost_ratio`` c each, in units of one 1-token
    target pass) plus one verification pass over k + 1 tokens (``verify_cost`` in the
    same units: about 1 on a GPU at batch 1, clearly more on a CPU).
    """
    return speedup_from_tokens_per_pass(expected_tokens_per_pass(acceptance, k), k, cost_ratio, verify_cost)


def speedup_from_tokens_per_pass(tokens_per_pass: float, draft_passes: float, cost_ratio: float,
                                 verify_cost: float = 1.0) -> float:
    """The same cost model fed measured figures: ``tokens_per_pass`` (tau) new tokens for each
    iteration's ``draft_passes`` draft passes (c each) and one verification pass (``verify_cost``).
    Where it differs from :func:`expected_speedup` on the same runs, acceptances are not independent."""
    return tokens_per_pass / (draft_passes * cost_ratio + verify_cost)


def optimal_k(acceptance: float, cost_ratio: float, verify_costs: dict[int, float] | None = None,
              k_max: int = 16) -> int:
    """The k that maximises :func:`expected_speedup`; ``verify_costs[k]`` is the measured cost of
    verifying k + 1 tokens (default 1 for every k: the memory-bound GPU regime)."""
    candidates = range(1, k_max + 1) if verify_costs is None else sorted(verify_costs)
    return max(candidates, key=lambda k: expected_speedup(
        acceptance, k, cost_ratio, 1.0 if verify_costs is None else verify_costs[k]))


@torch.inference_mode()
def measure_forward_seconds(model: torch.nn.Module, context: int, new_tokens: int, repeats: int = 7,
                            batch: int = 1) -> float:
    """Median time of one forward over ``new_tokens`` tokens on top of a ``context``-token KV cache,
    for ``batch`` sequences at once (random ids; the cache is rolled back after each pass)."""
    now = clock(model.device)
    ids = torch.randint(0, model.config.vocab_size, (batch, context + new_tokens), device=model.device)
    cache = new_cache(model)
    model(ids[:, :context], past_key_values=cache, use_cache=True, logits_to_keep=1)
    times = []
    for i in range(repeats + 1):
        t0 = now()
        model(ids[:, context:], past_key_values=cache, use_cache=True)
        if i:  # the first pass is the warm-up
            times.append(now() - t0)
        rollback(cache, context)
    return statistics.median(times)


@torch.inference_mode()
def measure_matmul_flops(n: int = 1024, repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """float32 FLOP/s of an n x n by n x n matmul (2 n^3 operations), median after a warm-up:
    the compute roof of the roofline on ``device``."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    now, times = clock(torch.device(device)), []
    for i in range(repeats + 1):
        t0 = now()
        a @ b
        if i:
            times.append(now() - t0)
    return 2 * n**3 / statistics.median(times)
