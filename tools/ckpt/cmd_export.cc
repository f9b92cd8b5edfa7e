// dsm-ckpt export: the parameters as a plain HDF5 or a safetensors file.
#include "tool.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "safetensors.hpp"

namespace dsm {
namespace ckpt_tool {

namespace {

const char *const kExportHelp =
    "usage: dsm-ckpt export PATH [--tag TAG] --output OUT [--dtype fp32|bf16|fp16] [--json]\n"
    "  Write the parameters (the /params tensors, under their original names) to\n"
    "  OUT: a plain HDF5 file when OUT ends in .h5 (one dataset per parameter at the\n"
    "  root, the checkpoint's escaped link names, attribute `name`), a safetensors file\n"
    "  when it ends in .safetensors. Checksums are verified while reading; on any\n"
    "  mismatch nothing is written and the exit status is 1.\n"
    "  --output OUT   the file to write (replaced if it exists)\n"
    "  --dtype DTYPE  fp32 (default: the checkpoint's values as they are), bf16 or fp16\n"
    "                 (rounded to nearest even; NaN and infinities kept). A finite value\n"
    "                 that does not fit (beyond 65504 in fp16) is an error naming the\n"
    "                 tensor, index and value; nothing is written\n"
    "  --tag TAG      the tag to export in a directory (default: the one `latest` names)\n"
    "  --json         a JSON summary on standard output (format in doc/dsm-ckpt.md)\n";

// An output written under a temporary name beside OUT and renamed over it only
// when complete, so that OUT is never a partial file and a failed export
// leaves an existing OUT untouched.
class TempOutput {
public:
    explicit TempOutput(const std::string &out) : out_(out) {
        const size_t slash = out.find_last_of('/');
        const std::string dir = slash == std::string::npos ? "" : out.substr(0, slash + 1);
        const std::string base = slash == std::string::npos ? out : out.substr(slash + 1);
        tmp_ = dir + "." + base + ".tmp" + std::to_string(static_cast<long>(getpid()));
    }
    TempOutput(const TempOutput &) = delete;
    TempOutput &operator=(const TempOutput &) = delete;
    ~TempOutput() {
        if (!committed_) std::remove(tmp_.c_str());
    }
    const std::string &path() const { return tmp_; }
    void commit() {
        if (std::rename(tmp_.c_str(), out_.c_str()) != 0)
            throw Error(out_ + ": cannot rename " + tmp_ + " to it: " + std::strerror(errno));
        committed_ = true;
    }

private:
    std::string out_, tmp_;
    bool committed_ = false;
};

// The consolidated weights as a plain HDF5 file: one F32LE dataset per
// parameter at the root, under the checkpoint's link name, with attribute
// `name`; the root holds the tag and step for provenance.
class H5Output {
public:
    // Created at `path` (a temporary name); messages name `shown`.
    // Datasets of `type` (H5T_IEEE_F32LE, or a 16-bit float type).
    H5Output(const std::string &path, const std::string &shown, hid_t type) : path_(shown), type_(type) {
        hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
        if (f < 0) throw Error(shown + ": cannot create: " + hdf5_message());
        file_ = Handle(f, H5Fclose);
    }

