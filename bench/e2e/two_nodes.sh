#!/usr/bin/env bash
# Time-to-accuracy on two emulated nodes: ranks 0-1 on node A, ranks 2-3 on
# node B. Each node is a network namespace; the two are joined by a veth pair
# shaped with tc (token bucket, both directions) to the inter-node rate, while
# ranks of one node talk over their namespace's loopback, unshaped. OpenMPI
# starts one daemon per node through an "rsh agent" that enters the node's
# namespace (ip netns exec), so MPI sees two hosts.
#
# Rows: flat and hierarchical (--ranks-per-node 2), for bf16 and each
# compressor given; COMPRESSOR~hier is the hierarchical run, and its speedup
# is over bf16~hier. Medians and ranges over --repeat runs.
#
#   sudo bench/e2e/two_nodes.sh [--out DIR] [--rates "1gbit 10gbit"] [--target 0.85] [--repeat 3]
#                               [--compressors "topkc-10%|--compressor topkc --ratio 0.1 --chunk 256"] [-- train flags]
#
# Needs root, iproute2 (ip, tc), OpenMPI and python3; creates and deletes its
# namespaces.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=e2e-two-nodes
rates="1gbit 10gbit"
target=0.85
repeat=3
entries=("topkc-10%|--compressor topkc --ratio 0.1 --chunk 256" "thc-4bit|--compressor thc --bits 4 --block 1024")
extra=()
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --compressors) IFS=';' read -r -a entries <<<"$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--out DIR] [--rates LIST] [--target ACC] [--repeat N] [--compressors 'NAME|FLAGS;...']" \
         "[-- train flags]" >&2; exit 2 ;;
  esac
done
entries=("bf16|--compressor bf16" "${entries[@]}")

if [ "$(id -u)" -ne 0 ]; then
  echo "$0: needs root to create network namespaces and shape them with tc; run it with sudo" >&2
  exit 1
fi
for tool in ip tc mpiexec python3; do
  command -v "$tool" >/dev/null || { echo "$0: $tool is missing (bash .ci/install-deps installs it)" >&2; exit 1; }
done

train=$PWD/build/examples/train
if [ ! -x "$train" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target train
fi

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
exec ip netns exec "$host" /bin/sh -c "$*"
AGENT
chmod +x "$agent"

burst_of() {  # a token bucket must hold a tick's worth of bytes at its rate
  case $1 in
    *gbit) echo "$((${1%gbit} * 512))kb" ;;
    *mbit) echo "$((${1%mbit} / 2 + 64))kb" ;;
    *) echo 256kb ;;
  esac
}

mkdir -p "$out"
rm -f "$out"/*.csv
for rate in $rates; do
  for pair in "$a va$tag" "$b vb$tag"; do
    set -- $pair
    ip netns exec "$1" tc qdisc del dev "$2" root 2>/dev/null || true
    ip netns exec "$1" tc qdisc add dev "$2" root tbf rate "$rate" burst "$(burst_of "$rate")" latency 50ms
  done
  for entry in "${entries[@]}"; do
    name=${entry%%|*}
    flags=${entry#*|}
    for level in flat hier; do
      label=$name
      level_flags=()
      [ "$level" = hier ] && label="$name~hier" && level_flags=(--ranks-per-node 2)
      for ((k = 1; k <= repeat; k++)); do
        echo "== $rate: $label (run $k of $repeat)"
        # shellcheck disable=SC2086
        ip netns exec "$a" mpiexec -n 4 --host "$a:2,$b:2" --allow-run-as-root --bind-to none \
          --mca plm_rsh_agent "$agent" --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
          --mca oob_tcp_if_include 10.77.0.0/24 \
          "$train" --backend mpi $flags "${level_flags[@]}" --target "$target" --stop-at-target --epochs 6 \
          --eval-every 25 --out "$out/${rate}__${label}__r$k.csv" "${extra[@]}" | tail -1
      done
    done
  done
done

python3 bench/e2e/report.py --target "$target" --csv "$out/e2e.csv" "$out"/*__*.csv
