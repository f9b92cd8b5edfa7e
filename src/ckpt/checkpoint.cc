// Checkpoint files in parallel HDF5: see checkpoint.hpp and doc/checkpoint.md.
#include "dsm_config.h"

#include "ckpt/checkpoint.hpp"
#include "ckpt/files.hpp"
#include "ckpt/params.hpp"
#include "ckpt/format.hpp"
#include "ckpt/h5.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <sstream>

#include <hdf5.h>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace ckpt {

using namespace files; // file names, durable writes, directory checks (files.cc)

namespace {

using Id = Handle;

// The innermost message of HDF5's error stack, for our messages.
std::string hdf5_reason() {
    std::string out;
    H5Ewalk2(
        H5E_DEFAULT, H5E_WALK_UPWARD,
        [](unsigned n, const H5E_error2_t *e, void *d) -> herr_t {
            if (n == 0 && e->desc != nullptr) *static_cast<std::string *>(d) = e->desc;
            return 0;
        },
        &out);
    return out.empty() ? std::string("unknown HDF5 error") : out;
}

hid_t h5(hid_t id, const std::string &what) {
    if (id < 0) DSM_FAIL(DSM_ERR_HDF5, what, ": ", hdf5_reason());
    return id;
}

void h5ok(herr_t rc, const std::string &what) {
    if (rc < 0) DSM_FAIL(DSM_ERR_HDF5, what, ": ", hdf5_reason());
}

Id plist(hid_t cls) { return Id(h5(H5Pcreate(cls), "H5Pcreate"), H5Pclose); }

// File access through MPI-IO with collective metadata, datasets aligned to
// the file system's block.
Id mpio_fapl(MPI_Comm comm, const std::string &dir) {
    Id fapl = plist(H5P_FILE_ACCESS);
    h5ok(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    h5ok(H5Pset_all_coll_metadata_ops(fapl.get(), 1), "H5Pset_all_coll_metadata_ops");
    h5ok(H5Pset_coll_metadata_write(fapl.get(), 1), "H5Pset_coll_metadata_write");
    struct statvfs vfs;
    hsize_t block = 4096;
    if (statvfs(dir.c_str(), &vfs) == 0 && vfs.f_bsize > block) block = vfs.f_bsize;
    h5ok(H5Pset_alignment(fapl.get(), 64 * 1024, block), "H5Pset_alignment");
    return fapl;
}

Id collective_xfer() {
    Id x = plist(H5P_DATASET_XFER);
    h5ok(H5Pset_dxpl_mpio(x.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
    return x;
}

// ---------------------------------------------------------------- attributes

void write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value,
                const std::vector<hsize_t> &dims = {}) {
    Id space(h5(dims.empty() ? H5Screate(H5S_SCALAR)
                             : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                cat("dataspace of attribute ", name)),
             H5Sclose);
    Id attr(h5(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT),
               cat("creating attribute ", name)),
            H5Aclose);
    h5ok(H5Awrite(attr.get(), mem_type, value), cat("writing attribute ", name));
}

void write_string_attr(hid_t obj, const char *name, const std::string &value) {
    Id type(h5(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
    h5ok(H5Tset_size(type.get(), value.size() + 1), "H5Tset_size");
    h5ok(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
    h5ok(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
    write_attr(obj, name, type.get(), type.get(), value.c_str());
}

void write_int_attr(hid_t obj, const char *name, int64_t v) {
    write_attr(obj, name, H5T_NATIVE_INT64, H5T_STD_I64LE, &v);
}

void write_json_attrs(hid_t obj, const Attributes &attrs) {
    for (const auto &kv : attrs.items()) {
        const std::string &k = kv.key();
        const auto &v = kv.value();
        if (v.is_string()) {
            write_string_attr(obj, k.c_str(), v.get<std::string>());
        } else if (v.is_number_float()) {
            const double d = v.get<double>();
            write_attr(obj, k.c_str(), H5T_NATIVE_DOUBLE, H5T_IEEE_F64LE, &d);
        } else if (v.is_number_integer()) {
            write_int_attr(obj, k.c_str(), v.get<int64_t>());
        } else if (v.is_array()) {
            std::vector<int64_t> a = v.get<std::vector<int64_t>>();
            const std::vector<hsize_t> dims{a.size()};
            write_attr(obj, k.c_str(), H5T_NATIVE_INT64, H5T_STD_I64LE, a.data(), dims);
        } else {
            DSM_FAIL(DSM_ERR_INTERNAL, "checkpoint attribute ", k, " has an unsupported type");
        }
    }
}

// Every attribute of `obj` as JSON: integers (scalars or 1-D arrays),
// floats, strings.
Attributes read_attrs(hid_t obj) {
    Attributes out = Attributes::object();
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t info;
    h5ok(H5Oget_info3(obj, &info, H5O_INFO_NUM_ATTRS), "H5Oget_info3");
#else
    H5O_info_t info;
    h5ok(H5Oget_info2(obj, &info, H5O_INFO_NUM_ATTRS), "H5Oget_info2");
#endif
    for (hsize_t i = 0; i < info.num_attrs; ++i) {
        Id attr(h5(H5Aopen_by_idx(obj, ".", H5_INDEX_NAME, H5_ITER_INC, i, H5P_DEFAULT, H5P_DEFAULT),
                   "opening an attribute"),
                H5Aclose);
        char name[256];
        if (H5Aget_name(attr.get(), sizeof name, name) < 0) continue;
        Id type(h5(H5Aget_type(attr.get()), "H5Aget_type"), H5Tclose);
        Id space(h5(H5Aget_space(attr.get()), "H5Aget_space"), H5Sclose);
        const hssize_t n = H5Sget_simple_extent_npoints(space.get());
        const H5T_class_t cls = H5Tget_class(type.get());
        if (cls == H5T_STRING) {
            if (H5Tis_variable_str(type.get()) > 0) {
                char *s = nullptr;
                Id mem(h5(H5Tcopy(H5T_C_S1), "H5Tcopy"), H5Tclose);
                H5Tset_size(mem.get(), H5T_VARIABLE);
                h5ok(H5Aread(attr.get(), mem.get(), &s), cat("reading attribute ", name));
                out[name] = s ? std::string(s) : std::string();
                H5free_memory(s);
            } else {
                std::string s(H5Tget_size(type.get()), '\0');
                h5ok(H5Aread(attr.get(), type.get(), &s[0]), cat("reading attribute ", name));
                s.resize(std::strlen(s.c_str()));
                out[name] = s;
            }
        } else if (cls == H5T_INTEGER) {
            std::vector<int64_t> v(static_cast<size_t>(std::max<hssize_t>(n, 1)));
            const bool is_unsigned = H5Tget_sign(type.get()) == H5T_SGN_NONE;
            if (is_unsigned) {
                std::vector<uint64_t> u(v.size());
                h5ok(H5Aread(attr.get(), H5T_NATIVE_UINT64, u.data()), cat("reading attribute ", name));
                if (H5Sget_simple_extent_ndims(space.get()) == 0) out[name] = u[0];
                else out[name] = u;
            } else {
                h5ok(H5Aread(attr.get(), H5T_NATIVE_INT64, v.data()), cat("reading attribute ", name));
                if (H5Sget_simple_extent_ndims(space.get()) == 0) out[name] = v[0];
                else out[name] = v;
            }
        } else if (cls == H5T_FLOAT) {
            std::vector<double> v(static_cast<size_t>(std::max<hssize_t>(n, 1)));
            h5ok(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, v.data()), cat("reading attribute ", name));
            if (H5Sget_simple_extent_ndims(space.get()) == 0) out[name] = v[0];
            else out[name] = v;
        }
    }
    return out;
}

// ---------------------------------------------------------------- selections

// Select elements [a, b) (row-major) of a dataspace of `dims`: at most
// 2 * ndims - 1 hyperslabs, each the largest aligned block that fits.
void select_range(hid_t space, const std::vector<hsize_t> &dims, hsize_t a, hsize_t b) {
    h5ok(H5Sselect_none(space), "H5Sselect_none");
    if (a >= b) return;
    if (dims.empty()) {
        h5ok(H5Sselect_all(space), "H5Sselect_all");
        return;
    }
    const size_t nd = dims.size();
    std::vector<hsize_t> stride(nd, 1); // elements per step of dimension k
    for (size_t k = nd - 1; k > 0; --k) stride[k - 1] = stride[k] * dims[k];
    while (a < b) {
        // The outermost dimension k whose blocks start at a and fit in [a, b).
        size_t k = 0;
        while (k + 1 < nd && (a % stride[k] != 0 || a + stride[k] > b)) ++k;
        const hsize_t at = (a / stride[k]) % dims[k];
        const hsize_t n = std::min((b - a) / stride[k], dims[k] - at);
        std::vector<hsize_t> start(nd), count(nd);
        hsize_t rem = a;
        for (size_t d = 0; d < nd; ++d) {
            start[d] = rem / stride[d];
            rem %= stride[d];
            start[d] %= dims[d];
        }
        for (size_t d = 0; d < nd; ++d) count[d] = d < k ? 1 : d == k ? n : dims[d];
        h5ok(H5Sselect_hyperslab(space, H5S_SELECT_OR, start.data(), nullptr, count.data(), nullptr),
             "H5Sselect_hyperslab");
        a += n * stride[k];
    }
}

std::vector<hsize_t> hdims(const std::vector<int64_t> &shape) {
    return std::vector<hsize_t>(shape.begin(), shape.end());
}

Id make_space(const std::vector<hsize_t> &dims) {
    return Id(h5(dims.empty() ? H5Screate(H5S_SCALAR)
                              : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                 "creating a dataspace"),
              H5Sclose);
}

// The selection of this rank's piece, in the file and in memory.
struct Selection {
    Id file, mem;
};

Selection selection(const Tensor &t) {
    const std::vector<hsize_t> dims = hdims(t.shape);
    Selection s;
    s.file = make_space(dims);
    select_range(s.file.get(), dims, t.offset, t.offset + t.count);
    const hsize_t n = std::max<hsize_t>(t.count, 1);
    s.mem = Id(h5(H5Screate_simple(1, &n, nullptr), "creating a dataspace"), H5Sclose);
    if (t.count == 0) h5ok(H5Sselect_none(s.mem.get()), "H5Sselect_none");
    return s;
}

// A buffer for ranks whose selection is empty (HDF5 wants a pointer).
float g_empty[1];
void *buffer_of(const Tensor &t) { return t.count ? static_cast<void *>(t.data) : static_cast<void *>(g_empty); }

std::string dataset_path(const Tensor &t) { return "/" + t.group + "/" + escape_name(t.name); }

// Rank 0, before the collective open of a load: read the metadata the load
// will read (the root attributes, every object under /params, /optimizer
// and /client_state, each with its attributes) in a child process, so that
// a corrupt file on which HDF5 itself crashes or loops fails the load on
// every rank with DSM_ERR_IO instead of killing or hanging the job. HDF5's
// own errors are left to the load, which reports them. The child makes no
// MPI call and leaves with _exit(). DSM_CKPT_PRECHECK=0 skips it (a system
// where a process that uses MPI must not fork).
void precheck_metadata(const std::string &path) {
    if (!precheck_param()) return;
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) return; // no child: the load goes on without the pre-check
    if (pid == 0) {
        H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
        const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
        if (file < 0) ::_exit(0);
        auto attrs = [](hid_t obj) {
            H5Aiterate2(
                obj, H5_INDEX_NAME, H5_ITER_INC, nullptr,
                [](hid_t loc, const char *name, const H5A_info_t *, void *) -> herr_t {
                    const hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
                    if (a < 0) return 0;
                    const hid_t t = H5Aget_type(a), sp = H5Aget_space(a);
                    const hssize_t n = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
                    const size_t size = t >= 0 ? H5Tget_size(t) : 0;
                    if (t >= 0 && n >= 0 && size > 0 && H5Tis_variable_str(t) <= 0 &&
                        static_cast<unsigned long long>(n) * size <= (64ull << 20)) {
                        std::vector<unsigned char> buf(static_cast<size_t>(std::max<hssize_t>(n, 1)) * size);
                        H5Aread(a, t, buf.data());
                    }
                    if (sp >= 0) H5Sclose(sp);
                    if (t >= 0) H5Tclose(t);
                    H5Aclose(a);
                    return 0;
                },
                nullptr);
        };
        attrs(file);
#if H5_VERSION_GE(1, 12, 0)
        using ObjInfo = H5O_info2_t;
#else
        using ObjInfo = H5O_info_t;
#endif
        herr_t (*const visit)(hid_t, const char *, const ObjInfo *, void *) = [](hid_t root, const char *name,
                                                                                const ObjInfo *, void *data) -> herr_t {
            const hid_t o = H5Oopen(root, name, H5P_DEFAULT);
            if (o < 0) return 0;
            (*static_cast<decltype(attrs) *>(data))(o);
            if (H5Iget_type(o) == H5I_DATASET) {
                const hid_t t = H5Dget_type(o), sp = H5Dget_space(o), pl = H5Dget_create_plist(o);
                if (t >= 0) H5Tclose(t);
                if (sp >= 0) H5Sclose(sp);
                if (pl >= 0) H5Pclose(pl);
            }
            H5Oclose(o);
            return 0;
        };
#if H5_VERSION_GE(1, 12, 0)
        H5Ovisit3(file, H5_INDEX_NAME, H5_ITER_INC, visit, &attrs, H5O_INFO_BASIC);
#else
        H5Ovisit2(file, H5_INDEX_NAME, H5_ITER_INC, visit, &attrs, H5O_INFO_BASIC);
#endif
        H5Fclose(file);
        ::_exit(0);
    }
    // The parent: wait for the child, at most DSM_CKPT_PRECHECK_TIMEOUT.
    const long limit = precheck_timeout_param();
    int wstatus = 0;
    pid_t got = 0;
    for (long waited_ms = 0; (got = ::waitpid(pid, &wstatus, WNOHANG)) == 0; waited_ms += 10) {
        if (limit > 0 && waited_ms >= limit * 1000) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, &wstatus, 0);
            DSM_FAIL(DSM_ERR_IO, "'", path, "': reading its HDF5 metadata did not finish in ", limit,
                     " s (the file is corrupt; DSM_CKPT_PRECHECK_TIMEOUT sets the limit)");
        }
        ::usleep(10000);
    }
    if (got == pid && WIFSIGNALED(wstatus))
        DSM_FAIL(DSM_ERR_IO, "'", path, "': HDF5 crashed reading its metadata (signal ", WTERMSIG(wstatus),
                 " in a child process): the file is corrupt");
    if (got == pid && WIFEXITED(wstatus) && WEXITSTATUS(wstatus) != 0)
        DSM_FAIL(DSM_ERR_IO, "'", path, "': reading its HDF5 metadata failed (exit status ", WEXITSTATUS(wstatus),
                 " in a child process): the file is corrupt");
}

// The steps of a save or a load, each agreed: run() runs one on this rank
// unless a rank has failed before, then the ranks agree whether any failed
// (one small allreduce), so that all of them stop making collective calls
// at the same point. The first failure of this rank is kept for the final
// agreement.
class Steps {
public:
    Steps(MPI_Comm comm, std::string file) : comm_(comm), file_(std::move(file)) {}
    bool run(const std::function<void()> &fn) {
        if (!stopped_) {
            try {
                fn();
            } catch (const Error &e) {
                status_ = e.status();
                failure_ = e.what();
            } catch (const std::bad_alloc &) {
                status_ = DSM_ERR_OUT_OF_MEMORY;
                failure_ = cat("out of memory for checkpoint '", file_, "'");
            }
        }
        int bad = status_ != DSM_SUCCESS ? 1 : 0;
        DSM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm_));
        stopped_ = bad != 0;
        return !stopped_;
    }
    bool stopped() const noexcept { return stopped_; }
    // This rank's failure, if it had one (for agree()).
    void rethrow() const {
        if (status_ != DSM_SUCCESS) DSM_FAIL(status_, failure_);
    }

private:
    MPI_Comm comm_;
    std::string file_, failure_;
    dsm_status_t status_ = DSM_SUCCESS;
    bool stopped_ = false;
};

} // namespace

