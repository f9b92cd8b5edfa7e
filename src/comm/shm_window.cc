// The shm backend's node communicator and SharedWindow (shm_backend.hpp).
#include "dsm_config.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "comm/shm_backend.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"

namespace dsm {
namespace comm {

namespace {

constexpr uintptr_t kAlign = 64;


bool finalized() noexcept {
    int fini = 0;
    MPI_Finalized(&fini);
    return fini != 0;
}

char *align_up(void *p) {
    return reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(p) + kAlign - 1) & ~(kAlign - 1));
}

} // namespace

// ---------------------------------------------------------------- node communicator and windows

Comm node_comm(MPI_Comm group, int node_color) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(group, &rank));
    Comm by_color;
    MPI_Comm base = group;
    if (node_color >= 0) {
        by_color = Comm::split(group, node_color, rank);
        base = by_color.get();
    }
    MPI_Comm c = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split_type(base, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &c));
    Comm node(c);
    DSM_CHECK_MPI(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
    return node;
}

namespace {

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 // Linux 5.14
#endif

// Where the MPI library keeps the files behind shared windows: Open MPI's
// control variable osc_sm_backing_directory (default /dev/shm on Linux),
// read through the MPI tool interface so that --mca, OMPI_MCA_ variables and
// parameter files all count (not an environment variable of libdsm's);
// MPICH and others use POSIX shared memory, which is /dev/shm too.
std::string read_backing_directory() {
    std::string dir = "/dev/shm";
#if MPI_VERSION > 3 || (MPI_VERSION == 3 && MPI_SUBVERSION >= 1)
    // Ask for the thread level MPI already gives: Open MPI 4 takes the level
    // given to MPI_T_init_thread as the whole library's, so asking for
    // MPI_THREAD_SINGLE would turn off its locks under an MPI_THREAD_MULTIPLE
    // application (and overlap_comm's progress thread).
    int level = MPI_THREAD_SINGLE, provided = 0;
    if (MPI_Query_thread(&level) != MPI_SUCCESS) level = MPI_THREAD_SINGLE;
    if (MPI_T_init_thread(level, &provided) != MPI_SUCCESS) return dir;
    int index = -1;
    if (MPI_T_cvar_get_index("osc_sm_backing_directory", &index) == MPI_SUCCESS && index >= 0) {
        char name[256];
        char desc[8];
        int name_len = sizeof name, desc_len = sizeof desc, verbosity = 0, bind = 0, scope = 0;
        MPI_Datatype type = MPI_DATATYPE_NULL;
        MPI_T_enum enumtype = MPI_T_ENUM_NULL;
        MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
        int count = 0;
        if (MPI_T_cvar_get_info(index, name, &name_len, &verbosity, &type, &enumtype, desc, &desc_len, &bind,
                                &scope) == MPI_SUCCESS &&
            type == MPI_CHAR && MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) == MPI_SUCCESS) {
            std::vector<char> buf(static_cast<size_t>(std::max(count, 0)) + 1, '\0');
            if (count > 0 && MPI_T_cvar_read(handle, buf.data()) == MPI_SUCCESS && buf[0] != '\0')
                dir.assign(buf.data());
            MPI_T_cvar_handle_free(&handle);
        }
    }
    MPI_T_finalize();
#endif
    return dir;
}

const std::string &backing_directory() {
    static const std::string dir = read_backing_directory();
    return dir;
}

size_t page_bytes() {
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? static_cast<size_t>(p) : 4096;
}

// Free and total bytes of the filesystem holding `dir`; false when unknown.
bool space_of(const std::string &dir, size_t *avail, size_t *total) {
    struct statvfs v {};
    if (statvfs(dir.c_str(), &v) != 0) return false;
    *avail = static_cast<size_t>(v.f_bavail) * static_cast<size_t>(v.f_frsize);
    *total = static_cast<size_t>(v.f_blocks) * static_cast<size_t>(v.f_frsize);
    return true;
}

[[noreturn]] void fail_no_room(const std::string &dir, size_t node_bytes, size_t mine, size_t most,
                               const char *what) {
    size_t avail = 0, total = 0;
    const bool known = space_of(dir, &avail, &total);
    DSM_FAIL(DSM_ERR_OUT_OF_MEMORY, "shared memory: ", what, ": the ranks of this node need ", node_bytes,
             " bytes in ", dir, " for a shared window (this rank asks for ", mine, " bytes, the most any asks for is ",
             most, "), and ", dir, " has ",
             known ? std::to_string(avail) : std::string("an unknown number of"), " bytes available",
             known ? " of " + std::to_string(total) : std::string(),
             ": enlarge ", dir, " (docker run --shm-size, or a larger tmpfs)");
}

} // namespace

