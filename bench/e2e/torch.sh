#!/usr/bin/env bash
# PyTorch's communication hooks beside gradcomp's, in one DDP: time-to-accuracy
# of examples/torch/train.py (4 gloo processes over the loopback of a private
# network namespace, shaped with tc to each rate in turn, as run.sh does), the
# same model, data order and bucket cap for every hook; repetition K trains
# with seed --first-seed + K - 1. Prints one table per rate (medians and
# ranges) and writes it, with every summary line, to the output folder.
#
#   sudo bench/e2e/torch.sh [--model mlp|cnn|gpt] [--fsdp] [--out DIR] [--rates "unshaped 1gbit"] [--target ACC]
#                           [--repeat 3] [--only "NAMES"] [--eval-every 10] [--first-seed 1]
#
# --target defaults to the model's (train.py: test accuracy 0.85 mlp, 0.88
# cnn; validation bits per byte 4.0 gpt). The held-out set is scored every
# --eval-every steps (outside the timed steps): a coarser grid rounds every
# hook's steps to target up to it. --fsdp shards the model with FSDP2 instead
# of DDP and times its reduce-scatters (fsdp_hooks). Where the run has an
# unshaped rate, each shaped row gives the link's share of the step: 1 - the
# hook's unshaped ms per step / its ms per step at that rate.
#
# Needs root (namespaces, tc), iproute2, PyTorch and the Python module:
# $GRADCOMP_PYTHON if set (the python folder of a build of your own), else
# build/python, built for this machine if missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

out=e2e-torch
model=mlp
rates="unshaped 1gbit"
target=""
repeat=3
only=""
eval_every=10
first_seed=1
fsdp=()  # or (--fsdp)
while (($#)); do
  case $1 in
    --model) model=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --eval-every) eval_every=$2; shift 2 ;;
    --first-seed) first_seed=$2; shift 2 ;;
    --fsdp) fsdp=(--fsdp); shift ;;
    *) echo "usage: $0 [--model mlp|cnn|gpt] [--fsdp] [--out DIR] [--rates LIST] [--target ACC] [--repeat N] [--only NAMES]" \
            "[--eval-every N] [--first-seed K]" >&2
       exit 2 ;;
  esac
done

