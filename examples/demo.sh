#!/usr/bin/env bash
# The demo: installs what it needs, builds, and trains an MLP on Fashion-MNIST
# with four in-process ranks, once through the bf16 baseline and once through
# TopK-Chunked, printing time-to-accuracy for each. Extra arguments go to
# both runs (e.g. --epochs 3 --target 0.86); see examples/train/main.cpp.
set -euo pipefail
cd "$(dirname "$0")/.."

bash .ci/install-deps
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_NATIVE_ARCH=ON >/dev/null
cmake --build build --target train

# OpenBLAS falls back to its generic SSE3 kernels on CPUs newer than itself;
# the time-to-accuracy scripts' helper picks the ones for this CPU's vector
# units (a user's choice wins).
# shellcheck source=bench/e2e/common.sh
source bench/e2e/common.sh
choose_blas_kernels

for run in "--compressor bf16" "--compressor topkc --fraction 0.1"; do
  echo
  echo "== train $run $*"
  # shellcheck disable=SC2086
  ./build/examples/train $run --ranks 4 --epochs 3 --eval-every 50 "$@"
done
