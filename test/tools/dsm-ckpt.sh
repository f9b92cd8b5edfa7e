#!/bin/sh
# dsm-ckpt end to end on checkpoints the library writes: test/tools/make_checkpoint
# trains a tiny model and saves the tags global_step2 and global_step4 (latest:
# global_step4). Checks info, verify, export (HDF5 and safetensors, the latter
# read back with Python's standard library, checksums recomputed there), diff,
# clean, escaped control characters, non-finite values, and every error: the
# exit status, and one line on stderr naming the problem.
set -u
bin=$top_builddir/tools/dsm-ckpt
maker=$top_builddir/test/tools/make_checkpoint
# Open MPI does not free its own allocations at exit (see test/mpirun-wrapper.sh.in).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
[ -x "$bin" ] || { echo "SKIP: $bin is not built (libdsm configured without parallel HDF5)"; exit 77; }
[ -x "$maker" ] || { echo "SKIP: $maker is not built"; exit 77; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is needed to read the JSON"; exit 77; }
tmp=${TMPDIR:-/tmp}/dsm-ckpt-test.$$
mkdir -p "$tmp" && trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect STATUS TEXT COMMAND...: COMMAND exits with STATUS; when TEXT is not
# empty, its stderr is one line containing TEXT. Its stdout is left in $tmp/out.
expect() {
    want=$1 text=$2
    shift 2
    "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -eq "$want" ] || { cat "$tmp/err"; fail "'$*' exited $rc, expected $want"; }
    [ -z "$text" ] && return 0
    [ "$(wc -l < "$tmp/err")" -eq 1 ] || { cat "$tmp/err"; fail "'$*': expected one line on stderr"; }
    grep -qF -- "$text" "$tmp/err" || { cat "$tmp/err"; fail "'$*': the message does not say '$text'"; }
}

ck=$tmp/ckpt
timeout 300 "$maker" "$ck" > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "make_checkpoint exited $?"; }
[ -f "$ck/global_step2.h5" ] && [ -f "$ck/global_step4.h5" ] || fail "make_checkpoint wrote no global_step2/4"

