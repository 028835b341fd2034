#!/usr/bin/env bash
# Set up everything the tests need (when missing) and run the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k greedy`.
# Each phase prints its wall time; pytest ends with the time per test file.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
phase() { local start=$SECONDS; "$@"; echo "[phase] $* took $((SECONDS - start)) s"; }
# vLLM's CPU build, in its own environment, for the tests against a real server (tests/integration),
# installed beside the course's environment (two pip installs at once: about a minute saved).
vllm_log=$(mktemp)
start=$SECONDS
bash scripts/setup_vllm_env.sh >"$vllm_log" 2>&1 &
vllm_setup=$!
phase bash scripts/setup_env.sh
if ! wait $vllm_setup; then cat "$vllm_log" >&2; exit 1; fi
cat "$vllm_log"; rm -f "$vllm_log"
echo "[phase] bash scripts/setup_vllm_env.sh (beside the one above) done after $((SECONDS - start)) s"
# nbgrader runs alembic as a subprocess: the environment's bin/ must be on PATH.
export PATH="$PWD/.venv/bin:$PATH"
# Two pytest runs at once (tests/conftest.py splits the tests): the vLLM servers' tests, about
# one core for ten minutes, beside the lessons and then everything else. The vLLM run's report
# follows the main one's; the exit status is the worse of the two (5, nothing selected, is fine).
scratch=$(mktemp -d)
.venv/bin/python -m pytest --stream vllm -p no:cacheprovider --basetemp "$scratch/tmp" "$@" >"$scratch/vllm.log" 2>&1 &
vllm_tests=$!
trap 'kill $vllm_tests 2>/dev/null || true' INT TERM
main_status=0; .venv/bin/python -m pytest --stream main "$@" || main_status=$?
vllm_status=0; wait $vllm_tests || vllm_status=$?
echo "======== the vLLM stream (tests/integration and lesson 8), run beside the above ========"
cat "$scratch/vllm.log"; rm -rf "$scratch"
for status in $main_status $vllm_status; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
if [ "$main_status" -eq 5 ] && [ "$vllm_status" -eq 5 ]; then exit 5; fi
