#!/bin/sh
# examples/gpt/train_gpt: a checkpoint saved on 2 ranks resumes on 1 and on 4.
# An uninterrupted 8-step run on 2 ranks gives the reference losses; a run of
# 3 steps saves a checkpoint (engine state, and the sampler's position in the
# client state); resumed from it on 1 and on 4 ranks (other data-parallel
# sizes, other gradient accumulation: 2 ranks x 2 saved micro-step 6, which is
# no multiple of 1 rank's accumulation 4), steps 4 to 8 must give the
# reference's losses up to fp32 rounding. A run stopped by DSM_STOP_SIGNAL saves its step
# and exits 3.
set -u
# shellcheck source=test/tools/gpt_common.sh disable=SC2154 # top_srcdir: set by the test harness
. "$top_srcdir/test/tools/gpt_common.sh"
shard 20000
config='{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
  "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.1}},
  "scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 8, "warmup_num_steps": 2}},
  "zero_optimization": {"stage": 2}}'
run() { # run N STEPS [ARGS...]
    n=$1 s=$2
    shift 2
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    out=$(timeout 120 $launcher -n "$n" "$bin" "$config" --data "$tmp/data.bin" --steps "$s" --print-every 1 "$@" 2>&1)
}
losses() { echo "$out" | awk '$1 == "step" && $2 > 3 { print $2, $4 }'; }

run 2 8 || fail "reference run: $out"
losses > "$tmp/ref"
[ "$(wc -l < "$tmp/ref")" -eq 5 ] || fail "reference: expected steps 4..8: $out"
run 2 3 --checkpoint "$tmp/ck" || fail "run to step 3: $out"
[ -f "$tmp/ck/latest" ] || fail "no checkpoint written: $out"
for n in 1 4; do
    cp -r "$tmp/ck" "$tmp/ck$n"
    run "$n" 8 --checkpoint "$tmp/ck$n" || fail "resume on $n ranks: $out"
    echo "$out" | grep -q "resumed from .* at step 3" || fail "$n ranks did not resume: $out"
    losses > "$tmp/run"
    # Every loss a number (nan, -nan, inf compare false in awk), every step
    # of the run in the reference, all within fp32 rounding.
    awk -v re="$number_re" 'NR == FNR { if ($2 !~ re) bad = 1; r[$1] = $2; next }
         { if ($2 !~ re || !($1 in r)) { bad = 1; next }
           d = ($2 - r[$1]) / r[$1]; if (d < 0) d = -d; if (!(d <= 2e-5)) bad = 1; c++ }
         END { exit bad || c != 5 }' "$tmp/ref" "$tmp/run" ||
        fail "resumed on $n ranks: losses differ: $(cat "$tmp/run") against $(cat "$tmp/ref")"
    echo "ok: saved on 2 ranks, resumed on $n: the same losses for steps 4..8"
done

# The stop signal: sent to one rank, every rank stops at the next boundary.
(
    # shellcheck disable=SC2086
    DSM_STOP_SIGNAL=USR1 timeout 120 $launcher -n 2 "$bin" "$config" --data "$tmp/data.bin" --steps 100000 \
        --print-every 1 --checkpoint "$tmp/stop" > "$tmp/stop.out" 2>&1
    echo $? > "$tmp/stop.rc"
) &
i=0
while ! grep -q "^step" "$tmp/stop.out" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 600 ] || fail "no step after 60 s: $(cat "$tmp/stop.out")"
    sleep 0.1
done
# One rank only (its command is train_gpt or libtool's lt-train_gpt), not timeout or the launcher.
pid=
for p in $(pgrep -f "train_gpt.*$tmp/stop"); do
    case $(cat /proc/"$p"/comm 2> /dev/null) in
        *train_gpt*) pid=$p; break ;;
    esac
done
[ -n "$pid" ] || fail "no train_gpt rank to signal"
kill -USR1 "$pid"
wait
[ "$(cat "$tmp/stop.rc")" = 3 ] || fail "stop signal: exit $(cat "$tmp/stop.rc"), expected 3: $(cat "$tmp/stop.out")"
grep -q "stopped on the stop signal after step .* (checkpoint saved)" "$tmp/stop.out" || fail "stop: $(cat "$tmp/stop.out")"
[ -f "$tmp/stop/latest" ] || fail "stop: no checkpoint"
echo "ok: the stop signal saves a checkpoint and exits 3"
