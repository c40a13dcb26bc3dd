#!/usr/bin/env bash
# Time-to-accuracy under a real bandwidth limit.
#
# Trains the Fashion-MNIST MLP with 4 MPI ranks (--ranks N) talking TCP over the loopback
# of a private network namespace, whose loopback is shaped with tc (token
# bucket) to each rate in turn, once per compressor, until the target test
# accuracy; then prints one table (time-to-accuracy, speedup over bf16, final
# accuracy, wire bytes per step, share of time in compression) and writes
# e2e.csv and e2e.png to the output folder. --repeat N runs every
# configuration N times, repetition K with --seed K (another initialization and
# data order, so the ranges cover the training's own variation, not only the
# timing's; the table gives medians and ranges); --overlap-both
# runs each compressor also with --overlap off (COMPRESSOR~no-overlap) and
# prints the two side by side; --only "bf16 topkc-10%" limits the compressors.
#
#   sudo bench/e2e/run.sh [--out DIR] [--rates "unshaped 10gbit 1gbit"] [--target 0.85] [--repeat N]
#                         [--ranks N] [--overlap-both] [--only "NAMES"] [-- more train flags]
#
# Needs root (network namespaces, tc) and iproute2, OpenMPI, gnuplot; creates
# and deletes its own namespace. GRADCOMP_TRAIN=path runs that trainer
# instead of build/examples/train (sudo keeps it with sudo --preserve-env).
set -euo pipefail
cd "$(dirname "$0")/../.."

out=e2e-results
rates="unshaped 10gbit 1gbit"
target=0.85
repeat=1
ranks=4
overlap_modes=(auto)
only=""
extra=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --overlap-both) overlap_modes=(on off); shift ;;
    --only) only=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--out DIR] [--rates LIST] [--target ACC] [--repeat N] [--ranks N] [--overlap-both]" \
         "[--only NAMES] [-- train flags]" >&2; exit 2 ;;
  esac
done

[[ $ranks =~ ^[1-9][0-9]*$ ]] || { echo "$0: --ranks takes a positive number, not '$ranks'" >&2; exit 2; }

source bench/e2e/common.sh
check_names "$only"
prepare ip tc mpiexec gnuplot python3

ns=gradcomp-e2e-$$
make_namespace "$ns"

mkdir -p "$out"
rm -f "$out"/*.csv
for rate in $rates; do
  shape_loopback "$ns" "$rate"
  for entry in "${compressors[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    selected "$name" "$only" || continue
    for overlap in "${overlap_modes[@]}"; do
      label=$name
      [ "$overlap" = off ] && label="$name~no-overlap"
      for ((k = 1; k <= repeat; k++)); do
        file="$out/${rate}__${label}.csv"
        ((repeat > 1)) && file="$out/${rate}__${label}__r$k.csv"
        echo "== $rate: $label${repeat:+ (run $k of $repeat)}"
        set_run_flags "$target" "$k"
        # shellcheck disable=SC2086
        one_node_mpiexec "$ns" "$ranks" "$train" --backend mpi $flags --overlap "$overlap" "${run_flags[@]}" --out "$file" "${extra[@]}" | tail -1
      done
    done
  done
done

python3 bench/e2e/report.py --target "$target" --plot "$out/e2e.png" --csv "$out/e2e.csv" "$out"/*__*.csv
