// Reading a checkpoint (load), its tag and the list of checkpoints: see
// checkpoint.hpp and doc/checkpoint.md; the checks of what is read are in
// validate.cc.
#include "dsm_config.h"

#include "ckpt/checkpoint.hpp"
#include "ckpt/files.hpp"
#include "ckpt/format.hpp"
#include "ckpt/hdf5_io.hpp"
#include "ckpt/protocol.hpp"
#include "ckpt/raw_io.hpp"
#include "ckpt/validate.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <hdf5.h>

#include "core/agree.hpp"
#include "core/error.hpp"

namespace dsm {
namespace ckpt {

using namespace files; // file names, directory checks (files.cc)

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

// Where the little-endian fp32 elements of `dset` (numel of them) lie in
// the file, one after the other, or HADDR_UNDEF when they do not (another
// layout, filters, storage of another size, not allocated).
haddr_t raw_offset(hid_t dset, uint64_t numel) {
    if (numel == 0) return HADDR_UNDEF;
    const hid_t dcpl = H5Dget_create_plist(dset);
    if (dcpl < 0) return HADDR_UNDEF;
    const bool contiguous = H5Pget_layout(dcpl) == H5D_CONTIGUOUS && H5Pget_nfilters(dcpl) == 0 &&
                            H5Pget_external_count(dcpl) == 0;
    H5Pclose(dcpl);
    if (!contiguous || H5Dget_storage_size(dset) != numel * sizeof(float)) return HADDR_UNDEF;
    return H5Dget_offset(dset);
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
            if (content.check_attrs) content.check_attrs(a);

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
        // Nothing in a tensor's data changes before every rank verified
        // every checksum: a contiguous dataset's piece is checksummed where
        // the page cache holds it (the file mapped, raw_io.hpp), anything
        // else is read through HDF5 into memory of the load's own; each
        // piece is copied into its tensor at the end (`copies`).
        struct Copy {
            float *dst;
            const float *src;
            size_t count;
        };
        std::vector<Copy> copies;
        std::vector<std::vector<float>> held;
        std::unique_ptr<FileMap> map;
        attempt([&] {
            xfer = collective_xfer();
            if (kRawFloatIo) {
                map = std::make_unique<FileMap>(path);
                if (map->data() == nullptr) DSM_FAIL(DSM_ERR_IO, "cannot map '", path, "' to read it: ", map->error());
            }
        });
        Progress progress(rank, "load", path, content.tensors);
        for (size_t i = 0; i < n && !steps.stopped(); ++i, progress.done(content.tensors[i - 1])) {
            if (content.tensors[i].skip) continue; // non-strict: not in the file, or another shape
            attempt([&] {
                Tensor &t = content.tensors[i];
                const std::string p = dataset_path(t);
                Id d(h5(H5Dopen2(file.get(), p.c_str(), H5P_DEFAULT), cat("opening ", p)), H5Dclose);
                stored[i] = check_dataset(d.get(), path, p, t, content.attrs["format_version"].get<int64_t>());
                // The same decision on every rank (the file's metadata).
                uint64_t numel = 1;
                for (int64_t x : t.shape) numel *= static_cast<uint64_t>(x);
                const haddr_t at = raw_offset(d.get(), numel);
                if (map && at != HADDR_UNDEF) {
                    if (t.count == 0) return;
                    const uint64_t begin = at + t.offset * sizeof(float), bytes = t.count * sizeof(float);
                    if (begin > map->size() || bytes > map->size() - begin)
                        DSM_FAIL(DSM_ERR_IO, "'", path, "': the data of ", p, " lies beyond the end of the file (",
                                 map->size(), " bytes; truncated?)");
                    map->will_need(begin, bytes);
                    const float *src = reinterpret_cast<const float *>(map->data() + begin);
                    if (t.owner) got[i] = checksum(src, t.offset, t.count);
                    copies.push_back(Copy{t.data, src, t.count});
                    return;
                }
                held.emplace_back(std::max<size_t>(t.count, 1));
                float *into = held.back().data();
                Selection sel = selection(t);
                h5ok(H5Dread(d.get(), H5T_NATIVE_FLOAT, sel.mem.get(), sel.file.get(), xfer.get(), into),
                     cat("'", path, "': reading ", p));
                if (t.owner && t.count) got[i] = checksum(into, t.offset, t.count);
                if (t.count) copies.push_back(Copy{t.data, into, t.count});
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
        // Every rank verified every tensor: now the tensors change.
        if (!steps.stopped())
            for (const Copy &c : copies) copy_floats(c.dst, c.src, c.count);
        xfer.reset();
        file.reset();
    }
    agree(comm, [&] {
        steps.rethrow();
    });
}

} // namespace ckpt
} // namespace dsm
