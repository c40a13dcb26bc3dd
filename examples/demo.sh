#!/usr/bin/env bash
# The demo: installs what it needs, builds, and runs four simulated ranks
# through the fp32, fp16 and bf16 baselines on this machine's CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/install-deps
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target quickstart
./build/examples/quickstart "$@"
