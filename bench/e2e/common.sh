# shellcheck shell=bash
# Shared by run.sh, two_nodes.sh and validate.sh: the compressors they compare, the token
# bucket's size for a rate, and the checks and build before a run.

# What each run compares: the baselines, and the compressors at sensible settings.
compressors=(
  "fp32|--compressor fp32"
  "fp16|--compressor fp16"
  "bf16|--compressor bf16"
  "topkc-10%|--compressor topkc --fraction 0.1 --chunk-size 256"
  "topk-1%|--compressor topk --fraction 0.01"
  "powersgd-r4|--compressor powersgd --matrix-rank 4"
  "thc-4bit|--compressor thc --bits 4 --block 1024"
  # QSGD at 4 bits is too noisy for error feedback: unbiased, without it.
  "qsgd-4bit|--compressor qsgd --bits 4 --ef off"
  "qsgd_multiscale|--compressor qsgd_multiscale"
  "intsgd|--compressor intsgd"
  # Random-k with error feedback diverges under momentum 0.9 (a coordinate
  # waits d/k steps, then lands with its whole backlog): plain SGD for it.
  # Feedback asked for by name (off by default); at 10 bits it is a
  # contraction (error bound sqrt(50000) / 1023 = 0.22).
  "global_randk-50k-sgd|--compressor global_randk --k 50000 --bits 10 --ef on --momentum 0"
  # The planner's choice per large bucket among three of the above, at their settings.
  "auto|--compressor auto:of=bf16+topkc:fraction=0.1,chunk_size=256+powersgd:matrix_rank=4"
)

# The trainer's flags every run shares, into the array run_flags: train until
# the target accuracy TARGET (at most 6 epochs), evaluating every 25 steps;
# repetition K trains with --seed K, so repeated runs differ in their training
# (initialization, data order), not only in their timing.
#   set_run_flags TARGET K
# shellcheck disable=SC2034  # (run_flags is read by the scripts that source this file)
set_run_flags() { run_flags=(--target "$1" --stop-at-target --epochs 6 --eval-every 25 --seed "$2"); }

# The OpenBLAS kernels for this CPU's vector units. OpenBLAS names the CPU by
# its model, and a model newer than the library (an Emerald Rapids Xeon under
# Debian 12's OpenBLAS 0.3.21) gets the generic SSE3 kernels, which nearly
# double a step's time; the vector units are enough to choose well.
#   blas_kernels [CPUINFO]   (default /proc/cpuinfo; prints nothing for neither)
blas_kernels() {
  local cpuinfo=${1:-/proc/cpuinfo}
  if grep -qw avx512f "$cpuinfo"; then echo SkylakeX
  elif grep -qw avx2 "$cpuinfo"; then echo Haswell
  fi
}

# Exports OPENBLAS_CORETYPE as blas_kernels chooses, unless the user set it,
# and fills blas_env with what mpiexec needs to pass it on to every rank
# (mpiexec passes on only the variables it is told).
choose_blas_kernels() {
  local kernels=${OPENBLAS_CORETYPE:-$(blas_kernels /proc/cpuinfo)}
  blas_env=()
  [ -z "$kernels" ] || { export OPENBLAS_CORETYPE=$kernels; blas_env=(-x OPENBLAS_CORETYPE); }
}

# True when NAME is in the space-separated list ONLY, or ONLY is empty.
selected() { [ -z "$2" ] || [[ " $2 " == *" $1 "* ]]; }

# Fails unless every name in the list is one of the compressors above.
check_names() {
  local name entry known
  for name in $1; do
    known=0
    for entry in "${compressors[@]}"; do [ "${entry%%|*}" = "$name" ] && known=1; done
    ((known)) || { echo "$0: unknown compressor '$name' (bench/e2e/common.sh lists them)" >&2; exit 2; }
  done
}

# A token bucket must hold a kernel tick's worth of bytes at its rate, and a
# packet (the loopback's MTU is 64 KiB). GRADCOMP_TC_BURST (a tc size, e.g.
# 80kb) sets it instead: a burst lets a message through at the loopback's
# speed once the bucket has refilled, which a real link does not.
burst_of() {
  if [ -n "${GRADCOMP_TC_BURST:-}" ]; then
    echo "$GRADCOMP_TC_BURST"
    return
  fi
  case $1 in
    *gbit) echo "$((${1%gbit} * 512))kb" ;;
    *mbit) echo "$((${1%mbit} / 2 + 64))kb" ;;
    *) echo 256kb ;;
  esac
}

# A private network namespace NAME with its loopback up, deleted when the
# script exits; its MTU GRADCOMP_LO_MTU where set (e.g. 9000, a jumbo frame:
# a smaller packet lets the token bucket's burst be smaller too).
#   make_namespace NAME
make_namespace() {
  ip netns add "$1"
  # shellcheck disable=SC2064  # the name is fixed now
  trap "ip netns del '$1' 2>/dev/null || true" EXIT
  ip netns exec "$1" ip link set lo up
  if [ -n "${GRADCOMP_LO_MTU:-}" ]; then
    ip netns exec "$1" ip link set lo mtu "$GRADCOMP_LO_MTU"
  fi
}

