"""vLLM's CPU server beside the reference's fast path (benchmarks/vllm_vs_fast.py), same pair and prompts.

This checks the benchmark, not the speeds: greedy identity is asserted; tokens/s are reported in
the terminal summary, not asserted. So the servers run with ``--vllm-eager`` (no torch.compile
while they start, about a minute less each on 2 cores; lesson 8 starts compiled servers), and the
fast reference is not compiled (bf16-stored weights on the zoo pair; ``--compile`` took four more
minutes of CI from a cold torch.compile cache, and the compiled path has its own tests in
tests/test_fast.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_ref.kernels import bf16 as bf16_weights

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vllm_vs_fast.py"
PROMPTS = 2


def test_vllm_and_the_fast_reference_side_by_side(model_pair, vllm_launcher, vllm_report, tmp_path):
    target, draft = model_pair
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--target", target, "--draft", draft, "--prompts", str(PROMPTS),
         "--k", "4", "--max-new-tokens", "48", "--vllm-eager", "--json", str(tmp_path / "summary.json")],
        capture_output=True, text=True, timeout=1800, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    for label in ("baseline", "speculative"):
        for name in ("vllm", "eager", "fast"):
            assert summary[label][name]["tokens_per_second"] > 0
            # float32 on both sides: every method reproduces the eager greedy output.
            assert summary[label][name]["identical_to_eager_baseline"] == PROMPTS, (label, name)
    assert summary["fast_path"] != "the eager model" and summary["vllm_compiled"] is False
    if target == "zoo:target":  # bf16-valued weights, read as bf16 where the kernel builds (AVX-512 or AVX2)
        assert summary["fast_path"] == ("bf16-stored weights (50 of 50 linear layers)" if bf16_weights.available()[0]
                                        else "prepacked oneDNN weights")
    lines = result.stdout.strip().splitlines()
    assert any(line.startswith("baseline") and "vllm" in line and "fast" in line for line in lines)
    assert "vLLM ran without torch.compile (--enforce-eager)" in result.stdout
    vllm_report.extend(line for line in lines if not line.startswith("JSON written"))
