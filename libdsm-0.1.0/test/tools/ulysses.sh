#!/bin/sh
# examples/c/ulysses_attention end to end.
# Part A: sequence-parallel causal attention, forward and backward, against
# the single-rank computation (the program checks it and fails on a
# difference), at 1, 2 and 4 ranks, with uneven heads and grouped-query
# attention; a head split that cannot work must fail cleanly on every rank.
# Part B: the language model trained for 20 steps at 1 rank, on 2 x 2
# (DP x SP) and on 1 x 2, for ZeRO stages 0 to 3. The global batch is the
# same, so the final parameters and the loss and gradient norm of each
# printed step must equal the 1-rank run's up to fp32 rounding. A run that
# differs on purpose (one step fewer) must be caught by the same comparison.
set -u
# shellcheck disable=SC2154 # set by the test harness (AM_TESTS_ENVIRONMENT)
bin=$top_builddir/examples/c/ulysses_attention
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT

# run N ARGS...: the example on N ranks; its output in $out.
run() {
    n=$1
    shift
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    out=$(timeout 120 $launcher -n "$n" "$bin" "$@" 2>&1)
}

# Tolerances. Parameters: Adam moves a weight by up to lr = 1e-2 per step;
# re-associated fp32 sums differ by ~1e-7 relative, but Adam divides by
# sqrt(v) + eps, which magnifies that for the rare weight whose gradient is
# near eps = 1e-8 (up to ~1.5e-5 after 20 steps, measured). 1e-4 is 1% of
# one step: far above that, far below a wrong gradient (~1e-2). Loss and
# gradient norm (about 1, printed with 6 decimals): 1e-5.
ptol=1e-4
stol=1e-5

# maxdiff REF FILE: the largest |difference| of two files of numbers, one
# per line, of the same length; anything that is not a finite number fails.
maxdiff() {
    awk 'function num(s) { return s ~ /^[-+]?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }
         NR == FNR { if (!num($1)) bad = 1; r[FNR] = $1; n = FNR; next }
         { if (!num($1)) bad = 1; d = $1 - r[FNR]; if (d < 0) d = -d; if (d > m) m = d; c = FNR }
         END { if (bad || c != n || n == 0) { print "unreadable"; exit 1 } printf "%.3g\n", m + 0 }' "$1" "$2"
}
# within D TOL: D <= TOL.
within() { awk -v d="$1" -v t="$2" 'BEGIN { exit !(d + 0 <= t + 0) }'; }
# steps: the loss and gradient norm of each printed step, one per line.
steps() { echo "$out" | awk '$1 == "step" { print $4; print $6 }'; }

# ------------------------------------------------------------------ part A
for args in "2 --sp 2" "4 --sp 4 --heads 7" "4 --sp 4 --heads 8 --kv-heads 2" \
            "2 --sp 2 --heads 4 --kv-heads 1" "4 --sp 2 --heads 8 --kv-heads 2" "3 --sp 3 --heads 5 --seq 10"; do
    # shellcheck disable=SC2086
    set -- $args
    n=$1
    shift
    run "$n" "$@" --steps 0 || fail "part A, $n ranks $*: $out"
    line=$(echo "$out" | grep "max |sequence parallel") || fail "part A, $n ranks $*: no result: $out"
    echo "part A, $n ranks $*: ${line#*single rank|: }"
done
run 4 --sp 4 --heads 6 --kv-heads 2 --steps 0 && fail "6 query heads over 2 key/value heads on 4 ranks must fail"
[ "$(echo "$out" | grep -c "rank 1 holds query head 3 but not its key/value head 1")" = 4 ] ||
    fail "the impossible head split is not reported by every rank: $out"
echo "part A: 6 query / 2 key/value heads on 4 ranks fails on every rank"

# ------------------------------------------------------------------ part B
# The reference: one rank, ZeRO-0, the whole batch of 8 in one micro-batch.
run 1 --sp 1 --stage 0 --dump "$tmp/ref.txt" || fail "part B on 1 rank: $out"
echo "$out" | grep -q "max |sequence parallel" || fail "part A did not run before part B: $out"
steps > "$tmp/ref.steps"
echo "part B, 1 rank: $(echo "$out" | grep 'final loss' | sed 's/^part B: //')"

for stage in 0 1 2 3; do
    for mesh in "4 2" "2 2"; do
        # shellcheck disable=SC2086
        set -- $mesh
        run "$1" --sp "$2" --stage "$stage" --dump "$tmp/run.txt" || fail "part B, ZeRO-$stage, $1 ranks: $out"
        steps > "$tmp/run.steps"
        dp=$(($1 / $2))
        d=$(maxdiff "$tmp/ref.txt" "$tmp/run.txt") || fail "ZeRO-$stage, $dp x $2: unreadable dump"
        s=$(maxdiff "$tmp/ref.steps" "$tmp/run.steps") || fail "ZeRO-$stage, $dp x $2: no loss lines: $out"
        echo "part B, ZeRO-$stage on $dp x $2 ranks: max |parameter - 1 rank| $d, max |loss or grad norm - 1 rank| $s"
        within "$d" $ptol || fail "ZeRO-$stage on $dp x $2: the parameters differ from the 1-rank run by $d (tolerance $ptol)"
        within "$s" $stol || fail "ZeRO-$stage on $dp x $2: the losses or gradient norms differ by $s (tolerance $stol)"
    done
done

# Uneven heads and a sequence that does not split evenly (15 tokens on 4
# ranks: 4 each, the last padded), GQA with replicated key/value heads, each
# against its own 1-rank run.
for args in "--heads 7 --seq 15 --stage 3" "--heads 4 --kv-heads 1 --stage 2"; do
    # shellcheck disable=SC2086
    run 1 --sp 1 $args --dump "$tmp/ref2.txt" || fail "part B on 1 rank, $args: $out"
    # shellcheck disable=SC2086
    run 4 --sp 4 $args --dump "$tmp/run.txt" || fail "part B on 4 ranks, $args: $out"
    d=$(maxdiff "$tmp/ref2.txt" "$tmp/run.txt") || fail "$args: unreadable dump"
    echo "part B, $args on 1 x 4 ranks: max |parameter - 1 rank| $d"
    within "$d" $ptol || fail "$args on 1 x 4: the parameters differ from the 1-rank run by $d"
done

# The comparison must see a real difference: 19 steps instead of 20.
run 1 --sp 1 --stage 0 --steps 19 --dump "$tmp/run.txt" || fail "part B, 19 steps: $out"
d=$(maxdiff "$tmp/ref.txt" "$tmp/run.txt") || fail "19 steps: unreadable dump"
within "$d" $ptol && fail "19 steps instead of 20 differ by only $d: the comparison cannot fail"
echo "control: 19 steps instead of 20 differ by $d (detected)"
exit 0