# Shapes namespace NAME's loopback to RATE (a tc rate), or to none for unshaped.
#   shape_loopback NAME RATE
shape_loopback() {
  ip netns exec "$1" tc qdisc del dev lo root 2>/dev/null || true
  if [ "$2" != unshaped ]; then
    ip netns exec "$1" tc qdisc add dev lo root tbf rate "$2" burst "$(burst_of "$2")" latency 50ms
  fi
}

# Two emulated nodes, each a network namespace (named in node_a and node_b),
# joined by a veth pair (node_devs: A's end, then B's), with host names that
# resolve inside both, and OpenMPI's rsh agent (node_agent: "agent HOST
# COMMAND..." runs COMMAND in HOST's namespace under HOST's own host name, a
# UTS namespace, so the shared-memory transports of the two nodes do not
# collide); all deleted when the script exits.
#   make_two_nodes
make_two_nodes() {
  local tag=$$ ns
  node_a=gcA$tag node_b=gcB$tag node_devs=("va$tag" "vb$tag")
  node_agent=$(mktemp)
  # shellcheck disable=SC2064  # the names are fixed now
  trap "ip netns del '$node_a' 2>/dev/null || true; ip netns del '$node_b' 2>/dev/null || true
        rm -rf '/etc/netns/$node_a' '/etc/netns/$node_b' '$node_agent'" EXIT
  ip netns add "$node_a"
  ip netns add "$node_b"
  ip link add "${node_devs[0]}" netns "$node_a" type veth peer name "${node_devs[1]}" netns "$node_b"
  ip -n "$node_a" addr add 10.77.0.1/24 dev "${node_devs[0]}"
  ip -n "$node_b" addr add 10.77.0.2/24 dev "${node_devs[1]}"
  for ns in "$node_a" "$node_b"; do
    ip -n "$ns" link set lo up
    mkdir -p "/etc/netns/$ns"
    printf '127.0.0.1 localhost\n10.77.0.1 %s\n10.77.0.2 %s\n' "$node_a" "$node_b" >"/etc/netns/$ns/hosts"
  done
  ip -n "$node_a" link set "${node_devs[0]}" up
  ip -n "$node_b" link set "${node_devs[1]}" up
  cat >"$node_agent" <<'AGENT'
#!/bin/sh
host=$1
shift
exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname $host && $*"
AGENT
  chmod +x "$node_agent"
}

# Shapes both directions of make_two_nodes's link to RATE, or to none for
# unshaped.
#   shape_two_nodes RATE
shape_two_nodes() {
  local ns dev
  for ns in "$node_a" "$node_b"; do
    [ "$ns" = "$node_a" ] && dev=${node_devs[0]} || dev=${node_devs[1]}
    ip netns exec "$ns" tc qdisc del dev "$dev" root 2>/dev/null || true
    if [ "$1" != unshaped ]; then
      ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "$1" burst "$(burst_of "$1")" latency 50ms
    fi
  done
}

# mpiexec with N ranks in namespace NAME (make_namespace's), talking TCP
# over its loopback, then the rest of the command line.
#   one_node_mpiexec NAME N COMMAND...
one_node_mpiexec() {
  local ns=$1 n=$2
  shift 2
  ip netns exec "$ns" mpiexec -n "$n" "${blas_env[@]}" --oversubscribe --allow-run-as-root --bind-to none \
    --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo "$@"
}

# mpiexec with N ranks over make_two_nodes's nodes, half on each, then the
# rest of the command line. OpenMPI is told to yield when idle: each
# emulated node has as many slots as ranks, so it would not see the
# oversubscription of the real cores and would spin, which once made steps
# four to six times longer.
#   two_node_mpiexec N COMMAND...
two_node_mpiexec() {
  local half=$(($1 / 2))
  local n=$((2 * half))
  shift
  ip netns exec "$node_a" mpiexec -n "$n" "${blas_env[@]}" --host "$node_a:$half,$node_b:$half" \
    --allow-run-as-root --bind-to none --mca plm_rsh_agent "$node_agent" --mca mpi_yield_when_idle 1 \
    --mca btl vader,tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 "$@"
}

# Root (namespaces, tc), then prepare_trainer.
prepare() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "$0: needs root to create network namespaces and shape them with tc; run it with sudo" >&2
    exit 1
  fi
  prepare_trainer "$@"
}

# The tools named; OpenBLAS's kernels (a user's OPENBLAS_CORETYPE wins), into
# blas_env for mpiexec; then the trainer: $GRADCOMP_TRAIN if set (a build of
# your own), else build/examples/train, built for this machine if missing.
prepare_trainer() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is missing (bash .ci/install-deps installs it)" >&2; exit 1; }
  done
  choose_blas_kernels
  train=${GRADCOMP_TRAIN:-$PWD/build/examples/train}
  if [ -n "${GRADCOMP_TRAIN:-}" ] && [ ! -x "$train" ]; then
    echo "$0: GRADCOMP_TRAIN=$train is not an executable" >&2
    exit 1
  fi
  if [ ! -x "$train" ]; then
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_NATIVE_ARCH=ON >/dev/null
    cmake --build build --target train
  fi
}
