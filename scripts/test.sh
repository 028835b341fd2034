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
# The course's caches, which the first test of each kind would otherwise build inside a stream on
# one core: SmolLM2 converted from its GGUF file (about 30 s), the C++ kernels in the two variants
# the tests load (about 25 s each), the held-out prompts' corpus (about 13 s). Built here, while
# vLLM's environment installs, two processes at a time.
warm_caches() {
    local py=".venv/bin/python" warm="OMP_NUM_THREADS=1 MKL_NUM_THREADS=1"
    local kernels="from specdec_ref.kernels import bf16, gguf; bf16.available(); gguf.available()"
    # The tests build no AVX2 variant of these (llama_pass, eagle_chain: one-call passes and drafts, on the above).
    local attention="from specdec_ref.kernels import attention, eagle_chain, llama_pass"
    attention+="; attention.available(); llama_pass.available(); eagle_chain.available()"
    # A failure here is not the suite's: the tests that need the cache build it again and say why.
    { env $warm $py -c "from specdec_ref import zoo; zoo.load('zoo:smollm2')" >/dev/null 2>&1 \
        || echo "warm-up: converting SmolLM2 failed (its tests will say why)"
      env $warm $py -c "from specdec_ref.zoo.corpus import cached_corpus; cached_corpus()" || true; } &
    local models=$!
    env $warm $py -c "$kernels; $attention" && env $warm SPECDEC_BF16_KERNEL=avx2 $py -c "$kernels" || true
    wait $models
}
phase warm_caches
if ! wait $vllm_setup; then cat "$vllm_log" >&2; exit 1; fi
cat "$vllm_log"; rm -f "$vllm_log"
echo "[phase] bash scripts/setup_vllm_env.sh (beside the one above) done after $((SECONDS - start)) s"
# nbgrader runs alembic as a subprocess: the environment's bin/ must be on PATH.
export PATH="$PWD/.venv/bin:$PATH"
# Two pytest runs at once, one per core (tests/conftest.py splits the tests by measured time):
# "side" holds the vLLM servers' tests, lesson 8, the sample class's grading, the instructors' guide
# run as a class of three, and the solutions run as a learner runs them; "main" the rest, lessons
# first. Then the few tests that need an idle machine run alone ("quiet"). The side run's report
# follows the main one's. The script fails with the first failing run's status (5, nothing
# selected, is not a failure unless all three selected nothing).
scratch=$(mktemp -d)
phase_start=$SECONDS
# The side run grades one notebook at a time until this file exists, then two (tests/conftest.py).
export SPECDEC_MAIN_STREAM_DONE="$scratch/main-stream-done"
.venv/bin/python -m pytest --stream side -p no:cacheprovider --basetemp "$scratch/tmp" "$@" >"$scratch/side.log" 2>&1 &
side_tests=$!
trap 'kill $side_tests 2>/dev/null || true' INT TERM
main_status=0; .venv/bin/python -m pytest --stream main "$@" || main_status=$?
touch "$SPECDEC_MAIN_STREAM_DONE"
echo "[phase] the main stream ended after $((SECONDS - phase_start)) s"
side_status=0; wait $side_tests || side_status=$?
echo "======== the side stream (vLLM servers, lesson 8, grading, the class of three, the learner path), run beside the above ========"
cat "$scratch/side.log"; rm -rf "$scratch"
echo "[phase] the main and side streams took $((SECONDS - phase_start)) s"
echo "======== the quiet stream: tests that need an idle machine, run alone ========"
phase_start=$SECONDS
quiet_status=0; .venv/bin/python -m pytest --stream quiet -p no:cacheprovider "$@" || quiet_status=$?
echo "[phase] the quiet stream took $((SECONDS - phase_start)) s"
statuses="$main_status $side_status $quiet_status"
for status in $statuses; do
    if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
done
if [ "$statuses" = "5 5 5" ]; then exit 5; fi
