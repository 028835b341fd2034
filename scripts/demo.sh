#!/usr/bin/env bash
# Set up .venv if missing, then run the main demo on the shipped zoo models:
# a streamed speculative generation, baseline vs speculative vs transformers, the roofline.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
bash scripts/setup_env.sh
exec .venv/bin/python -m specdec_ref demo "$@"
