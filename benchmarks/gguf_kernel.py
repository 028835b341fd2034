"""The GGUF-code kernel alone, on SmolLM2's own layers: time per call, weight bandwidth, and what a
pass of several rows costs against one.

    python benchmarks/gguf_kernel.py               # 1, 2, 4, 8 and 16 rows
    python benchmarks/gguf_kernel.py --rows 1,4

For each kind of layer of ``fast.prepare(zoo:smollm2)`` (the stacked q/k/v, o, the stacked gate/up,
down: Q4_1 codes; the tied LM head: Q8_0), the calls cycle through all of the model's layers of that
kind, as a decode step does, so the weights come from DRAM, not from the caches (the LM head, 35 MB,
does not fit them either). The rows of one layer kind are timed in turn, round after round, and each
figure is the median over rounds; ``x 1 row`` is the median of the per-round ratios, the kernel's own
share of a verification pass's cost v(k). Prints the CPU and the kernel variant
(``SPECDEC_BF16_KERNEL=avx2`` times the AVX2 build on an AVX-512 CPU) beside the DRAM triad of the run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specdec_ref import bench, zoo  # noqa: E402
from specdec_ref.kernels import fast, gguf  # noqa: E402
from specdec_ref.timing import threads_for_timing  # noqa: E402
from specdec_ref.vllm.recorded import cpu_fields, cpu_model  # noqa: E402


def layer_kinds(model: torch.nn.Module) -> dict[str, list[torch.nn.Module]]:
    """SmolLM2's coded layers by kind, each kind's layers in model order."""
    kinds: dict[str, list[torch.nn.Module]] = {"q/k/v": [], "o": [], "gate/up": [], "down": []}
    for layer in model.model.layers:
        kinds["q/k/v"].append(layer.self_attn.qkv_proj)
        kinds["o"].append(layer.self_attn.o_proj)
        kinds["gate/up"].append(layer.mlp.gate_up_proj)
        kinds["down"].append(layer.mlp.down_proj)
    kinds["LM head"] = [model.lm_head]
    return kinds


def cpu() -> str:
    """The CPU's name, family and model (an "AMD EPYC" may be any Zen)."""
    fields = cpu_fields()
    return f"{cpu_model()} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def call(layer: torch.nn.Module, x: torch.Tensor) -> None:
    torch.ops.specdec.gguf_weights_linear(x, layer.packed, layer.out_features, layer.bits)


def seconds_per_call(layers: list[torch.nn.Module], x: torch.Tensor, calls: int) -> float:
    rounds = max(1, calls // len(layers))
    start = time.perf_counter()
    for _ in range(rounds):
        for layer in layers:
            call(layer, x)
    return (time.perf_counter() - start) / (rounds * len(layers))


def row_counts(text: str) -> list[int]:
    rows = sorted({int(part) for part in text.split(",")})
    if not rows or rows[0] < 1 or rows[-1] > gguf.MAX_ROWS:
        raise argparse.ArgumentTypeError(f"rows between 1 and {gguf.MAX_ROWS}, comma-separated")
    return rows if rows[0] == 1 else [1, *rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_counts, default=[1, 2, 4, 8, 16], help="input rows per call (default 1,2,4,8,16)")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds (default 15)")
    args = parser.parse_args()
    found = threads_for_timing()
    ok, variant = gguf.available()
    if not ok:
        raise SystemExit(f"the GGUF-code kernel is not available here: {variant}")
    model = fast.prepare(zoo.load("zoo:smollm2")[0])
    print(f"{cpu()}; {variant}; {found}")
    print(f"DRAM triad {bench.dram_bandwidth() / 1e9:.1f} GB/s")
    print(f"{'layer':8s} {'MB':>6s} {'rows':>4s} {'us/call':>8s} {'GB/s':>6s} {'x 1 row':>8s}")
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for kind, layers in layer_kinds(model).items():
            inputs = {rows: torch.randn(rows, layers[0].in_features, generator=generator) for rows in args.rows}
            calls = 4 * len(layers) if len(layers) > 1 else 8
            times: dict[int, list[float]] = {rows: [] for rows in args.rows}
            for i in range(args.rounds + 1):  # the first round is the warm-up
                for rows in args.rows:
                    seconds = seconds_per_call(layers, inputs[rows], calls)
                    if i:
                        times[rows].append(seconds)
            megabytes = layers[0].packed.numel() / 1e6
            for rows in args.rows:
                median = statistics.median(times[rows])
                ratio = statistics.median(t / one for t, one in zip(times[rows], times[1]))
                print(f"{kind:8s} {megabytes:6.2f} {rows:4d} {median * 1e6:8.1f} {megabytes / 1e3 / median:6.1f} {ratio:8.2f}")


if __name__ == "__main__":
    main()
