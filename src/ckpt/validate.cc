// The checks of a load: see validate.hpp.
#include "dsm_config.h"

#include "ckpt/validate.hpp"
#include "ckpt/format.hpp"
#include "ckpt/params.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "core/error.hpp"

namespace dsm {
namespace ckpt {

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

namespace {
constexpr int64_t kMaxCounter = int64_t(1) << 62;
} // namespace

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

} // namespace ckpt
} // namespace dsm
