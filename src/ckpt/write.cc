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

#include <hdf5.h>

#include "core/agree.hpp"
#include "core/error.hpp"

namespace dsm {
namespace ckpt {

using namespace files; // file names, durable writes, directory checks (files.cc)

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
    // The data: each rank's pieces written by itself at the datasets'
    // offsets (raw_io.hpp); HDF5 writes the metadata.
    RawFile raw;
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
            if (kRawFloatIo) {
                raw = RawFile(tmp);
                if (raw.fd() < 0) DSM_FAIL(DSM_ERR_IO, "cannot open '", tmp, "' to write its data: ", raw.error());
            }
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
                // Contiguous and allocated at creation: the piece's bytes
                // start at the dataset's offset plus the piece's.
                const haddr_t at = t.count ? H5Dget_offset(dset) : HADDR_UNDEF;
                if (t.count && raw.fd() >= 0 && at != HADDR_UNDEF) {
                    const std::string why = raw.write(t.data, t.count * sizeof(float), at + t.offset * sizeof(float));
                    if (!why.empty())
                        DSM_FAIL(DSM_ERR_IO, "writing ", path, " to '", tmp, "': ", why, space_hint(dir));
                    return;
                }
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
        if (captured) captured(); // the data is in the file system's hands and summed
        // Every rank's data on the disk before the commit (its own
        // descriptor: on a parallel file system each client holds its own).
        if (!steps.stopped() && raw.fd() >= 0)
            attempt([&] {
                const std::string why = raw.sync();
                raw.close();
                if (!why.empty()) DSM_FAIL(DSM_ERR_IO, "flushing the data of '", tmp, "': ", why, space_hint(dir));
            });
        raw.close();
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

} // namespace ckpt
} // namespace dsm
