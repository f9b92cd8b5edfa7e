#!/bin/sh
# Bad input to the PyTorch bridge on 1, 2 and 4 ranks (test_torch_errors):
# missing, corrupt and too-new model files, a model without parameters,
# parameters that differ between ranks, bad options and configuration,
# inputs and labels of the wrong shape or dtype on one rank. Every rank
# returns the error with a message naming the thing; none hangs.
set -u
# shellcheck source=test/torch/torch_common.sh
. "$top_srcdir/test/torch/torch_common.sh"
models
for w in 1 2 4; do
    "$run" "$w" "$top_builddir/test/torch/test_torch_errors" "$tmp" || fail "test_torch_errors on $w ranks"
done
echo "ok: bad input reported on every rank at 1, 2 and 4 ranks"
