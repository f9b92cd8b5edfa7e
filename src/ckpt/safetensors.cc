// Reading model weights from safetensors files (see safetensors.hpp).
#include "ckpt/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ckpt/files.hpp"
#include "core/agree.hpp"
#include "core/error.hpp"
#include "core/half.hpp"

namespace dsm {
namespace ckpt {

namespace {

// The dtypes of the format, with the element size of those libdsm loads.
const std::map<std::string, unsigned> &known_dtypes() {
    static const std::map<std::string, unsigned> m = {
        {"F32", 4}, {"BF16", 2}, {"F16", 2}, {"F64", 0}, {"F8_E4M3", 0}, {"F8_E5M2", 0}, {"BOOL", 0},
        {"U8", 0},  {"I8", 0},   {"I16", 0}, {"U16", 0}, {"I32", 0},     {"U32", 0},     {"I64", 0},
        {"U64", 0}};
    return m;
}

// A file descriptor closed on scope exit.
class Fd {
public:
    explicit Fd(int fd) : fd_(fd) {}
    Fd(const Fd &) = delete;
    Fd &operator=(const Fd &) = delete;
    ~Fd() {
        if (fd_ >= 0) ::close(fd_);
    }
    int get() const { return fd_; }

private:
    int fd_;
};

// n bytes at `offset`, or DSM_ERR_IO naming the file.
void read_at(const Fd &fd, const std::string &path, void *dst, uint64_t n, uint64_t offset) {
    unsigned char *p = static_cast<unsigned char *>(dst);
    while (n > 0) {
        const ssize_t got = ::pread(fd.get(), p, n, static_cast<off_t>(offset));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) DSM_FAIL(DSM_ERR_IO, "'", path, "': cannot read: ", std::strerror(errno));
        if (got == 0) DSM_FAIL(DSM_ERR_IO, "'", path, "': unexpected end of file at byte ", offset, " (truncated?)");
        p += got;
        n -= static_cast<uint64_t>(got);
        offset += static_cast<uint64_t>(got);
    }
}

// `count` elements of e's dtype, little-endian bytes (assembled as such
// whatever the host's byte order), as fp32 (core/half.hpp's conversions).
void to_fp32(const SafetensorsEntry &e, const unsigned char *src, float *dst, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        const unsigned char *b = src + i * e.element_bytes;
        if (e.element_bytes == 4) {
            const uint32_t u = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
            dst[i] = bits_float(u);
        } else {
            const uint16_t h = static_cast<uint16_t>(b[0] | b[1] << 8);
            dst[i] = e.dtype == "BF16" ? bf16_to_fp32(h) : fp16_to_fp32(h);
        }
    }
}

} // namespace