// ---------------------------------------------------------------- public helpers

void check_tag(const std::string &tag) {
    DSM_REQUIRE(!tag.empty() && tag.size() <= kMaxTag, DSM_ERR_INVALID_ARGUMENT, "checkpoint tag '", tag,
                "' must have 1..", kMaxTag, " characters");
    DSM_REQUIRE(tag[0] != '.', DSM_ERR_INVALID_ARGUMENT, "checkpoint tag '", tag,
                "' must not start with '.' (it would name a hidden file or another directory)");
    for (unsigned char c : tag)
        DSM_REQUIRE((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-', DSM_ERR_INVALID_ARGUMENT,
                    "checkpoint tag '", tag, "' has the character '", static_cast<char>(c),
                    "': tags use A-Z a-z 0-9 . _ - only (no '/', so a tag cannot leave the directory)");
}

namespace {

// DSM_CKPT_FAULT parsed: [kill:]POINT[:RANK].
struct FaultSpec {
    bool set = false, kill = false;
    std::string point;
    int rank = 0;
};

FaultSpec fault_spec() {
    FaultSpec f;
    const std::string spec = fault_param();
    if (spec.empty()) return f;
    std::string rest = spec;
    if (rest.rfind("kill:", 0) == 0) {
        f.kill = true;
        rest = rest.substr(5);
    }
    const size_t colon = rest.find(':');
    f.point = rest.substr(0, colon);
    bool ok = f.point == "write" || f.point == "data" || f.point == "rename" || f.point == "latest";
    if (ok && colon != std::string::npos) {
        const std::string r = rest.substr(colon + 1);
        ok = !r.empty() && r.size() <= 9 && r.find_first_not_of("0123456789") == std::string::npos;
        if (ok) f.rank = std::atoi(r.c_str());
    }
    if (!ok)
        DSM_FAIL(DSM_ERR_INVALID_ARGUMENT, "DSM_CKPT_FAULT=", spec,
                 " is malformed: expected POINT, POINT:RANK or kill:POINT:RANK with POINT write, data, rename or latest "
                 "and RANK a rank number");
    f.set = true;
    return f;
}

} // namespace

void fault_point(const char *point, int world_rank) {
    const FaultSpec f = fault_spec();
    if (!f.set || f.point != point || f.rank != world_rank) return;
    if (f.kill) ::raise(SIGKILL);
    DSM_FAIL(DSM_ERR_IO, "injected fault at checkpoint point '", point, "' (DSM_CKPT_FAULT=",
             fault_param(), ")");
}

// ---------------------------------------------------------------- save

namespace {

// Progress of a long save or load on rank 0, at INFO: a line every few
// seconds with the bytes done, the total and the time so far.
class Progress {
public:
    Progress(int rank, const char *what, const std::string &path, const std::vector<Tensor> &tensors)
        : on_(rank == 0 && log_enabled(LogLevel::INFO, Subsys::ENGINE)), what_(what), path_(path),
          start_(MPI_Wtime()), last_(start_) {
        for (const Tensor &t : tensors) total_ += bytes_of(t);
    }
    // After tensor `t`.
    void done(const Tensor &t) {
        done_ += bytes_of(t);
        if (!on_) return;
        const double now = MPI_Wtime();
        if (now - last_ < kEverySeconds) return;
        last_ = now;
        DSM_INFO(ENGINE, "checkpoint %s '%s': %.0f of %.0f MB (%.0f%%) in %.1f s", what_, path_.c_str(),
                 done_ / 1e6, total_ / 1e6, total_ > 0 ? 100.0 * done_ / total_ : 100.0, now - start_);
    }

private:
    static constexpr double kEverySeconds = 5.0;
    static double bytes_of(const Tensor &t) {
        double n = 4; // fp32
        for (int64_t d : t.shape) n *= static_cast<double>(d);
        return n;
    }
    bool on_;
    const char *what_;
    std::string path_;
    double start_, last_, total_ = 0, done_ = 0;
};

} // namespace

void save_prepare(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
                  size_t client_size) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    const std::string reserve = reserve_of(dir, tag);
    const size_t n = content.tensors.size();

    // The directory, no leftovers of earlier saves, room for the file; then
    // every rank must see that directory.
    agree(comm, [&] {
        check_tag(tag);
        fault_spec();
        if (rank != 0) return;
        make_dirs(dir);
        remove_leftovers(dir);
        check_space(dir, content, client_size);
        const int fd = ::open(reserve.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) return; // the directory check below names the reason
        const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(reserve_size(n)));
        ::close(fd);
        if (err == ENOSPC || err == EDQUOT) {
            ::unlink(reserve.c_str());
            DSM_FAIL(DSM_ERR_IO, "no room for the checkpoint in '", dir, "': ", std::strerror(err));
        }
    });
    try {
        check_shared_dir(comm, rank, dir);
    } catch (...) {
        if (rank == 0) ::unlink(reserve.c_str());
        throw;
    }
}

