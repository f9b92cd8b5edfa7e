# Spack package recipe for libdsm.
#
# Install it into a Spack package repository as packages/libdsm/package.py
# (see contrib/spack/README.md), then for example
#   spack install libdsm +fortran +hdf5 ^openmpi
#   spack install libdsm +cuda cuda_arch=90 +nccl
# From a source checkout, `spack dev-build libdsm@0.2.0` builds that tree.

from spack.package import *


class Libdsm(AutotoolsPackage, CudaPackage):
    """DeepSpeed's distributed-training runtime for MPI codes in C, C++ and
    Fortran: a named device mesh, ZeRO stages 0-3, DeepSpeed JSON
    configuration, mixed precision, Ulysses sequence parallelism and
    checkpoints in parallel HDF5 that restart on any number of ranks."""

    # Release tarballs are what `make dist` writes: libdsm-X.Y.Z.tar.gz. A site
    # puts them in a Spack mirror (`spack mirror add`) under libdsm/.
    url = "libdsm-0.2.0.tar.gz"

    version("0.2.0")

    variant("fortran", default=True, description="Build the Fortran module (module dsm, libdsmf)")
    variant("hdf5", default=True, description="Checkpoints in parallel HDF5 and the dsm-ckpt tool")
    variant("nccl", default=False, description="The NCCL communication backend (needs +cuda)")
    # +cuda and cuda_arch come from CudaPackage.

    conflicts("+nccl", when="~cuda", msg="the NCCL backend runs on the CUDA runtime: use +cuda +nccl")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("fortran", type="build", when="+fortran")
    depends_on("pkgconfig", type="build")

    depends_on("mpi")
    depends_on("hwloc@2:")
    depends_on("nlohmann-json@3:", type="build")
    depends_on("hdf5@1.10: +mpi", when="+hdf5")
    depends_on("nccl", when="+nccl")
    depends_on("cmocka@1.1:", type="test")

    # The C++17 compiler the library needs.
    conflicts("%gcc@:7", msg="libdsm needs a C++17 compiler (GCC 8 or newer)")

    def setup_build_environment(self, env):
        # Build with the MPI compiler wrappers of the chosen MPI.
        spec = self.spec
        env.set("CC", spec["mpi"].mpicc)
        env.set("CXX", spec["mpi"].mpicxx)
        if spec.satisfies("+fortran"):
            env.set("FC", spec["mpi"].mpifc)

    def configure_args(self):
        spec = self.spec
        args = [
            "--with-mpi={0}".format(spec["mpi"].prefix),
            "--with-hwloc={0}".format(spec["hwloc"].prefix),
        ]
        args += self.enable_or_disable("fortran")
        if spec.satisfies("+hdf5"):
            args.append("--with-hdf5={0}".format(spec["hdf5"].prefix))
        else:
            args.append("--without-hdf5")
        if spec.satisfies("+cuda"):
            args.append("--with-cuda={0}".format(spec["cuda"].prefix))
            archs = spec.variants["cuda_arch"].value
            if archs and archs[0] != "none":
                flags = ["-O3", "-std=c++17"]
                flags += ["-gencode arch=compute_{0},code=sm_{0}".format(a) for a in archs]
                args.append("NVCCFLAGS={0}".format(" ".join(flags)))
        else:
            args.append("--without-cuda")
        if spec.satisfies("+nccl"):
            args.append("--with-nccl={0}".format(spec["nccl"].prefix))
        else:
            args.append("--without-nccl")
        return args

    # Spack's Autotools builder runs `make check` (the MPI tests on up to 8 ranks,
    # oversubscribed) and `make installcheck` (programs built against the
    # installed copy with pkg-config and CMake) with `spack install --test=root`.
