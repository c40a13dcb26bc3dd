#!/usr/bin/env bash
# Time-to-accuracy on two emulated nodes: ranks 0-1 on node A, ranks 2-3 on
# node B. Each node is a network namespace; the two are joined by a veth pair
# shaped with tc (token bucket, both directions) to the inter-node rate, while
# ranks of one node talk over shared memory, unshaped. OpenMPI
# starts one daemon per node through an "rsh agent" that enters the node's
# namespace (ip netns exec), so MPI sees two hosts (common.sh's
# make_two_nodes and two_node_mpiexec).
#
# Rows: flat and hierarchical (--ranks-per-node 2), for bf16 and each
# compressor of --only (names from common.sh); COMPRESSOR~hier is the
# hierarchical run, and its speedup is over bf16~hier (auto~hier: the
# planner's choice for two levels). Classic TopK does not shard, and runs
# flat only. Medians and ranges over --repeat runs; run K
# trains with --seed K, so the ranges cover the training's own variation.
#
#   sudo bench/e2e/two_nodes.sh [--out DIR] [--rates "1gbit 10gbit"] [--target 0.85] [--repeat 3]
#                               [--only "topkc-10% thc-4bit"] [-- train flags]
#
# Needs root, iproute2 (ip, tc), unshare, OpenMPI and python3; creates and deletes its
# namespaces.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=e2e-two-nodes
rates="1gbit 10gbit"
target=0.85
repeat=3
only="topkc-10% thc-4bit"
extra=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--out DIR] [--rates LIST] [--target ACC] [--repeat N] [--only NAMES]" \
         "[-- train flags]" >&2; exit 2 ;;
  esac
done
only="bf16 $only"  # the baseline of both levels

source bench/e2e/common.sh
check_names "$only"
prepare ip tc mpiexec unshare python3

make_two_nodes

mkdir -p "$out"
rm -f "$out"/*.csv
for rate in $rates; do
  shape_two_nodes "$rate"
  for entry in "${compressors[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    selected "$name" "$only" || continue
    for level in flat hier; do
      [ "$level" = hier ] && [[ $name == topk-* ]] && continue  # (classic TopK does not shard)
      label=$name
      level_flags=()
      [ "$level" = hier ] && label="$name~hier" && level_flags=(--ranks-per-node 2)
      for ((k = 1; k <= repeat; k++)); do
        echo "== $rate: $label (run $k of $repeat)"
        set_run_flags "$target" "$k"
        # shellcheck disable=SC2086
        two_node_mpiexec 4 "$train" --backend mpi $flags "${level_flags[@]}" "${run_flags[@]}" \
          --out "$out/${rate}__${label}__r$k.csv" "${extra[@]}" | tail -1
      done
    done
  done
done

python3 bench/e2e/report.py --target "$target" --csv "$out/e2e.csv" "$out"/*__*.csv
