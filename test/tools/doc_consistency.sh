#!/bin/sh
# What the docs tell a new user agrees with itself and with this build:
#  - one C link line and one Fortran link line, the same in README.md and
#    every page of doc/, with the rpath; the C one links README's example
#    against this build (through a dsm.pc that points at it) and the program
#    starts without LD_LIBRARY_PATH;
#  - no page names a libdsm.so.N other than the one this build makes;
#  - the keys the docs call "no effect" are the reader's own list
#    (resolved.no_effect of dsm-info config --json), and the keys they say the
#    engine acts on are none of them: doc/deepspeed-migration.md,
#    doc/engine.md ("Configuration keys the engine uses") and
#    doc/configuration.md ("Status");
#  - the tutorial shows the loop's helpers (dsm_engine_param_read_f32,
#    dsm_engine_grad_add_f32, dsm_engine_batch, dsm_engine_resume,
#    dsm_engine_mean_loss) and the loss-scale line.
set -u
fail() { echo "FAIL: $*"; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "SKIP: python3 is needed"; exit 77; }
tmp=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$tmp"' EXIT
src=$top_srcdir
info=$top_builddir/tools/dsm-info

# ---------------------------------------------------------------- link lines
python3 - "$src" > "$tmp/lines" <<'PY' || fail "the link lines of the docs differ"
import glob, os, re, sys
src = sys.argv[1]
pages = [os.path.join(src, "README.md")] + sorted(glob.glob(os.path.join(src, "doc", "*.md")))
found = {"dsm": [], "dsmf": []}
for page in pages:
    for n, line in enumerate(open(page, encoding="utf-8"), 1):
        m = re.search(r"pkg-config (?:--cflags )?--libs (dsmf?)(?![-\w])", line)
        if not m:
            continue
        text = line.strip()
        # The object and program names are the page's own.
        text = re.sub(r"^(mpicc|mpifort) \S+?\.o ", r"\1 app.o ", text)
        text = re.sub(r" -o \S+$", " -o app", text)
        found[m.group(1)].append((os.path.relpath(page, src), n, text))
bad = False
for module, lines in found.items():
    if not lines:
        print("no link line for", module, file=sys.stderr); bad = True; continue
    distinct = sorted(set(t for _, _, t in lines))
    if len(distinct) != 1:
        print("%s: %d different link lines:" % (module, len(distinct)), file=sys.stderr)
        for p, n, t in lines:
            print("  %s:%d: %s" % (p, n, t), file=sys.stderr)
        bad = True
    rpath = "-Wl,-rpath,$(pkg-config --variable=libdir %s)" % module
    for p, n, t in lines:
        if rpath not in t:
            print("%s:%d: the link line has no rpath: %s" % (p, n, t), file=sys.stderr); bad = True
    print(module, distinct[0])
sys.exit(1 if bad else 0)
PY
c_line=$(sed -n 's/^dsm //p' "$tmp/lines")
echo "C link line: $c_line"

