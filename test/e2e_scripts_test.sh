#!/usr/bin/env bash
# The time-to-accuracy scripts, without root or a run: they parse, their
# shared helpers answer as the runs rely on, every compressor name the docs'
# commands pass to --only is one the scripts know, and (given the trainer)
# the scripts' list covers the registry and passes flags the trainer has.
#   e2e_scripts_test.sh [TRAIN]
# shellcheck disable=SC2016  # (the checks grep the scripts for literal "$variables")
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
failures=0
expect() {  # expect DESCRIPTION ACTUAL WANTED
  if [ "$2" != "$3" ]; then
    echo "FAIL: $1: got '$2', want '$3'"
    failures=$((failures + 1))
  fi
}

for script in bench/e2e/run.sh bench/e2e/two_nodes.sh bench/e2e/torch.sh bench/e2e/validate.sh bench/e2e/common.sh; do
  bash -n "$script" || { echo "FAIL: $script does not parse"; failures=$((failures + 1)); }
done

# shellcheck source=bench/e2e/common.sh
source bench/e2e/common.sh
expect "burst at 1gbit" "$(burst_of 1gbit)" 512kb
expect "burst at 10gbit" "$(burst_of 10gbit)" 5120kb
expect "burst at 100mbit" "$(burst_of 100mbit)" 114kb
selected topkc-10% "bf16 topkc-10%" && got=yes || got=no
expect "a listed name is selected" "$got" yes
selected topkc "bf16 topkc-10%" && got=yes || got=no
expect "a prefix of a name is not selected" "$got" no
selected thc-4bit "" && got=yes || got=no
expect "an empty list selects everything" "$got" yes
(check_names "bf16 nonesuch" 2>/dev/null) && got=accepted || got=refused
expect "an unknown name" "$got" refused

# Repetition K trains with seed K, so repeated runs differ in their training,
# not only in their timing; both scripts pass the shared flags before the
# user's (whose own --seed, passed after --, still wins).
set_run_flags 0.88 2
expect "the shared trainer flags" "${run_flags[*]}" "--target 0.88 --stop-at-target --epochs 6 --eval-every 25 --seed 2"
for script in bench/e2e/run.sh bench/e2e/two_nodes.sh; do
  grep -q 'set_run_flags "$target" "$k"' "$script" && got=yes || got=no
  expect "$script sets the shared flags for repetition K" "$got" yes
  line=$(grep -A1 -- '"${run_flags\[@\]}"' "$script" | tr -d '\n')
  [[ $line == *'"${run_flags[@]}"'*'"${extra[@]}"'* ]] && got=yes || got=no
  expect "$script passes the shared flags before the user's" "$got" yes
done

# OpenBLAS's kernels come from the CPU's vector units, and both scripts hand
# the choice to every rank.
cpuinfo=$(mktemp)
printf 'flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n' >"$cpuinfo"
expect "kernels for AVX-512" "$(blas_kernels "$cpuinfo")" SkylakeX
printf 'flags\t\t: fpu sse2 avx avx2 fma\n' >"$cpuinfo"
expect "kernels for AVX2" "$(blas_kernels "$cpuinfo")" Haswell
printf 'flags\t\t: fpu sse2 sse3 avx512_fake\n' >"$cpuinfo"
expect "no choice without AVX2" "$(blas_kernels "$cpuinfo")" ""
rm -f "$cpuinfo"
saved=${OPENBLAS_CORETYPE-unset}
OPENBLAS_CORETYPE=Zen choose_blas_kernels
expect "a user's kernels win" "$OPENBLAS_CORETYPE" Zen
expect "mpiexec is told to pass them on" "${blas_env[*]}" "-x OPENBLAS_CORETYPE"
if [ "$saved" = unset ]; then unset OPENBLAS_CORETYPE; else export OPENBLAS_CORETYPE=$saved; fi
grep -q '^choose_blas_kernels$' examples/demo.sh && got=yes || got=no
expect "the demo chooses the kernels as the scripts do" "$got" yes
expect "both of common.sh's launchers pass the BLAS kernels to mpiexec" \
  "$(grep -c 'mpiexec -n [^ ]* "${blas_env\[@\]}"' bench/e2e/common.sh)" 2