void save(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
          const void *client, size_t client_size, int keep_last) {
    save_prepare(comm, dir, tag, content, client_size);
    save_write(comm, dir, tag, content, client, client_size, keep_last);
}

void save_write(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
                const void *client, size_t client_size, int keep_last) {
    int rank = 0, world_rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DSM_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
    const std::string final_path = file_of(dir, tag), tmp = tmp_of(dir, tag), reserve = reserve_of(dir, tag);
    const size_t n = content.tensors.size();
    auto free_reserve = [&] {
        if (rank == 0) ::unlink(reserve.c_str());
    };

    // The root attributes as the file holds them, with their checksum.
    Attributes attrs = content.attrs;
    attrs["format"] = kFormat;
    attrs["format_version"] = kFormatVersion;
    const uint64_t root_sum = root_attributes_checksum(attrs);

    // Checksums: each element counted once, by its owner. They are computed
    // by a second thread while this one writes the data (neither calls MPI
    // or HDF5 from that thread), and summed over the ranks afterwards; the
    // attributes that hold them are written after the data.
    std::vector<uint64_t> sums(n + 1, 0); // tensors, client state
    auto local_sums = std::async(std::launch::async, [&] {
        for (size_t i = 0; i < n; ++i) {
            const Tensor &t = content.tensors[i];
            if (t.owner && t.count) sums[i] = checksum(t.data, t.offset, t.count);
        }
        if (rank == 0 && client_size)
            sums[n] = checksum_bytes(static_cast<const unsigned char *>(client), 0, client_size);
    });

    // Every rank makes the same HDF5 calls in the same order. Each rank
    // writes its own pieces independently (a failed write, such as a full
    // disk, stays on its rank), and after each step the ranks agree whether
    // any failed: then all stop making collective calls at the same point
    // and close the file together. The outcome is agreed after the close.
    Steps steps(comm, tmp);
    struct statvfs vfs;
    const uint64_t userblock =
        userblock_size(n + 1, ::statvfs(dir.c_str(), &vfs) == 0 ? static_cast<uint64_t>(vfs.f_bsize) : 4096);
    std::vector<Extent> extents;
    auto attempt = [&](const std::function<void()> &fn) { return steps.run(fn); };
    {
        QuietHdf5 quiet;
        Id file, lcpl, dcpl;
        std::vector<Id> dsets;
        dsets.reserve(n + 1);
        attempt([&] {
            Id fapl = mpio_fapl(comm, dir);
            Id fcpl = plist(H5P_FILE_CREATE);
            h5ok(H5Pset_userblock(fcpl.get(), userblock), "H5Pset_userblock");
            file = Id(h5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), cat("creating '", tmp, "'")),
                      H5Fclose);
            write_json_attrs(file.get(), attrs);
            write_attr(file.get(), "attrs_checksum", H5T_NATIVE_UINT64, H5T_STD_U64LE, &root_sum);
            lcpl = plist(H5P_LINK_CREATE);
            h5ok(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group");
            dcpl = plist(H5P_DATASET_CREATE);
            h5ok(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
            h5ok(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
        });
        Progress progress(rank, "save", final_path, content.tensors);
        for (size_t i = 0; i < n && !steps.stopped(); ++i, progress.done(content.tensors[i - 1])) {
            attempt([&] {
                const Tensor &t = content.tensors[i];
                const std::string path = dataset_path(t);
                Id space = make_space(hdims(t.shape));
                dsets.emplace_back(h5(H5Dcreate2(file.get(), path.c_str(), H5T_IEEE_F32LE, space.get(), lcpl.get(),
                                                 dcpl.get(), H5P_DEFAULT),
                                      cat("creating ", path)),
                                   H5Dclose);
                const hid_t dset = dsets.back().get();
                write_string_attr(dset, "name", t.name);
                write_string_attr(dset, "group", t.group);
                write_int_attr(dset, "trainable", t.trainable ? 1 : 0);
                if (i == n / 2) fault_point("write", world_rank);
                Selection sel = selection(t);
                if (t.count && H5Dwrite(dset, H5T_NATIVE_FLOAT, sel.mem.get(), sel.file.get(), H5P_DEFAULT,
                                        buffer_of(t)) < 0)
                    DSM_FAIL(DSM_ERR_IO, "writing ", path, " to '", tmp, "': ", hdf5_reason(), space_hint(dir));
            });
        }
        if (client_size && !steps.stopped()) {
            attempt([&] {
                const hsize_t len = client_size;
                Id space(h5(H5Screate_simple(1, &len, nullptr), "creating a dataspace"), H5Sclose);
                dsets.emplace_back(h5(H5Dcreate2(file.get(), "/client_state", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                                                 dcpl.get(), H5P_DEFAULT),
                                      "creating /client_state"),
                                   H5Dclose);
                if (rank == 0)
                    h5ok(H5Dwrite(dsets.back().get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, client),
                         cat("writing /client_state to '", tmp, "'"));
            });
        }
        local_sums.get();
        if (!steps.stopped()) {
            DSM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(n + 1), MPI_UINT64_T, MPI_SUM, comm));
            attempt([&] {
                for (size_t i = 0; i < dsets.size(); ++i)
                    write_attr(dsets[i].get(), "checksum", H5T_NATIVE_UINT64, H5T_STD_U64LE, &sums[i < n ? i : n]);
                // Where the data lies, for the integrity record.
                for (const Id &d : dsets) {
                    const haddr_t at = H5Dget_offset(d.get());
                    if (at != HADDR_UNDEF) extents.push_back({at, H5Dget_storage_size(d.get())});
                }
                dsets.clear();
                free_reserve();
                h5ok(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), cat("flushing '", tmp, "'"));
            });
        }
        if (steps.stopped() && rank == 0) {
            // The temporary is garbage now: give its room to the metadata
            // that the close writes.
            free_reserve();
            if (::truncate(tmp.c_str(), 0) != 0) { /* the close may still fit */ }
        }
        dsets.clear();
        file.reset();
        free_reserve();
    }
    // Agree on the data, then rank 0 commits: flush, rename, directory,
    // `latest`. After a failure before the rename, rank 0 removes the
    // temporary and every rank waits for that, so that no rank returns while
    // the temporary still exists. A failure after the rename (flushing the
    // directory, writing `latest`) leaves the new file complete under its
    // name and `latest` on the previous tag.
    bool renamed = false;
    try {
        agree(comm, [&] {
            steps.rethrow();
            fault_point("data", world_rank);
        });
        agree(comm, [&] {
            if (rank != 0) return;
            const std::string why = write_integrity(tmp, userblock, extents);
            if (!why.empty()) DSM_FAIL(DSM_ERR_IO, "'", tmp, "': ", why);
            fsync_path(tmp, false);
            fault_point("rename", world_rank);
            if (std::rename(tmp.c_str(), final_path.c_str()) != 0)
                DSM_FAIL(DSM_ERR_IO, "cannot rename '", tmp, "' to '", final_path, "': ", std::strerror(errno));
            renamed = true;
            fsync_path(dir, true);
            fault_point("latest", world_rank);
            replace_file(dir, dir + "/latest", dir + "/.latest.tmp", tag + "\n");
            // checkpoint.keep_last: the save is complete and `latest` names
            // it; inside the agreement, so that no rank returns before.
            if (keep_last > 0) prune(dir, static_cast<size_t>(keep_last), tag);
        });
    } catch (...) {
        if (rank == 0 && !renamed) ::unlink(tmp.c_str());
        if (rank == 0) ::unlink((dir + "/.latest.tmp").c_str());
        MPI_Barrier(comm);
        throw;
    }
}

