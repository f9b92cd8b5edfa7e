#!/bin/sh
# bench_gpt.sh: train_gpt against its PyTorch reference on this machine's CPU,
# the newest PyTorch and Debian's 1.13 side by side.
#
#   examples/gpt/bench_gpt.sh [BUILDDIR] [STEPS] [ROUNDS]
#
# The small preset (4 layers, 4 heads, width 256, context 256, vocabulary 256,
# 3.3M parameters), examples/gpt/gpt_small.json (global batch 16 sequences =
# 4096 tokens, AdamW, clipping), the same initial weights (the reference
# writes them; train_gpt loads them with dsm_engine_load_weights) and the same
# synthetic shard read in the same order (--no-shuffle). Every run uses 1
# thread per rank (OMP_NUM_THREADS = OPENBLAS_NUM_THREADS = torch threads = 1).
# The PyTorches: DSM_BENCH_PYTHON (a python with torch), else the newest
# PyTorch from PyPI in a virtual environment (DSM_BENCH_VENV, default
# /tmp/torch-venv, created and filled with `pip install torch numpy` when
# missing: about 5 GB); and /usr/bin/python3 (Debian's python3-torch, 1.13)
# as a second column when it imports torch (DSM_BENCH_PYTHON2 to name
# another). The reference uses scaled_dot_product_attention where its
# PyTorch has it (2.0 and later).
# Runs, all in this one invocation, ROUNDS (default 3) times interleaved:
#   train_gpt on 1 and on 2 MPI ranks;
#   each reference on 1 process and under DistributedDataParallel (gloo) on 2.
# Each ratio is taken within a round; the median and range over the rounds.
# tokens/s is the global batch's tokens over the mean step time of the steps
# after the first two. MFU: the model's FLOPs per token, 6 N + 12 L C T (N
# parameters, attention's full square), over one core's measured sgemm rate
# (a 1024 x 1024 x 1024 sgemm through numpy, 1 thread), the "peak" here.
# libdsm's share: rank 0's time inside libdsm calls over its step time.
# Wrap it in `flock /tmp/bench.lock` on a shared machine.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../..}
steps=${2:-12}
rounds=${3:-3}
preset=${DSM_BENCH_PRESET:-small} # tiny: a quick check of the script itself
launcher=${MPIEXEC:-mpiexec}
if [ -n "${DSM_BENCH_PYTHON:-}" ]; then
    py=$DSM_BENCH_PYTHON
else
    venv=${DSM_BENCH_VENV:-/tmp/torch-venv}
    if ! "$venv/bin/python" -c "import torch, numpy" 2>/dev/null; then
        echo "bench_gpt.sh: installing the newest PyTorch from PyPI into $venv (about 5 GB)"
        python3 -m venv "$venv" && "$venv/bin/pip" install --quiet torch numpy ||
            { echo "bench_gpt.sh: cannot install PyTorch into $venv (set DSM_BENCH_PYTHON)"; exit 1; }
    fi
    py=$venv/bin/python