for script in bench/e2e/run.sh bench/e2e/two_nodes.sh bench/e2e/validate.sh; do  # (through common.sh's launchers)
  grep -q ' mpiexec -n' "$script" && got=no || got=yes
  expect "$script starts its ranks only through common.sh" "$got" yes
  grep -Eq '(one|two)_node_mpiexec ' "$script" && got=yes || got=no
  expect "$script starts its ranks through common.sh" "$got" yes
done

# Every --only list in the docs names known compressors (torch.sh's: its hooks and fsdp_hooks).
docs=(README.md docs/*.md bench/e2e/results/README.md)
torch_hooks=$(sed -nE '/^(fsdp_)?hooks=\(/,/^\)/p' bench/e2e/torch.sh | grep -o '"[^|"]*|' | tr -d '"|')
while read -r line; do
  names=$(grep -o -- '--only "[^"]*"' <<< "$line" | sed 's/--only "\(.*\)"/\1/')
  if [[ $line == *bench/e2e/torch.sh* ]]; then
    for name in $names; do
      grep -qxF -- "$name" <<< "$torch_hooks" || { echo "FAIL: torch.sh has no hook '$name'"; failures=$((failures + 1)); }
    done
  else
    (check_names "$names") || failures=$((failures + 1))
  fi
done < <(cat "${docs[@]}" | sed -e ':a' -e '/\\$/N; s/\\\n//; ta' | grep -- '--only "[^"]*"')  # (a command continued over lines: one line)
[ "$(cat "${docs[@]}" | grep -c -- '--only "')" -gt 0 ] && got=yes || got=no
expect "the docs have --only lists to check" "$got" yes

# The scripts' list against the trainer: every registered compressor is
# compared (by the name it is given with --compressor), and every flag the
# list passes is one the trainer knows.
if [ $# -ge 1 ]; then
  train=$1
  registered=$("$train" --list-compressors | sort | tr '\n' ' ')
  listed=$(for entry in "${compressors[@]}"; do
    read -ra words <<<"${entry#*|}"
    for ((i = 0; i < ${#words[@]}; i++)); do [ "${words[i]}" = --compressor ] && echo "${words[i + 1]%%:*}"; done
  done | grep -vx auto | sort -u | tr '\n' ' ')  # (auto: the planner, not a compressor)
  expect "the scripts compare every registered compressor" "$listed" "$registered"
  help=$("$train" --help)
  for entry in "${compressors[@]}"; do
    for word in ${entry#*|}; do
      [[ $word == --* ]] || continue
      grep -q -- "^  $word " <<<"$help" && got=yes || got=no
      expect "the trainer knows $word" "$got" yes
    done
  done

  # In process the validation needs no root: a short run of two candidates
  # makes its table, the planner's choice judged against both.
  dir=$(mktemp -d)
  if GRADCOMP_TRAIN=$train bash bench/e2e/validate.sh --in-process --out "$dir" --steps 8 --repeat 1 --ranks 2 \
       --candidates "bf16 topkc" >"$dir/out.txt" 2>&1; then
    for row in "| in-process | bf16 |" "| in-process | topkc |" "| in-process | the planner's choice |" \
               "| in-process | *fastest measured: " "over 3 rows; the choice within 5% of the measured fastest at "; do
      grep -qF -- "$row" "$dir/table.md" && got=yes || got=no
      expect "the in-process validation's table has '$row'" "$got" yes
    done
    runs=("$dir"/in-process__*__r1.csv)
    expect "the in-process validation's runs" "${#runs[@]}" 3
  else
    echo "FAIL: validate.sh --in-process failed:"; cat "$dir/out.txt"
    failures=$((failures + 1))
  fi
  rm -rf "$dir"
fi

if ((failures)); then
  echo "$failures failure(s)"
  exit 1
fi
echo "e2e scripts: all checks passed"