// ---------------------------------------------------------------- load

std::string resolve_tag(MPI_Comm comm, const std::string &dir, const std::string &tag) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    std::string chosen = tag;
    agree(comm, [&] {
        if (rank != 0) return;
        struct stat st;
        if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
            DSM_FAIL(DSM_ERR_IO, "checkpoint directory '", dir, "' does not exist");
        if (chosen.empty()) {
            const std::string latest = dir + "/latest";
            std::ifstream f(latest);
            if (!f) DSM_FAIL(DSM_ERR_IO, "no checkpoint to load: '", latest, "' does not exist");
            std::getline(f, chosen);
            while (!chosen.empty() && (chosen.back() == '\r' || chosen.back() == ' ')) chosen.pop_back();
            try {
                check_tag(chosen);
            } catch (const Error &e) {
                DSM_FAIL(DSM_ERR_IO, "'", latest, "' does not name a valid tag: ", e.what());
            }
            if (::stat(file_of(dir, chosen).c_str(), &st) != 0)
                DSM_FAIL(DSM_ERR_IO, "'", latest, "' names tag '", chosen, "' but '", file_of(dir, chosen),
                         "' does not exist");
        } else {
            check_tag(chosen);
            if (::stat(file_of(dir, chosen).c_str(), &st) != 0)
                DSM_FAIL(DSM_ERR_IO, "checkpoint '", file_of(dir, chosen), "' does not exist");
        }
    });
    return bcast_string(comm, 0, chosen);
}

