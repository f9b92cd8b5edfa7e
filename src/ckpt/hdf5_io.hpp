// HDF5 access shared by the checkpoint writer (write.cc) and reader
// (read.cc, validate.cc): HDF5 failures as DSM_ERR_HDF5 with HDF5's own
// reason, the MPI-IO file access, attributes as JSON, and the selection of
// a rank's piece of a tensor. Internal to src/ckpt.
#pragma once

#include <string>
#include <vector>

#include <mpi.h>
#include <hdf5.h>

#include "ckpt/checkpoint.hpp"
#include "ckpt/h5.hpp"

namespace dsm {
namespace ckpt {

using Id = Handle;

// The innermost message of HDF5's error stack, for our messages.
std::string hdf5_reason();
// `id`, or DSM_ERR_HDF5 naming `what` when it is negative.
hid_t h5(hid_t id, const std::string &what);
// DSM_ERR_HDF5 naming `what` when `rc` is negative.
void h5ok(herr_t rc, const std::string &what);
Id plist(hid_t cls);

// File access through MPI-IO with collective metadata, datasets aligned to
// the file system's block of `dir`.
Id mpio_fapl(MPI_Comm comm, const std::string &dir);
// File access by one process (HDF5's POSIX driver, no file lock), the
// same alignment: the checkpoint's metadata, created by rank 0 alone.
Id posix_fapl(const std::string &dir);
// Collective data transfer.
Id collective_xfer();

// Attributes.
void write_attr(hid_t obj, const char *name, hid_t mem_type, hid_t file_type, const void *value,
                const std::vector<hsize_t> &dims = {});
void write_string_attr(hid_t obj, const char *name, const std::string &value);
void write_int_attr(hid_t obj, const char *name, int64_t v);
// Each value of `attrs` (int64, double, string or int64 array) as an attribute.
void write_json_attrs(hid_t obj, const Attributes &attrs);
// Every attribute of `obj` as JSON: integers (scalars or 1-D arrays),
// floats, strings.
Attributes read_attrs(hid_t obj);

// Selections.
std::vector<hsize_t> hdims(const std::vector<int64_t> &shape);
Id make_space(const std::vector<hsize_t> &dims);
// The selection of this rank's piece of a tensor, in the file and in memory.
struct Selection {
    Id file, mem;
};
Selection selection(const Tensor &t);
// The tensor's data, or a valid pointer for a rank whose piece is empty
// (HDF5 wants one).
void *buffer_of(const Tensor &t);
// "/<group>/<escaped name>".
std::string dataset_path(const Tensor &t);

} // namespace ckpt
} // namespace dsm
