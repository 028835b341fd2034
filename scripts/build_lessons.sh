#!/usr/bin/env bash
# Execute every lesson (or those named) into out/lessons/NN_name.html for reading.
#   bash scripts/build_lessons.sh                # all lessons
#   bash scripts/build_lessons.sh 02_ 05_        # lessons whose file name contains 02_ or 05_
# The committed notebooks stay clean; executed copies live under out/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PATH="$PWD/.venv/bin:$PATH"
[ -x .venv/bin/jupyter ] || { echo "no .venv: run 'bash scripts/setup_env.sh' first" >&2; exit 1; }

patterns=("$@")
wanted() {  # is lesson $1 among those asked for (all when none were named)?
    [ ${#patterns[@]} -eq 0 ] && return 0
    local p
    for p in "${patterns[@]}"; do [[ "$1" == *"$p"* ]] && return 0; done
    return 1
}

mkdir -p out/lessons
status=0
for notebook in notebooks/[0-9]*.ipynb; do
    name=$(basename "$notebook" .ipynb)
    wanted "$name" || continue
    start=$SECONDS
    # The kernel runs in notebooks/, as in JupyterLab; a failing cell fails this lesson only.
    if jupyter nbconvert --to html --execute --ExecutePreprocessor.timeout=600 \
        --ExecutePreprocessor.kernel_name=python3 --output-dir out/lessons --log-level=WARN "$notebook"; then
        echo "$name: out/lessons/$name.html ($((SECONDS - start)) s)"
    else
        echo "$name: FAILED after $((SECONDS - start)) s" >&2
        status=1
    fi
done
exit $status