std::vector<std::string> list_checkpoints(MPI_Comm comm, const std::string &dir) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    std::string joined;
    if (rank == 0)
        for (const std::string &t : tags_newest_first(dir)) joined += t + "\n";
    joined = bcast_string(comm, 0, joined);
    std::vector<std::string> out;
    std::stringstream ss(joined);
    for (std::string t; std::getline(ss, t);) out.push_back(t);
    return out;
}

namespace {

constexpr int64_t kMaxCounter = int64_t(1) << 62;

// The root attributes the format defines, checked as the loader uses them:
// every one present with its type and in its range (DSM_ERR_IO naming the
// file, the attribute and its value), and the checksum over them (format
// version 2) matching.
void check_root_attrs(const std::string &path, const Attributes &a) {
    auto bad = [&](const std::string &name, const std::string &why) {
        DSM_FAIL(DSM_ERR_IO, "'", path, "': attribute '", name, "' ",
                 a.contains(name) ? cat("is ", a[name].dump(), ", ") : std::string(), why);
    };
    const int64_t version = a["format_version"].get<int64_t>();
    auto integer = [&](const char *name, int64_t lo, int64_t hi) -> int64_t {
        if (!a.contains(name)) bad(name, "is missing");
        if (!a[name].is_number_integer()) bad(name, "expected an integer");
        if (a[name].is_number_unsigned() && a[name].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
            bad(name, cat("expected ", lo, "..", hi));
        const int64_t v = a[name].get<int64_t>();
        if (v < lo || v > hi) bad(name, cat("expected ", lo, "..", hi));
        return v;
    };
    auto text = [&](const char *name) -> std::string {
        if (!a.contains(name)) bad(name, "is missing");
        if (!a[name].is_string()) bad(name, "expected a string");
        return a[name].get<std::string>();
    };
    auto one_of = [&](const char *name, std::initializer_list<const char *> allowed) {
        const std::string v = text(name);
        std::string list;
        for (const char *x : allowed) {
            if (v == x) return;
            list += cat(list.empty() ? "" : ", ", x);
        }
        bad(name, cat("expected one of ", list));
    };
    const int64_t global = integer("global_steps", 0, kMaxCounter);
    const int64_t micro = integer("micro_steps", 0, kMaxCounter);
    if (micro < global) bad("micro_steps", cat("is less than global_steps ", global));
    integer("skipped_steps", 0, global);
    integer("global_samples", 0, kMaxCounter);
    integer("optimizer_steps", 0, global);
    const int64_t cur_iter = integer("loss_scale_cur_iter", 0, kMaxCounter);
    integer("loss_scale_last_overflow_iter", -1, cur_iter);
    integer("loss_scale_cur_hysteresis", 0, kMaxCounter);
    integer("lr_schedule_last_step", -1, kMaxCounter);
    integer("zero_stage", 0, 3);
    integer("data_parallel_size", 1, INT_MAX);
    integer("sequence_parallel_size", 1, INT_MAX);
    if (!a.contains("loss_scale") || !a["loss_scale"].is_number()) bad("loss_scale", "expected a number");
    const double scale = a["loss_scale"].get<double>();
    if (!(std::isfinite(scale) && scale > 0)) bad("loss_scale", "expected a positive finite number");
    text("libdsm_version");
    if (!valid_tag(text("tag"))) bad("tag", "not a valid tag");
    one_of("compute_dtype", {"float32", "float16", "bfloat16"});
    one_of("optimizer", {"adam", "adamw", "sgd", "lamb", "lion", "adagrad"});
    if (!nlohmann::json::accept(text("config"))) bad("config", "is not valid JSON");
    const std::string names = text("mesh_names");
    if (!a.contains("mesh_shape") || !a["mesh_shape"].is_array()) bad("mesh_shape", "expected an integer array");
    const size_t count = names.empty() ? 0 : std::count(names.begin(), names.end(), ',') + size_t(1);
    if (a["mesh_shape"].size() != count) bad("mesh_shape", cat("has ", a["mesh_shape"].size(), " sizes for the ", count, " names of mesh_names"));
    for (const auto &d : a["mesh_shape"])
        if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > INT_MAX)
            bad("mesh_shape", "expected sizes >= 1");
    if (version >= 2) {
        if (!a.contains("attrs_checksum") || !a["attrs_checksum"].is_number_unsigned())
            bad("attrs_checksum", "expected the uint64 checksum of the root attributes");
        if (a["attrs_checksum"].get<uint64_t>() != root_attributes_checksum(a))
            DSM_FAIL(DSM_ERR_IO, "'", path, "': checksum mismatch in the root attributes (the file is corrupt)");
    }
}

// The link at `path` is a hard link; for a dataset, the only link to it.
void check_link(hid_t file, const std::string &fname, const std::string &path, bool dataset) {
    H5L_info_t li;
    h5ok(H5Lget_info(file, path.c_str(), &li, H5P_DEFAULT), cat("'", fname, "': reading the link ", path));
    if (li.type != H5L_TYPE_HARD)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " is a ", li.type == H5L_TYPE_SOFT ? "soft" : li.type == H5L_TYPE_EXTERNAL ? "external" : "user-defined",
                 " link; a checkpoint holds its ", dataset ? "tensors" : "groups", " directly");
#if H5_VERSION_GE(1, 12, 0)
    H5O_info2_t oi;
    h5ok(H5Oget_info_by_name3(file, path.c_str(), &oi, H5O_INFO_BASIC, H5P_DEFAULT), cat("'", fname, "': ", path));
#else
    H5O_info_t oi;
    h5ok(H5Oget_info_by_name2(file, path.c_str(), &oi, H5O_INFO_BASIC, H5P_DEFAULT), cat("'", fname, "': ", path));
#endif
    if (oi.type != (dataset ? H5O_TYPE_DATASET : H5O_TYPE_GROUP))
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " is not a ", dataset ? "dataset" : "group");
    if (dataset && oi.rc != 1)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " has ", oi.rc, " links (hard-linked to another tensor)");
}

