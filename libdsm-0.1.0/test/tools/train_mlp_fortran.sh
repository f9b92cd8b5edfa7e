#!/bin/sh
# examples/fortran/train_mlp through the checks of train_mlp.sh: each shipped
# configuration at 1, 2 and 4 ranks, a checkpoint on 4 ranks resumed on 2,
# and a missing configuration failing cleanly on every rank.
DSM_TRAIN_MLP=$top_builddir/examples/fortran/train_mlp
export DSM_TRAIN_MLP
exec $SHELL "$top_srcdir/test/tools/train_mlp.sh"