std::vector<SafetensorsEntry> parse_safetensors_header(const std::string &path, const std::string &header,
                                                       uint64_t file_size) {
    const uint64_t data_start = 8 + header.size();
    nlohmann::json h;
    try {
        h = nlohmann::json::parse(header);
    } catch (const nlohmann::json::exception &e) {
        DSM_FAIL(DSM_ERR_IO, "'", path, "': the safetensors header is not valid JSON: ", e.what());
    }
    DSM_REQUIRE(h.is_object(), DSM_ERR_IO, "'", path, "': the safetensors header is not a JSON object");
    std::vector<SafetensorsEntry> out;
    for (auto it = h.begin(); it != h.end(); ++it) {
        const std::string &name = it.key();
        const nlohmann::json &v = it.value();
        const std::string where = cat("'", path, "': tensor '", name, "': ");
        if (name == "__metadata__") {
            DSM_REQUIRE(v.is_object(), DSM_ERR_IO, "'", path, "': __metadata__ is not a JSON object");
            continue;
        }
        DSM_REQUIRE(v.is_object(), DSM_ERR_IO, where, "its entry is not a JSON object");
        DSM_REQUIRE(v.contains("dtype") && v["dtype"].is_string(), DSM_ERR_IO, where, "no string \"dtype\"");
        DSM_REQUIRE(v.contains("shape") && v["shape"].is_array(), DSM_ERR_IO, where, "no array \"shape\"");
        DSM_REQUIRE(v.contains("data_offsets") && v["data_offsets"].is_array() && v["data_offsets"].size() == 2 &&
                        v["data_offsets"][0].is_number_unsigned() && v["data_offsets"][1].is_number_unsigned(),
                    DSM_ERR_IO, where, "\"data_offsets\" is not two non-negative integers");
        SafetensorsEntry e;
        e.name = name;
        e.dtype = v["dtype"].get<std::string>();
        const auto known = known_dtypes().find(e.dtype);
        DSM_REQUIRE(known != known_dtypes().end(), DSM_ERR_IO, where, "unknown dtype '", e.dtype, "'");
        e.element_bytes = known->second;
        uint64_t elements = 1;
        for (const nlohmann::json &d : v["shape"]) {
            DSM_REQUIRE(d.is_number_unsigned() && d.get<uint64_t>() <= (uint64_t(1) << 62), DSM_ERR_IO, where,
                        "the shape ", v["shape"].dump(), " is not a list of non-negative integers");
            const uint64_t n = d.get<uint64_t>();
            DSM_REQUIRE(n == 0 || elements <= (uint64_t(1) << 62) / n, DSM_ERR_IO, where, "the shape ",
                        v["shape"].dump(), " has too many elements");
            elements *= n;
            e.shape.push_back(static_cast<int64_t>(n));
        }
        const uint64_t begin = v["data_offsets"][0].get<uint64_t>(), end = v["data_offsets"][1].get<uint64_t>();
        DSM_REQUIRE(begin <= end, DSM_ERR_IO, where, "data_offsets [", begin, ", ", end, "] end before they begin");
        DSM_REQUIRE(end <= file_size - data_start, DSM_ERR_IO, where, "data_offsets [", begin, ", ", end,
                    "] run past the end of the file (", file_size - data_start,
                    " bytes of data after the header): the file is truncated or corrupt");
        if (e.element_bytes != 0)
            DSM_REQUIRE((end - begin) % e.element_bytes == 0 && (end - begin) / e.element_bytes == elements,
                        DSM_ERR_IO, where, "data_offsets [", begin, ", ", end, "] hold ", end - begin, " bytes, but ",
                        elements, " ", e.dtype, " elements need ", elements, " x ", e.element_bytes);
        e.begin = data_start + begin;
        e.end = data_start + end;
        out.push_back(std::move(e));
    }
    return out;
}

