#!/bin/sh
# examples/gpt/train_gpt: the same loss trajectory on every mesh and ZeRO stage.
# The tiny preset trains 5 steps on a synthetic shard from one global batch
# size (8 sequences) at 1, 2 and 4 ranks, ZeRO stages 0 to 3, and at
# data x sequence parallelism 2 x 2 (Ulysses all-to-alls around attention,
# the token-weighted loss) against 4 x 1. The sampler gives every mesh the
# same global batches, so the loss and gradient norm of every step must
# equal the 1-rank ZeRO-0 run's up to fp32 rounding. bf16 under ZeRO-3 and
# fp16 under ZeRO-2 must train too (their rounding differs: the loss must
# fall). Bad input must fail cleanly on every rank.
set -u
# shellcheck source=test/tools/gpt_common.sh disable=SC2154 # top_srcdir: set by the test harness
. "$top_srcdir/test/tools/gpt_common.sh"
shard 20000

# config STAGE [EXTRA]: a DeepSpeed configuration; small buckets make ZeRO-2/3
# reduce in several, persistence 0 gathers every parameter under ZeRO-3.
config() {
    echo "{\"train_batch_size\": 8, \"train_micro_batch_size_per_gpu\": 2, \"gradient_clipping\": 0.5,
      \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-3, \"weight_decay\": 0.1}},
      \"scheduler\": {\"type\": \"WarmupLR\", \"params\": {\"warmup_num_steps\": 3, \"warmup_type\": \"linear\"}},
      \"zero_optimization\": {\"stage\": $1, \"reduce_bucket_size\": 3000,
                              \"stage3_param_persistence_threshold\": 0}${2:+, $2}}"
}
# run N STAGE [EXTRA]: 5 steps on N ranks; the output in $out.
run() {
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    out=$(timeout 120 $launcher -n "$1" "$bin" "$(config "$2" "${3:-}")" --data "$tmp/data.bin" \
          --steps 5 --print-every 1 2>&1)
}
# steps: the loss and gradient norm of each step, one per line.
steps() { echo "$out" | awk '$1 == "step" { print $4; print $8 }'; }
# maxrel REF FILE: the largest relative difference of two files of numbers.
maxrel() {
    awk -v re="$number_re" 'function num(s) { return s ~ re }
         NR == FNR { if (!num($1)) bad = 1; r[FNR] = $1; n = FNR; next }
         { if (!num($1)) bad = 1; d = ($1 - r[FNR]) / r[FNR]; if (d < 0) d = -d; if (d > m) m = d; c = FNR }
         END { if (bad || c != n || n == 0) { print "unreadable"; exit 1 } printf "%.3g\n", m + 0 }' "$1" "$2"
}
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d + 0 <= t + 0) }'; }
# Tolerance: the sums of gradients are re-associated across ranks and
# micro-steps (fp32 rounding, ~1e-7 relative); after 5 Adam steps the loss
# (printed with 6 decimals, about 5.5) and the gradient norm differ by
# a few 1e-6 at most. A wrong gradient or sample moves them by 1e-3 or more.
tol=2e-5

run 1 0 || fail "1 rank, ZeRO-0: $out"
steps > "$tmp/ref"
[ "$(wc -l < "$tmp/ref")" -eq 10 ] || fail "1 rank: expected 5 step lines: $out"
for case in "1 3" "2 0" "2 1" "2 2" "2 3" "4 0" "4 1" "4 2" "4 3"; do
    # shellcheck disable=SC2086
    set -- $case
    run "$1" "$2" || fail "$1 ranks, ZeRO-$2: $out"
    steps > "$tmp/run"
    d=$(maxrel "$tmp/ref" "$tmp/run") || fail "$1 ranks, ZeRO-$2: unreadable: $out"
    within "$d" "$tol" || fail "$1 ranks, ZeRO-$2: relative difference $d > $tol: $(cat "$tmp/run")"
    echo "ok: $1 ranks, ZeRO-$2 (relative difference $d)"
    [ "$1 $2" = "4 2" ] && cp "$tmp/run" "$tmp/dp4"
