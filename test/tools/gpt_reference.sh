#!/bin/sh
# examples/gpt/train_gpt against its PyTorch reference (examples/gpt/gpt_reference.py):
# from the same initial weights (a safetensors file the reference writes,
# loaded with dsm_engine_load_weights) and the same batch (4 sequences of the
# shard), the loss and every parameter's gradient must agree within fp32
# tolerance: ||g_ref - g|| / ||g_ref|| <= 1e-5 for each of the 28 tensors.
# Skipped (77) without a Python with torch (DSM_BENCH_PYTHON, else
# /usr/bin/python3, else python3).
set -u
# shellcheck source=test/tools/gpt_common.sh disable=SC2154 # top_srcdir: set by the test harness
. "$top_srcdir/test/tools/gpt_common.sh"
py=
for p in ${DSM_BENCH_PYTHON:-} /usr/bin/python3 python3; do
    if "$p" -c 'import torch' >/dev/null 2>&1; then py=$p; break; fi
done
[ -n "$py" ] || { echo "SKIP: no Python with torch"; exit 77; }
ref=$top_srcdir/examples/gpt/gpt_reference.py
shard 5000
"$py" "$ref" init --preset tiny --out "$tmp/init.safetensors" --seed 7 || fail "reference init"
config='{"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4,
  "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 0}}'
# shellcheck disable=SC2086 # MPIEXEC may carry options
out=$(timeout 120 $launcher -n 1 "$bin" "$config" --data "$tmp/data.bin" --no-shuffle \
      --init "$tmp/init.safetensors" --dump-grads "$tmp/grads.safetensors" 2>&1) || fail "train_gpt: $out"
echo "$out" | tail -n 1
"$py" "$ref" grads --preset tiny --init "$tmp/init.safetensors" --data "$tmp/data.bin" --batch 4 \
    --compare "$tmp/grads.safetensors" --tol 1e-5 || fail "the gradients differ"
# A file whose names do not match the model: every rank fails, naming them.
"$py" "$ref" init --preset tiny --out "$tmp/other.safetensors" >/dev/null || fail "reference init"
sed 's/ln_f.bias/ln_g.bias/' "$tmp/other.safetensors" > "$tmp/renamed.safetensors"
# shellcheck disable=SC2086
out=$(timeout 120 $launcher -n 1 "$bin" "$config" --data "$tmp/data.bin" --init "$tmp/renamed.safetensors" 2>&1)
refused $? "weights with a wrong name" "$out"
echo "$out" | grep -q "ln_g.bias" || fail "the error does not name the unexpected tensor: $out"
echo "ok: loss and gradients equal the PyTorch reference's"