// A scalar attribute of a dataset, read after checking its class and size.
Id scalar_attr(hid_t obj, const std::string &fname, const std::string &path, const char *name, H5T_class_t cls) {
    if (H5Aexists(obj, name) <= 0) DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " has no attribute '", name, "'");
    Id attr(h5(H5Aopen(obj, name, H5P_DEFAULT), cat("'", fname, "': ", path, ": opening attribute ", name)), H5Aclose);
    Id type(h5(H5Aget_type(attr.get()), "H5Aget_type"), H5Tclose);
    Id space(h5(H5Aget_space(attr.get()), "H5Aget_space"), H5Sclose);
    if (H5Tget_class(type.get()) != cls || H5Sget_simple_extent_npoints(space.get()) != 1 ||
        (cls == H5T_INTEGER && H5Tget_size(type.get()) > 8))
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, ": attribute '", name, "' is not a scalar ",
                 cls == H5T_STRING ? "string" : "integer");
    return attr;
}

// The dataset of tensor `t`: reached through hard links only, float32
// little-endian, stored in the file itself, its `name` and `trainable`
// attributes those of the tensor, its checksum returned.
uint64_t check_dataset(hid_t dset, const std::string &fname, const std::string &path, const Tensor &t,
                       int64_t version) {
    Id type(h5(H5Dget_type(dset), "H5Dget_type"), H5Tclose);
    if (H5Tequal(type.get(), H5T_IEEE_F32LE) <= 0)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " is not 32-bit little-endian float (H5T_IEEE_F32LE)");
    Id dcpl(h5(H5Dget_create_plist(dset), "H5Dget_create_plist"), H5Pclose);
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout == H5D_VIRTUAL || H5Pget_external_count(dcpl.get()) != 0)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " keeps its data in other files (virtual or external storage)");
    auto text = [&](const char *name) {
        Id attr = scalar_attr(dset, fname, path, name, H5T_STRING);
        Id ftype(h5(H5Aget_type(attr.get()), "H5Aget_type"), H5Tclose);
        if (H5Tis_variable_str(ftype.get()) > 0 || H5Tget_size(ftype.get()) > (1u << 20))
            DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, ": attribute '", name, "' is not a fixed-length string");
        std::string s(H5Tget_size(ftype.get()), '\0');
        h5ok(H5Aread(attr.get(), ftype.get(), &s[0]), cat("'", fname, "': reading attribute ", name, " of ", path));
        s.resize(std::strlen(s.c_str()));
        return s;
    };
    const std::string name = text("name");
    if (name != t.name)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " holds the tensor named '", name, "' (tensors swapped or renamed)");
    if (version >= 2) {
        const std::string group = text("group");
        if (group != t.group)
            DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, " holds a tensor of /", group, " (tensors swapped or moved)");
    }
    int64_t trainable = -1;
    h5ok(H5Aread(scalar_attr(dset, fname, path, "trainable", H5T_INTEGER).get(), H5T_NATIVE_INT64, &trainable),
         cat("'", fname, "': reading 'trainable' of ", path));
    if (trainable != 0 && trainable != 1)
        DSM_FAIL(DSM_ERR_IO, "'", fname, "': ", path, ": attribute 'trainable' is ", trainable, ", expected 0 or 1");
    uint64_t sum = 0;
    h5ok(H5Aread(scalar_attr(dset, fname, path, "checksum", H5T_INTEGER).get(), H5T_NATIVE_UINT64, &sum),
         cat("'", fname, "': reading the checksum of ", path));
    return sum;
}

} // namespace

