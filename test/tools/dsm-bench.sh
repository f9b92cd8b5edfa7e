#!/bin/sh
# dsm-bench refuses every bad numeric option of every subcommand: garbage
# text, a sign, an empty value, overflow, out of range, sizes whose bytes
# overflow or exceed the machine's memory. Each refusal: exit status 2, no
# signal, no sanitizer report, one line on stderr naming the option and the
# value; under mpiexec with 2 ranks every rank refuses (the job ends, nonzero,
# without hanging). Nothing here runs a benchmark but one step of
# `optimizer --model` on a tiny list.
set -u
# shellcheck disable=SC2154 # set by the test harness (AM_TESTS_ENVIRONMENT)
bin=$top_builddir/tools/dsm-bench
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
[ -x "$bin" ] || { echo "SKIP: $bin is not built"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
checked=0

# refused SUB TEXT ARGS...: 'dsm-bench SUB ARGS...' (one process) exits 2 with
# one line on stderr that contains TEXT (by default the last two arguments,
# "OPTION 'VALUE'"), and prints nothing on stdout.
refused() {
    sub=$1 text=$2
    shift 2
    timeout 60 "$bin" "$sub" "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "'dsm-bench $sub $*' exited $rc, expected 2"; }
    grep -q "AddressSanitizer\|runtime error" "$tmp/err" && { cat "$tmp/err"; fail "'dsm-bench $sub $*': sanitizer report"; }
    [ "$(wc -l < "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "'dsm-bench $sub $*': expected one line on stderr"; }
    grep -qF -- "$text" "$tmp/err" || { cat "$tmp/err"; fail "'dsm-bench $sub $*': the message does not say \"$text\""; }
    [ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "'dsm-bench $sub $*' printed on stdout"; }
    checked=$((checked + 1))
}

# bad SUB OPTION VALUE...: each VALUE of OPTION is refused, the message naming both.
bad() {
    sub=$1 opt=$2
    shift 2
    for v in "$@"; do refused "$sub" "$opt '$v'" "$opt" "$v"; done
}

# What no numeric option takes: garbage, signs and spaces, other bases, an
# empty value, values beyond 64 bits. Every option is read by the same
# function: the first option of each subcommand gets the whole list, the
# others a sample (each run starts MPI, which takes a while).
garbage="abc 12x 1e3 0x10 1.5 +-1 -- ' 4' '4 ' '' 99999999999999999999 -99999999999999999999 18446744073709551616"
sample="x '' 99999999999999999999"

for_each() { # for_each SUB OPTION EXTRA...: the garbage and EXTRA values
    sub=$1 opt=$2
    shift 2
    eval "bad $sub $opt $garbage" '"$@"'
}
some() { # some SUB OPTION EXTRA...: a sample of the garbage and EXTRA values
    sub=$1 opt=$2
    shift 2
    eval "bad $sub $opt $sample" '"$@"'
}

# ---------------------------------------------------------------- optimizer
for_each optimizer --params 0 -1 -4611686018427387904 4611686018427387904 9223372036854775807
some optimizer --iters 0 -5 100001
some optimizer --threads -1 1025 100000 2147483648
# Within range but beyond this machine's memory: 2^44 parameters are 256 TiB.
refused optimizer "--params 17592186044416" --params 17592186044416
refused optimizer "--isa 'sse9'" --isa sse9
refused optimizer "--device 'tpu'" --device tpu
refused optimizer "--params needs a value" --params
refused optimizer "--dtype 'fp8'" --dtype fp8
refused optimizer "--dtype bf16 needs --model" --dtype bf16
refused optimizer "--model 'nope' is not gpt2, gpt2-medium, gpt2-large, gpt2-xl or llama-7b" --model nope
printf '{"parameters": [{"name": "a", "shape": [-3]}]}' > "$tmp/bad.json"
refused optimizer "parameters[0] ('a')" --model "$tmp/bad.json"
refused optimizer "--model llama-7b needs" --model llama-7b --no-torch
# --model on a tiny list runs (one step): the step, the bound and their
# ratio in the JSON; --device cuda runs, or says why it skipped, exit 0.
printf '{"parameters": [{"name": "w", "shape": [40, 30]}, {"name": "b", "shape": [30]}]}' > "$tmp/tiny.json"
for dt in fp32 bf16; do
    timeout 60 "$bin" optimizer --model "$tmp/tiny.json" --dtype $dt --iters 1 --threads 2 --no-torch --json \
        > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; fail "optimizer --model tiny.json --dtype $dt failed"; }
    grep -q '"params":1230,' "$tmp/out" && grep -q '"bound_over_step":[0-9]' "$tmp/out" &&
        grep -q "\"dtype\":\"$dt\"" "$tmp/out" || { cat "$tmp/out"; fail "optimizer --model tiny.json: no ratio"; }