void load_safetensors(MPI_Comm comm, const std::string &path, Content &content) {
    int rank = 0;
    DSM_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    // Rank 0 reads and validates the header; every rank then parses the same
    // text, so that the matching below fails alike everywhere.
    std::string header;
    uint64_t file_size = 0;
    agree(comm, [&] {
        if (rank != 0) return;
        Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.get() < 0) DSM_FAIL(DSM_ERR_IO, "'", path, "': cannot open: ", std::strerror(errno));
        struct stat st;
        if (::fstat(fd.get(), &st) != 0) DSM_FAIL(DSM_ERR_IO, "'", path, "': ", std::strerror(errno));
        if (!S_ISREG(st.st_mode)) DSM_FAIL(DSM_ERR_IO, "'", path, "' is not a regular file");
        file_size = static_cast<uint64_t>(st.st_size);
        DSM_REQUIRE(file_size >= 8, DSM_ERR_IO, "'", path, "' has ", file_size,
                    " bytes: too short for a safetensors file (not safetensors, or truncated)");
        unsigned char len[8];
        read_at(fd, path, len, 8, 0);
        uint64_t n = 0;
        for (int k = 7; k >= 0; --k) n = n << 8 | len[k];
        DSM_REQUIRE(n >= 2 && n <= kSafetensorsMaxHeader && n <= file_size - 8, DSM_ERR_IO, "'", path,
                    "': the safetensors header length ", n, " is out of bounds (the file has ", file_size,
                    " bytes; at most ", kSafetensorsMaxHeader, "): not a safetensors file, or truncated");
        header.resize(n);
        read_at(fd, path, &header[0], n, 8);
        parse_safetensors_header(path, header, file_size);
    });
    header = bcast_string(comm, 0, header);
    DSM_CHECK_MPI(MPI_Bcast(&file_size, 1, MPI_UINT64_T, 0, comm));
    files::check_same_file(comm, rank, path);
    const std::vector<SafetensorsEntry> entries = parse_safetensors_header(path, header, file_size);

    std::map<std::string, const SafetensorsEntry *> by_name;
    for (const SafetensorsEntry &e : entries) by_name[e.name] = &e;
    std::set<std::string> wanted;
    std::vector<std::string> problems;
    content.missing.clear();
    content.unexpected.clear();
    content.mismatched.clear();
    std::vector<const SafetensorsEntry *> source(content.tensors.size(), nullptr);
    for (size_t k = 0; k < content.tensors.size(); ++k) {
        Tensor &t = content.tensors[k];
        t.skip = true;
        if (t.group != "params") continue;
        wanted.insert(t.name);
        const auto it = by_name.find(t.name);
        if (it == by_name.end()) {
            problems.push_back(cat("parameter '", t.name, "' is missing from the file"));
            content.missing.push_back(t.name);
            continue;
        }
        const SafetensorsEntry &e = *it->second;
        if (e.shape != t.shape) {
            problems.push_back(cat("tensor '", t.name, "' has shape ", shape_text(e.shape), " in the file but ",
                                   shape_text(t.shape), " in the engine"));
            content.mismatched.push_back(
                cat(t.name, " ", shape_text(e.shape), " in the file, ", shape_text(t.shape), " in the engine"));
            continue;
        }
        DSM_REQUIRE(e.element_bytes != 0, DSM_ERR_NOT_SUPPORTED, "'", path, "': tensor '", t.name, "' has dtype '",
                    e.dtype, "'; libdsm loads F32, BF16 and F16");
        t.skip = false;
        source[k] = &e;
    }
    for (const SafetensorsEntry &e : entries)
        if (!wanted.count(e.name)) {
            problems.push_back(cat("unexpected tensor '", e.name, "' in the file"));
            content.unexpected.push_back(e.name);
        }
    if (!problems.empty() && content.strict) {
        std::string all;
        for (size_t i = 0; i < problems.size() && i < 20; ++i) all += (i ? "; " : "") + problems[i];
        if (problems.size() > 20) all += cat("; and ", problems.size() - 20, " more");
        DSM_FAIL(DSM_ERR_MISMATCH, "'", path, "' does not match the engine's parameters: ", all);
    }

    // Every rank reads its pieces, in blocks, converting as it goes.
    agree(comm, [&] {
        Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        if (fd.get() < 0) DSM_FAIL(DSM_ERR_IO, "'", path, "': cannot open: ", std::strerror(errno));
        std::vector<unsigned char> buf;
        const size_t block = size_t(1) << 20;
        for (size_t k = 0; k < content.tensors.size(); ++k) {
            const Tensor &t = content.tensors[k];
            const SafetensorsEntry *e = source[k];
            if (e == nullptr || t.count == 0) continue;
            for (size_t at = 0; at < t.count; at += block) {
                const size_t n = std::min(block, t.count - at);
                buf.resize(n * e->element_bytes);
                read_at(fd, path, buf.data(), buf.size(), e->begin + (t.offset + at) * e->element_bytes);
                to_fp32(*e, buf.data(), t.data + at, n);
            }
        }
    });
}

} // namespace ckpt
} // namespace dsm