# ---------------------------------------------------------------- info
expect 0 "" "$bin" info "$ck"
grep -q "global_step4" "$tmp/out" && grep -q "^training state" "$tmp/out" || fail "info text: $(cat "$tmp/out")"
expect 0 "" "$bin" info "$ck" --json
cp "$tmp/out" "$tmp/info4.json"
expect 0 "" "$bin" info "$ck" --tag global_step2 --json
cp "$tmp/out" "$tmp/info2.json"
expect 0 "" "$bin" info "$ck/global_step4.h5" --json
cp "$tmp/out" "$tmp/info4f.json"
python3 - "$tmp/info4.json" "$tmp/info2.json" "$tmp/info4f.json" <<'PY' || fail "info --json content"
import json, sys
j4, j2, jf = (json.load(open(p)) for p in sys.argv[1:4])
for j in (j4, j2, jf):
    assert j["format"] == "dsm-ckpt-info" and j["format_version"] == 1
    a = j["attributes"]
    assert a["format"] == "dsm-checkpoint" and a["format_version"] == 2 and "attrs_checksum" in a, a
    for k in ("global_steps", "micro_steps", "skipped_steps", "global_samples", "optimizer_steps", "loss_scale",
              "lr_schedule_last_step", "zero_stage", "data_parallel_size", "sequence_parallel_size",
              "compute_dtype", "optimizer", "libdsm_version", "mesh_shape", "mesh_names"):
        assert k in a, k
    assert a["optimizer"] in ("adam", "adamw", "sgd", "lamb", "lion", "adagrad"), a["optimizer"]
    params = [t for t in j["tensors"] if t["kind"] == "param"]
    assert params, "no parameters"
    for t in j["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        assert t["elements"] == n and t["bytes"] == 4 * n and t["dtype"] == "float32", t
        assert t["path"].startswith("/params/" if t["kind"] == "param" else "/optimizer/" + t["state"] + "/"), t
        assert isinstance(t["name"], str), t
    tot = j["totals"]["params"]
    assert tot["count"] == len(params) and tot["bytes"] == sum(t["bytes"] for t in params), tot
    assert j["problems"] == [], j["problems"]
d = j4["directory"]
assert "global_step2" in d["tags"] and "global_step4" in d["tags"], d
assert d["latest"] == "global_step4" and j4["tag"] == "global_step4" and j2["tag"] == "global_step2"
assert j4["file"].endswith("global_step4.h5") and j2["file"].endswith("global_step2.h5")
assert j4["attributes"]["tag"] == "global_step4" and j2["attributes"]["tag"] == "global_step2"
assert j4["attributes"]["global_steps"] > j2["attributes"]["global_steps"]
assert jf["directory"] is None and jf["attributes"] == j4["attributes"] and jf["tensors"] == j4["tensors"]
PY

# ---------------------------------------------------------------- verify
expect 0 "" "$bin" verify "$ck"
grep -q "^OK: " "$tmp/out" || fail "verify text: $(cat "$tmp/out")"
expect 0 "" "$bin" verify "$ck" --tag global_step2 --json
python3 - "$tmp/out" "$tmp/info2.json" <<'PY' || fail "verify --json content"
import json, sys
v, info = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
assert v["format"] == "dsm-ckpt-verify" and v["format_version"] == 1 and v["ok"] is True, v
assert v["problems"] == [] and all(c["ok"] for c in v["checked"]), v
paths = {c["path"] for c in v["checked"]}
assert paths >= {t["path"] for t in info["tensors"]}, paths
assert (info["client_state"] is None) == ("/client_state" not in paths)
PY

# ---------------------------------------------------------------- export
expect 0 "" "$bin" export "$ck" --output "$tmp/w.safetensors" --json
cp "$tmp/out" "$tmp/export.json"
python3 - "$tmp/w.safetensors" "$tmp/export.json" "$tmp/info4.json" <<'PY' || fail "safetensors content"
import json, struct, sys
data = open(sys.argv[1], "rb").read()
e, info = json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
assert e["format"] == "dsm-ckpt-export" and e["format_version"] == 1 and e["output_format"] == "safetensors", e
n, = struct.unpack("<Q", data[:8])
assert n % 8 == 0 and 8 + n <= len(data), n
text = data[8:8 + n].decode("utf-8")
assert text.startswith("{") and text == text.rstrip(" ") + " " * (len(text) - len(text.rstrip(" ")))
header = json.loads(text)
meta = header.pop("__metadata__")
assert meta["format"] == "pt" and all(isinstance(v, str) for v in meta.values()), meta
params = {t["name"]: t for t in info["tensors"] if t["kind"] == "param"}
assert set(header) == set(params), (sorted(header), sorted(params))
buf = data[8 + n:]
end = 0
checksums = {t["name"]: int(t["checksum"], 16) for t in e["tensors"]}
def splitmix64(z):
    m = (1 << 64) - 1
    z = (z + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)
for name, t in header.items():                     # header order is data order
    begin, stop = t["data_offsets"]
    assert t["dtype"] == "F32" and t["shape"] == params[name]["shape"], (name, t)
    assert begin == end and stop - begin == 4 * params[name]["elements"], (name, t)
    end = stop
    # The checkpoint's checksum (doc/checkpoint.md), recomputed here: the writer
    # and this reader agree on the formula, not only with each other's code.
    words = struct.unpack("<%dI" % params[name]["elements"], buf[begin:stop])
    s = sum(splitmix64((i * 0x9E3779B97F4A7C15 + b) & ((1 << 64) - 1)) for i, b in enumerate(words)) % (1 << 64)
    assert s == checksums[name], (name, hex(s), hex(checksums[name]))
assert end == len(buf), (end, len(buf))
assert e["bytes"] == len(buf) and e["file_bytes"] == len(data)
PY
expect 0 "" "$bin" export "$ck" --tag global_step2 --output "$tmp/w.h5"
[ -s "$tmp/w.h5" ] || fail "export wrote no $tmp/w.h5"
if command -v h5ls >/dev/null 2>&1; then
    nparams=$(python3 -c "import json,sys; print(sum(t['kind'] == 'param' for t in json.load(open(sys.argv[1]))['tensors']))" "$tmp/info2.json")
    [ "$(h5ls "$tmp/w.h5" | grep -c Dataset)" -eq "$nparams" ] || fail "the .h5 export holds not $nparams datasets: $(h5ls "$tmp/w.h5")"
fi
ls -a "$tmp" | grep -q '\.tmp' && fail "export left a temporary file: $(ls -a "$tmp")"

# --dtype bf16 / fp16: every element is the fp32 export's value rounded to
# nearest even, checked bit for bit against conversions written here (bf16:
# the rounding on the bit pattern; fp16: struct's "e", which rounds to nearest
# even), the header dtypes "BF16"/"F16", 2 bytes an element.
expect 0 "" "$bin" export "$ck" --output "$tmp/w16.safetensors" --dtype fp16 --json
cp "$tmp/out" "$tmp/export16.json"
expect 0 "" "$bin" export "$ck" --output "$tmp/wb16.safetensors" --dtype=bf16 --json
cp "$tmp/out" "$tmp/exportb16.json"
expect 0 "" "$bin" export "$ck" --output "$tmp/w32.safetensors" --dtype fp32
cmp -s "$tmp/w32.safetensors" "$tmp/w.safetensors" || fail "--dtype fp32 differs from the default export"
cat > "$tmp/st.py" <<'PY'
import json, math, struct
def read(path):
    data = open(path, "rb").read()
    n, = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return header, data[8 + n:]
def values(header, buf, name):
    t = header[name]
    begin, end = t["data_offsets"]
    code = {"F32": "I", "BF16": "H", "F16": "H"}[t["dtype"]]
    return struct.unpack("<%d%s" % ((end - begin) // struct.calcsize(code), code), buf[begin:end])
def bf16(u):
    if (u & 0x7fffffff) > 0x7f800000:
        return (u >> 16) | 0x40
    return ((u + 0x7fff + ((u >> 16) & 1)) >> 16) & 0xffff
def fp16(u):
    x, = struct.unpack("<f", struct.pack("<I", u))
    if math.isnan(x):
        return 0x7e00 | ((u >> 16) & 0x8000)
    if math.isinf(x):
        return 0x7c00 | ((u >> 16) & 0x8000)
    return struct.unpack("<H", struct.pack("<e", x))[0]
PY
python3 - "$tmp" <<'PY' || fail "bf16/fp16 safetensors content"
import json, sys
sys.path.insert(0, sys.argv[1])
from st import read, values, bf16, fp16
t = sys.argv[1]
h32, b32 = read(t + "/w.safetensors")
for path, dtype, ref, summary in ((t + "/w16.safetensors", "F16", fp16, "export16.json"),
                                  (t + "/wb16.safetensors", "BF16", bf16, "exportb16.json")):
    h, b = read(path)
    e = json.load(open(t + "/" + summary))
    assert e["dtype"] == {"F16": "fp16", "BF16": "bf16"}[dtype], e
    assert list(h) == list(h32), (list(h), list(h32))
    end = 0
    for name in h:
        assert h[name]["dtype"] == dtype and h[name]["shape"] == h32[name]["shape"], (name, h[name])
        begin, stop = h[name]["data_offsets"]
        assert begin == end, (name, begin, end)
        end = stop
        got, src = values(h, b, name), values(h32, b32, name)
        assert stop - begin == 2 * len(src), (name, begin, stop)
        want = tuple(ref(u) for u in src)
        assert got == want, (name, dtype, [hex(g) for g in got], [hex(w) for w in want])
    assert end == len(b) == e["bytes"], (end, len(b), e["bytes"])
PY
expect 0 "" "$bin" export "$ck" --output "$tmp/w16.h5" --dtype fp16
if command -v h5dump >/dev/null 2>&1; then
    h5dump -H "$tmp/w16.h5" | grep -q "16-bit" || h5dump -H "$tmp/w16.h5" | grep -q "H5T_IEEE_F16LE" ||
        fail "the fp16 .h5 export holds no 16-bit floats: $(h5dump -H "$tmp/w16.h5" | head -20)"
fi
# Non-finite values stay what they are (NaN at index 1, +inf at index 3 of emb);
# a finite value beyond the fp16 range (70000) is an error naming the tensor,
# the index and the value, and nothing is written. bf16 holds it (rounded).
big=$tmp/large
timeout 300 "$maker" "$big" --nonfinite --large > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "make_checkpoint --large"; }
expect 1 "/params/emb: the value 70000 at index 2 is beyond the fp16 range (largest 65504)" \
    "$bin" export "$big" --output "$tmp/big16.safetensors" --dtype fp16
[ ! -e "$tmp/big16.safetensors" ] || fail "an fp16 export that overflows wrote its output"
expect 1 "70000 at index 2" "$bin" export "$big" --output "$tmp/big16.h5" --dtype fp16
[ ! -e "$tmp/big16.h5" ] || fail "an fp16 .h5 export that overflows wrote its output"
expect 0 "" "$bin" export "$big" --output "$tmp/bigb16.safetensors" --dtype bf16
expect 0 "" "$bin" export "$big" --output "$tmp/big32.safetensors"
python3 - "$tmp" <<'PY' || fail "bf16 export of non-finite and large values"
import sys
sys.path.insert(0, sys.argv[1])
from st import read, values, bf16
h, b = read(sys.argv[1] + "/bigb16.safetensors")
h32, b32 = read(sys.argv[1] + "/big32.safetensors")
emb, src = values(h, b, "emb"), values(h32, b32, "emb")
assert emb[1] & 0x7fff > 0x7f80 and emb[3] == 0x7f80 and emb[2] == bf16(src[2]) == 0x4789, [hex(x) for x in emb]
assert emb == tuple(bf16(u) for u in src)
PY
ls -a "$tmp" | grep -q '\.tmp' && fail "export left a temporary file: $(ls -a "$tmp")"

# ---------------------------------------------------------------- diff
expect 0 "" "$bin" diff "$ck" "$ck"
grep -q "^equal" "$tmp/out" || fail "diff of a checkpoint with itself: $(cat "$tmp/out")"
expect 0 "" "$bin" diff "$ck/global_step4.h5" "$ck" --json
expect 1 "" "$bin" diff "$ck" "$ck" --tag-a global_step2 --json
python3 - "$tmp/out" <<'PY' || fail "diff --json content"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["format"] == "dsm-ckpt-diff" and d["format_version"] == 1 and d["equal"] is False, d
assert d["a"]["tag"] == "global_step2" and d["b"]["tag"] == "global_step4"
names = {a["name"]: a for a in d["attributes"]}
assert names["global_steps"]["counted"] is True and names["global_steps"]["a"] < names["global_steps"]["b"]
assert names["tag"]["counted"] is False
assert d["only_in_a"] == [] and d["only_in_b"] == []
assert any(not t["equal"] and t["max_abs_diff"] > 0 for t in d["tensors"] if t["path"].startswith("/params/"))
PY
expect 1 "" "$bin" diff "$ck" "$ck" --tag-a global_step2
grep -q "^different" "$tmp/out" && grep -q "global_steps" "$tmp/out" || fail "diff text: $(cat "$tmp/out")"
# Was the resume exact? A run resumed from global_step2 and saved at step 4
# against the run that went on: the tensors, counters and schedule are the
# same, the loss scaler's iteration counter included (it counts from the
# start of training, not from the resume).
mkdir -p "$tmp/resumed"
cp "$ck/global_step2.h5" "$tmp/resumed/" && printf global_step2 > "$tmp/resumed/latest"
timeout 300 "$maker" "$tmp/resumed" --resume --steps 2 > "$tmp/make.log" 2>&1 ||
    { cat "$tmp/make.log"; fail "make_checkpoint --resume exited $?"; }
expect 0 "" "$bin" diff "$tmp/resumed" "$ck"
grep -q "^equal" "$tmp/out" || fail "diff after an exact resume: $(cat "$tmp/out")"
grep "^attribute " "$tmp/out" && fail "attributes differ after an exact resume: $(cat "$tmp/out")"
expect 0 "" "$bin" diff "$tmp/resumed" "$ck" --all
grep -q "^equal" "$tmp/out" || fail "diff --all after an exact resume: $(cat "$tmp/out")"
expect 0 "" "$bin" diff "$tmp/resumed" "$ck" --json
python3 - "$tmp/out" <<'PY' || fail "diff --json after a resume"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["equal"] is True and d["all"] is False, d
kinds = {a["name"]: (a["kind"], a["counted"]) for a in d["attributes"]}
assert kinds == {}, kinds
PY
# A training counter that differs is counted: step 4 against step 2.
expect 1 "" "$bin" diff "$tmp/resumed" "$ck" --tag-b global_step2 --json
python3 - "$tmp/out" <<'PY' || fail "diff --json counts the training state"
import json, sys
d = json.load(open(sys.argv[1]))
kinds = {a["name"]: (a["kind"], a["counted"]) for a in d["attributes"]}
assert kinds.get("global_steps") == ("training", True), kinds
PY

# ---------------------------------------------------------------- errors
expect 1 "$tmp/none: No such file or directory" "$bin" info "$tmp/none"
expect 1 "$tmp/none" "$bin" verify "$tmp/none"
echo "not a checkpoint" > "$tmp/junk.h5"
expect 1 "not an HDF5 file" "$bin" info "$tmp/junk.h5"
expect 1 "$tmp/junk.h5" "$bin" verify "$tmp/junk.h5"
size=$(wc -c < "$ck/global_step4.h5")
head -c $((size / 2)) "$ck/global_step4.h5" > "$tmp/truncated.h5"
expect 1 "truncated" "$bin" verify "$tmp/truncated.h5"
expect 1 "truncated" "$bin" export "$tmp/truncated.h5" --output "$tmp/t.safetensors"
head -c 100 "$ck/global_step4.h5" > "$tmp/short.h5"
expect 1 "$tmp/short.h5" "$bin" info "$tmp/short.h5"

# latest naming a tag whose file is missing; a directory without latest.
mkdir "$tmp/lost" && cp "$ck/global_step2.h5" "$tmp/lost/" && echo global_step9 > "$tmp/lost/latest"
expect 1 "global_step9" "$bin" info "$tmp/lost"
expect 1 "global_step9" "$bin" verify "$tmp/lost"
expect 0 "" "$bin" verify "$tmp/lost" --tag global_step2
rm "$tmp/lost/latest"
expect 1 "latest" "$bin" info "$tmp/lost"
expect 1 "no tag 'global_step4'" "$bin" info "$tmp/lost" --tag global_step4

# One flipped bit inside a tensor's data: verify names the dataset, export
# refuses, diff warns. The data is found in the file by its bytes, taken from
# the safetensors export (both are little-endian fp32, stored contiguously).
mkdir "$tmp/flip" && cp "$ck/global_step4.h5" "$tmp/flip/global_step4.h5"
flipped=$(python3 - "$tmp/flip/global_step4.h5" "$tmp/w.safetensors" "$tmp/export.json" <<'PY'
import json, struct, sys
ck, st, exp = sys.argv[1:4]
b = open(st, "rb").read()
n, = struct.unpack("<Q", b[:8])
header, data = json.loads(b[8:8 + n]), b[8 + n:]
f = bytearray(open(ck, "rb").read())
for t in sorted(json.load(open(exp))["tensors"], key=lambda t: -t["bytes"]):
    begin, end = header[t["name"]]["data_offsets"]
    raw = data[begin:end]
    if len(raw) >= 8 and f.count(raw) == 1:
        f[f.find(raw) + len(raw) // 2] ^= 0x01
        open(ck, "wb").write(f)
        print(t["dataset"])
        break
PY
)
[ -n "$flipped" ] || fail "found no tensor data to corrupt"
expect 1 "$flipped" "$bin" verify "$tmp/flip/global_step4.h5"
grep -qF "$flipped: checksum mismatch" "$tmp/out" || fail "verify does not report $flipped: $(cat "$tmp/out")"
expect 1 "$flipped" "$bin" verify "$tmp/flip/global_step4.h5" --json
python3 -c "
import json, sys
v = json.load(open(sys.argv[1]))
assert v['ok'] is False and [p['path'] for p in v['problems']] == [sys.argv[2]], v['problems']
" "$tmp/out" "$flipped" || fail "verify --json of the corrupted file"
expect 1 "checksum mismatch" "$bin" export "$tmp/flip/global_step4.h5" --output "$tmp/flip/w.safetensors"
[ ! -e "$tmp/flip/w.safetensors" ] || fail "export of a corrupted checkpoint wrote its output"
ls -a "$tmp/flip" | grep -q '\.tmp' && fail "a failed export left a temporary file"
expect 1 "" "$bin" diff "$tmp/flip/global_step4.h5" "$ck"
grep -qF "warning: $flipped: checksum mismatch in A" "$tmp/out" || fail "diff does not warn of the damage: $(cat "$tmp/out")"

# A file of another format: its `format` string patched (same length).
python3 - "$ck/global_step4.h5" "$tmp/other.h5" <<'PY' || fail "cannot patch the format attribute"
import sys
f = open(sys.argv[1], "rb").read()
assert f.count(b"dsm-checkpoint") >= 1
open(sys.argv[2], "wb").write(f.replace(b"dsm-checkpoint", b"dsm-checkpoinX", 1))
PY
expect 1 "format" "$bin" info "$tmp/other.h5"
expect 1 "format" "$bin" verify "$tmp/other.h5"

# A root attribute changed (the tag, same length): the integrity record in
# the user block (format version 2) no longer matches the HDF5 metadata;
# without the record, the checksum over the root attributes still does not.
python3 - "$ck/global_step4.h5" "$tmp/retag.h5" "$tmp/retag-norecord.h5" <<'PY' || fail "cannot patch the tag attribute"
import sys
f = open(sys.argv[1], "rb").read()
assert f[:8] == b"DSMCKPT1" and f.count(b"global_step4") >= 1
g = f.replace(b"global_step4", b"global_step5", 1)
open(sys.argv[2], "wb").write(g)
open(sys.argv[3], "wb").write(bytes(8) + g[8:])
PY
expect 1 "checksum mismatch in its HDF5 metadata" "$bin" verify "$tmp/retag.h5"
expect 1 "checksum mismatch in the root attributes" "$bin" verify "$tmp/retag-norecord.h5"

# Control characters from a file never reach the output raw: an attribute
# value, a parameter name and a tag (a file name) holding terminal escape
# sequences are printed escaped (\x1b; a byte that is not UTF-8: \x9b; a C1
# control: \u009b) in text, and as \u001b in JSON, which is all ASCII.
mkdir "$tmp/esc"
python3 - "$ck/global_step4.h5" "$tmp/esc" <<'PY' || fail "cannot write the file with escape sequences"
import sys
f = open(sys.argv[1], "rb").read()
assert f.count(b"adamw") >= 1 and f.count(b"fc.bias") >= 1
g = f.replace(b"adamw", b"\x1b[2J\x07").replace(b"fc.bias", b"fc\x1b]0;X")   # same lengths
g = bytes(8) + g[8:]   # no integrity record: the edited attributes are what verify reports first
open(sys.argv[2] + "/global_step4.h5", "wb").write(g)
open(sys.argv[2].encode() + b"/\x1b[31mevil\x9b\xc2\x9b.h5", "wb").write(g)   # raw CSI, then U+009B (CSI)
open(sys.argv[2] + "/latest", "w").write("global_step4\n")
PY
esc=$(printf '\033')
for cmd in "info $tmp/esc" "info $tmp/esc --json" "verify $tmp/esc" "verify $tmp/esc --json" \
           "diff $tmp/esc $ck" "diff $tmp/esc $ck --json" "export $tmp/esc --output $tmp/esc.h5"; do
    # shellcheck disable=SC2086 # the words of $cmd are the arguments
    "$bin" $cmd > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -le 2 ] || fail "dsm-ckpt $cmd exited $rc"
    if grep -q "$esc" "$tmp/out" "$tmp/err"; then fail "dsm-ckpt $cmd printed a raw escape character"; fi
    if LC_ALL=C grep -q "$(printf '\233')" "$tmp/out" "$tmp/err"; then fail "dsm-ckpt $cmd printed a raw CSI byte"; fi
done
expect 0 "" "$bin" info "$tmp/esc"
grep -qF '"\x1b[2J\x07"' "$tmp/out" && grep -qF '/params/fc\x1b]0;X' "$tmp/out" && grep -qF '\x1b[31mevil\x9b\u009b' "$tmp/out" ||
    fail "info does not show the escaped text: $(cat "$tmp/out")"
expect 0 "" "$bin" info "$tmp/esc" --json
python3 - "$tmp/out" <<'PY' || fail "info --json does not carry the escaped values"
import json, sys
text = open(sys.argv[1], "rb").read()
assert all(b < 0x80 for b in text), "not ASCII"
j = json.loads(text)
assert j["attributes"]["optimizer"] == "\x1b[2J\x07", j["attributes"]["optimizer"]
assert any(t["name"] == "fc\x1b]0;X" for t in j["tensors"])
PY
expect 1 'attribute '"'"'optimizer'"'"' is "\x1b[2J\x07"' "$bin" verify "$tmp/esc"

# Non-finite values: make_checkpoint --nonfinite puts a NaN at index 1 and
# +inf at index 3 of the frozen parameter emb. verify warns (exit status 0);
# --fail-nonfinite makes it a problem (exit status 1).
nf=$tmp/nonfinite
timeout 300 "$maker" "$nf" --nonfinite > "$tmp/make.log" 2>&1 || { cat "$tmp/make.log"; fail "make_checkpoint --nonfinite"; }
expect 0 "" "$bin" verify "$ck" --fail-nonfinite
expect 0 "" "$bin" verify "$nf"
grep -qF "warning: /params/emb: 2 non-finite values (1 NaN, 1 infinite), the first at index 1" "$tmp/out" &&
    grep -q "^OK: .*1 tensor holds NaN or infinite values" "$tmp/out" || fail "verify of NaN weights: $(cat "$tmp/out")"
expect 0 "" "$bin" verify "$nf" --json
python3 - "$tmp/out" <<'PY' || fail "verify --json of NaN weights"
import json, sys
v = json.load(open(sys.argv[1]))
assert v["ok"] is True and v["nonfinite_tensors"] == 1 and v["problems"] == [], v
c = {c["path"]: c for c in v["checked"]}
assert c["/params/emb"]["nonfinite"] == 2 and c["/params/emb"]["nan"] == 1 and c["/params/emb"]["inf"] == 1
assert c["/params/emb"]["first_nonfinite"] == 1 and c["/params/fc.weight"]["nonfinite"] == 0
assert [w["path"] for w in v["warnings"]] == ["/params/emb"], v["warnings"]
PY
expect 1 "/params/emb: 2 non-finite values" "$bin" verify "$nf" --fail-nonfinite
grep -q "^FAILED: " "$tmp/out" || fail "verify --fail-nonfinite: $(cat "$tmp/out")"
expect 1 "" "$bin" verify "$nf" --fail-nonfinite --json
python3 -c "
import json, sys
v = json.load(open(sys.argv[1]))
assert v['ok'] is False and [p['path'] for p in v['problems']] == ['/params/emb'], v
" "$tmp/out" || fail "verify --fail-nonfinite --json"

# Leftovers of killed saves: .<tag>.h5.tmp and .latest.tmp. info lists them,
# clean --dry-run lists them and removes nothing, clean removes them and
# nothing else (not the checkpoints, latest, another .tmp file, a link or a
# directory with a leftover's name).
cl=$tmp/clean
mkdir "$cl" && cp "$ck/global_step2.h5" "$ck/global_step4.h5" "$ck/latest" "$cl/"
head -c 1000 "$ck/global_step4.h5" > "$cl/.global_step6.h5.tmp"
echo global_step6 > "$cl/.latest.tmp"
head -c 100 "$ck/global_step4.h5" > "$cl/.global_step6.h5.reserve"
echo 0123456789abcdef > "$cl/.dsm-dircheck-0123456789abcdef"
echo keep > "$cl/.other.tmp"
echo keep > "$cl/notes.h5.tmp"
mkdir "$cl/.global_step8.h5.tmp"
ln -s "$cl/global_step2.h5" "$cl/.global_step9.h5.tmp"
expect 0 "" "$bin" info "$cl" --json
python3 -c "
import json, sys
t = json.load(open(sys.argv[1]))['directory']['temporary_files']
assert '.global_step6.h5.tmp' in t and '.latest.tmp' in t, t
" "$tmp/out" || fail "info does not list the leftovers"
expect 0 "" "$bin" clean "$cl" --dry-run
grep -q "would remove $cl/.global_step6.h5.tmp" "$tmp/out" && grep -q "would remove $cl/.latest.tmp" "$tmp/out" ||
    fail "clean --dry-run: $(cat "$tmp/out")"
[ -f "$cl/.global_step6.h5.tmp" ] && [ -f "$cl/.latest.tmp" ] || fail "clean --dry-run removed a file"
expect 0 "" "$bin" clean "$cl" --dry-run --json
python3 - "$tmp/out" <<'PY' || fail "clean --dry-run --json"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["format"] == "dsm-ckpt-clean" and c["format_version"] == 1 and c["dry_run"] is True, c
assert [(f["file"], f["kind"], f["tag"], f["removed"]) for f in c["leftovers"]] == [
    (".dsm-dircheck-0123456789abcdef", "token", None, False),
    (".global_step6.h5.reserve", "reserve", "global_step6", False),
    (".global_step6.h5.tmp", "checkpoint", "global_step6", False), (".latest.tmp", "latest", None, False)], c
assert c["bytes"] == 1000 + 100 + 17 + len("global_step6\n") and c["removed"] == 0, c
assert sorted(k["file"] for k in c["kept"]) == [".global_step8.h5.tmp", ".global_step9.h5.tmp"], c["kept"]
PY
expect 0 "" "$bin" clean "$cl" --json
python3 -c "
import json, sys
c = json.load(open(sys.argv[1]))
assert c['removed'] == 4 and all(f['removed'] for f in c['leftovers']), c
" "$tmp/out" || fail "clean --json"
[ ! -e "$cl/.global_step6.h5.tmp" ] && [ ! -e "$cl/.latest.tmp" ] && [ ! -e "$cl/.global_step6.h5.reserve" ] &&
    [ ! -e "$cl/.dsm-dircheck-0123456789abcdef" ] || fail "clean left a leftover"
for f in global_step2.h5 global_step4.h5 latest .other.tmp notes.h5.tmp; do
    [ -f "$cl/$f" ] || fail "clean removed $f"
done
[ -d "$cl/.global_step8.h5.tmp" ] && [ -L "$cl/.global_step9.h5.tmp" ] && [ -f "$cl/global_step2.h5" ] ||
    fail "clean removed a directory or a link, or what it points to"
expect 0 "" "$bin" clean "$cl"
grep -q "no leftovers of interrupted saves" "$tmp/out" || fail "clean of a clean directory: $(cat "$tmp/out")"
expect 0 "" "$bin" verify "$cl"
expect 2 "not a directory" "$bin" clean "$cl/global_step4.h5"
expect 1 "$tmp/none" "$bin" clean "$tmp/none"
expect 2 "--tag" "$bin" clean "$cl" --tag global_step4
expect 2 "--dry-run" "$bin" verify "$ck" --dry-run
expect 2 "--fail-nonfinite" "$bin" info "$ck" --fail-nonfinite

# Usage errors: exit status 2, the message naming the culprit.
expect 2 "--bogus" "$bin" info "$ck" --bogus
expect 2 "--tag" "$bin" info "$ck" --tag
expect 2 "PATH" "$bin" verify
expect 2 "frobnicate" "$bin" frobnicate "$ck"
expect 2 "extra" "$bin" info "$ck" extra
expect 2 "--tag" "$bin" info "$ck/global_step4.h5" --tag global_step4
expect 2 "../x" "$bin" info "$ck" --tag ../x
expect 2 "--output" "$bin" export "$ck"
expect 2 "w.txt" "$bin" export "$ck" --output "$tmp/w.txt"
expect 2 "--dtype 'int8'" "$bin" export "$ck" --output "$tmp/w.safetensors" --dtype int8
expect 2 "--dtype" "$bin" export "$ck" --output "$tmp/w.safetensors" --dtype
# The command line of getopt_long: a value joined with '=', a prefix of a long
# option, "--" before a path, and the refusals that come with them.
expect 2 "dsm-ckpt clean: --dry-run takes no value" "$bin" clean "$cl" --dry-run=1
expect 2 "dsm-ckpt info: --json takes no value" "$bin" info "$ck" --json=yes
expect 2 "dsm-ckpt info: --tag needs a value" "$bin" info "$ck" --tag
expect 2 "ambiguous option '--ta' (--tag-a or --tag-b) (see dsm-ckpt diff --help)" "$bin" diff "$ck" "$ck" --ta x
expect 2 "unknown option '--bogus' (see dsm-ckpt diff --help)" "$bin" diff "$ck" "$ck" --bogus=1
expect 2 "unknown option '-x' (see dsm-ckpt info --help)" "$bin" info "$ck" -x
expect 2 "unexpected argument 'extra' (see dsm-ckpt info --help)" "$bin" info "$ck" extra
expect 2 "--rtol 'x'" "$bin" diff "$ck" "$ck" --rtol=x
expect 0 "" "$bin" info "$ck" --tag=global_step4
expect 0 "" "$bin" verify --fail-non "$ck"
expect 0 "" "$bin" info -- "$ck"
expect 2 "--atol" "$bin" diff "$ck" "$ck" --atol -1
expect 2 "--rtol" "$bin" diff "$ck" "$ck" --rtol x
expect 2 "B" "$bin" diff "$ck"
"$bin" > /dev/null 2>&1; [ $? -eq 2 ] || fail "no subcommand must exit 2"
expect 0 "" "$bin" --help
grep -q "dsm-ckpt diff" "$tmp/out" || fail "--help"
for sub in info verify export diff clean; do
    expect 0 "" "$bin" $sub --help
    grep -q "usage: dsm-ckpt $sub" "$tmp/out" || fail "$sub --help"
done
expect 0 "" "$bin" --version
grep -q "libdsm" "$tmp/out" || fail "--version"

echo "PASS: dsm-ckpt"
