#!/usr/bin/env bash
# Every public header compiles on its own with nothing but -I include (CCCL's
# header tests are the model): each .hpp under every C++ compiler given, each
# .cuh under nvcc when given. A header that leans on an include it does not
# make, or on a generated file, fails here.
#   headers_alone.sh INCLUDE_DIR [--cxx COMPILER]... [--nvcc NVCC]
set -uo pipefail
include=$1
shift
cxx=()
nvcc=""
while [ $# -gt 0 ]; do
  case $1 in
    --cxx) cxx+=("$2"); shift 2 ;;
    --nvcc) nvcc=$2; shift 2 ;;
    *) echo "unknown argument $1"; exit 2 ;;
  esac
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0 checked=0
check() {  # check NAME COMMAND...
  local name=$1
  shift
  checked=$((checked + 1))
  if ! "$@" >"$work/out" 2>&1; then
    echo "FAIL: $name"
    head -5 "$work/out"
    failures=$((failures + 1))
  fi
}
cd "$include" || exit 1
for header in $(find gradcomp -name '*.hpp' | sort); do
  printf '#include <%s>\n' "$header" >"$work/alone.cpp"
  for compiler in "${cxx[@]}"; do
    check "$compiler: $header" "$compiler" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I . "$work/alone.cpp"
  done
done
if [ -n "$nvcc" ]; then
  for header in $(find gradcomp -name '*.cuh' | sort); do
    printf '#include <%s>\n' "$header" >"$work/alone.cu"
    check "nvcc: $header" "$nvcc" -std=c++20 -arch=sm_90 -I . -c "$work/alone.cu" -o "$work/alone.o"
  done
fi
echo "$checked header compilations, $failures failed"
[ "$checked" -gt 0 ] && [ "$failures" -eq 0 ]
