"""The way to run a model that is quickest on this machine, measured at load.

Three ways compute the same model: PyTorch's stock layers ("eager"), few-row layers computed
weights-first (:mod:`specdec_ref.kernels.weights_first`) and the fast path
(:mod:`specdec_ref.kernels.fast`: GGUF codes or bf16 copies read as stored). Which is quickest
depends on the CPU: weights-first made a one-token SmolLM2 step 0.65 of the stock one on an AMD
Zen 5 and about twice the stock one on an Intel Xeon with AMX (``docs/BENCHMARKS.md``), and the fast
path applies only to weights it can read as stored. :func:`fastest_path` times what speculative
decoding runs, a decode step and a verification pass, on each way that applies, and keeps the
quickest. Every way sums in its own order: greedy output is exact against a baseline on the same
way, and may differ from another way's at a near-tie.
"""
from __future__ import annotations

import statistics
import warnings
from dataclasses import dataclass

import torch

from ..roofline import measure_forward_seconds
from . import fast
from .weights_first import is_weights_first, weights_first

PATHS = ("eager", "weights-first", "fast")


@dataclass(frozen=True)
class PathChoice:
    """The way chosen to run a model, and what each way that applies measured."""

    name: str  # one of PATHS
    model: torch.nn.Module  # the model on that way (sharing the original's weights)
    seconds: dict[str, float]  # per way measured: one decode step plus one verification pass, median of rounds
    verify_tokens: int  # tokens of the verification pass timed
    skipped: dict[str, str]  # per way not measured: why

    def reason(self) -> str:
        """One line: which way runs and why, e.g. for a command's output."""
        if len(self.seconds) < 2:
            why = "; ".join(f"{name}: {why}" for name, why in self.skipped.items())
            return f"{self.name}: the only way that applies here ({why})"
        others = ", ".join(f"{1e3 * s:.1f} ms {name}" for name, s in self.seconds.items() if name != self.name)
        return (f"{self.name}: a decode step plus a {self.verify_tokens}-token verification pass took "
                f"{1e3 * self.seconds[self.name]:.1f} ms, against {others} (measured at load)")


def on_path(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """``model`` run the way ``path`` names (one of :data:`PATHS`): itself, or a copy sharing its weights."""
    if path == "eager":
        return model
    if path == "weights-first":
        return weights_first(model)
    if path == "fast":
        usable, reason = fast.available(model)
        if not usable:
            raise ValueError(f"the fast path does not apply: {reason}")
        return fast.prepare(model)
    raise ValueError(f"unknown path {path!r}; choose one of {', '.join(PATHS)}")


@torch.inference_mode()
def fastest_path(model: torch.nn.Module, verify_tokens: int = 4, context: int = 64, rounds: int = 3) -> PathChoice:
    """Time each way of running ``model`` that applies (:data:`PATHS`) and return the quickest.

    A way's time is one decode step plus one ``verify_tokens``-token pass on a ``context``-token
    cache (each the median of three passes after a warm-up), the median over ``rounds`` rounds in
    which the ways take turns going first. Off the CPU only the eager model applies."""
    candidates: dict[str, torch.nn.Module] = {"eager": model}
    skipped: dict[str, str] = {}
    if model.device.type != "cpu":
        skipped["weights-first, fast"] = f"CPU kernels, and the model is on {model.device.type}"
    else:
        few_rows = weights_first(model)
        if is_weights_first(few_rows):
            candidates["weights-first"] = few_rows
        else:
            skipped["weights-first"] = "no float32 linear layer to compute weights-first"
        usable, reason = fast.available(model)
        if usable:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", fast.FastPathWarning)
                prepared = fast.prepare(model)
            if prepared is model:
                skipped["fast"] = str(caught[-1].message) if caught else "the fast path kept the eager model"
            else:
                candidates["fast"] = prepared
        else:
            skipped["fast"] = reason
    timings: dict[str, list[float]] = {name: [] for name in candidates}
    names = list(candidates)
    for i in range(rounds if len(names) > 1 else 0):
        for name in names[i % len(names):] + names[:i % len(names)]:
            candidate = candidates[name]
            timings[name].append(measure_forward_seconds(candidate, context, 1, repeats=3)
                                 + measure_forward_seconds(candidate, context, verify_tokens, repeats=3))
    seconds = {name: statistics.median(times) for name, times in timings.items() if times}
    name = min(seconds, key=seconds.get) if seconds else "eager"
    return PathChoice(name, candidates[name], seconds, verify_tokens, skipped)
