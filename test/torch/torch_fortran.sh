#!/bin/sh
# The PyTorch bridge from Fortran (test_torch_fortran, module dsm_torch) on 2
# ranks against PyTorch's DistributedDataParallel training of the same model
# on the same data: every loss within 1e-5 relative over 20 steps.
set -u
# shellcheck source=test/torch/torch_common.sh
. "$top_srcdir/test/torch/torch_common.sh"
models
STEPS=20 ddp 2 1
"$run" 2 "$top_builddir/test/torch/test_torch_fortran" "$tmp/mlp.pt" "$tmp/data.bin" "$tmp/ref_w2_g1.bin" 20 "$tmp/ckpt" ||
    fail "test_torch_fortran"
echo "ok: Fortran arrays train the model as PyTorch does"
