#!/bin/sh
# dsm-info end to end: the build description, and `dsm-info mesh --json` on
# 8 ranks over 2 simulated cyclic nodes, read back with a JSON parser.
set -u
bin=$top_builddir/tools/dsm-info
launcher=${MPIEXEC:-mpiexec}
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_mpi_yield_when_idle=1
# Open MPI does not free its own allocations at exit (see test/mpirun-wrapper.sh.in).
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is needed to read the JSON"; exit 77; }
tmp=${TMPDIR:-/tmp}/dsm-info-test.$$
mkdir -p "$tmp" && trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --version | grep -q "libdsm" || fail "--version"
"$bin" | grep -q "DSM_MESH_PLACEMENT" || fail "no parameters in the text output"
"$bin" --env | grep -q "^environment parameters:" || fail "--env"
"$bin" --env | grep -q "DSM_COMM_BACKEND" || fail "--env lacks DSM_COMM_BACKEND"
# A value that engine creation refuses (DSM_SIMD) is still listed, as set.
DSM_SIMD=sse9 "$bin" --env > "$tmp/env" || fail "dsm-info --env with DSM_SIMD=sse9 exited $?"
grep -q 'DSM_SIMD = "sse9" (set' "$tmp/env" || fail "--env does not report DSM_SIMD=sse9"
"$bin" --json > "$tmp/info.json" || fail "dsm-info --json exited $?"
python3 - "$tmp/info.json" "$top_srcdir/doc/environment.md" <<'PY' || fail "dsm-info --json content"
import json, re, sys
j = json.load(open(sys.argv[1]))
assert j["features"]["mpi"] is True
names = [p["name"] for p in j["parameters"]]
assert "DSM_DEBUG" in names and "DSM_SIM_NODES" in names, names
assert all(p["help"] for p in j["parameters"])
assert all(p["type"] in ("string", "choice", "int", "size", "bool", "signal") for p in j["parameters"])
# Every parameter the library declares, in the order and with the type of
# the reference table (the table's rows start with the name and the type).
doc = [re.match(r"\| `(DSM_\w+)` \| (\w+) \|", l) for l in open(sys.argv[2])]
doc = [(m.group(1), m.group(2)) for m in doc if m]
assert [(p["name"], p["type"]) for p in j["parameters"]] == doc, (names, doc)
PY
"$bin" --env | grep -q '^  DSM_COMM_NET_CHUNK = "[^"]*" ([a-z]*, size)$' || fail "--env lacks the type of DSM_COMM_NET_CHUNK"

"$bin" --bogus > /dev/null 2>&1; [ $? -eq 2 ] || fail "an unknown option must exit 2"
# The command line (getopt_long): each refusal exits 2 naming the option or
# value; a value joined with '=' and a prefix of a long option are read.
usage_error() { # usage_error TEXT ARGS...
    text=$1
    shift
    "$bin" "$@" > "$tmp/out" 2> "$tmp/err"
    rc=$?
    [ "$rc" -eq 2 ] || { cat "$tmp/err"; fail "'dsm-info $*' exited $rc, expected 2"; }
    head -n 1 "$tmp/err" | grep -qF -- "$text" || { cat "$tmp/err"; fail "'dsm-info $*': no \"$text\""; }
    [ ! -s "$tmp/out" ] || fail "'dsm-info $*' printed on stdout"
}
usage_error "dsm-info: unknown option '--bogus'" --bogus
usage_error "dsm-info: unexpected argument 'extra'" --env extra
usage_error "dsm-info: --json takes no value" --json=1
usage_error "dsm-info mesh: --shape needs a value" mesh --shape
usage_error "dsm-info mesh: --shape: '2x' is not a size" mesh --shape 2x
usage_error "dsm-info mesh: --placement 'far' is not node or none" mesh --shape 2 --placement=far
usage_error "dsm-info config: --world-size '+8' is not a non-negative integer" config '{}' --world-size +8
usage_error "dsm-info lr: --steps ' 3' is not a non-negative integer" lr '{}' --steps " 3"
usage_error "dsm-info lr: unknown option '--sequence-parallel-size'" lr '{}' --steps 3 --sequence-parallel-size 2
usage_error "dsm-info config: unexpected argument 'b.json'" config a.json b.json --world-size 2
"$bin" lr '{"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 0.001}}}' --steps=2 --world=1 | grep -q "^ *2 " ||
    fail "dsm-info lr --steps=2 --world=1"