# PyTorch's hooks (PowerSGD: rank 4, error feedback, warm start) and
# gradcomp's, by name; every run warms up 2 iterations (PowerSGD needs them).
hooks=(
  "torch-fp32|none"
  "torch-bf16|torch-bf16"
  "torch-powersgd-r4|torch-powersgd"
  "gradcomp-bf16|gradcomp:bf16"
  "gradcomp-powersgd-r4|gradcomp:powersgd:matrix_rank=4"
  "gradcomp-topkc-10%|gradcomp:topkc:fraction=0.1"
  "gradcomp-thc-4bit|gradcomp:thc:bits=4"
  "gradcomp-intsgd|gradcomp:intsgd"
  "gradcomp-auto|gradcomp:auto"
)
# Under --fsdp: FSDP2's own reduce-scatter (fp32, and bf16 through
# MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)) and gradcomp's.
fsdp_hooks=(
  "torch-fp32|none"
  "torch-bf16|torch-bf16"
  "gradcomp-thc-4bit|gradcomp:thc:bits=4"
  "gradcomp-qsgd|gradcomp:qsgd"
  "gradcomp-topkc-10%|gradcomp:topkc:fraction=0.1"
)
if ((${#fsdp[@]})); then
  hooks=("${fsdp_hooks[@]}")
fi

source bench/e2e/common.sh
if [ "$(id -u)" -ne 0 ]; then
  echo "$0: needs root to create network namespaces and shape them with tc; run it with sudo" >&2
  exit 1
fi
python3 -c "import torch" 2>/dev/null || { echo "$0: PyTorch is missing (bash .ci/install-deps installs it)" >&2; exit 1; }
module=${GRADCOMP_PYTHON:-$PWD/build/python}
if [ -n "${GRADCOMP_PYTHON:-}" ] && [ ! -d "$module/gradcomp/torch" ]; then
  echo "$0: GRADCOMP_PYTHON=$module holds no gradcomp/torch module" >&2
  exit 1
fi
if [ ! -d "$module/gradcomp/torch" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGRADCOMP_NATIVE_ARCH=ON >/dev/null
  cmake --build build --target gradcomp_torch_python
fi

ns=gradcomp-torch-$$
make_namespace "$ns"

mkdir -p "$out"
: > "$out/summaries.txt"
for rate in $rates; do
  shape_loopback "$ns" "$rate"
  for entry in "${hooks[@]}"; do
    name=${entry%%|*}
    hook=${entry#*|}
    selected "$name" "$only" || continue
    for ((k = 1; k <= repeat; k++)); do
      seed=$((first_seed + k - 1))
      echo "== $rate: $name (run $k of $repeat, seed $seed)"
      line=$(ip netns exec "$ns" env PYTHONPATH="$module" GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
        python3 examples/torch/train.py --model "$model" "${fsdp[@]}" --hook "$hook" --warmup 2 ${target:+--target "$target"} \
        --stop-at-target --epochs 6 --eval-every "$eval_every" --seed "$seed" 2>/dev/null | grep '^summary:' ||
        echo "summary: failed")
      echo "$line"
      echo "rate=$rate name=$name $line" >> "$out/summaries.txt"
    done
  done
done

python3 - "$out/summaries.txt" <<'EOF' | tee "$out/table.md"
import collections, re, statistics, sys
runs = collections.defaultdict(list)
rates = []
for line in open(sys.argv[1]):
    f = dict(re.findall(r"(\w+)=(\S+)", line))
    runs[(f["rate"], f["name"])].append(f)
    if f["rate"] not in rates:
        rates.append(f["rate"])
def spread(values, digits):
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"
def reached(fs):
    return [f for f in fs if f["time_to_target_s"] != "not-reached"]
def per_step(fs):
    return [1e3 * float(f["time_to_target_s"]) / int(f["steps_to_target"]) for f in reached(fs)]
for rate in rates:
    first = next(f for (r, _), fs in runs.items() if r == rate for f in fs if "target" in f)
    metric = next(k for k in first if k.startswith("final_"))[len("final_"):]
    goal = (f"{float(first['target']):.0%} test accuracy" if metric == "accuracy"
            else f"{float(first['target']):g} validation {metric.replace('_', ' ')}")
    setup = " under FSDP2" if first.get("backend") == "gloo-fsdp" else ""
    share = rate != "unshaped" and "unshaped" in rates
    print(f"\n{rate}: {first.get('model', 'mlp')}{setup} to {goal}, median of the seeds (range); "
          "ms per step = time to target / steps to target"
          + ("; link share = 1 - unshaped ms per step / ms per step" if share else "") + "\n")
    print(f"| hook | time to target, s | x torch-bf16 | steps | ms per step | final {metric.replace('_', ' ')} "
          "| wire bytes/step |" + (" link share |" if share else ""))
    print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if share else ""))
    base = [float(f["time_to_target_s"]) for f in reached(runs.get((rate, "torch-bf16"), []))]
    for (r, name), fs in runs.items():
        if r != rate:
            continue
        ok = reached(fs)
        t = [float(f["time_to_target_s"]) for f in ok]
        steps = [int(f["steps_to_target"]) for f in ok]
        ratio = f"{statistics.median(t) / statistics.median(base):.2f}" if t and base else "-"
        note = f" ({len(ok)} of {len(fs)} reached)" if len(ok) < len(fs) else ""
        mine, unshaped = per_step(fs), per_step(runs.get(("unshaped", name), []))
        link = (f" {1 - statistics.median(unshaped) / statistics.median(mine):.0%} |"
                if share and mine and unshaped else " - |" if share else "")
        print(f"| {name} | {spread(t, 2) if t else 'not reached'}{note} | {ratio} | "
              f"{f'{statistics.median(steps):g}' if steps else '-'} | {spread(mine, 1) if mine else '-'} | "
              f"{statistics.median(float(f.get('final_' + metric, 'nan')) for f in fs):.4f} | "
              f"{fs[0]['wire_bytes_per_step']} |{link}")
EOF
