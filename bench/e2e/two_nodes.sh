#!/usr/bin/env bash
# Time-to-accuracy on two emulated nodes: ranks 0-1 on node A, ranks 2-3 on
# node B. Each node is a network namespace; the two are joined by a veth pair
# shaped with tc (token bucket, both directions) to the inter-node rate, while
# ranks of one node talk over shared memory, unshaped. OpenMPI
# starts one daemon per node through an "rsh agent" that enters the node's
# namespace (ip netns exec), so MPI sees two hosts.
#
# OpenMPI is told to yield when idle: each emulated node has as many slots as
# ranks, so it would not see the oversubscription of the real cores and would
# spin, which once made steps four to six times longer. Each daemon also gets its own host
# name (a UTS namespace), so that the shared-memory transport of one node
# does not collide with the other's.
#
# Rows: flat and hierarchical (--ranks-per-node 2), for bf16 and each
# compressor of --only (names from common.sh); COMPRESSOR~hier is the
# hierarchical run, and its speedup is over bf16~hier. Classic TopK does not
# shard, and runs flat only. Medians and ranges over --repeat runs; run K
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

# Two namespaces, a veth pair between them, and host names that resolve inside.
tag=$$
a=gcA$tag
b=gcB$tag
agent=$(mktemp)
cleanup() {
  ip netns del "$a" 2>/dev/null || true
  ip netns del "$b" 2>/dev/null || true
  rm -rf "/etc/netns/$a" "/etc/netns/$b" "$agent"
}
trap cleanup EXIT
ip netns add "$a"
ip netns add "$b"
ip link add "va$tag" netns "$a" type veth peer name "vb$tag" netns "$b"
ip -n "$a" addr add 10.77.0.1/24 dev "va$tag"
ip -n "$b" addr add 10.77.0.2/24 dev "vb$tag"
for ns in "$a" "$b"; do
  ip -n "$ns" link set lo up
  mkdir -p "/etc/netns/$ns"
  printf '127.0.0.1 localhost\n10.77.0.1 %s\n10.77.0.2 %s\n' "$a" "$b" >"/etc/netns/$ns/hosts"
done
ip -n "$a" link set "va$tag" up
ip -n "$b" link set "vb$tag" up

# OpenMPI's rsh agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace.
cat >"$agent" <<'AGENT'
#!/bin/sh
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname $host && $*"
AGENT
chmod +x "$agent"

mkdir -p "$out"
rm -f "$out"/*.csv
for rate in $rates; do
  for side in "$a:va$tag" "$b:vb$tag"; do
    ns=${side%%:*} dev=${side#*:}
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$rate" burst "$(burst_of "$rate")" latency 50ms
  done
  for entry in "${compressors[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    selected "$name" "$only" || continue
    for level in flat hier; do
      [ "$level" = hier ] && [[ $name == topk-* || $name == auto ]] && continue  # (neither runs in two levels)
      label=$name
      level_flags=()
      [ "$level" = hier ] && label="$name~hier" && level_flags=(--ranks-per-node 2)
      for ((k = 1; k <= repeat; k++)); do
        echo "== $rate: $label (run $k of $repeat)"
        set_run_flags "$target" "$k"
        # shellcheck disable=SC2086
        ip netns exec "$a" mpiexec -n 4 --host "$a:2,$b:2" --allow-run-as-root --bind-to none "${blas_env[@]}" \
          --mca plm_rsh_agent "$agent" --mca mpi_yield_when_idle 1 --mca btl vader,tcp,self \
          --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
          "$train" --backend mpi $flags "${level_flags[@]}" "${run_flags[@]}" \
          --out "$out/${rate}__${label}__r$k.csv" "${extra[@]}" | tail -1
      done
    done
  done
done

python3 bench/e2e/report.py --target "$target" --csv "$out/e2e.csv" "$out"/*__*.csv
