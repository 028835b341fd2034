#!/usr/bin/env bash
# Create the separate virtual environment that runs llama.cpp (through
# llama-cpp-python) for the side-by-side benchmark benchmarks/llamacpp_vs_fast.py.
#
# Usage: scripts/setup_llamacpp_env.sh [DIR]      (default: .venv-llamacpp in the repo)
#
# llama.cpp gets its own environment: the course never imports it, and the
# registry here serves llama-cpp-python only as a source package, which builds
# llama.cpp with CMake (about 8 minutes on 2 cores; run at `nice -n 19` so that
# timings running beside it on the machine suffer least). Idempotent: a finished
# install (stamp file holding the spec and the CPU build flags) is left alone, a
# broken or half-finished one is built again.
#
# CPU flags: GGML_NATIVE=ON (-march=native) built a library that died with an
# illegal instruction on an AMX Xeon under KVM (issue 53). So the build is
# portable (GGML_NATIVE=OFF) with AVX2/FMA/F16C on, and each AVX-512 extension
# (F, VNNI, BF16) on only where /proc/cpuinfo lists its flag; AMX is always off.
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMACPP_SPEC="llama-cpp-python==0.3.36"
venv="${1:-.venv-llamacpp}"
stamp="$venv/.specdec-installed"

has_flag() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -qx "$1"; }
on_if() { if has_flag "$1"; then echo ON; else echo OFF; fi; }
avx512=$(on_if avx512f)
vnni=OFF; bf16=OFF
if [ "$avx512" = ON ]; then vnni=$(on_if avx512_vnni); bf16=$(on_if avx512_bf16); fi
cmake_args="-DGGML_NATIVE=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF"
cmake_args+=" -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=$(on_if bmi2)"
cmake_args+=" -DGGML_AVX512=$avx512 -DGGML_AVX512_VNNI=$vnni -DGGML_AVX512_BF16=$bf16 -DGGML_AVX512_VBMI=OFF"
cmake_args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
cmake_args+=" -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF"
# LLAVA_BUILD=OFF: no multimodal library (mtmd), which only image chat loads.
cmake_args+=" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
wanted="$LLAMACPP_SPEC $cmake_args"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
start=$(date +%s)
[ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
echo "building $LLAMACPP_SPEC with CMAKE_ARGS=$cmake_args (about 8 minutes on 2 cores)"
# --no-binary: a wheel left in pip's cache by an earlier build with other flags
# must not be reused; --no-cache-dir keeps this build's wheel out of it too.
CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  nice -n 19 "$venv/bin/python" -m pip install --quiet --no-cache-dir \
    --no-binary llama-cpp-python --force-reinstall --no-deps "$LLAMACPP_SPEC"
"$venv/bin/python" -m pip install --quiet "$LLAMACPP_SPEC"  # its Python dependencies (numpy, jinja2, diskcache)
# Loading the library runs ggml's CPU backend registration: where a wrong
# instruction set was compiled in, this is where it dies (illegal instruction).
"$venv/bin/python" -c 'import llama_cpp; print("llama_cpp", llama_cpp.__version__, "system_info:", llama_cpp.llama_print_system_info().decode())'
echo "$wanted" > "$stamp"
echo "llama.cpp environment ready: $venv ($(( $(date +%s) - start )) s)"
