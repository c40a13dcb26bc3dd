#!/usr/bin/env bash
# The Python package as a user installs it: a fresh virtual environment that
# sees the PyTorch already installed, `pip install --no-build-isolation` of
# this checkout, then `python -m gradcomp` and the DDP and FSDP tests, run from
# / against the installed copy (GRADCOMP_EXPECT_INSTALLED: the tests refuse a
# gradcomp found anywhere else, which is checked first with the build tree's
# package). The tests' own helper module (gradcomp_c10d_tests, the reference
# reductions) still comes from the CMake build.
#
#   bash test/torch/installed_test.sh [BUILD_DIR]   (default: build)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
venv=$root/build-venv
pip=(--disable-pip-version-check --root-user-action=ignore -q)

rm -rf "$venv"
python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install "${pip[@]}" "scikit-build-core>=0.10"
# The build directory sits beside the CMake build's, and the compilers,
# their Release flags and the CUDA architectures are the ones it used, by
# the same paths, so ccache serves the module's objects from that build (it
# takes c++ and g++ for two compilers).
defines=()
for variable in CMAKE_CXX_COMPILER CMAKE_CXX_FLAGS_RELEASE CMAKE_CUDA_COMPILER CMAKE_CUDA_FLAGS_RELEASE \
  CMAKE_CUDA_ARCHITECTURES; do
  value=$(sed -n "s/^${variable}:[A-Z]*=//p" "$build/CMakeCache.txt")
  [ -n "$value" ] && defines+=(-C "cmake.define.${variable}=$value")
done
"$venv/bin/pip" install "${pip[@]}" --no-build-isolation -C build-dir="$root/build-wheel" "${defines[@]}" "$root"

cd /
export GRADCOMP_EXPECT_INSTALLED=1 OMP_NUM_THREADS=1
tests=$root/test/torch
if [ -d "$build/python/gradcomp" ] &&
  PYTHONPATH=$build/python:$tests "$venv/bin/python" -c "import gloo_ranks" 2>/dev/null; then
  echo "FAIL: the tests accepted gradcomp from the build tree $build/python" >&2
  exit 1
fi
export PYTHONPATH=$build/test/torch
"$venv/bin/python" -m gradcomp
"$venv/bin/python" "$tests/ddp_test.py"
"$venv/bin/python" "$tests/ddp_errors_test.py"
"$venv/bin/python" "$tests/ddp_auto_test.py"
"$venv/bin/python" "$tests/ddp_compile_test.py"
"$venv/bin/python" "$tests/fsdp_test.py"