# ---------------------------------------------------------------- the library's name
so=$(cd "$top_builddir/.libs" 2>/dev/null && ls libdsm.so.[0-9]* 2>/dev/null | grep -E '^libdsm\.so\.[0-9]+$' | head -n 1)
[ -n "$so" ] || { echo "SKIP: no shared libdsm.so.N in $top_builddir/.libs (a static build)"; exit 77; }
named=$(grep -ohE 'libdsm\.so\.[0-9]+' "$src/README.md" "$src"/doc/*.md | sort -u)
for n in $named; do
    [ "$n" = "$so" ] || fail "the docs name $n, this build makes $so"
done

# ---------------------------------------------------------------- the link line links
sed -n '/^```c$/,/^```$/p' "$src/README.md" | sed '1d;$d' > "$tmp/app.c"
[ -s "$tmp/app.c" ] || fail "README.md has no \`\`\`c block"
libdir=$(cd "$top_builddir/.libs" && pwd)
incdir=$(cd "$src/include" && pwd)
bincdir=$(cd "$top_builddir/include" && pwd)
cat > "$tmp/dsm.pc" <<EOF
libdir=$libdir
includedir=$incdir
Name: dsm
Description: libdsm, this build tree
Version: 0
Cflags: -I\${includedir} -I$bincdir
Libs: -L\${libdir} -ldsm
EOF
export PKG_CONFIG_PATH=$tmp
command -v pkg-config >/dev/null 2>&1 || { echo "SKIP: pkg-config is needed"; exit 77; }
compile_line=$(grep -h '^ *mpicc -c app.c \$(pkg-config --cflags dsm)$' "$src/README.md" | sed 's/^ *//' | head -n 1)
[ -n "$compile_line" ] || fail "README.md lacks the compile line 'mpicc -c app.c \$(pkg-config --cflags dsm)'"
# The docs' compiler is mpicc; this build's is $CC (the same wrapper, perhaps
# behind ccache), with this build's $CFLAGS (the sanitizers' flags in that
# build, without which its libdsm.so does not link).
( cd "$tmp" && unset LD_LIBRARY_PATH &&
  eval "$(echo "$compile_line" | sed "s|^mpicc |$CC ${CFLAGS:-} |")" &&
  eval "$(echo "$c_line" | sed "s|^mpicc |$CC ${CFLAGS:-} |")" ) > "$tmp/build.log" 2>&1 ||
    { cat "$tmp/build.log"; fail "the documented link line does not build README's example"; }
export OMPI_MCA_rmaps_base_oversubscribe=1 OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
out=$(cd "$tmp" && unset LD_LIBRARY_PATH && timeout 300 ${MPIEXEC:-mpiexec} -n 1 ./app 2>&1) ||
    fail "the program linked with the documented line does not run: $out"
echo "$out" | grep -q '^step 10' || fail "the program linked with the documented line printed: $out"

# ---------------------------------------------------------------- the keys
[ -x "$info" ] || fail "$info is not built"
"$info" config '{"train_batch_size": 1, "optimizer": {"type": "AdamW"}}' --world-size 1 --json > "$tmp/cfg.json" ||
    fail "dsm-info config --json"
python3 - "$tmp/cfg.json" "$src" <<'PY' || fail "the docs' key lists disagree with the reader's"
import json, os, re, sys
cfg = json.load(open(sys.argv[1]))
src = sys.argv[2]
truth = set(cfg["resolved"]["no_effect"])
# Every key path the reader resolves (the leaves of the resolved configuration).
paths = set()
def walk(j, prefix):
    if isinstance(j, dict) and j:
        for k, v in j.items():
            walk(v, prefix + "." + k if prefix else k)
    else:
        paths.add(prefix)
walk({k: v for k, v in cfg.items() if k not in ("resolved", "unknown_keys")}, "")
def full(key, parent=""):
    """The resolved paths a documented key names: itself, or a key of `parent`."""
    cands = [key] + ([parent + "." + key] if parent else []) + ["zero_optimization." + key]
    return [c for c in cands if c in paths or any(p.startswith(c + ".") for p in paths)]
bad = []
def page(name):
    return open(os.path.join(src, "doc", name), encoding="utf-8").read()

# deepspeed-migration.md: the marked list is exactly the reader's list.
mig = page("deepspeed-migration.md")
m = re.search(r"<!-- no-effect keys: begin -->(.*?)<!-- no-effect keys: end -->", mig, re.S)
if not m:
    bad.append("deepspeed-migration.md: no marked list of the keys without effect")
else:
    listed = set(re.findall(r"`([\w.]+)`", m.group(1)))
    want = truth - {"zero_optimization.legacy_form"}  # the old boolean form, said in words
    for k in sorted(want - listed):
        bad.append("deepspeed-migration.md: %s has no effect but is not listed" % k)
    for k in sorted(listed - want):
        bad.append("deepspeed-migration.md: %s is listed as without effect but the reader says it acts" % k)
# Its table of supported keys: none without effect.
sup = mig[mig.index("### Supported"):mig.index("### Accepted and ignored")]
for row in re.findall(r"^\| (.*?) \|", sup, re.M):
    parent = ""
    for k in re.findall(r"`([\w.]+)`", row):
        if "." in k:
            parent = k.rsplit(".", 1)[0]
        for p in full(k, parent):
            if p in truth:
                bad.append("deepspeed-migration.md: %s is supported there, the reader says no effect" % p)

# engine.md: the keys the engine uses are none of the no-effect ones.
eng = page("engine.md")
sec = eng[eng.index("## Configuration keys the engine uses"):]
sec = sec[:sec.index("\n## ", 5)]
table = [l for l in sec.splitlines() if l.startswith("| `")]
if not table:
    bad.append("engine.md: no table of the keys the engine uses")
for row in table:
    cell = row.split("|")[1]
    parent = ""
    for k in re.findall(r"`([\w.]+)`", cell):
        if "." in k:
            parent = k.rsplit(".", 1)[0]
        for p in full(k, parent):
            if p in truth:
                bad.append("engine.md: the engine uses %s, the reader says no effect" % p)
# Its sentence on the keys without effect names only such keys.
rest = sec[sec.index("The other keys"):]
rest = rest[:rest.index("`dsm-info config` marks")]
for k in re.findall(r"`([\w.]+)`", rest):
    ps = full(k)
    if ps and not any(p in truth for p in ps):
        bad.append("engine.md: %s is said to have no effect, the reader says it acts" % k)

# configuration.md, "Status": what the engine acts on, and what has no effect.
conf = page("configuration.md")
st = conf[conf.index("**Status.**"):]
st = st[:st.index("\n\n")]
acts = st[:st.index("[engine.md]")]
for k in re.findall(r"`([\w.]+)`", acts):
    for p in full(k):
        if p in truth:
            bad.append("configuration.md: Status says the engine acts on %s, the reader says no effect" % p)
none = st[st.index("The other keys have no effect"):]
none = none[:none.index(";")]   # the sentence's list, up to its end
for k in re.findall(r"`([\w.]+)`", none):
    ps = full(k)
    if ps and not any(p in truth for p in ps):
        bad.append("configuration.md: Status says %s has no effect, the reader says it acts" % k)
for b in bad:
    print(b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY

# ---------------------------------------------------------------- the tutorial's loop
for f in dsm_engine_param_read_f32 dsm_engine_grad_add_f32 dsm_engine_batch dsm_engine_resume dsm_engine_mean_loss \
         dsm_engine_loss_scale; do
    grep -q "$f(" "$src/doc/tutorial.md" || fail "doc/tutorial.md does not show $f"
done
exit 0
