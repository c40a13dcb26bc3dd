#!/usr/bin/env bash
# The soak test: 10,000 steps of the trainer's model reducer with overlap,
# 16-bit (bf16) gradients and a checkpoint every 1,000 steps, its resident
# memory sampled twice a second. After warm-up (up to the first checkpoint)
# the resident set must stay flat within 1%: a step that allocates,
# or a checkpoint that leaks, shows up here. Not part of CI (minutes).
#
#   bench/soak.sh [--steps N] [--compressor SPEC] [--ranks N] [-- more train flags]
#
# Prints the samples' summary and exits 1 when memory grew or shrank by more
# than 1% after warm-up, or when the run failed.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=10000 compressor=topkc ranks=2 extra=()
while (($#)); do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --compressor) compressor=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "usage: $0 [--steps N] [--compressor SPEC] [--ranks N] [-- train flags]" >&2; exit 2 ;;
  esac
done

train=${TRAIN:-build/examples/train}
if [ ! -x "$train" ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build --target train
fi

work=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && cp "$work/rss" "$KEEP"; rm -rf "$work"' EXIT
"$train" --compressor "$compressor" --ranks "$ranks" --overlap on --grad-dtype bf16 \
  --checkpoint "$work/run" --checkpoint-every 1000 --max-steps "$steps" --epochs 1000 --eval-every 1000 \
  "${extra[@]}" >"$work/log" 2>&1 &
pid=$!
# Warm-up ends a second after the first checkpoint is written (by then the
# data is loaded, and the first evaluation and checkpoint have run).
warm=""
while kill -0 "$pid" 2>/dev/null; do
  awk '/^VmRSS:/ { print $2 }' "/proc/$pid/status" 2>/dev/null >>"$work/rss" || true
  if [ -z "$warm" ] && compgen -G "$work/run.rank*" >/dev/null; then warm=$(($(wc -l <"$work/rss") + 2)); fi
  sleep 0.5
done
status=0
wait "$pid" || status=$?
tail -n 3 "$work/log"
if [ "$status" -ne 0 ]; then
  echo "soak: the run failed (exit $status)"
  exit 1
fi
awk -v steps="$steps" -v first="${warm:-0}" '
  { rss[n++] = $1 }
  END {
    if (first == 0 || n < first + 20) { print "soak: " n " samples, " n - first " after warm-up; run more steps"; exit 1 }
    lo = hi = rss[first]
    for (i = first; i < n; ++i) { lo = rss[i] < lo ? rss[i] : lo; hi = rss[i] > hi ? rss[i] : hi }
    change = (hi - lo) / lo
    printf "soak: %d steps, %d samples; resident memory %.1f MiB at the first sample, %.1f to %.1f MiB over the %d samples after warm-up (%.2f%%; limit 1%%)\n",
           steps, n, rss[0] / 1024, lo / 1024, hi / 1024, n - first, 100 * change
    if (change > 0.01) { print "soak: FAILED, memory is not flat"; exit 1 }
    print "soak: flat"
  }' "$work/rss"
