#!/usr/bin/env bash
# The GPU check: builds for sm_90, runs the gpu-labelled tests and the CUDA
# benchmarks, and prints one summary table last.
#
#   test/gpu/check.sh prepare   on a machine without a GPU (no GPU needed):
#                               builds the binaries into .gpu-kit/bin with the
#                               shared libraries a bare GPU machine may lack,
#                               plus doctest / Google Benchmark for a rebuild.
#                               BUILD_DIR=build takes them from an existing
#                               build tree configured for sm_90 instead.
#   test/gpu/check.sh [run]     on the GPU machine: runs the kit's binaries, or
#                               builds them there first (CMake, ninja, nvcc;
#                               no network) when the kit has none.
#   test/gpu/check.sh profile   on the GPU machine, after run or prepare: Nsight
#                               Compute's time and DRAM traffic per kernel of
#                               the 64M rows named in $ROWS (CSV in
#                               $OUT/profile, the table in profile.md).
#   test/gpu/check.sh torch     on the GPU machine: builds the Python module
#                               against its PyTorch (with CUDA buckets) and runs
#                               the DDP hook on CUDA buckets over NCCL
#                               (test/torch/ddp_cuda_test.py; one GPU suffices).
#   test/gpu/check.sh memcheck  on the GPU machine: the gpu tests under
#                               compute-sanitizer's memcheck (memcheck.log).
#   test/gpu/check.sh sass      anywhere (no GPU needed): ptxas's spill report for
#                               every kernel, and per kernel the 16-byte global
#                               loads and stores in its machine code (needs
#                               cuobjdump and nvdisasm: pip install
#                               nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm).
#
# Logs and the benchmark JSON go to $OUT (default .gpu-kit/out).
set -euo pipefail
cd "$(dirname "$0")/../.."
kit=.gpu-kit
out=${OUT:-$kit/out}
arch=${CMAKE_CUDA_ARCHITECTURES:-90}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH

build() {  # build <dir> [cmake args...]
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DGRADCOMP_BUILD_EXAMPLES=OFF "$@" >/dev/null
  cmake --build "$dir" --target gradcomp_gpu_tests gradcomp_bench_cuda
}

python_lib_dirs() {  # NCCL and cuBLAS from the nvidia-* Python packages, where the machine has them there
  python3 - <<'PY' 2>/dev/null || true
import glob, os, nvidia
dirs = set()
for root in nvidia.__path__:
    for lib in ("libnccl.so*", "libcublas.so*", "libcublasLt.so*"):
        dirs.update(os.path.dirname(p) for p in glob.glob(os.path.join(root, "**", lib), recursive=True))
print(":".join(sorted(dirs)))
PY
}

