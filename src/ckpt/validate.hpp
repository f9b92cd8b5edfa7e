// The checks of a load (doc/checkpoint.md): the metadata read in a child
// process first, the root attributes, the links and each tensor's dataset.
// Each failure is DSM_ERR_IO naming the file, the object and the value.
// Internal to src/ckpt (read.cc).
#pragma once

#include <cstdint>
#include <string>

#include <hdf5.h>

#include "ckpt/checkpoint.hpp"
#include "ckpt/hdf5_io.hpp"

namespace dsm {
namespace ckpt {

// Rank 0, before the collective open of a load: read the metadata the load
// will read (the root attributes, every object under /params, /optimizer
// and /client_state, each with its attributes) in a child process, so that
// a corrupt file on which HDF5 itself crashes or loops fails the load on
// every rank with DSM_ERR_IO instead of killing or hanging the job. HDF5's
// own errors are left to the load, which reports them. The child makes no
// MPI call and leaves with _exit(). DSM_CKPT_PRECHECK=0 skips it (a system
// where a process that uses MPI must not fork).
void precheck_metadata(const std::string &path);

// The root attributes the format defines, checked as the loader uses them:
// every one present with its type and in its range (DSM_ERR_IO naming the
// file, the attribute and its value), and the checksum over them (format
// version 2) matching.
void check_root_attrs(const std::string &path, const Attributes &a);

// The link at `path` is a hard link; for a dataset, the only link to it.
void check_link(hid_t file, const std::string &fname, const std::string &path, bool dataset);

// A scalar attribute of a dataset, read after checking its class and size.
Id scalar_attr(hid_t obj, const std::string &fname, const std::string &path, const char *name, H5T_class_t cls);

// The dataset of tensor `t`: reached through hard links only, float32
// little-endian, stored in the file itself, its `name` and `trainable`
// attributes those of the tensor, its checksum returned.
uint64_t check_dataset(hid_t dset, const std::string &fname, const std::string &path, const Tensor &t,
                       int64_t version);

} // namespace ckpt
} // namespace dsm
