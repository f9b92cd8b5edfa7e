# Sourced by the PyTorch bridge's tests (test/torch/*.sh): the launcher and
# its environment, fail(), a temporary directory $tmp removed at exit, $py (a
# Python with PyTorch: DSM_TORCH_PYTHON, else /usr/bin/python3, else python3;
# there is none is a failure, not a skip: scripts/setup-debian.sh installs
# python3-torch wherever the bridge is built), and models: the TorchScript
# files and data of test/torch/torch_reference.py in $tmp.
# shellcheck shell=sh disable=SC2154,SC2034 # top_builddir: set by the test harness
run=$top_builddir/test/mpirun-wrapper.sh
ref_py=$top_srcdir/test/torch/torch_reference.py
export OMP_NUM_THREADS=1 DSM_TEST_TIMEOUT=${DSM_TEST_TIMEOUT:-300}
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
py=
for p in ${DSM_TORCH_PYTHON:-} /usr/bin/python3 python3; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || fail "no Python with PyTorch (python3-torch; or set DSM_TORCH_PYTHON): the bridge's tests compare with PyTorch"
models() { "$py" "$ref_py" models "$tmp" || fail "torch_reference.py models"; }
# ddp W G: PyTorch's DistributedDataParallel training on W processes with G accumulation steps
ddp() { "$py" "$ref_py" ddp "$tmp" --world "$1" --gas "$2" --steps "${STEPS:-50}" || fail "torch_reference.py ddp --world $1 --gas $2"; }
