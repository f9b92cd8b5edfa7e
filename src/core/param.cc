#include "dsm_config.h"

#include "core/param.hpp"

#include <strings.h>

#include <cstdlib>

#include "core/error.hpp"

namespace dsm {

const std::vector<Param> &params() {
    static const std::vector<Param> table = {
        {"DSM_DEBUG", "WARN", "Log level: NONE, WARN, INFO or TRACE."},
        {"DSM_DEBUG_SUBSYS", "ALL",
         "Subsystems to log, comma separated: INIT, MESH, TOPO, ERROR, ENGINE, COMM or ALL; a leading ^ logs all "
         "but the listed ones."},
        {"DSM_DEBUG_FILE", "",
         "Write the log to this file instead of stderr; %h is replaced by the host name, %p by the "
         "process id and %r by the MPI rank in MPI_COMM_WORLD."},
        {"DSM_MESH_PLACEMENT", "node",
         "Rank placement of dsm_mesh_create when the caller leaves it to the environment: node "
         "(innermost mesh dimensions inside a node, ranks ordered by NUMA domain and rank inside it) "
         "or none (mesh position = rank)."},
        {"DSM_BIND", "none",
         "CPU binding at mesh creation when the caller leaves it to the environment: none, spread "
         "(an even share of the node's cores per rank) or gpu (the cores nearest the rank's GPU)."},
        {"DSM_COMM_BACKEND", "auto",
         "The communication backend of the engine and sequence parallelism: auto, mpi, shm or nccl. "
         "auto: nccl for buffers in device memory when NCCL is built and every rank has a GPU of its own, else "
         "shm when some node holds two or more ranks of a group (node-shared memory, MPI between "
         "nodes), else mpi. nccl takes device memory only, shm host memory only; a backend that cannot "
         "serve the buffers fails with DSM_ERR_NOT_SUPPORTED on every rank."},
        {"DSM_COMM_NET_ALGO", "auto",
         "How the shm backend's allreduce, reduce-scatter and allgather cross nodes (on one lane per "
         "local rank): ring (pipelined ring over point-to-point MPI), rhd (recursive halving and doubling; "
         "node counts that are not powers of two fold onto one), mpi (MPI's own collectives on the lanes) "
         "or auto (two nodes: rhd for an allreduce, which is then one exchange of the whole lane, else ring; "
         "more nodes: rhd for a power of two when each node's block is under 64 KiB, else ring). Read when "
         "the backend is created."},
        {"DSM_COMM_NET_CHUNK", "60K",
         "Bytes per message of the shm backend's between-node stage (ring, rhd): the unit in which the "
         "stages of a collective overlap. The default stays under Open MPI's eager limit over TCP (64 KiB), "
         "so that no message waits for a handshake behind queued data; raise it on fabrics with a larger "
         "eager limit. 4096 to 1073741824; a K or M suffix allowed."},
        {"DSM_ENGINE_DEVICE", "auto",
         "Where an engine keeps the model state when dsm_engine_options_t.device is DSM_DEVICE_DEFAULT "
         "(and for dsm_engine_init): auto, host, cuda or sim. auto: cuda (device-resident training: "
         "parameters, gradients, master weights and optimizer state in GPU memory, collectives on NCCL) "
         "when NCCL is built, every rank has a GPU of its own and no ZeRO-Offload is configured, else host. "
         "sim: the device-resident engine on a simulated device (host memory with a deferred queue), "
         "for testing the device paths without a GPU."},
        {"DSM_NUM_THREADS", "",
         "Threads of each rank's CPU kernels (optimizer, conversions, checksums) and of OpenMP in the "
         "program, set at engine creation. Empty: OMP_NUM_THREADS when it is set, else the cores of the "
         "rank's CPU binding, else the node's cores divided by the ranks on the node."},
        {"DSM_STOP_SIGNAL", "",
         "A signal (USR1, SIGTERM, a number) that asks training to stop: every engine created while it is "
         "set catches it, and dsm_engine_stop_requested() reports it on every rank from the next step "
         "boundary on (as dsm_engine_set_stop_signal()). Empty: no signal is caught."},
        {"DSM_CUDA_DEVICE", "",
         "The CUDA device every rank of the process uses, as CUDA numbers the devices the process sees "
         "(after CUDA_VISIBLE_DEVICES). Empty: the GPU the mesh placement gave the rank when the process "
         "sees all of its node's GPUs, else the rank's index on its node modulo the device count."},
        {"DSM_NCCL_TIMEOUT", "1800",
         "Seconds an operation of the nccl backend (communicator creation, a collective, the final "
         "release) may take before the rank aborts its NCCL communicator and fails with DSM_ERR_NCCL; "
         "0 waits for ever."},
        {"DSM_SIM_NODES", "",
         "Testing: pretend the ranks run on these nodes. A node name per rank, comma separated "
         "(a,a,b,b), or COUNT:block or COUNT:cyclic for COUNT nodes filled as Slurm's block or cyclic "
         "distribution would."},
        {"DSM_SIM_NUMA", "",
         "Testing: pretend each rank is bound to this NUMA domain; a domain number per rank, comma "
         "separated."},
        {"DSM_SIM_GPUS", "", "Testing: pretend every node has this many GPUs."},
        {"DSM_SIM_DEVICE_MEMORY", "0",
         "Testing: 1 makes an engine that offloads (zero_optimization.offload_optimizer or offload_param "
         "device \"cpu\") keep its device copies of the parameters and gradients in separate host memory "
         "instead of on a CUDA device, so the offload path runs without a GPU."},
        {"DSM_CKPT_SPACE_CHECK", "1",
         "1: before a checkpoint save, rank 0 checks that the file system reports room for the file and "
         "fails the save on every rank when it does not; 0 skips that check (a file system that reports "
         "less free space than it has). A write that fails anyway is caught on every rank either way."},
        {"DSM_CKPT_PRECHECK", "1",
         "1: before a checkpoint load opens the file collectively, rank 0 reads its HDF5 metadata in a "
         "child process, so that a corrupt file on which HDF5 crashes or loops fails the load on every "
         "rank instead of killing or hanging the job; 0 skips that (where a process using MPI must not fork)."},
        {"DSM_CKPT_PRECHECK_TIMEOUT", "120",
         "Seconds the load's metadata pre-check (DSM_CKPT_PRECHECK) may take before the file is declared "
         "corrupt; 0 waits for ever."},
        {"DSM_CKPT_FAULT", "",
         "Testing: make a checkpoint save fail at a point on one rank: POINT:RANK, or kill:POINT:RANK to "
         "kill that rank with SIGKILL there. POINT is write (that rank, in the middle of writing its data), "
         "data (after writing), rename (rank 0, before the rename) or latest (rank 0, before rewriting "
         "latest); RANK defaults to 0. A malformed value fails the save on every rank."},
    };
    return table;
}

static const Param &lookup(const char *name) {
    for (const Param &p : params())
        if (std::string(p.name) == name) return p;
    DSM_FAIL(DSM_ERR_INTERNAL, "environment parameter ", name, " is not registered");
}

std::string param_string(const char *name) {
    const Param &p = lookup(name);
    const char *v = std::getenv(p.name);
    return (v != nullptr && *v != '\0') ? std::string(v) : std::string(p.default_value);
}

bool param_is_set(const char *name) {
    const Param &p = lookup(name);
    const char *v = std::getenv(p.name);
    return v != nullptr && *v != '\0';
}

std::string param_choice(const char *name, std::initializer_list<const char *> choices) {
    std::string v = param_string(name);
    std::string list;
    for (const char *c : choices) {
        if (strcasecmp(v.c_str(), c) == 0) return c;
        list += list.empty() ? "" : ", ";
        list += c;
    }
    DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "environment ", name, "=\"", v, "\": expected one of ", list);
}

} // namespace dsm
