// HDF5 access shared by the checkpoint writer and reader: see hdf5_io.hpp.
#include "dsm_config.h"

#include "ckpt/hdf5_io.hpp"
#include "ckpt/format.hpp"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstring>

#include "core/error.hpp"

namespace dsm {
namespace ckpt {

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

namespace {

// Datasets of 64 KiB and more aligned to the file system's block of `dir`.
void set_alignment(hid_t fapl, const std::string &dir) {
    struct statvfs vfs;
    hsize_t block = 4096;
    if (statvfs(dir.c_str(), &vfs) == 0 && vfs.f_bsize > block) block = vfs.f_bsize;
    h5ok(H5Pset_alignment(fapl, 64 * 1024, block), "H5Pset_alignment");
}

} // namespace

// File access through MPI-IO with collective metadata, datasets aligned to
// the file system's block.
Id mpio_fapl(MPI_Comm comm, const std::string &dir) {
    Id fapl = plist(H5P_FILE_ACCESS);
    h5ok(H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL), "H5Pset_fapl_mpio");
    h5ok(H5Pset_all_coll_metadata_ops(fapl.get(), 1), "H5Pset_all_coll_metadata_ops");
    h5ok(H5Pset_coll_metadata_write(fapl.get(), 1), "H5Pset_coll_metadata_write");
    set_alignment(fapl.get(), dir);
    return fapl;
}

// One process's file access (HDF5's POSIX driver), the same alignment.
Id posix_fapl(const std::string &dir) {
    Id fapl = plist(H5P_FILE_ACCESS);
    h5ok(H5Pset_fapl_sec2(fapl.get()), "H5Pset_fapl_sec2");
#if H5_VERSION_GE(1, 12, 1) || (H5_VERSION_GE(1, 10, 7) && !H5_VERSION_GE(1, 11, 0))
    // The other ranks write the data through descriptors of their own, and
    // some parallel file systems refuse flock(): no lock.
    h5ok(H5Pset_file_locking(fapl.get(), 0, 1), "H5Pset_file_locking");
#endif
    set_alignment(fapl.get(), dir);
    return fapl;
}

Id collective_xfer() {
    Id x = plist(H5P_DATASET_XFER);
    h5ok(H5Pset_dxpl_mpio(x.get(), H5FD_MPIO_COLLECTIVE), "H5Pset_dxpl_mpio");
    return x;
}

// ---------------------------------------------------------------- attributes

void write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value,
                const std::vector<hsize_t> &dims) {
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

namespace {
float g_empty[1];
} // namespace

void *buffer_of(const Tensor &t) { return t.count ? static_cast<void *>(t.data) : static_cast<void *>(g_empty); }

std::string dataset_path(const Tensor &t) { return "/" + t.group + "/" + escape_name(t.name); }

} // namespace ckpt
} // namespace dsm