fi
py2=${DSM_BENCH_PYTHON2:-/usr/bin/python3}
"$py2" -c "import torch" 2>/dev/null || py2=""
[ "$py2" != "$py" ] || py2=""
tv() { "$1" -c "import torch; print(torch.__version__.split('+')[0])"; }
v1=$(tv "$py")
v2=${py2:+$(tv "$py2")}
echo "PyTorch $v1 ($py)${py2:+ and $v2 ($py2)}"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_MCA_rmaps_base_oversubscribe=1
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/examples/gpt/gpt_shard" --synthetic 400000 "$tmp/data.bin" >/dev/null
"$py" "$here/gpt_reference.py" init --preset "$preset" --out "$tmp/init.safetensors" >/dev/null
# one core's sgemm rate now (GFLOP/s -> TFLOP/s), measured again in each round
measure_peak() {
    "$py" -c '
import time, numpy as np
a = np.random.rand(1024, 1024).astype(np.float32); b = a.copy(); a @ b
t = time.perf_counter(); n = 10
for _ in range(n): a @ b
print(2 * 1024**3 * n / (time.perf_counter() - t) / 1e12)'
}
tps() { awk '$1 == "figures:" { print $2 }'; }
field() { awk -v k="$1" '{ for (i = 1; i < NF; ++i) if ($i == k) print $(i + 1) }' | head -n 1; }
run_dsm() { # N
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    $launcher -n "$1" "$build/examples/gpt/train_gpt" "$here/gpt_small.json" --preset "$preset" --data "$tmp/data.bin" \
        --no-shuffle --init "$tmp/init.safetensors" --steps "$steps" --print-every 100 --peak-tflops "$peak" 2>&1
}
run_ref() { # PYTHON N
    p=$1
    shift
    "$p" "$here/gpt_reference.py" train --preset "$preset" --init "$tmp/init.safetensors" --data "$tmp/data.bin" \
        --batch 16 --micro 8 --steps "$steps" --ranks "$1" --threads 1 --lr 1e-3 --warmup 10 --total 300 \
        --print-every 100 2>&1
}
# Rounds of the four runs, interleaved, so that a change of the machine's
# load hits every program alike; the ratios are taken within each round.
: > "$tmp/rounds"
r=0
while [ $r -lt "$rounds" ]; do
    r=$((r + 1))
    peak=$(measure_peak)
    d2=$(run_dsm 2); r2=$(run_ref "$py" 2); d1=$(run_dsm 1); r1=$(run_ref "$py" 1)
    o1=0 o2=0
    if [ -n "$py2" ]; then o2=$(run_ref "$py2" 2 | tps); o1=$(run_ref "$py2" 1 | tps); fi
    echo "$r $(echo "$d1" | tps) $(echo "$d2" | tps) $(echo "$r1" | tps) $(echo "$r2" | tps) $o1 $o2" \
         "$(echo "$d1" | field MFU) $(echo "$d2" | field MFU)" \
         "$(echo "$d2" | awk '$1 == "libdsm" && $2 == "share:" { print $3 }')" \
         "$(echo "$d2" | sed -n 's/.* of [0-9.]* s (\([0-9.]*%\))$/\1/p')" \
         "$(awk -v p="$peak" 'BEGIN { printf "%.1f", p * 1000 }')" >> "$tmp/rounds"
done
printf '\n%s preset, %s steps (the first 2 not timed), 1 thread per rank; tokens/s of each run\n' "$preset" "$steps"
printf '%-6s %11s %11s %11s %11s %11s %11s %7s %7s %10s %10s %9s\n' round "dsm 1" "dsm 2" "pt$v1 1" "pt$v1 DDP2" \
    "pt${v2:-none} 1" "pt${v2:-none} DDP2" "MFU 1" "MFU 2" "dsm calls" "eng timer" "sgemm GF"
awk '{ printf "%-6s %11.1f %11.1f %11.1f %11.1f %11.1f %11.1f %7s %7s %10s %10s %9s\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12 }' "$tmp/rounds"
# median (and range) over the rounds of each ratio
awk 'function med(a, n,   i, j, t) { for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                  return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     function show(name, a, n, goal,   lo, hi, i) { lo = hi = a[1]; for (i = 2; i <= n; ++i) { if (a[i] < lo) lo = a[i]; if (a[i] > hi) hi = a[i] }
                                  printf "%-46s %.2fx (%.2f-%.2f)%s\n", name, med(a, n), lo, hi, goal }
     { n++; ddp[n] = $3 / $5; one[n] = $2 / $4; sc[n] = $3 / $2; tsc[n] = $5 / $4
       if ($6 > 0) { m++; oddp[m] = $3 / $7; oone[m] = $2 / $6; osc[m] = $7 / $6 } }
     END { show("train_gpt / PyTorch " v1 " DDP at 2 ranks:", ddp, n, " (goal >= 1.2)")
           show("train_gpt / PyTorch " v1 " at 1 rank:", one, n, "")
           if (m) { show("train_gpt / PyTorch " v2 " DDP at 2 ranks:", oddp, m, "")
                    show("train_gpt / PyTorch " v2 " at 1 rank:", oone, m, "") }
           show("train_gpt scaling 1 -> 2 ranks:", sc, n, " (goal >= 1.9)")
           show("PyTorch " v1 " scaling 1 -> 2 ranks (DDP):", tsc, n, "")
           if (m) show("PyTorch " v2 " scaling 1 -> 2 ranks (DDP):", osc, m, "") }' v1="$v1" v2="$v2" "$tmp/rounds"
echo "libdsm share at 2 ranks: 'dsm calls' = wall time inside libdsm calls / step time (rank 0);"
echo "'eng timers' = the engine's reduce + optimizer + gather timers / run time (goal <= 5%)"
