// The checkpoint's file-system side: file names of a tag, durable writes
// (fsync, atomic replace), directory checks shared by all ranks, leftovers
// of failed saves, free space. Internal to src/ckpt (write.cc, read.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "ckpt/checkpoint.hpp"

namespace dsm {
namespace ckpt {
namespace files {

// The file of a tag, its temporary while written, and the room reserved for
// HDF5's metadata beside it.
std::string file_of(const std::string &dir, const std::string &tag);
std::string tmp_of(const std::string &dir, const std::string &tag);
std::string reserve_of(const std::string &dir, const std::string &tag);

// Room kept aside for HDF5's metadata while the data is written: HDF5
// writes its metadata when the file is flushed and closed, and a rank whose
// metadata write fails leaves the others waiting inside HDF5. Rank 0 frees
// this room just before the flush, and after a failed write also truncates
// the temporary, so the close always has room for the metadata.
size_t reserve_size(size_t tensors);

void fsync_path(const std::string &path, bool directory);

void make_dirs(const std::string &dir);

// Write `text` to `path` through a temporary, flushed, renamed, with the
// directory flushed after: readers see the old or the new file, whole.
void replace_file(const std::string &dir, const std::string &path, const std::string &tmp, const std::string &text);

std::string host_name();

std::string hex64(uint64_t v);

// Collective: every rank sees, under its own spelling of `dir`, the
// directory rank 0 writes to. Rank 0 leaves a token file with a random name
// there and every other rank reads it back; a rank on which the token is
// missing (node-local scratch, another path on that rank) fails, and so
// every rank does, before any collective open of a file in `dir` could
// hang. The token is removed whatever the outcome.
void check_shared_dir(MPI_Comm comm, int rank, const std::string &dir);

// Collective: every rank sees `path` as the same file rank 0 sees (same
// size and modification time), before a collective open of it.
void check_same_file(MPI_Comm comm, int rank, const std::string &path);

// Rank 0, at the start of a save: remove what earlier saves left when they
// were killed or failed: `.<tag>.h5.tmp` and `.<tag>.h5.reserve` of any
// tag, `.latest.tmp`, and directory tokens (one job saves into a directory
// at a time, as `latest` requires, so every one of these is garbage).
void remove_leftovers(const std::string &dir);

// What a failed write adds to its message: the file system's free space
// when it is (nearly) full.
std::string space_hint(const std::string &dir);

// Rank 0, before a save: the file system has room for the file (the data,
// the client state, and per dataset its header and alignment), so that a
// full disk is one clear error before any data moves. Quotas and space
// taken while the save runs are caught by the write agreement instead.
void check_space(const std::string &dir, const Content &content, size_t client_size);

// The tags of the checkpoint files in `dir` (<tag>.h5, a valid tag, a
// regular file), newest first: modification time, then tag. Empty when the
// directory cannot be read.
std::vector<std::string> tags_newest_first(const std::string &dir);

// Rank 0, after a complete save (checkpoint.keep_last): remove the
// checkpoints of `dir` beyond the `keep` newest. Only files libdsm wrote and
// that are complete count and go (their integrity record verifies); the one
// `latest` names (`latest_tag`) always stays. A file that cannot be removed
// is a WARN, never a failure of the save that was just made.
void prune(const std::string &dir, size_t keep, const std::string &latest_tag);

} // namespace files
} // namespace ckpt
} // namespace dsm
