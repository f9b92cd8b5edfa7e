#!/bin/sh
# examples/gpt/train_gpt stops on a non-finite loss: from weights whose
# ln_f.weight is NaN (the rest zero) the first step's loss is NaN; every
# rank must stop at that step with exit status 4 and a message naming the
# loss and the step, and save nothing (no `latest` in --checkpoint), at 1
# and 2 ranks.
set -u
# shellcheck source=test/tools/gpt_common.sh disable=SC2154 # top_srcdir: set by the test harness
. "$top_srcdir/test/tools/gpt_common.sh"
shard 20000
# The tiny preset's parameters (2 layers, width 32, context 32, vocabulary
# 256) in a safetensors file, written with the standard library only.
python3 - "$tmp/nan.safetensors" <<'PY' || fail "writing the weights"
import json, struct, sys
C, T, Vp, L = 32, 32, 256, 2
shapes = {"wte.weight": [Vp, C], "wpe.weight": [T, C]}
layer = {"ln_1.weight": [C], "ln_1.bias": [C], "attn.c_attn.weight": [C, 3 * C], "attn.c_attn.bias": [3 * C],
         "attn.c_proj.weight": [C, C], "attn.c_proj.bias": [C], "ln_2.weight": [C], "ln_2.bias": [C],
         "mlp.c_fc.weight": [C, 4 * C], "mlp.c_fc.bias": [4 * C], "mlp.c_proj.weight": [4 * C, C],
         "mlp.c_proj.bias": [C]}
for l in range(L):
    shapes.update({f"h.{l}.{k}": v for k, v in layer.items()})
shapes.update({"ln_f.weight": [C], "ln_f.bias": [C]})
header, blobs, off = {}, [], 0
for name, shape in shapes.items():
    n = 1
    for d in shape:
        n *= d
    value = float("nan") if name == "ln_f.weight" else 0.0
    blobs.append(struct.pack(f"<{n}f", *([value] * n)))
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + 4 * n]}
    off += 4 * n
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PY
for n in 1 2; do
    rm -rf "$tmp/ckpt"
    # shellcheck disable=SC2086 # MPIEXEC may carry options
    out=$(timeout 120 $launcher -n $n "$bin" "$top_srcdir/examples/gpt/gpt_tiny.json" --data "$tmp/data.bin" \
          --init "$tmp/nan.safetensors" --steps 5 --checkpoint "$tmp/ckpt" --save-every 1 2>&1)
    rc=$?
    [ $rc = 4 ] || fail "$n ranks: exit status $rc, expected 4: $out"
    echo "$out" | grep -q "the loss is NaN at step 1" || fail "$n ranks: no message naming the NaN loss: $out"
    [ ! -e "$tmp/ckpt/latest" ] || fail "$n ranks: a checkpoint of the diverged state was saved"
    echo "$out" | grep "the loss is"
    echo "ok: $n ranks"
done
