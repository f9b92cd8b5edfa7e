// Writing a checkpoint (save): see checkpoint.hpp and doc/checkpoint.md.
#include "dsm_config.h"

#include "ckpt/checkpoint.hpp"
#include "ckpt/files.hpp"
#include "ckpt/format.hpp"
#include "ckpt/hdf5_io.hpp"
#include "ckpt/protocol.hpp"
#include "ckpt/raw_io.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>

#include <hdf5.h>

#include "core/agree.hpp"
#include "core/error.hpp"

namespace dsm {
namespace ckpt {

using namespace files; // file names, durable writes, directory checks (files.cc)

namespace {

constexpr uint64_t kNoOffset = ~uint64_t(0); // a dataset without storage (no elements)

// Collective: whether this rank flushes the data its node's ranks wrote:
// the lowest rank of each node (MPI_COMM_TYPE_SHARED), except on rank 0's
// node, which rank 0's fsync of the whole file at the commit flushes.
bool flushes_for_node(MPI_Comm comm, int rank) {
    MPI_Comm node = MPI_COMM_NULL;
    DSM_CHECK_MPI(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
    int node_rank = 0;
    MPI_Comm_rank(node, &node_rank);
    MPI_Comm_free(&node);
    return node_rank == 0 && rank != 0;
}

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
        check_fault_spec();
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
                const void *client, size_t client_size, int keep_last, const std::function<void()> &captured) {
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

    // Rank 0 alone creates the file and its metadata with HDF5's POSIX
    // driver (no MPI-IO: one process writes a few KiB), every dataset
    // contiguous and allocated at creation, and sends every rank the
    // datasets' offsets; each rank then writes its own pieces there with
    // pwrite() (raw_io.hpp), independently. Every step is agreed (Steps), so
    // that a failure on any rank, rank 0's creation included, stops every
    // rank; the outcome is agreed after rank 0 closed the file.
    Steps steps(comm, tmp);
    auto attempt = [&](const std::function<void()> &fn) { return steps.run(fn); };
    struct statvfs vfs;
    const uint64_t userblock =
        userblock_size(n + 1, ::statvfs(dir.c_str(), &vfs) == 0 ? static_cast<uint64_t>(vfs.f_bsize) : 4096);
    std::vector<Extent> extents;
    std::vector<uint64_t> where(n, kNoOffset); // each tensor's data in the file
    const bool node_flusher = flushes_for_node(comm, rank);
    std::optional<RawFile> node_sync; // the node flusher's descriptor, until it synced
    {
        QuietHdf5 quiet;
        Id file; // rank 0's
        std::vector<Id> dsets;
        attempt([&] {
            if (rank != 0) return;
            Id fapl = posix_fapl(dir);
            Id fcpl = plist(H5P_FILE_CREATE);
            h5ok(H5Pset_userblock(fcpl.get(), userblock), "H5Pset_userblock");
            file = Id(h5(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), cat("creating '", tmp, "'")),
                      H5Fclose);
            write_json_attrs(file.get(), attrs);
            write_attr(file.get(), "attrs_checksum", H5T_NATIVE_UINT64, H5T_STD_U64LE, &root_sum);
            Id lcpl = plist(H5P_LINK_CREATE);
            h5ok(H5Pset_create_intermediate_group(lcpl.get(), 1), "H5Pset_create_intermediate_group");
            Id dcpl = plist(H5P_DATASET_CREATE);
            h5ok(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
            h5ok(H5Pset_alloc_time(dcpl.get(), H5D_ALLOC_TIME_EARLY), "H5Pset_alloc_time");
            dsets.reserve(n + 1);
            for (size_t i = 0; i < n; ++i) {
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
                // Contiguous and allocated at creation: the elements lie in
                // one range from here (none for an empty tensor).
                const haddr_t at = H5Dget_offset(dset);
                if (at != HADDR_UNDEF) where[i] = static_cast<uint64_t>(at);
            }
            if (client_size) {
                const hsize_t len = client_size;
                Id space(h5(H5Screate_simple(1, &len, nullptr), "creating a dataspace"), H5Sclose);
                dsets.emplace_back(h5(H5Dcreate2(file.get(), "/client_state", H5T_STD_U8LE, space.get(), H5P_DEFAULT,
                                                 dcpl.get(), H5P_DEFAULT),
                                      "creating /client_state"),
                                   H5Dclose);
                h5ok(H5Dwrite(dsets.back().get(), H5T_NATIVE_UCHAR, H5S_ALL, H5S_ALL, H5P_DEFAULT, client),
                     cat("writing /client_state to '", tmp, "'"));
            }
            fault_point("create", world_rank);
        });
        // The data: each rank's pieces at the offsets rank 0 sent, through
        // a descriptor of its own. No collective call between the pieces:
        // a rank whose write fails (a full disk) stops writing, and the
        // agreement after the data stops every rank.
        if (!steps.stopped()) {
            DSM_CHECK_MPI(MPI_Bcast(where.data(), static_cast<int>(n), MPI_UINT64_T, 0, comm));
            Progress progress(rank, "save", final_path, content.tensors);
            attempt([&] {
                RawFile raw(tmp);
                if (raw.fd() < 0) DSM_FAIL(DSM_ERR_IO, "cannot open '", tmp, "' to write its data: ", raw.error());
                for (size_t i = 0; i < n; progress.done(content.tensors[i]), ++i) {
                    const Tensor &t = content.tensors[i];
                    if (i == n / 2) fault_point("write", world_rank);
                    if (t.count == 0) continue;
                    if (where[i] == kNoOffset)
                        DSM_FAIL(DSM_ERR_INTERNAL, "'", tmp, "': ", dataset_path(t), " has no storage for its data");
                    const std::string why = raw.write_floats(t.data, t.count, where[i] + t.offset * sizeof(float));
                    if (!why.empty())
                        DSM_FAIL(DSM_ERR_IO, "writing ", dataset_path(t), " to '", tmp, "': ", why, space_hint(dir));
                }
                // Every node's data on its disk before the commit: the
                // pages a node's ranks wrote are that node's (its page
                // cache, or its client of a parallel file system), and one
                // fdatasync flushes them all, so one rank per node syncs,
                // after every rank of the node wrote (the agreement below).
                // Rank 0's node is flushed by the commit's fsync.
                if (node_flusher) node_sync.emplace(std::move(raw));
            });
        }
        local_sums.get();
        if (captured) captured(); // the data is in the file system's hands and summed
        // Every rank takes part (attempt() agrees), the node flushers sync.
        if (!steps.stopped())
            attempt([&] {
                if (!node_sync) return;
                const std::string why = node_sync->sync();
                node_sync.reset();
                if (!why.empty()) DSM_FAIL(DSM_ERR_IO, "flushing the data of '", tmp, "': ", why, space_hint(dir));
            });
        node_sync.reset();
        if (!steps.stopped()) {
            DSM_CHECK_MPI(MPI_Allreduce(MPI_IN_PLACE, sums.data(), static_cast<int>(n + 1), MPI_UINT64_T, MPI_SUM, comm));
            attempt([&] {
                if (rank != 0) return;
                for (size_t i = 0; i < dsets.size(); ++i)
                    write_attr(dsets[i].get(), "checksum", H5T_NATIVE_UINT64, H5T_STD_U64LE, &sums[i < n ? i : n]);
                // Where the data lies, for the integrity record.
                for (const Id &d : dsets) {
                    const haddr_t at = H5Dget_offset(d.get());
                    if (at != HADDR_UNDEF) extents.push_back({at, H5Dget_storage_size(d.get())});
                }
                dsets.clear();
                free_reserve();
                const hid_t id = file.release();
                h5ok(H5Fclose(id), cat("closing '", tmp, "'"));
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

} // namespace ckpt
} // namespace dsm