DSM_SIM_NODES=2:cyclic timeout 120 $launcher -n 8 "$bin" mesh --shape 2,2,2 --names dp,cp,tp \
    --flatten dp,cp --json > "$tmp/mesh.json" || fail "dsm-info mesh exited $?"
python3 - "$tmp/mesh.json" <<'PY' || fail "dsm-info mesh --json content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "dsm-mesh" and j["format_version"] == 1
assert j["shape"] == [2, 2, 2] and j["names"] == ["dp", "cp", "tp"]
assert j["nnodes"] == 2 and j["within_node"] == {"dp": False, "cp": True, "tp": True}, j["within_node"]
assert j["groups"] == ["dp", "cp", "tp", "dp_cp"]
ranks = j["ranks"]
assert [r["rank"] for r in ranks] == list(range(8))
for r in ranks:
    assert r["node"] == r["rank"] % 2          # cyclic launch
    for g in ("cp", "tp"):                     # inner groups on one node
        assert all(ranks[m]["node"] == r["node"] for m in r["groups"][g])
    for g, n in (("dp", 2), ("cp", 2), ("tp", 2), ("dp_cp", 4)):
        assert len(r["groups"][g]) == n and r["groups"][g] == sorted(r["groups"][g])
        assert r["rank"] in r["groups"][g]
PY

DSM_SIM_NODES=2:cyclic timeout 120 $launcher -n 8 "$bin" mesh --shape 2,2,2 --names dp,cp,tp \
    --slice dp,tp --json > "$tmp/slice.json" || fail "dsm-info mesh --slice exited $?"
python3 - "$tmp/slice.json" <<'PY' || fail "dsm-info mesh --slice content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["names"] == ["dp", "tp"] and j["shape"] == [2, 2]
assert j["slice_of"] == {"shape": [2, 2, 2], "names": ["dp", "cp", "tp"]}
assert all(len(r["coords"]) == 2 for r in j["ranks"])
PY

# A bad shape: an error naming the value, exit status 1, no hang.
timeout 120 $launcher -n 4 "$bin" mesh --shape 3,2 > "$tmp/out" 2> "$tmp/err"
[ $? -ne 0 ] || fail "a wrong shape must fail"
grep -q "communicator size 4" "$tmp/err" || { cat "$tmp/err"; fail "message does not name the size"; }
# dsm-info config: a DeepSpeed file resolved for 8 ranks, with and without a mesh.
cfg=$top_srcdir/test/data/config/zero2_bf16_adamw_warmupdecay.json
"$bin" config "$cfg" --world-size 8 --json > "$tmp/config.json" || fail "dsm-info config exited $?"
"$bin" config "$cfg" --world-size 8 --sequence-parallel-size 2 --json > "$tmp/config_sp.json" ||
  fail "dsm-info config --sequence-parallel-size exited $?"
python3 - "$tmp/config.json" "$tmp/config_sp.json" <<'PY' || fail "dsm-info config content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["train_micro_batch_size_per_gpu"] == 8 and j["gradient_accumulation_steps"] == 4
assert j["train_batch_size"] == 8 * 4 * 8, j["train_batch_size"]
assert j["zero_optimization"]["stage"] == 2 and j["bf16"]["enabled"] is True
assert j["resolved"]["data_parallel_world_size"] == 8
k = json.load(open(sys.argv[2]))
assert k["resolved"]["data_parallel_world_size"] == 4 and k["train_batch_size"] == 8 * 4 * 4
assert j["sequence_parallel_size"] == 1 and k["sequence_parallel_size"] == 2, k["sequence_parallel_size"]
assert "zero_optimization.sub_group_size" in j["resolved"]["no_effect"], j["resolved"]["no_effect"]
assert "zero_optimization.stage" not in j["resolved"]["no_effect"]
PY
"$bin" config "$cfg" --world-size 8 --sequence-parallel-size 2 | grep -q "^sequence_parallel_size = 2$" ||
  fail "dsm-info config --sequence-parallel-size 2 must show sequence_parallel_size = 2"