prepare() {
  local dir=${BUILD_DIR:-build-gpu}
  if [ -n "${BUILD_DIR:-}" ]; then
    cmake --build "$dir" --target gradcomp_gpu_tests gradcomp_bench_cuda
  else
    build "$dir"
  fi
  rm -rf "$kit"
  mkdir -p "$kit/bin" "$kit/lib" "$kit/prefix/include" "$kit/prefix/lib/cmake" "$kit/prefix/lib/x86_64-linux-gnu/cmake"
  cp "$dir"/test/gradcomp_gpu_tests "$dir"/bench/gradcomp_bench_cuda "$kit/bin/"
  # Shared libraries outside the C/CUDA runtime that the binaries load
  # (NCCL and cuBLAS come from the GPU machine's Python packages: too big).
  ldd "$kit"/bin/* | awk '/libbenchmark|libgomp|libopenblas|libgfortran|libquadmath/ {print $3}' | sort -u |
    xargs -r -I{} cp -L {} "$kit/lib/"
  # What a rebuild on the GPU machine needs and it lacks: doctest, Google Benchmark.
  cp -r /usr/include/doctest /usr/include/benchmark "$kit/prefix/include/"
  cp -r /usr/lib/cmake/doctest "$kit/prefix/lib/cmake/"
  cp -r /usr/lib/x86_64-linux-gnu/cmake/benchmark "$kit/prefix/lib/x86_64-linux-gnu/cmake/"
  cp -L /usr/lib/x86_64-linux-gnu/libbenchmark.so.1.7.1 /usr/lib/x86_64-linux-gnu/libbenchmark_main.a \
    "$kit/prefix/lib/x86_64-linux-gnu/"
  du -sh "$kit"
}

tests_bin=$kit/bin/gradcomp_gpu_tests
bench_bin=$kit/bin/gradcomp_bench_cuda
binaries() {  # sets LD_LIBRARY_PATH; builds here when the kit's binaries do not load
  local libs nccl
  libs=$(python_lib_dirs)
  nccl=$(echo "$libs" | tr ':' '\n' | grep -m1 nccl || true)
  export LD_LIBRARY_PATH="$PWD/$kit/lib:$PWD/$kit/prefix/lib/x86_64-linux-gnu${libs:+:$libs}:${LD_LIBRARY_PATH:-}"
  if [ -x build-gpu/test/gradcomp_gpu_tests ] && [ ! -x "$tests_bin" ]; then
    tests_bin=build-gpu/test/gradcomp_gpu_tests bench_bin=build-gpu/bench/gradcomp_bench_cuda
  fi
  if [ ! -x "$tests_bin" ] || ldd "$tests_bin" "$bench_bin" | grep -q 'not found'; then
    echo "no prebuilt binaries in $kit that load here: building here"
    build build-gpu -DCMAKE_PREFIX_PATH="$PWD/$kit/prefix" ${nccl:+-DNCCL_ROOT=$(dirname "$nccl")}
    tests_bin=build-gpu/test/gradcomp_gpu_tests bench_bin=build-gpu/bench/gradcomp_bench_cuda
  fi
  mkdir -p "$out"
}

profile() {
  binaries
  local ncu row
  ncu=$(command -v ncu || true)
  for candidate in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -n "$ncu" ] || [ ! -x "$candidate" ] || ncu=$candidate
  done
  [ -n "$ncu" ] || { echo "profile: no ncu here"; return 0; }
  mkdir -p "$out/profile"
  for row in ${ROWS:-bf16 topkc:fraction=0.01 thc:bits=4,block=1024 qsgd_multiscale intsgd}; do
    timeout "${PROFILE_SECONDS:-120}" "$ncu" --clock-control none --csv --page raw --print-units base --print-kernel-base demangled \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__registers_per_thread,launch__grid_size,launch__block_size \
      "$bench_bin" --benchmark_filter="^cuda/${row//./\\.}/67108864(/|\$)" --benchmark_min_time=0.001 \
      >"$out/profile/${row//[^A-Za-z0-9.-]/_}.csv" 2>>"$out/profile.log" || echo "profile: ncu failed on $row (see $out/profile.log)"
  done
  python3 bench/ncu_table.py "$out"/profile/*.csv | tee "$out/profile.md" || true
}

memcheck() {
  binaries
  local sanitizer
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
  [ -n "$sanitizer" ] || { echo "memcheck: no compute-sanitizer here"; return 0; }
  timeout "${MEMCHECK_SECONDS:-120}" "$sanitizer" --tool memcheck --leak-check full "$tests_bin" \
    >"$out/memcheck.log" 2>&1 || true
  grep -E "ERROR SUMMARY|LEAK SUMMARY|test cases:" "$out/memcheck.log" | sed 's/\x1b\[[0-9;]*m//g' ||
    echo "memcheck: no summary (timed out?); see $out/memcheck.log"
}

run() {
  binaries
  nvidia-smi -L 2>/dev/null || echo "nvidia-smi: no GPU listed"

  local status=0 tests
  timeout 240 "$tests_bin" >"$out/gpu_tests.log" 2>&1 || status=$?
  case $status in
    0) tests="passed" ;;
    77) tests="skipped (no CUDA device)" ;;
    *) tests="FAILED (exit $status)"; tail -40 "$out/gpu_tests.log" ;;
  esac
  timeout "${BENCH_SECONDS:-360}" "$bench_bin" --benchmark_min_time=0.1 --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_out="$out/bench_cuda.json" \
    --benchmark_out_format=json >"$out/bench_cuda.log" 2>&1 || echo "benchmark binary failed: see $out/bench_cuda.log"

  echo
  echo "gpu tests: $tests ($(grep -E 'test cases:' "$out/gpu_tests.log" | sed 's/\x1b\[[0-9;]*m//g' | tail -1))"
  python3 bench/table.py "$out/bench_cuda.json"
  [ "$status" = 0 ] || [ "$status" = 77 ]
}

torch_hook() {
  local dir=build-torch
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DGRADCOMP_BUILD_EXAMPLES=OFF -DGRADCOMP_BUILD_TESTS=OFF -DGRADCOMP_BUILD_BENCH=OFF >/dev/null
  cmake --build "$dir" --target gradcomp_torch_python
  PYTHONPATH=$dir/python timeout "${TORCH_SECONDS:-600}" python3 test/torch/ddp_cuda_test.py
}

sass() {
  local dir=build-sass tools
  tools=$(python3 -c 'import glob, os, nvidia; print(":".join({os.path.dirname(p) for r in nvidia.__path__ for p in glob.glob(r + "/**/bin/cuobjdump", recursive=True)}))' 2>/dev/null || true)
  export PATH="${tools:+$tools:}$PATH"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
    -DGRADCOMP_BUILD_EXAMPLES=OFF "-DCMAKE_CUDA_FLAGS=-Xptxas=-v" >/dev/null
  touch test/gpu/*.cu bench/cuda.cu
  cmake --build "$dir" --target gradcomp_gpu_tests gradcomp_bench_cuda 2>&1 | grep -E "bytes spill" | sort | uniq -c
  command -v cuobjdump >/dev/null || { echo "no cuobjdump: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"; return; }
  echo "16-byte loads / stores in the element-wise (transform) kernels:"
  cuobjdump -sass "$dir/bench/gradcomp_bench_cuda" | awk '
    /Function :/ { f = $3; next }
    /LDG\.E\.128/ { l[f]++ } /STG\.E\.128/ { st[f]++ } /STL|LDL/ { local[f]++ }
    END { for (k in l) if (k ~ /transform_kernel/) n++; print n " transform kernels use 16-byte loads";
          for (k in local) m++; print m + 0 " kernels touch local memory (STL/LDL)" }'
}

case "${1:-run}" in
  prepare) prepare ;;
  run) run ;;
  profile) profile ;;
  memcheck) memcheck ;;
  torch) torch_hook ;;
  sass) sass ;;
  *) echo "usage: $0 [prepare|run|profile|memcheck|torch|sass]" >&2; exit 2 ;;
esac
