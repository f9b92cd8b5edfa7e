#!/bin/sh
# The metrics files open in the tools users read them with: train_mlp trains
# with csv_monitor and tensorboard enabled on 2 ranks; Python's csv module
# reads every CSV file (header "step,<name>", one row per boundary) and
# TensorBoard's own event reader (the tensorboard package) reads the event
# file's scalars with the same steps and values. Skipped (77) without a
# python3 that has tensorboard.
set -u
py=${DSM_TEST_PYTHON:-python3}
if ! "$py" -c "from tensorboard.backend.event_processing import event_accumulator" 2> /dev/null; then
    echo "SKIP: no python3 with the tensorboard package ($py)"
    exit 77
fi
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fail() { echo "FAIL: $*"; exit 1; }
dir=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$dir"' EXIT
"$py" - "$top_srcdir/examples/c/train_mlp.json" "$dir" << 'PY' || fail "writing the configuration"
import json, sys
cfg = json.load(open(sys.argv[1]))
cfg["csv_monitor"] = {"enabled": True, "output_path": sys.argv[2] + "/csv", "job_name": "mlp"}
cfg["tensorboard"] = {"enabled": True, "output_path": sys.argv[2] + "/tb", "job_name": "mlp"}
json.dump(cfg, open(sys.argv[2] + "/config.json", "w"))
PY
out=$(timeout 300 $launcher -n 2 "$top_builddir/examples/c/train_mlp" "$dir/config.json" --steps 30 2>&1) ||
    fail "train_mlp with the monitors: $out"
"$py" - "$dir" << 'PY' || fail "reading the metrics back"
import csv, glob, math, os, sys
from tensorboard.backend.event_processing import event_accumulator
d = sys.argv[1]
rows = {}
for path in sorted(glob.glob(d + "/csv/mlp/*.csv")):
    with open(path, newline="") as f:
        r = list(csv.reader(f))
    name = os.path.basename(path)[:-4]
    assert r[0][0] == "step" and len(r[0]) == 2, (path, r[0])
    rows[name] = [(int(a), float(b)) for a, b in r[1:]]
for want in ["Train_Samples_train_loss", "Train_Samples_lr", "Train_Samples_grad_norm",
             "Train_Samples_samples_per_sec", "Train_Samples_elapsed_time_ms_step"]:
    assert want in rows, (want, sorted(rows))
    assert len(rows[want]) == 30, (want, len(rows[want]))
loss = rows["Train_Samples_train_loss"]
steps = [s for s, _ in loss]
assert steps == sorted(steps) and steps[0] > 0 and len(set(steps)) == 30, steps
assert loss[-1][1] < loss[0][1], "the loss did not fall"
files = glob.glob(d + "/tb/mlp/events.out.tfevents.*")
assert len(files) == 1, files
acc = event_accumulator.EventAccumulator(files[0])
acc.Reload()
tags = acc.Tags()["scalars"]
for tag in ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/grad_norm"]:
    assert tag in tags, (tag, tags)
ev = acc.Scalars("Train/Samples/train_loss")
assert [e.step for e in ev] == steps, ([e.step for e in ev], steps)
for e, (s, v) in zip(ev, loss):
    assert math.isclose(e.value, v, rel_tol=1e-6), (e.value, v)
print("metrics: %d CSV files, %d TensorBoard scalar tags, train_loss %.4f -> %.4f over %d boundaries"
      % (len(rows), len(tags), loss[0][1], loss[-1][1], len(loss)))
PY
exit 0