"$bin" config "$cfg" --world-size 8 | grep -q "^zero_optimization.sub_group_size = .*  # no effect in libdsm$" ||
  fail "dsm-info config must mark keys accepted without effect"
"$bin" config '{"train_batch_size": 8, "sequence_parallel_size": 4}' --world-size 8 --sequence-parallel-size 2 \
  > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "a sequence_parallel_size that contradicts --sequence-parallel-size must exit 1"
grep -q "sequence_parallel_size: the configuration says 4 but the mesh's sequence_parallel dimension has 2 ranks" \
  "$tmp/err" || { cat "$tmp/err"; fail "sequence_parallel_size mismatch message"; }
"$bin" config "$cfg" --world-size 8 | grep -q "^zero_optimization.stage = 2$" || fail "dsm-info config text"
"$bin" config '{"train_batch_size": 8, "zero_optimization": {"stage": 4}}' --world-size 2 \
  > /dev/null 2> "$tmp/err"
[ $? -eq 1 ] || fail "a bad configuration must exit 1"
grep -q "zero_optimization.stage: expected 0..3, got 4" "$tmp/err" || { cat "$tmp/err"; fail "config message"; }
"$bin" config "$cfg" > /dev/null 2>&1; [ $? -eq 2 ] || fail "config without --world-size must exit 2"

# dsm-info lr: one entry per step, the warmup reaching its maximum.
"$bin" lr "$cfg" --steps 600 --json > "$tmp/lr.json" || fail "dsm-info lr exited $?"
python3 - "$tmp/lr.json" <<'PY' || fail "dsm-info lr content"
import json, sys
j = json.load(open(sys.argv[1]))
assert j["format"] == "dsm-lr" and j["scheduler"] == "WarmupDecayLR"
steps = j["steps"]
assert len(steps) == 601 and steps[0]["step"] == 0 and steps[600]["step"] == 600
lrs = [s["lr"][0] for s in steps]
assert lrs[0] == 0.0 and max(lrs) <= 3e-4 * (1 + 1e-12)
assert abs(max(lrs) - 3e-4) < 1e-9, max(lrs)
peak = lrs.index(max(lrs))
assert 499 <= peak <= 502, peak
assert all(a <= b for a, b in zip(lrs[:peak], lrs[1:peak + 1]))   # warmup rises
assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:]))    # then decays
PY
[ "$("$bin" lr "$cfg" --steps 3 | grep -c '^ *[0-9]')" -eq 4 ] || fail "dsm-info lr text: 4 lines for 3 steps"

# The `dsm-info lr` examples of the docs print what the docs show: each
# block's command is run and its data lines compared (among them the schedule
# restored by hand of configuration.md, whose step 0 is the optimizer's lr).
python3 - "$bin" "$top_srcdir/doc/configuration.md" "$top_srcdir/doc/dsm-info.md" <<'PY' || fail "dsm-info lr examples of the docs"
import re, subprocess, sys
found = 0
for doc in sys.argv[2:]:
    text = open(doc).read()
    for block in re.findall(r"```\n(\$ dsm-info lr '.*?)```", text, re.S):
        m = re.match(r"\$ dsm-info lr '(.*?)' --steps (\d+)\n(.*)", block, re.S)
        assert m, (doc, block)
        config = " ".join(line.strip() for line in m.group(1).splitlines())
        want = [l for l in m.group(3).splitlines() if l[:1].isdigit()]
        out = subprocess.run([sys.argv[1], "lr", config, "--steps", m.group(2)], capture_output=True, text=True)
        assert out.returncode == 0, (doc, out.stderr)
        got = [l for l in out.stdout.splitlines() if l[:1].isdigit()]
        assert got == want, (doc, want, got)
        found += 1
assert found >= 2, found
PY

echo "PASS: dsm-info"
