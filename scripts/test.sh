#!/usr/bin/env bash
# Set up everything the tests need (when missing) and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k greedy`.
# Each phase prints its wall time; pytest ends with the time per test file.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
phase() { local start=$SECONDS; "$@"; echo "[phase] $* took $((SECONDS - start)) s"; }
phase bash scripts/setup_env.sh
# vLLM's CPU build, in its own environment, for the tests against a real server (tests/integration).
phase bash scripts/setup_vllm_env.sh
# nbgrader runs alembic as a subprocess: the environment's bin/ must be on PATH.
export PATH="$PWD/.venv/bin:$PATH"
exec .venv/bin/python -m pytest "$@"
