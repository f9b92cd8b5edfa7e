# Sourced by the tests of examples/gpt (test/tools/gpt_*.sh): the programs,
# the launcher and its environment (root, oversubscription, one thread per
# rank, no leak report for the processes that a test kills), fail(), and a
# temporary directory $tmp removed at exit. shard N: a synthetic shard of N
# tokens in $tmp/data.bin.
# shellcheck shell=sh disable=SC2154,SC2034 # top_builddir: set by the test harness; bin, launcher: for the sourcing tests
bin=$top_builddir/examples/gpt/train_gpt
shard_tool=$top_builddir/examples/gpt/gpt_shard
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
shard() { "$shard_tool" --synthetic "$1" "$tmp/data.bin" >/dev/null || fail "gpt_shard"; }
# refused RC WHAT OUTPUT: a run that must fail failed cleanly: not 0, and
# neither timeout's 124 or 137 (it hung after its message) nor a death by a
# signal (128 + N).
refused() {
    [ "$1" -ne 0 ] || fail "$2 ran: $3"
    [ "$1" -ne 124 ] && [ "$1" -lt 128 ] || fail "$2: exit status $1 (a hang or a signal), expected a clean failure: $3"
}
# The regular expression of a number as printf writes one: not nan, -nan, inf.
number_re='^[-+]?[0-9]+([.][0-9]*)?([eE][-+]?[0-9]+)?$'