done
timeout 120 "$bin" optimizer --model "$tmp/tiny.json" --device cuda --iters 1 --no-torch > "$tmp/out" 2> "$tmp/err" ||
    { cat "$tmp/err"; fail "optimizer --model tiny.json --device cuda failed"; }
grep -q "bound/step\|no CUDA device: skipped" "$tmp/out" || { cat "$tmp/out"; fail "optimizer --device cuda: no result"; }

# ---------------------------------------------------------------- collectives
for_each collectives --count 0 -1 2147483648 9223372036854775807
some collectives --iters 0 -1 1000001

# ---------------------------------------------------------------- zero
for_each zero --params 0 -1 1125899906842625 9223372036854775807
some zero --steps 0 -1 1001
some zero --stage -1 4 2147483651
some zero --device gpu ""
refused zero "--params 1125899906842624" --params 1125899906842624 --no-torch
# --model: an unknown name, files that are not a parameter list, a model
# larger than the machine.
refused zero "--model 'nope' is not gpt2, gpt2-medium, gpt2-large, gpt2-xl or llama-7b" --model nope
printf '{"parameters": [{"name": "a", "shape": [4, 0]}]}' > "$tmp/bad.json"
refused zero "parameters[0] ('a'): shape extent 0" --model "$tmp/bad.json"
printf '{"parameters": [{"name": "a", "shape": [4], "decay": 1}]}' > "$tmp/bad.json"
refused zero "\"decay\" is not true or false" --model "$tmp/bad.json"
printf 'not json' > "$tmp/bad.json"
refused zero "not JSON" --model "$tmp/bad.json"
refused zero "--model llama-7b needs" --model llama-7b --no-torch
# zero --model on the tiny list, 2 ranks, every stage, one step: ZeRO-1's
# bound also zeroes the gradient elements outside the rank's partition (every
# gradient stays whole there), the other stages' none.
timeout 120 "$launcher" -n 2 "$bin" zero --model "$tmp/tiny.json" --stage all --steps 1 --no-torch --json \
    > "$tmp/out" 2> "$tmp/err" || { cat "$tmp/err"; fail "zero --model tiny.json on 2 ranks failed"; }
tr '{' '\n' < "$tmp/out" | grep '"stage":' > "$tmp/rows"
[ "$(wc -l < "$tmp/rows")" -eq 4 ] || { cat "$tmp/out"; fail "zero --model tiny.json: expected 4 stages"; }
grep '"stage":1,' "$tmp/rows" | grep -q '"zeroed_elements_per_rank":[1-9]' ||
    { cat "$tmp/out"; fail "zero --model: stage 1's bound zeroes no gradient elements outside the partition"; }
[ "$(grep -c '"zeroed_elements_per_rank":0,' "$tmp/rows")" -eq 3 ] ||
    { cat "$tmp/out"; fail "zero --model: stages 0, 2 and 3 should zero nothing outside what they update"; }

# ---------------------------------------------------------------- checkpoint
for_each checkpoint --params 0 -1 1125899906842625 9223372036854775807
some checkpoint --iters 0 -1 1001
some checkpoint --stage -1 4
refused checkpoint "--params 1125899906842624" --params 1125899906842624

# ---------------------------------------------------------------- alltoall
for_each alltoall --batch 0 -1 1099511627777 9223372036854775807
for opt in --seq --heads --head-dim; do
    some alltoall $opt 0 -1 1099511627777
done
some alltoall --iters 0 -1 1001
# Each dimension in range, their product beyond the MPI baselines' int counts.
refused alltoall "beyond the int counts" --batch 1099511627776 --seq 1099511627776 --heads 1099511627776

# ---------------------------------------------------------------- overlap
for_each overlap --layers 0 -1 100001
some overlap --params 0 -1 1099511627777
some overlap --work -1 -5 1099511627777 AUTO
some overlap --stage -1 4
some overlap --steps 0 1001
some overlap --bucket 0 -1
some overlap --allgather-bucket 0
some overlap --prefetch 0
refused overlap "--layers 100000 --params 1099511627776 needs" --layers 100000 --params 1099511627776
refused overlap "--work needs a value" --work

# ---------------------------------------------------------------- quantize
for_each quantize --values 0 -1 1023 17179869185
some quantize --rounds 0 1001
some quantize --block 0 15 1048577
refused quantize "--block: block size 24 is not a multiple of 16" --block 24
refused quantize "--device 'tpu'" --device tpu
refused quantize "--iters '0' is not an integer from 1 to 1000" --device cuda --iters 0
refused quantize "--block: block size 24 is not a multiple of 16" --device cuda --block 24

