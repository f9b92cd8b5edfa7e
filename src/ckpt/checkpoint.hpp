// Checkpoints in parallel HDF5 (doc/checkpoint.md): one file per tag holding
// logical, full-shape fp32 tensors, written and read collectively, each rank
// moving the part of each tensor it owns; atomic commit and `latest`.
//
// This layer knows tensors and attributes, not the engine: the engine
// describes what each rank holds (a Tensor with at most one contiguous piece
// per rank, in row-major element order) and which rank counts for each
// tensor (`owner`: exactly one rank per element writes it and adds it to
// the checksum), and gets back what it asked to read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include <nlohmann/json.hpp>

#include "ckpt/format.hpp"

namespace dsm {
namespace ckpt {

// A tensor of the file and this rank's part of it.
struct Tensor {
    std::string group;           // "params" or "optimizer/<state>"
    std::string name;            // the parameter's name
    std::vector<int64_t> shape;  // empty: a scalar
    bool trainable = true;
    size_t offset = 0, count = 0; // this rank's elements [offset, offset + count), row-major
    float *data = nullptr;        // count floats (written from, or read into)
    bool owner = false;           // this rank writes the piece and counts it in the checksum
    bool skip = false;            // set by a non-strict load: not read (missing, or another shape)
};

// The file's root attributes: int64, double, string or int64-array values.
using Attributes = nlohmann::json;

// Tag rules of doc/checkpoint.md; DSM_ERR_INVALID_ARGUMENT naming the tag.
void check_tag(const std::string &tag);

// What a save and a load act on.
struct Content {
    std::vector<Tensor> tensors;
    Attributes attrs = Attributes::object(); // written on save, filled on load
    // Load: strict (the default) fails on any difference between the file
    // and `tensors`; non-strict reads the tensors that match by name and
    // shape, marks the others `skip`, and lists the differences here (every
    // rank the same): dataset paths missing from the file, /params entries
    // of the file the engine lacks, and paths whose shapes differ.
    bool strict = true;
    std::vector<std::string> missing, unexpected, mismatched;
    // Load: called (every rank) with the file's root attributes once they
    // are read, before any tensor data: what the caller needs from them,
    // checked while a failure still changes nothing (it throws).
    std::function<void(const Attributes &)> check_attrs;
};

// Testing: a failure, or a SIGKILL, at a point of the save
// (DSM_CKPT_FAULT=POINT:RANK or kill:POINT:RANK; POINT is create, write,
// data, rename or latest). Returns normally when no fault is set for here; a
// malformed DSM_CKPT_FAULT is DSM_ERR_INVALID_ARGUMENT.
void fault_point(const char *point, int world_rank);

// Collective over `comm`. Writes DIR/<tag>.h5 atomically and then DIR/latest
// (doc/checkpoint.md); the client bytes go to /client_state (none when size
// is 0). Before any collective open, every rank must see the directory
// rank 0 creates (a token file), and the file system must have room for
// the file; leftovers of earlier failed saves are removed. Rank 0 alone
// creates the file's metadata (HDF5's POSIX driver) and sends the datasets'
// offsets; each rank writes its pieces there independently (pwrite), one
// rank per node flushes them, and every step is agreed, so a failure on
// one rank (rank 0's create, a full disk) stops all of them. On any failure every rank throws the same error; a failure before
// the rename leaves no file under the final name, one after it (flushing
// the directory, writing `latest`) leaves the complete new file and
// `latest` on the previous tag.
// After the save, with `keep_last` > 0, rank 0 removes the complete
// checkpoints of the directory beyond the `keep_last` newest (files::prune).
void save(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
          const void *client, size_t client_size, int keep_last = 0);

// save() in two parts, for a save whose writing runs in the background:
// save_prepare does the directory, the leftovers, the room and the shared
// directory check (quick); save_write, with the same arguments, the rest.
// Both collective over `comm`, errors agreed as in save().
void save_prepare(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
                  size_t client_size);
// `captured`, when given, is called once the tensors' data is no longer
// read (handed to the file system and checksummed; also after a failure):
// from then on the caller may change it while the save goes on.
void save_write(MPI_Comm comm, const std::string &dir, const std::string &tag, const Content &content,
                const void *client, size_t client_size, int keep_last = 0,
                const std::function<void()> &captured = {});

// Collective: the tags of the checkpoint files in `dir` (<tag>.h5 with a
// valid tag), newest first (modification time, then tag), as rank 0 sees
// them; empty when the directory cannot be read.
std::vector<std::string> list_checkpoints(MPI_Comm comm, const std::string &dir);

// The tag a load reads: `tag`, or the one DIR/latest names when empty.
// Collective; DSM_ERR_IO on every rank when the file is missing or names a
// tag whose file is missing.
std::string resolve_tag(MPI_Comm comm, const std::string &dir, const std::string &tag);

// Collective over `comm`: check that every rank sees the same file, open
// DIR/<tag>.h5, check its format, validate and read the root attributes
// (types, ranges, and their checksum from format version 2) into
// content.attrs, refuse soft, external and multiply-linked tensors and
// tensors whose `name` attribute is another's, and read every tensor's piece into its data,
// verifying the checksums; no tensor's data changes unless every rank read
// and verified every tensor. `names` are the parameter names the engine has:
// the file's /params must hold exactly them with the tensors' shapes, else
// DSM_ERR_MISMATCH listing the differences. Tensors whose group is not
// "params" must exist in the file (DSM_ERR_MISMATCH otherwise; a non-strict
// load, content.strict false, reads what matches instead). The client
// state is returned in `client`. Nothing outside `content` and `client` is
// touched, so a failed load changes nothing.
void load(MPI_Comm comm, const std::string &dir, const std::string &tag, Content &content,
          std::vector<unsigned char> *client);

// load() of the checkpoint file `path` (any name): dsm_engine_load_weights.
void load_file(MPI_Comm comm, const std::string &path, Content &content, std::vector<unsigned char> *client);

} // namespace ckpt
} // namespace dsm