SharedWindow::SharedWindow(MPI_Comm node, size_t bytes, MPI_Comm group) {
    if (group == MPI_COMM_NULL) group = node;
    int local = 1, me = 0;
    DSM_CHECK_MPI(MPI_Comm_size(node, &local));
    DSM_CHECK_MPI(MPI_Comm_rank(node, &me));
    // The MPI library backs the window with a file of the node's total size
    // (each noncontig segment rounded to pages, plus its own state) that it
    // sizes without reserving: Open MPI's rank 0 fails alone when the
    // filesystem is too small (and the others then wait for it forever), and
    // pages it cannot find later kill the process with SIGBUS on first
    // touch. So the node checks the room first and agrees, then each rank
    // makes its pages exist before anything touches them and all agree again.
    const size_t page = page_bytes();
    const std::string dir = backing_directory();
    DSM_REQUIRE(bytes <= SIZE_MAX / 2, DSM_ERR_OUT_OF_MEMORY, "shared memory: a window of ", bytes,
                " bytes is too large");
    const size_t mine = (bytes + kAlign + page - 1) / page * page;
    unsigned long long node_total = 0, most = 0;
    const unsigned long long want = mine, asked = bytes;
    DSM_CHECK_MPI(MPI_Allreduce(&want, &node_total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, node));
    DSM_CHECK_MPI(MPI_Allreduce(&asked, &most, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, node));
    agree(group, [&] {
        size_t avail = 0, total = 0;
        const size_t slack = (static_cast<size_t>(local) + 4) * page; // the library's state
        if (space_of(dir, &avail, &total) && node_total + slack > avail)
            fail_no_room(dir, static_cast<size_t>(node_total), bytes, static_cast<size_t>(most), "not enough room");
    });

    // Each segment on its own pages, first touched by its owner (NUMA-local),
    // with room to align its start to 64 bytes.
    MPI_Info info = MPI_INFO_NULL;
    DSM_CHECK_MPI(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void *first = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(bytes + kAlign), 1, info, node, &first, &win_);
    MPI_Info_free(&info);
    int ok = rc == MPI_SUCCESS ? 1 : 0, all_ok = 0;
    DSM_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, node));
    if (all_ok == 0) win_ = MPI_WIN_NULL; // freeing is collective: leave a partial window alone
    agree(group, [&] {
        DSM_CHECK_MPI(rc);
        DSM_REQUIRE(all_ok == 1, DSM_ERR_MPI, "MPI_Win_allocate_shared failed on another rank of this node");
    });
    try {
        agree(group, [&] {
            DSM_CHECK_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
            DSM_CHECK_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
            bases_.resize(static_cast<size_t>(local));
            sizes_.resize(static_cast<size_t>(local));
            for (int p = 0; p < local; ++p) {
                MPI_Aint size = 0;
                int unit = 0;
                void *b = nullptr;
                DSM_CHECK_MPI(MPI_Win_shared_query(win_, p, &size, &unit, &b));
                // Mappings are page-aligned, so every process aligns to the same
                // byte. Each rank asked for its own bytes + kAlign (no segment is
                // empty, even for zero bytes), of which the alignment skips fewer
                // than kAlign.
                const size_t got = static_cast<size_t>(size);
                DSM_REQUIRE(b != nullptr && got >= kAlign, DSM_ERR_MPI, "MPI_Win_shared_query gave local rank ",
                            p, " a segment of ", got, " bytes at ", b);
                bases_[static_cast<size_t>(p)] = align_up(b);
                sizes_[static_cast<size_t>(p)] = got - kAlign;
                if (p != me) continue;
                // Allocate this rank's pages now: MADV_POPULATE_WRITE reports
                // a full filesystem as an error where a store would raise
                // SIGBUS. Older kernels (EINVAL) rely on the check above.
                const uintptr_t lo = reinterpret_cast<uintptr_t>(b) / page * page;
                const uintptr_t hi = (reinterpret_cast<uintptr_t>(b) + got + page - 1) / page * page;
                if (madvise(reinterpret_cast<void *>(lo), hi - lo, MADV_POPULATE_WRITE) != 0 && errno != EINVAL &&
                    errno != ENOSYS)
                    fail_no_room(dir, static_cast<size_t>(node_total), bytes, static_cast<size_t>(most),
                                 "the pages could not be allocated");
            }
        });
    } catch (...) {
        reset();
        throw;
    }
    bytes_ = bytes;
}

SharedWindow::SharedWindow(SharedWindow &&o) noexcept
    : win_(std::exchange(o.win_, MPI_WIN_NULL)), bases_(std::move(o.bases_)), sizes_(std::move(o.sizes_)),
      bytes_(std::exchange(o.bytes_, 0)) {}

SharedWindow &SharedWindow::operator=(SharedWindow &&o) noexcept {
    if (this != &o) {
        reset();
        win_ = std::exchange(o.win_, MPI_WIN_NULL);
        bases_ = std::move(o.bases_);
        sizes_ = std::move(o.sizes_);
        bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
}

void SharedWindow::sync() const noexcept {
    if (win_ != MPI_WIN_NULL) MPI_Win_sync(win_);
}

void SharedWindow::reset() noexcept {
    if (win_ != MPI_WIN_NULL && !finalized()) {
        MPI_Win_unlock_all(win_);
        MPI_Win_free(&win_);
    }
    win_ = MPI_WIN_NULL;
    bases_.clear();
    sizes_.clear();
    bytes_ = 0;
}

} // namespace comm
} // namespace dsm