# ---------------------------------------------------------------- watchdog
for_each watchdog --count 0 -1 268435457 9223372036854775807
some watchdog --iters 0 -1 1000001
some watchdog --params 0 -1 4294967297
some watchdog --steps 0 1001
refused watchdog "--params 4294967296" --params 4294967296 --count 268435456

# ---------------------------------------------------------------- command line
# getopt_long for every subcommand: the same refusals everywhere, a value
# joined with '=' and a prefix of a long option read like the option itself.
refused zero "dsm-bench zero: --steps needs a value" --steps
refused collectives "dsm-bench collectives: --count needs a value" --count
refused alltoall "dsm-bench alltoall: --json takes no value" --json=1
refused optimizer "dsm-bench optimizer: --no-torch takes no value" --no-torch=yes
refused collectives "dsm-bench collectives: --dtype 'fp8' is not fp32, fp16, bf16 or fp64" --dtype fp8
refused alltoall "dsm-bench alltoall: --dtype 'fp8' is not fp32, bf16, fp16 or both" --dtype fp8
refused alltoall "dsm-bench alltoall: --layout 'diag' is not batch or seq" --layout diag
refused zero "--steps '0'" --steps=0
refused checkpoint "--iters '0'" --iter 0
refused checkpoint "--dir '' is empty" --dir=
timeout 60 "$bin" zero --st 1 > /dev/null 2> "$tmp/err"
head -n 1 "$tmp/err" | grep -qF "dsm-bench zero: ambiguous option '--st' (--steps or --stage)" ||
    { cat "$tmp/err"; fail "'dsm-bench zero --st 1': not named ambiguous"; }
# An unknown option, an ambiguous prefix (zero --st: --stage or --steps) and
# a stray argument: the message, then the usage.
for args in "zero --bogus" "overlap -q" "collectives stray" "zero --st 1"; do
    # shellcheck disable=SC2086 # the words are the arguments
    timeout 60 "$bin" $args > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "'dsm-bench $args' exited $rc, expected 2"; }
    head -n 1 "$tmp/err" | grep -q "^dsm-bench ${args%% *}: \(unknown option\|ambiguous option\|unexpected argument\) '" ||
        { cat "$tmp/err"; fail "'dsm-bench $args': no message naming the argument"; }
    grep -q "^usage: " "$tmp/err" || { cat "$tmp/err"; fail "'dsm-bench $args': no usage"; }
    [ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "'dsm-bench $args' printed on stdout"; }
    checked=$((checked + 1))
done

# The collectives' memory check, where this machine has less than the
# 96 GiB that 2^31 - 1 fp64 elements in six buffers need.
mem_kb=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo 2>/dev/null)
if [ -n "$mem_kb" ] && [ "$mem_kb" -lt 100000000 ]; then
    refused collectives "--count 2147483647 --dtype fp64" --count 2147483647 --dtype fp64
fi

# ---------------------------------------------------------------- 2 ranks
# Every rank refuses: the job ends, nonzero, within the timeout, and rank 0
# names the value. (A rank that went on would wait for the others forever.)
on2() { # on2 TEXT SUB ARGS...
    text=$1
    shift
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    timeout 120 $launcher -n 2 "$bin" "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -lt 128 ] ||
        { cat "$tmp/err"; fail "'mpiexec -n 2 dsm-bench $*' exited $rc, expected a usage error"; }
    grep -qF -- "$text" "$tmp/err" || { cat "$tmp/err"; fail "'mpiexec -n 2 dsm-bench $*': no \"$text\" on stderr"; }
    grep -q "AddressSanitizer\|Segmentation\|signal" "$tmp/err" && { cat "$tmp/err"; fail "'mpiexec -n 2 dsm-bench $*' crashed"; }
    checked=$((checked + 1))
}
if command -v "${launcher%% *}" > /dev/null 2>&1; then
    on2 "--params '4611686018427387904'" optimizer --params 4611686018427387904
    on2 "--threads '100000'" optimizer --threads 100000
    on2 "--count 'x'" collectives --count x
    on2 "--count 1 is less than the 2 ranks" collectives --count 1
    on2 "--steps '0'" zero --steps 0
    on2 "--params 1125899906842624" zero --params 1125899906842624 --no-torch
    on2 "--stage '9'" checkpoint --stage 9
    on2 "--seq 3 is not a multiple" alltoall --seq 3
    on2 "--head-dim '-2'" alltoall --head-dim -2
    on2 "--layers '0'" overlap --layers 0
    on2 "--layers 100000 --params 1099511627776 needs" overlap --layers 100000 --params 1099511627776
fi

echo "PASS: dsm-bench refused $checked bad option values"