    void string_attribute(hid_t obj, const char *name, const std::string &v) {
        Handle type(H5Tcopy(H5T_C_S1), H5Tclose), space(H5Screate(H5S_SCALAR), H5Sclose);
        if (!type.valid() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
            H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0 || !space.valid())
            fail("attribute " + std::string(name));
        Handle attr(H5Acreate2(obj, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        const char *p = v.c_str();
        if (!attr.valid() || H5Awrite(attr.get(), type.get(), &p) < 0) fail("attribute " + std::string(name));
    }

    void int_attribute(hid_t obj, const char *name, int64_t v) {
        Handle space(H5Screate(H5S_SCALAR), H5Sclose);
        Handle attr(H5Acreate2(obj, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
        if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &v) < 0) fail("attribute " + std::string(name));
    }

    hid_t root() const { return file_.get(); }

    void begin(const std::string &link, const std::string &name, const std::vector<uint64_t> &shape) {
        const std::vector<hsize_t> dims(shape.begin(), shape.end());
        Handle space(shape.empty() ? H5Screate(H5S_SCALAR)
                                   : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
        if (!space.valid()) fail(link);
        hid_t ds = H5Dcreate2(file_.get(), link.c_str(), type_, space.get(), H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT);
        if (ds < 0) fail(link);
        ds_ = Handle(ds, H5Dclose);
        shape_ = shape;
        link_ = link;
        string_attribute(ds, "name", name);
    }

    // The elements of block b, `data` in memory type `mem` (b.data itself, or
    // its conversion).
    void write(const Block &b, hid_t mem, const void *data) {
        if (shape_.empty()) {
            if (H5Dwrite(ds_.get(), mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0) fail(link_);
            return;
        }
        Handle fspace(H5Dget_space(ds_.get()), H5Sclose);
        std::vector<hsize_t> start(shape_.size(), 0), count(shape_.begin(), shape_.end());
        start[0] = b.row0;
        count[0] = b.rows;
        const hsize_t n = b.n;
        Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
        if (!fspace.valid() || !mspace.valid() ||
            H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
            H5Dwrite(ds_.get(), mem, mspace.get(), fspace.get(), H5P_DEFAULT, data) < 0)
            fail(link_);
    }

    void end() { ds_.reset(); }

    void close() {
        ds_.reset();
        if (H5Fflush(file_.get(), H5F_SCOPE_GLOBAL) < 0) fail("flush");
        if (H5Fclose(file_.release()) < 0) throw Error(path_ + ": cannot close: " + hdf5_message());
    }

private:
    [[noreturn]] void fail(const std::string &what) {
        throw Error(path_ + ": " + what + ": cannot write: " + hdf5_message());
    }
    std::string path_, link_;
    hid_t type_;
    Handle file_, ds_;
    std::vector<uint64_t> shape_;
};

enum class OutKind { Hdf5, Safetensors };

// The /params tensors, each with what export needs; throws Error naming the
// first that lacks it, since an unverifiable tensor must not be exported.
std::vector<const Tensor *> exportable_params(const Checkpoint &ck) {
    std::vector<const Tensor *> out;
    for (const Tensor &t : ck.tensors()) {
        if (!t.param()) continue;
        const std::string why = !t.float32    ? t.unreadable
                                : !t.name     ? "has no string attribute 'name'"
                                : !t.checksum ? "has no uint64 attribute 'checksum'"
                                              : "";
        if (!why.empty()) throw Error(ck.file() + ": " + t.path + ": " + why + "; nothing exported");
        out.push_back(&t);
    }
    if (out.empty()) throw Error(ck.file() + ": no parameters under /params; nothing exported");
    return out;
}

// The element type of an export (--dtype).
struct ExportDtype {
    const char *option;      // "fp32", "bf16", "fp16"
    const char *safetensors; // the header's dtype
    unsigned bytes;          // per element
    uint16_t (*convert)(float); // core/half.hpp's rounding; nullptr for fp32
    uint16_t inf;            // the bits of +infinity
    const char *largest;     // the largest finite value, for messages
};

const ExportDtype kExportDtypes[] = {
    {"fp32", "F32", 4, nullptr, 0, ""},
    {"bf16", "BF16", 2, [](float x) { return fp32_to_bf16(x); }, 0x7f80u, "3.3895314e38"},
    {"fp16", "F16", 2, [](float x) { return fp32_to_fp16(x); }, 0x7c00u, "65504"},
};

// The HDF5 file type of a 16-bit export: IEEE binary16, or bfloat16 (binary32
// with the low 16 mantissa bits dropped), both little-endian.
Handle h5_half_type(const ExportDtype &d) {
    Handle t(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    const bool bf16 = std::strcmp(d.option, "bf16") == 0;
    if (!t.valid() || H5Tset_fields(t.get(), 15, bf16 ? 7 : 10, bf16 ? 8 : 5, 0, bf16 ? 7 : 10) < 0 ||
        H5Tset_precision(t.get(), 16) < 0 || H5Tset_size(t.get(), 2) < 0 ||
        H5Tset_ebias(t.get(), bf16 ? 127 : 15) < 0)
        throw Error(std::string("cannot make the HDF5 ") + d.option + " type: " + hdf5_message());
    return t;
}

// A block of fp32 values converted to a 16-bit dtype into out. A finite value
// that becomes infinite (beyond the range of fp16, or bfloat16's largest
// value) is an error naming the tensor, the row-major index and the value:
// saturating would change the model silently, and Inf would poison it.
void convert_block(const ExportDtype &d, const std::string &file, const Tensor &t, const Block &b,
                   std::vector<uint16_t> &out) {
    out.resize(b.n);
    for (size_t i = 0; i < b.n; ++i) {
        out[i] = d.convert(b.data[i]);
        if ((out[i] & 0x7fffu) != d.inf || !std::isfinite(b.data[i])) continue;
        char value[32];
        std::snprintf(value, sizeof value, "%.9g", static_cast<double>(b.data[i])); // every float, exactly
        throw Error(file + ": " + t.path + ": the value " + value + " at index " + std::to_string(b.offset + i) +
                    " is beyond the " + d.option + " range (largest " + d.largest + "); nothing exported");
    }
}

} // namespace

int cmd_export(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("export", argc, argv, {"--tag", "--output", "--dtype"}, 1, kExportHelp, a))
        return rc < 0 ? 0 : rc;
    const ExportDtype *dtype = &kExportDtypes[0];
    if (const std::optional<std::string> d = value(a, "--dtype")) {
        dtype = nullptr;
        for (const ExportDtype &e : kExportDtypes)
            if (*d == e.option) dtype = &e;
        if (dtype == nullptr) {
            std::fprintf(stderr, "dsm-ckpt export: --dtype '%s' is not fp32, bf16 or fp16\n", printable(*d).c_str());
            return 2;
        }
    }
    const bool half = dtype->convert != nullptr;
    const std::optional<std::string> out = value(a, "--output");
    if (!out || out->empty()) {
        std::fprintf(stderr, "dsm-ckpt export: --output OUT is required\n");
        return 2;
    }
    OutKind kind;
    if (ends_with(*out, ".h5") && out->size() > 3) kind = OutKind::Hdf5;
    else if (ends_with(*out, ".safetensors") && out->size() > 12) kind = OutKind::Safetensors;
    else {
        std::fprintf(stderr, "dsm-ckpt export: --output '%s' must end in .h5 or .safetensors\n", out->c_str());
        return 2;
    }
    const Opened o = open_checkpoint(a.positional[0], value(a, "--tag"));
    const Checkpoint &ck = o.ck;
    const std::vector<const Tensor *> params = exportable_params(ck);

    // Replacing the checkpoint with its weights would lose it.
    struct stat in_st, out_st;
    if (stat(printable(ck.file()).c_str(), &in_st) == 0 && stat(out->c_str(), &out_st) == 0 && in_st.st_dev == out_st.st_dev &&
        in_st.st_ino == out_st.st_ino)
        throw Error(*out + ": is the checkpoint being exported; choose another --output");

    std::vector<std::pair<std::string, std::string>> metadata;
    metadata.emplace_back("format", "pt"); // what transformers expects of PyTorch weights
    metadata.emplace_back("source", "dsm-checkpoint");
    for (const char *name : {"tag", "libdsm_version", "global_steps"})
        if (const Attribute *attr = ck.attribute(name))
            metadata.emplace_back(name, attr->kind == Attribute::Kind::String ? attr->s : attr->text());

    TempOutput tmp(*out);
    uint64_t elements = 0, bytes = 0;
    // Each tensor is written while its checksum is computed; a mismatch
    // throws, and the temporary file is removed: nothing reaches OUT.
    auto verified = [&](const Tensor &t, const std::function<void(const Block &)> &write) {
        Checksum sum;
        ck.read_blocks(t, [&](const Block &b) {
            sum.add_floats(b.data, b.n);
            write(b);
        });
        if (sum.value() != *t.checksum)
            throw Error(ck.file() + ": " + t.path + ": checksum mismatch (stored " + hex64(*t.checksum) +
                        ", computed " + hex64(sum.value()) + "); nothing exported");
        elements += t.elements;
        bytes += t.elements * dtype->bytes;
    };
    if (kind == OutKind::Safetensors) {
        std::vector<SafetensorsEntry> entries;
        uint64_t data_bytes = 0;
        for (const Tensor *t : params) {
            entries.push_back({*t->name, t->shape, t->elements});
            data_bytes += t->elements * dtype->bytes;
        }
        std::string header;
        try {
            header = safetensors_header(entries, metadata, dtype->safetensors, dtype->bytes);
        } catch (const Error &e) { // a name safetensors cannot hold
            throw Error(ck.file() + ": " + e.what() + "; nothing exported");
        }
        SafetensorsWriter w(tmp.path(), *out, header, data_bytes);
        std::vector<uint16_t> converted;
        for (const Tensor *t : params)
            verified(*t, [&](const Block &b) {
                if (!half) return w.write(b.data, 4, b.n);
                convert_block(*dtype, ck.file(), *t, b, converted);
                w.write(converted.data(), 2, b.n);
            });
        w.finish();
    } else {
        Handle half_type;
        if (half) half_type = h5_half_type(*dtype);
        H5Output h5(tmp.path(), *out, half ? half_type.get() : H5T_IEEE_F32LE);
        for (const auto &m : metadata)
            if (m.first == "global_steps") {
                if (const Attribute *attr = ck.attribute("global_steps"); attr && attr->kind == Attribute::Kind::Int)
                    h5.int_attribute(h5.root(), "global_steps", attr->i);
            } else if (m.first != "format") {
                h5.string_attribute(h5.root(), m.first.c_str(), m.second);
            }
        for (const Tensor *t : params) {
            h5.begin(t->link, *t->name, t->shape);
            std::vector<uint16_t> converted;
            verified(*t, [&](const Block &b) {
                if (!half) return h5.write(b, H5T_NATIVE_FLOAT, b.data);
                convert_block(*dtype, ck.file(), *t, b, converted);
                h5.write(b, half_type.get(), converted.data());
            });
            h5.end();
        }
        h5.close();
    }
    tmp.commit();

    struct stat st;
    const long long file_bytes = stat(out->c_str(), &st) == 0 ? static_cast<long long>(st.st_size) : -1;
    const char *kind_name = kind == OutKind::Hdf5 ? "hdf5" : "safetensors";
    if (a.json) {
        Json tensors = Json::array();
        for (const Tensor *t : params)
            tensors.push_back({{"name", *t->name},
                               {"dataset", t->path},
                               {"shape", shape_json(t->shape)},
                               {"elements", t->elements},
                               {"bytes", t->elements * dtype->bytes},
                               {"checksum", hex64(*t->checksum)}});
        print_json(Json{{"format", "dsm-ckpt-export"},
                        {"format_version", 1},
                        {"path", o.loc.directory ? o.loc.dir : o.loc.file},
                        {"file", ck.file()},
                        {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)},
                        {"output", *out},
                        {"output_format", kind_name},
                        {"dtype", dtype->option},
                        {"tensors", tensors},
                        {"elements", elements},
                        {"bytes", bytes},
                        {"file_bytes", file_bytes}});
    } else {
        std::printf("exported %s (%s, %s of %s data, checksums verified) from %s to %s (%s)\n",
                    plural(params.size(), "parameter", "parameters").c_str(),
                    plural(elements, "element", "elements").c_str(), plural(bytes, "byte", "bytes").c_str(),
                    dtype->option,
                    printable(ck.file()).c_str(), printable(*out).c_str(), kind_name);
    }
    return 0;
}

} // namespace ckpt_tool
} // namespace dsm
