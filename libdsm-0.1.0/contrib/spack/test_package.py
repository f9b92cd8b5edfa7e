#!/usr/bin/env python3
"""Checks contrib/spack/package.py without Spack: loads the recipe against a
stand-in for the few parts of Spack's package API it uses, then for every
combination of its variants checks the configure arguments it produces:
each --with/--enable option must be one that ./configure --help lists, each
dependency's prefix goes to its option, and a disabled variant turns its
package off. Usage: test_package.py RECIPE CONFIGURE_HELP_TEXT_FILE."""
import itertools
import re
import sys
import types

recipe, help_file = sys.argv[1], sys.argv[2]
help_text = open(help_file).read()
known = set(re.findall(r"--(?:with|enable)-([a-z0-9-]+)", help_text))

directives = {"version": [], "variant": [], "depends_on": [], "conflicts": []}


def record(kind):
    def directive(*args, **kwargs):
        directives[kind].append((args, kwargs))
    return directive


class Prefix(str):
    pass


class Spec:
    def __init__(self, variants, cuda_arch):
        self.on = variants
        self.variants = {"cuda_arch": types.SimpleNamespace(value=cuda_arch)}

    def satisfies(self, text):
        m = re.fullmatch(r"([+~])([a-z0-9_]+)", text)
        if not m:
            raise AssertionError("satisfies(%r): not a single variant" % text)
        return self.on[m.group(2)] == (m.group(1) == "+")

    def __getitem__(self, name):
        return types.SimpleNamespace(prefix=Prefix("/opt/" + name), mpicc="/opt/mpi/bin/mpicc",
                                     mpicxx="/opt/mpi/bin/mpicxx", mpifc="/opt/mpi/bin/mpif90")


class AutotoolsPackage:
    def enable_or_disable(self, name):
        return ["--enable-" + name if self.spec.satisfies("+" + name) else "--disable-" + name]


spack = types.ModuleType("spack")
package_api = types.ModuleType("spack.package")
package_api.AutotoolsPackage = AutotoolsPackage
package_api.CudaPackage = type("CudaPackage", (), {})
for kind in directives:
    setattr(package_api, kind, record(kind))
for name in ("run_after", "on_package_attributes"):
    setattr(package_api, name, lambda *a, **k: (lambda f: f))
package_api.__all__ = [n for n in dir(package_api) if not n.startswith("_")]
sys.modules["spack"] = spack
sys.modules["spack.package"] = package_api

namespace = {}
exec(compile(open(recipe).read(), recipe, "exec"), namespace)
Libdsm = namespace["Libdsm"]

failures = []
variants = sorted(a[0] for a, _ in directives["variant"]) + ["cuda"]
for want in ("fortran", "hdf5", "nccl", "cuda"):
    if want not in variants:
        failures.append("no variant %r" % want)
if not directives["version"]:
    failures.append("no version")
deps = [a[0] for a, _ in directives["depends_on"]]
for dep in ("mpi", "hwloc@2:", "nlohmann-json@3:"):
    if dep not in deps:
        failures.append("no depends_on(%r)" % dep)

cases = 0
for values in itertools.product([False, True], repeat=len(variants)):
    on = dict(zip(variants, values))
    if on["nccl"] and not on["cuda"]:
        continue  # the recipe's conflicts() rules this out
    for arch in (["none"], ["80", "90"]):
        pkg = Libdsm.__new__(Libdsm)
        pkg.spec = Spec(on, arch)
        args = pkg.configure_args()
        cases += 1
        opts = {}
        for arg in args:
            m = re.fullmatch(r"--(with|without|enable|disable)-([a-z0-9-]+)(=(.*))?", arg)
            if m:
                if m.group(2) not in known:
                    failures.append("%s: not an option of configure" % arg)
                opts[m.group(2)] = (m.group(1), m.group(4))
            elif not arg.startswith("NVCCFLAGS="):
                failures.append("%s: unexpected argument" % arg)
        for dep in ("mpi", "hwloc"):
            if opts.get(dep) != ("with", "/opt/" + dep):
                failures.append("%s: --with-%s=/opt/%s missing in %s" % (on, dep, dep, args))
        for variant, kind in (("fortran", "enable"), ("hdf5", "with"), ("cuda", "with"), ("nccl", "with")):
            got = opts.get(variant, (None, None))[0]
            want = kind if on[variant] else {"enable": "disable", "with": "without"}[kind]
            if got != want:
                failures.append("%s: --%s-%s expected, got %s" % (on, want, variant, args))
        nvcc = [a for a in args if a.startswith("NVCCFLAGS=")]
        if on["cuda"] and arch != ["none"]:
            if not nvcc or "sm_80" not in nvcc[0] or "sm_90" not in nvcc[0]:
                failures.append("%s cuda_arch=%s: NVCCFLAGS %s" % (on, arch, nvcc))
        elif nvcc:
            failures.append("%s cuda_arch=%s: unexpected %s" % (on, arch, nvcc))

for f in failures:
    print("FAIL:", f)
print("%d variant combinations checked, %d failures" % (cases, len(failures)))
sys.exit(1 if failures else 0)