void load(MPI_Comm comm, const std::string &dir, const std::string &tag, Content &content,
          std::vector<unsigned char> *client) {
    load_file(comm, file_of(dir, tag), content, client);
}

void load_file(MPI_Comm comm, const std::string &path, Content &content, std::vector<unsigned char> *client) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    const size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    agree(comm, [&] {
        if (rank != 0) return;
        QuietHdf5 quiet;
#if H5_VERSION_GE(1, 12, 0)
        const htri_t ok = H5Fis_accessible(path.c_str(), H5P_DEFAULT);
#else
        const htri_t ok = H5Fis_hdf5(path.c_str());
#endif
        if (ok <= 0)
            DSM_FAIL(DSM_ERR_IO, "'", path, "' is not a readable HDF5 file (missing, truncated or not HDF5)");
        // A file with its integrity record is checked byte for byte before
        // HDF5 reads it; one without (format version 1) in a child process.
        std::string why;
        const Integrity integrity = check_integrity(path, why);
        if (integrity == Integrity::Corrupt) DSM_FAIL(DSM_ERR_IO, "'", path, "': ", why);
        if (integrity == Integrity::Absent) precheck_metadata(path);
    });
    check_same_file(comm, rank, path);

    // As in the save: every step is agreed, so that a rank that fails stops
    // the others before they make a collective call it would not make.
    Steps steps(comm, path);
    auto attempt = [&](const std::function<void()> &fn) { return steps.run(fn); };
    {
        QuietHdf5 quiet;
        Id file;
        attempt([&] {
            Id fapl = mpio_fapl(comm, dir);
            file = Id(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
            if (file.get() < 0)
                DSM_FAIL(DSM_ERR_IO, "'", path, "' cannot be opened as HDF5 (truncated or corrupt?): ", hdf5_reason());
        });
        attempt([&] {
            content.attrs = read_attrs(file.get());
            const Attributes &a = content.attrs;
            if (!a.contains("format") || !a["format"].is_string() || a["format"].get<std::string>() != kFormat)
                DSM_FAIL(DSM_ERR_IO, "'", path, "' is not a libdsm checkpoint (no format attribute \"", kFormat, "\")");
            if (!a.contains("format_version") || !a["format_version"].is_number_integer() ||
                a["format_version"].get<int64_t>() < 1 || a["format_version"].get<int64_t>() > kFormatVersion)
                DSM_FAIL(DSM_ERR_IO, "'", path, "' has format_version ",
                         a.contains("format_version") ? a["format_version"].dump() : std::string("(none)"),
                         "; this libdsm reads format_version 1 to ", kFormatVersion);
            check_root_attrs(path, a);

            // The file's /params against the engine's parameters.
            std::map<std::string, const Tensor *> want; // escaped name -> tensor
            for (const Tensor &t : content.tensors)
                if (t.group == "params") want[escape_name(t.name)] = &t;
            std::vector<std::string> in_file;
            if (H5Lexists(file.get(), "/params", H5P_DEFAULT) > 0) {
                check_link(file.get(), path, "/params", false);
                Id g(h5(H5Gopen2(file.get(), "/params", H5P_DEFAULT), "opening /params"), H5Gclose);
                H5G_info_t gi;
                h5ok(H5Gget_info(g.get(), &gi), "H5Gget_info");
                for (hsize_t i = 0; i < gi.nlinks; ++i) {
                    char name[4096];
                    if (H5Lget_name_by_idx(g.get(), ".", H5_INDEX_NAME, H5_ITER_INC, i, name, sizeof name, H5P_DEFAULT) >= 0)
                        in_file.push_back(name);
                }
            }
            std::vector<std::string> problems;
            content.missing.clear();
            content.unexpected.clear();
            content.mismatched.clear();
            for (const std::string &f : in_file)
                if (!want.count(f)) {
                    problems.push_back(cat("unexpected tensor '", f, "' in the checkpoint"));
                    content.unexpected.push_back("/params/" + f);
                }
            for (Tensor &t : content.tensors) {
                t.skip = false;
                const std::string p = dataset_path(t);
                // Each group on the way, then the dataset: hard links only
                // (a soft or external link is refused before it is followed).
                bool present = true;
                std::string at;
                std::stringstream parts(t.group);
                std::string part;
                while (present && std::getline(parts, part, '/')) {
                    at += "/" + part;
                    present = H5Lexists(file.get(), at.c_str(), H5P_DEFAULT) > 0;
                    if (present) check_link(file.get(), path, at, false);
                }
                if (!present || H5Lexists(file.get(), p.c_str(), H5P_DEFAULT) <= 0) {
                    problems.push_back(t.group == "params" ? cat("parameter '", t.name, "' is missing from the checkpoint")
                                                           : cat("the checkpoint has no ", p, " (optimizer state)"));
                    content.missing.push_back(p);
                    t.skip = true;
                    continue;
                }
                check_link(file.get(), path, p, true);
                Id d(h5(H5Dopen2(file.get(), p.c_str(), H5P_DEFAULT), cat("opening ", p)), H5Dclose);
                Id s(h5(H5Dget_space(d.get()), "H5Dget_space"), H5Sclose);
                const int nd = H5Sget_simple_extent_ndims(s.get());
                if (nd < 0 || nd > 32) DSM_FAIL(DSM_ERR_IO, "'", path, "': ", p, " has an unreadable shape");
                std::vector<hsize_t> dims(static_cast<size_t>(nd));
                if (nd > 0) H5Sget_simple_extent_dims(s.get(), dims.data(), nullptr);
                const std::vector<int64_t> shape(dims.begin(), dims.end());
                if (shape != t.shape) {
                    problems.push_back(cat(p, " has shape ", shape_text(shape), " in the checkpoint but ",
                                           shape_text(t.shape), " in the engine"));
                    content.mismatched.push_back(cat(p, " ", shape_text(shape), " in the checkpoint, ",
                                                     shape_text(t.shape), " in the engine"));
                    t.skip = true;
                }
            }
            // Non-strict: what matches by name and shape is read, the rest
            // is reported (every rank read the same metadata: the same lists).
            if (!problems.empty() && content.strict) {
                std::string all;
                for (size_t i = 0; i < problems.size() && i < 20; ++i) all += (i ? "; " : "") + problems[i];
                if (problems.size() > 20) all += cat("; and ", problems.size() - 20, " more");
                DSM_FAIL(DSM_ERR_MISMATCH, "'", path, "' does not match the engine's parameters: ", all);
            }
        });

        // The data, and the checksums over what was read.
        const size_t n = content.tensors.size();
        std::vector<uint64_t> got(n, 0), stored(n, 0);
        Id xfer;
        attempt([&] { xfer = collective_xfer(); });
        Progress progress(rank, "load", path, content.tensors);
        for (size_t i = 0; i < n && !steps.stopped(); ++i, progress.done(content.tensors[i - 1])) {
            if (content.tensors[i].skip) continue; // non-strict: not in the file, or another shape
            attempt([&] {
                Tensor &t = content.tensors[i];
                const std::string p = dataset_path(t);
                Id d(h5(H5Dopen2(file.get(), p.c_str(), H5P_DEFAULT), cat("opening ", p)), H5Dclose);
                stored[i] = check_dataset(d.get(), path, p, t, content.attrs["format_version"].get<int64_t>());
                Selection sel = selection(t);
                h5ok(H5Dread(d.get(), H5T_NATIVE_FLOAT, sel.mem.get(), sel.file.get(), xfer.get(), buffer_of(t)),
                     cat("'", path, "': reading ", p));
                if (t.owner && t.count) got[i] = checksum(t.data, t.offset, t.count);
            });
        }
        if (!steps.stopped()) {
            DSM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, got.data(), static_cast<int>(n), MPI_UINT64_T, MPI_SUM, comm));
            attempt([&] {
                std::vector<std::string> bad;
                for (size_t i = 0; i < n; ++i)
                    if (got[i] != stored[i]) bad.push_back(dataset_path(content.tensors[i]));
                if (client) {
                    client->clear();
                    if (H5Lexists(file.get(), "/client_state", H5P_DEFAULT) > 0) {
                        check_link(file.get(), path, "/client_state", true);
                        Id d(h5(H5Dopen2(file.get(), "/client_state", H5P_DEFAULT), "opening /client_state"), H5Dclose);
                        Id type(h5(H5Dget_type(d.get()), "H5Dget_type"), H5Tclose);
                        Id s(h5(H5Dget_space(d.get()), "H5Dget_space"), H5Sclose);
                        if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1 ||
                            H5Sget_simple_extent_ndims(s.get()) != 1)
                            DSM_FAIL(DSM_ERR_IO, "'", path, "': /client_state is not a 1-D uint8 dataset");
                        const hssize_t len = H5Sget_simple_extent_npoints(s.get());
                        struct stat st;
                        if (len < 0 || ::stat(path.c_str(), &st) != 0 || len > st.st_size)
                            DSM_FAIL(DSM_ERR_IO, "'", path, "': /client_state claims ", len,
                                     " bytes, more than the file holds");
                        client->resize(static_cast<size_t>(len));
                        uint64_t want_sum = 0;
                        h5ok(H5Aread(scalar_attr(d.get(), path, "/client_state", "checksum", H5T_INTEGER).get(),
                                     H5T_NATIVE_UINT64, &want_sum),
                             "reading the checksum of /client_state");
                        if (!client->empty())
                            h5ok(H5Dread(d.get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, xfer.get(), client->data()),
                                 "reading /client_state");
                        if (checksum_bytes(client->data(), 0, client->size()) != want_sum) bad.push_back("/client_state");
                    }
                }
                if (!bad.empty()) {
                    std::string all;
                    for (size_t i = 0; i < bad.size() && i < 20; ++i) all += (i ? ", " : "") + bad[i];
                    if (bad.size() > 20) all += cat(" and ", bad.size() - 20, " more");
                    DSM_FAIL(DSM_ERR_IO, "'", path, "': checksum mismatch in ", all, " (the file is corrupt)");
                }
            });
        }
        xfer.reset();
        file.reset();
    }
    agree(comm, [&] {
        steps.rethrow();
    });
}

} // namespace ckpt
} // namespace dsm
