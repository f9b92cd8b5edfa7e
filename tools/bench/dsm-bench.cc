// dsm-bench: see harness.hpp and doc/dsm-bench.md.
//
// Through what each subcommand measures libdsm. The engine benchmarks drive
// the engine as a program does, through the public C API (api_engine.hpp:
// dsm_mesh_create, dsm_engine_init_with_options, the acquire and release
// calls, dsm_step, dsm_engine_describe for the timers, byte counts and
// memory, the checkpoint calls):
//   zero, zero --model  the ZeRO step (bench_zero.cc, bench_model.cc)
//   overlap             overlap_comm on a synthetic model (bench_overlap.cc)
//   checkpoint          save, load and the asynchronous save (bench_checkpoint.cc)
//   watchdog            its engine-step row (bench_watchdog.cc)
// Two waits have no public call and reach behind the handle, in
// api_engine.cc only: the engine's queue (a device-resident or simulated
// step returns with work queued) and the asynchronous save's capture of the
// state.
//
// The others measure what the public API does not expose, on the internal
// layers (linked statically):
//   optimizer           the fused optimizer kernels of each instruction set
//                       (optim::, simd::force for --isa); --model: the
//                       optimizer on a model's tensors without the engine
//                       around it (bench_optimizer*.cc)
//   quantize            ZeRO++'s blockwise quantization kernels of each
//                       instruction set (comm/quantize.hpp)
//   collectives         the shm and mpi backends' allreduce, reduce-scatter
//                       and allgather on node-shared buffers (comm::Backend)
//   alltoall            the Ulysses transforms (sp::Context::transform, the
//                       function behind dsm_sp_seq_to_head*), with the shm
//                       backend's counts of the path each took
//   watchdog            the bookkeeping of one wait and a backend allreduce,
//                       the watchdog switched on and off in one process
// and the baselines beside every figure (bandwidth bounds, raw MPI, PyTorch)
// are their own code; the bounds' kernels are a kernel family on libdsm's one
// SIMD dispatch (bounds.hpp), run on the CPU's widest set.
#include "harness.hpp"

int main(int argc, char **argv) { return dsm::bench::main(argc, argv); }
