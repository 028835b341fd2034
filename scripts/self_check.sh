#!/usr/bin/env bash
# A learner's self-check before submitting: run every cell of your notebook and its visible tests
# with nbgrader's own `validate` (what the Validate button of JupyterLab's assignment list runs),
# in the course's environment. Benchmark cells skip themselves, as they do under the grader.
#   bash scripts/self_check.sh exercises/ex01_speculative_loop/ex01_speculative_loop.ipynb
# It prints "Success! Your notebook passes all the tests." or each failing test's error.
# The grader runs more tests than you see: passing here is necessary, not sufficient.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -eq 0 ]; then
    echo "usage: bash scripts/self_check.sh [nbgrader validate options] NOTEBOOK.ipynb [...]" >&2
    exit 2
fi
if [ ! -x "$root/.venv/bin/nbgrader" ]; then
    echo "error: no course environment (.venv): run 'bash scripts/setup_env.sh' first" >&2
    exit 1
fi
notebooks=()
for path in "$@"; do
    if [[ "$path" == -* ]]; then  # an option of nbgrader validate (--invert, --json, ...)
        notebooks+=("$path")
        continue
    fi
    if [ ! -f "$path" ] || [[ "$path" != *.ipynb ]]; then
        echo "error: $path is not a notebook file (.ipynb)" >&2
        exit 2
    fi
    notebooks+=("$(cd "$(dirname "$path")" && pwd)/$(basename "$path")")
done
export SPECDEC_GRADING=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PATH="$root/.venv/bin:$PATH"  # nbgrader runs alembic as a subprocess
# Run outside the course folder: its nbgrader_config.py is the instructor's.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cd "$scratch"
echo "c = get_config()" > nbgrader_config.py
nbgrader validate "${notebooks[@]}"