done
run 4 2 '"sequence_parallel_size": 2' || fail "2 x 2 (DP x SP), ZeRO-2: $out"
echo "$out" | grep -q "data parallel 2 x sequence parallel 2" || fail "2 x 2: not on a 2 x 2 mesh: $out"
steps > "$tmp/run"
d=$(maxrel "$tmp/dp4" "$tmp/run") || fail "2 x 2: unreadable: $out"
within "$d" "$tol" || fail "2 x 2 against 4 x 1: relative difference $d > $tol"
echo "ok: 2 x 2 (DP x SP) against 4 x 1 (relative difference $d)"
run 2 3 '"sequence_parallel_size": 2' || fail "1 x 2 (DP x SP), ZeRO-3: $out"
steps > "$tmp/run"
d=$(maxrel "$tmp/ref" "$tmp/run") || fail "1 x 2: unreadable: $out"
within "$d" "$tol" || fail "1 x 2, ZeRO-3 against 1 rank: relative difference $d > $tol"
echo "ok: 1 x 2 (DP x SP), ZeRO-3 (relative difference $d)"

# 16-bit compute: the same model trains (the loss falls over the 5 steps).
for case in '3 "bf16": {"enabled": true}' '2 "fp16": {"enabled": true, "initial_scale_power": 12}'; do
    stage=${case%% *}
    run 2 "$stage" "${case#* }" || fail "2 ranks, ZeRO-$stage, ${case#* }: $out"
    # Numbers only (a -nan compares as a string below the first loss), 5 of
    # them, compared as numbers.
    echo "$out" | awk -v re="$number_re" '$1 == "step" { if ($4 !~ re) bad = 1; if (!c++) first = $4 + 0; last = $4 + 0 }
                       END { exit bad || c != 5 || !(first > 0 && last < first) }' ||
        fail "${case#* }: the loss did not fall: $out"
    echo "ok: 2 ranks, ZeRO-$stage, ${case#* }"
done

# Bad input: every rank fails with a message naming it, nobody hangs (a
# run that prints its error and then hangs until timeout fails the test).
# shellcheck disable=SC2086
out=$(timeout 60 $launcher -n 2 "$bin" "$(config 0)" --data "$tmp/missing.bin" 2>&1)
refused $? "a missing shard" "$out"
[ "$(echo "$out" | grep -c "cannot open the token shard $tmp/missing.bin")" -eq 2 ] || fail "missing shard: $out"
printf 'not a shard at all, but long enough to hold a header? no' > "$tmp/bad.bin"
head -c 2048 /dev/zero >> "$tmp/bad.bin"
# shellcheck disable=SC2086
out=$(timeout 60 $launcher -n 2 "$bin" "$(config 0)" --data "$tmp/bad.bin" 2>&1)
refused $? "a bad shard" "$out"
[ "$(echo "$out" | grep -c "not a token shard")" -eq 2 ] || fail "bad shard: $out"
"$shard_tool" --synthetic 1000 "$tmp/v.bin" --vocab 300 >/dev/null || fail "gpt_shard --vocab 300"
# shellcheck disable=SC2086
out=$(timeout 60 $launcher -n 2 "$bin" "$(config 0)" --data "$tmp/v.bin" 2>&1)
refused $? "tokens past the vocabulary" "$out"
echo "$out" | grep -q "outside the vocabulary of 256" || fail "tokens past the vocabulary: $out"
# shellcheck disable=SC2086
out=$(timeout 60 $launcher -n 3 "$bin" "$(config 0 '"sequence_parallel_size": 3')" --data "$tmp/data.bin" --ctx 33 2>&1)
refused $? "sequence parallelism 3 over 4 heads" "$out"
echo "$out" | grep -q "sequence parallelism 3 must divide the context 33 and the heads 4" || fail "SP 3: $out"
# shellcheck disable=SC2086 # MPIEXEC may carry options
out=$(timeout 60 $launcher -n 1 "$bin" --data "$tmp/data.bin" --width 30 2>&1)
refused $? "width 30 over 4 heads" "$out"
echo "$out" | grep -q "width 30 is not a multiple of heads 4" || fail "width 30: $out"
out=$(timeout 60 "$shard_tool" --synthetic 0 "$tmp/z.bin" 2>&1)
refused $? "gpt_shard --synthetic 0" "$out"
echo "$out" | grep -q 'N must be a positive integer, got "0"' || fail "gpt_shard 0: $out"
echo "ok: bad input fails cleanly"

# The CUDA path: trains where every rank has a GPU, else exits 77 saying why.
# shellcheck disable=SC2086
out=$(timeout 120 $launcher -n 1 "$bin" "$(config 3 '"bf16": {"enabled": true}')" --data "$tmp/data.bin" \
      --steps 3 --device cuda 2>&1)
rc=$?
case $rc in
    0) echo "ok: --device cuda trained on a GPU" ;;
    77) echo "$out" | grep -q "device cuda skipped on rank 0: " || fail "--device cuda: exit 77 without a reason: $out"
        echo "ok: --device cuda skipped cleanly without a GPU" ;;
    *) fail "--device cuda: exit $rc: $out" ;;
esac
