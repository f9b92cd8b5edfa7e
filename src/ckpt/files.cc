// The checkpoint's file-system side (files.hpp).
#include "dsm_config.h"

#include "ckpt/files.hpp"
#include "ckpt/params.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/log.hpp"

namespace dsm {
namespace ckpt {
namespace files {


std::string file_of(const std::string &dir, const std::string &tag) { return dir + "/" + tag + ".h5"; }
std::string tmp_of(const std::string &dir, const std::string &tag) { return dir + "/." + tag + ".h5.tmp"; }
std::string reserve_of(const std::string &dir, const std::string &tag) { return dir + "/." + tag + ".h5.reserve"; }

// Room kept aside for HDF5's metadata while the data is written: HDF5
// writes its metadata when the file is flushed and closed, and a rank whose
// metadata write fails leaves the others waiting inside HDF5. Rank 0 frees
// this room just before the flush, and after a failed write also truncates
// the temporary, so the close always has room for the metadata.
size_t reserve_size(size_t tensors) { return (size_t(1) << 20) + 8192 * tensors; }

void fsync_path(const std::string &path, bool directory) {
    const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
    if (fd < 0) DSM_FAIL(DSM_ERR_IO, "cannot open '", path, "' to flush it: ", std::strerror(errno));
    const int rc = ::fsync(fd);
    const int err = errno;
    ::close(fd);
    if (rc != 0) DSM_FAIL(DSM_ERR_IO, "fsync of '", path, "' failed: ", std::strerror(err));
}

void make_dirs(const std::string &dir) {
    std::string at;
    std::stringstream ss(dir);
    std::string part;
    if (!dir.empty() && dir[0] == '/') at = "/";
    while (std::getline(ss, part, '/')) {
        if (part.empty()) continue;
        at += part;
        if (::mkdir(at.c_str(), 0777) != 0 && errno != EEXIST)
            DSM_FAIL(DSM_ERR_IO, "cannot create the checkpoint directory '", at, "': ", std::strerror(errno));
        at += "/";
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        DSM_FAIL(DSM_ERR_IO, "the checkpoint directory '", dir, "' is not a directory");
}

// Write `text` to `path` through a temporary, flushed, renamed, with the
// directory flushed after: readers see the old or the new file, whole.
void replace_file(const std::string &dir, const std::string &path, const std::string &tmp, const std::string &text) {
    {
        std::ofstream f(tmp, std::ios::trunc);
        f << text;
        f.close();
        if (!f) DSM_FAIL(DSM_ERR_IO, "cannot write '", tmp, "'");
    }
    fsync_path(tmp, false);
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
        DSM_FAIL(DSM_ERR_IO, "cannot rename '", tmp, "' to '", path, "': ", std::strerror(errno));
    fsync_path(dir, true);
}


std::string host_name() {
    char host[256] = {0};
    if (::gethostname(host, sizeof host - 1) != 0) return "(unknown host)";
    return host;
}

std::string hex64(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

constexpr const char *kDirToken = ".dsm-dircheck-";

// Collective: every rank sees, under its own spelling of `dir`, the
// directory rank 0 writes to. Rank 0 leaves a token file with a random name
// there and every other rank reads it back; a rank on which the token is
// missing (node-local scratch, another path on that rank) fails, and so
// every rank does, before any collective open of a file in `dir` could
// hang. The token is removed whatever the outcome.
void check_shared_dir(MPI_Comm comm, int rank, const std::string &dir) {
    int size = 1;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    uint64_t nonce = 0;
    std::string token;
    agree(comm, [&] {
        if (rank != 0) return;
        nonce = std::random_device{}() * 0x100000001ull ^ static_cast<uint64_t>(::getpid()) ^
                static_cast<uint64_t>(::time(nullptr)) << 20;
        token = dir + "/" + kDirToken + hex64(nonce);
        const int fd = ::open(token.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (fd < 0)
            DSM_FAIL(DSM_ERR_IO, "cannot create a file in the checkpoint directory '", dir, "' (host ", host_name(),
                     "): ", std::strerror(errno));
        const std::string text = hex64(nonce) + "\n";
        const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
        const int err = errno;
        ::close(fd);
        if (!ok) {
            ::unlink(token.c_str());
            DSM_FAIL(DSM_ERR_IO, "cannot write a file in the checkpoint directory '", dir, "' (host ", host_name(),
                     "): ", std::strerror(err));
        }
    });
    if (size == 1) {
        ::unlink(token.c_str());
        return;
    }
    DSM_CHECK_MPI(MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, comm));
    const std::string host0 = bcast_string(comm, 0, rank == 0 ? host_name() : std::string());
    try {
        agree(comm, [&] {
            if (rank == 0) return;
            const std::string mine = dir + "/" + kDirToken + hex64(nonce);
            std::ifstream f(mine);
            std::string text;
            const int err = errno;
            if (f) std::getline(f, text);
            if (!f || text != hex64(nonce))
                DSM_FAIL(DSM_ERR_IO, "on host ", host_name(), " the checkpoint directory '", dir,
                         "' is not the one rank 0 (host ", host0, ") writes to: the file '", mine,
                         "' that rank 0 created there ", f ? "has other contents" : cat("cannot be read (", std::strerror(err), ")"),
                         "; every rank must name one shared directory (node-local storage such as /tmp or "
                         "TMPDIR on each node, or a different path on some ranks, cannot hold a checkpoint)");
        });
    } catch (...) {
        if (rank == 0) ::unlink(token.c_str());
        throw;
    }
    if (rank == 0) ::unlink(token.c_str());
}

// Collective: every rank sees `path` as the same file rank 0 sees (same
// size and modification time), before a collective open of it.
void check_same_file(MPI_Comm comm, int rank, const std::string &path) {
    int size = 1;
    DSM_CHECK_MPI(MPI_Comm_size(comm, &size));
    if (size == 1) return;
    long long id[3] = {0, 0, 0}; // size, mtime s, mtime ns (rank 0's)
    agree(comm, [&] {
        if (rank != 0) return;
        struct stat st;
        if (::stat(path.c_str(), &st) != 0)
            DSM_FAIL(DSM_ERR_IO, "checkpoint '", path, "': ", std::strerror(errno));
        if (!S_ISREG(st.st_mode)) DSM_FAIL(DSM_ERR_IO, "checkpoint '", path, "' is not a regular file");
        id[0] = static_cast<long long>(st.st_size);
        id[1] = static_cast<long long>(st.st_mtim.tv_sec);
        id[2] = static_cast<long long>(st.st_mtim.tv_nsec);
    });
    DSM_CHECK_MPI(MPI_Bcast(id, 3, MPI_LONG_LONG, 0, comm));
    const std::string host0 = bcast_string(comm, 0, rank == 0 ? host_name() : std::string());
    agree(comm, [&] {
        if (rank == 0) return;
        struct stat st;
        const std::string where = cat("on host ", host_name(), " the checkpoint '", path, "' ");
        const std::string hint = cat("; rank 0 (host ", host0,
                                     ") reads another file: every rank must name one shared directory");
        if (::stat(path.c_str(), &st) != 0) DSM_FAIL(DSM_ERR_IO, where, "cannot be read (", std::strerror(errno), ")", hint);
        if (static_cast<long long>(st.st_size) != id[0] || static_cast<long long>(st.st_mtim.tv_sec) != id[1] ||
            static_cast<long long>(st.st_mtim.tv_nsec) != id[2])
            DSM_FAIL(DSM_ERR_IO, where, "has ", static_cast<long long>(st.st_size), " bytes and another modification time than rank 0's (",
                     id[0], " bytes)", hint);
    });
}

// Rank 0, at the start of a save: remove what earlier saves left when they
// were killed or failed: `.<tag>.h5.tmp` and `.<tag>.h5.reserve` of any
// tag, `.latest.tmp`, and directory tokens (one job saves into a directory
// at a time, as `latest` requires, so every one of these is garbage).
void remove_leftovers(const std::string &dir) {
    DIR *d = ::opendir(dir.c_str());
    if (d == nullptr) return;
    std::vector<std::string> doomed;
    while (const struct dirent *e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name == ".latest.tmp") {
            doomed.push_back(name);
        } else if (name.size() > 8 && name[0] == '.' && name.compare(name.size() - 7, 7, ".h5.tmp") == 0) {
            if (valid_tag(name.substr(1, name.size() - 8))) doomed.push_back(name);
        } else if (name.size() > 12 && name[0] == '.' && name.compare(name.size() - 11, 11, ".h5.reserve") == 0) {
            if (valid_tag(name.substr(1, name.size() - 12))) doomed.push_back(name);
        } else if (name.rfind(kDirToken, 0) == 0) {
            doomed.push_back(name);
        }
    }
    ::closedir(d);
    for (const std::string &name : doomed) {
        const std::string path = dir + "/" + name;
        if (::unlink(path.c_str()) != 0 && errno != ENOENT)
            DSM_FAIL(DSM_ERR_IO, "cannot remove the leftover temporary '", path, "': ", std::strerror(errno));
    }
}

// What a failed write adds to its message: the file system's free space
// when it is (nearly) full.
std::string space_hint(const std::string &dir) {
    struct statvfs vfs;
    if (::statvfs(dir.c_str(), &vfs) != 0 || vfs.f_blocks == 0) return "";
    const unsigned long long avail = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
    if (avail >= (64ull << 20)) return "";
    return cat(" (No space left on device? '", dir, "' has ", avail, " bytes free)");
}

// Rank 0, before a save: the file system has room for the file (the data,
// the client state, and per dataset its header and alignment), so that a
// full disk is one clear error before any data moves. Quotas and space
// taken while the save runs are caught by the write agreement instead.
void check_space(const std::string &dir, const Content &content, size_t client_size) {
    if (!space_check_param()) return;
    struct statvfs vfs;
    // A file system that reports no size (some FUSE and object-store
    // mounts) is not judged by it.
    if (::statvfs(dir.c_str(), &vfs) != 0 || vfs.f_blocks == 0) return;
    const unsigned long long block = std::max<unsigned long long>(vfs.f_bsize, 4096);
    unsigned long long need = reserve_size(content.tensors.size());
    need += client_size + block;
    for (const Tensor &t : content.tensors) {
        unsigned long long numel = 1;
        for (int64_t d : t.shape) numel *= static_cast<unsigned long long>(d);
        need += numel * sizeof(float) + 2048 + block;
    }
    const unsigned long long avail = static_cast<unsigned long long>(vfs.f_bavail) * vfs.f_frsize;
    if (avail < need)
        DSM_FAIL(DSM_ERR_IO, "no room for the checkpoint in '", dir, "': the file needs about ", need,
                 " bytes and the file system has ", avail,
                 " bytes free (DSM_CKPT_SPACE_CHECK=0 skips this check on a file system that reports less than it has)");
}

std::vector<std::string> tags_newest_first(const std::string &dir) {
    struct Entry {
        std::string tag;
        long long sec, nsec;
    };
    std::vector<Entry> found;
    DIR *d = ::opendir(dir.c_str());
    if (d == nullptr) return {};
    while (const struct dirent *e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name.size() <= 3 || name.compare(name.size() - 3, 3, ".h5") != 0) continue;
        const std::string tag = name.substr(0, name.size() - 3);
        struct stat st;
        if (!valid_tag(tag) || ::stat((dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        found.push_back({tag, static_cast<long long>(st.st_mtim.tv_sec), static_cast<long long>(st.st_mtim.tv_nsec)});
    }
    ::closedir(d);
    std::sort(found.begin(), found.end(), [](const Entry &a, const Entry &b) {
        if (a.sec != b.sec) return a.sec > b.sec;
        if (a.nsec != b.nsec) return a.nsec > b.nsec;
        return a.tag > b.tag;
    });
    std::vector<std::string> out;
    for (const Entry &e : found) out.push_back(e.tag);
    return out;
}

void prune(const std::string &dir, size_t keep, const std::string &latest_tag) {
    size_t kept = 0;
    for (const std::string &tag : tags_newest_first(dir)) {
        const std::string path = file_of(dir, tag);
        std::string why;
        if (check_integrity(path, why) != Integrity::Verified) continue; // not ours, or not complete
        if (tag == latest_tag || kept < keep) {
            ++kept;
            continue;
        }
        if (::unlink(path.c_str()) != 0)
            DSM_WARN(ENGINE, "checkpoint.keep_last: cannot remove the old checkpoint '%s': %s", path.c_str(),
                     std::strerror(errno));
        else
            DSM_INFO(ENGINE, "checkpoint.keep_last %zu: removed the old checkpoint '%s'", keep, path.c_str());
    }
}

} // namespace files
} // namespace ckpt
} // namespace dsm
