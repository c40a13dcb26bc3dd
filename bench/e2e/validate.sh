#!/usr/bin/env bash
# The planner against measurement, per rate: the trainer's prediction of one
# step's reductions for every candidate (train --compressor auto:of=...
# prints "prediction: spec=S ms=T" lines), then each candidate trained alone
# and the planner's own choice trained, each for a few steps, with their
# reductions' time per step measured (the trainer's CSV: compress_s +
# comm_s, between its first and last evaluation, so the first steps are left
# out). Overlap is off: the planner adds local work and communication. Writes
# the runs' logs and CSVs, and prints and writes the comparison
# (validate.py).
#
#   sudo bench/e2e/validate.sh [--out DIR] [--rates "100mbit 1gbit 10gbit unshaped"] [--steps N] [--repeat N]
#                              [--ranks N] [--nodes 1|2] [--candidates "SPEC SPEC ..."]
#   bench/e2e/validate.sh --in-process [--out DIR] [--steps N] [--repeat N] [--ranks N] [--candidates ...]
#
# --ranks: MPI ranks on this machine (4; as many as its cores leaves none of
# them waiting for another that shares its core). --nodes 2: the ranks on two
# emulated nodes, half on each, the rate that of the link between them
# (two_nodes.sh's layout); 1, the default: one node, its loopback shaped
# (run.sh's). --in-process: the ranks are threads of one trainer (--backend
# local, the demo's layout), with no network to shape; its runs are
# labelled "in-process".
#
# Needs root (network namespaces, tc), iproute2 and OpenMPI, as run.sh, and
# unshare for two nodes; in process, none of them.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=validate-results
rates="100mbit 1gbit 10gbit unshaped"
steps=80
repeat=1
ranks=4
nodes=1
in_process=0
rates_given=0
candidates="bf16 fp32 topkc:fraction=0.1,chunk_size=256 powersgd:matrix_rank=4 thc:bits=4,block=1024 intsgd"
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; rates_given=1; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --nodes) nodes=$2; shift 2 ;;
    --candidates) candidates=$2; shift 2 ;;
    --in-process) in_process=1; shift ;;
    *) echo "usage: $0 [--out DIR] [--rates LIST] [--steps N] [--repeat N] [--ranks N] [--nodes 1|2 | --in-process]" \
         "[--candidates \"SPEC ...\"]" >&2; exit 2 ;;
  esac
done

if ! [[ $ranks =~ ^[1-9][0-9]*$ ]] || { [ "$nodes" != 1 ] && { [ "$nodes" != 2 ] || ((ranks % 2)); }; }; then
  echo "$0: --ranks is a positive number, --nodes 1 or 2, and two nodes take an even number of ranks" >&2
  exit 2
fi

source bench/e2e/common.sh
if ((in_process)); then
  if ((nodes != 1 || rates_given)); then echo "$0: --in-process has no nodes and no rates" >&2; exit 2; fi
  prepare_trainer python3
  rates=in-process
elif ((nodes == 1)); then
  prepare ip tc mpiexec python3
  ns=gradcomp-validate-$$
  make_namespace "$ns"
else
  prepare ip tc mpiexec unshare python3
  make_two_nodes
fi
mkdir -p "$out"
rm -f "$out"/*.csv "$out"/*.log
auto="auto:of=${candidates// /+}"
every=$((steps / 4))

launch() {  # the trainer's command line, on the ranks of the layout
  if ((in_process)); then
    "$@" --backend local --ranks "$ranks"
  elif ((nodes == 1)); then
    one_node_mpiexec "$ns" "$ranks" "$@" --backend mpi
  else
    two_node_mpiexec "$ranks" "$@" --backend mpi
  fi
}

train_one() {  # rate, label, spec, k
  local file="$out/$1__$2__r$4"
  launch "$train" --compressor "$3" --overlap off --max-steps "$steps" --eval-every "$every" --seed "$4" \
    --out "$file.csv" >"$file.log"
  tail -1 "$file.log"
}

for rate in $rates; do
  if ((in_process)); then :; elif ((nodes == 1)); then shape_loopback "$ns" "$rate"; else shape_two_nodes "$rate"; fi
  for ((k = 1; k <= repeat; k++)); do
    echo "== $rate, run $k of $repeat: the planner's choice"
    train_one "$rate" auto "$auto" "$k"
    i=0
    for spec in $candidates; do
      echo "== $rate, run $k of $repeat: $spec"
      train_one "$rate" "c$i" "$spec" "$k"
      i=$((i + 1))
    done
  done
done

python3 bench/e2e/validate.py --candidates "$candidates" --out "$out/table.md" "$out"
