// dsm-ckpt: reading checkpoint files (see ckpt_read.hpp, doc/checkpoint.md).
#include "ckpt_read.hpp"

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <dirent.h>
#include <csignal>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

namespace dsm {
namespace ckpt_tool {

// ---------------------------------------------------------------- small helpers

namespace {

// The names of the links of a group in name order (creation order is not
// always tracked, name order always is).
std::vector<std::string> link_names(hid_t group) {
    H5G_info_t info;
    if (H5Gget_info(group, &info) < 0) throw Error("cannot list: " + hdf5_message());
    std::vector<std::string> names;
    for (hsize_t k = 0; k < info.nlinks; ++k) {
        const ssize_t n = H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, nullptr, 0, H5P_DEFAULT);
        if (n < 0) throw Error("cannot list: " + hdf5_message());
        std::string name(static_cast<size_t>(n) + 1, '\0');
        if (H5Lget_name_by_idx(group, ".", H5_INDEX_NAME, H5_ITER_INC, k, &name[0], name.size(), H5P_DEFAULT) < 0)
            throw Error("cannot list: " + hdf5_message());
        name.resize(static_cast<size_t>(n));
        names.push_back(name);
    }
    return names;
}

// The type of an HDF5 datatype for messages: "int64", "uint8", "float32", "string".
std::string type_name(hid_t type) {
    const H5T_class_t cls = H5Tget_class(type);
    const size_t bits = H5Tget_size(type) * 8;
    switch (cls) {
    case H5T_INTEGER:
        return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    case H5T_FLOAT:
        return "float" + std::to_string(bits);
    case H5T_STRING:
        return "string";
    case H5T_COMPOUND:
        return "compound";
    case H5T_ARRAY:
        return "array";
    case H5T_ENUM:
        return "enum";
    default:
        return "type class " + std::to_string(static_cast<int>(cls));
    }
}

// A string attribute of either kind HDF5 has: variable-length (what the format
// says) or fixed-length (what some writers produce), read as UTF-8 bytes.
std::string read_string_attribute(hid_t attr, hid_t type) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    if (!mem.valid()) throw Error(hdf5_message());
    H5Tset_cset(mem.get(), H5Tget_cset(type));
    if (H5Tis_variable_str(type) > 0) {
        H5Tset_size(mem.get(), H5T_VARIABLE);
        char *p = nullptr;
        if (H5Aread(attr, mem.get(), &p) < 0) throw Error(hdf5_message());
        std::string s = p != nullptr ? p : "";
        H5free_memory(p);
        return s;
    }
    const size_t n = H5Tget_size(type);
    H5Tset_size(mem.get(), n + 1); // room for the terminator HDF5 adds
    H5Tset_strpad(mem.get(), H5T_STR_NULLTERM);
    std::string s(n + 1, '\0');
    if (H5Aread(attr, mem.get(), &s[0]) < 0) throw Error(hdf5_message());
    s.resize(std::strlen(s.c_str()));
    if (H5Tget_strpad(type) == H5T_STR_SPACEPAD) s.erase(s.find_last_not_of(' ') + 1);
    return s;
}

// Reads one attribute whatever its type; throws Error (without the object's
// name: the caller adds it) when HDF5 fails.
Attribute read_attribute(hid_t attr, const std::string &name) {
    Attribute a;
    a.name = name;
    Handle type(H5Aget_type(attr), H5Tclose), space(H5Aget_space(attr), H5Sclose);
    if (!type.valid() || !space.valid()) throw Error(hdf5_message());
    const H5S_class_t sc = H5Sget_simple_extent_type(space.get());
    const hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
    const int rank = H5Sget_simple_extent_ndims(space.get());
    if (sc == H5S_NULL || npoints < 0 || rank < 0) {
        a.type = "empty";
        return a;
    }
    a.scalar = sc == H5S_SCALAR;
    const std::string base = type_name(type.get());
    a.type = a.scalar ? base : base + "[" + std::to_string(npoints) + "]";
    const H5T_class_t cls = H5Tget_class(type.get());
    // The format's attributes are scalars or a few mesh sizes; a corrupt
    // dataspace could claim billions of values.
    if (npoints > (hssize_t(1) << 20)) throw Error("holds " + std::to_string(npoints) + " values, too many");
    const size_t n = static_cast<size_t>(npoints);
    if (cls == H5T_INTEGER) {
        a.kind = a.scalar ? Attribute::Kind::Int : Attribute::Kind::IntArray;
        a.is_unsigned = H5Tget_sign(type.get()) == H5T_SGN_NONE;
        a.bits = static_cast<int>(H5Tget_size(type.get()) * 8);
        // Unsigned values are read as uint64 and kept as their bits, so that a
        // checksum above 2^63 survives (int64 would saturate it).
        std::vector<uint64_t> v(n);
        if (H5Aread(attr, a.is_unsigned ? H5T_NATIVE_UINT64 : H5T_NATIVE_INT64, v.data()) < 0)
            throw Error(hdf5_message());
        for (uint64_t x : v) a.ints.push_back(static_cast<int64_t>(x));
        if (a.scalar && !a.ints.empty()) a.i = a.ints[0];
    } else if (cls == H5T_FLOAT) {
        a.kind = a.scalar ? Attribute::Kind::Float : Attribute::Kind::FloatArray;
        a.bits = static_cast<int>(H5Tget_size(type.get()) * 8);
        a.floats.resize(n);
        if (H5Aread(attr, H5T_NATIVE_DOUBLE, a.floats.data()) < 0) throw Error(hdf5_message());
        if (a.scalar && !a.floats.empty()) a.f = a.floats[0];
    } else if (cls == H5T_STRING && a.scalar) {
        a.kind = Attribute::Kind::String;
        a.s = read_string_attribute(attr, type.get());
    }
    return a;
}

// The attribute `name` of an object, or nothing when it has none.
std::optional<Attribute> find_attribute(hid_t obj, const char *name) {
    const htri_t exists = H5Aexists(obj, name);
    if (exists < 0) throw Error("attribute " + std::string(name) + ": " + hdf5_message());
    if (exists == 0) return std::nullopt;
    Handle attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
    if (!attr.valid()) throw Error("attribute " + std::string(name) + ": " + hdf5_message());
    try {
        return read_attribute(attr.get(), name);
    } catch (const Error &e) {
        throw Error("attribute " + std::string(name) + ": " + e.what());
    }
}

// Multiplies with a limit: a corrupt file can claim any dimensions.
bool checked_product(const std::vector<uint64_t> &dims, uint64_t &out) {
    constexpr uint64_t kMax = uint64_t(1) << 61; // elements * 4 bytes stays below 2^63
    uint64_t p = 1;
    for (uint64_t d : dims) {
        if (d != 0 && p > kMax / d) return false;
        p *= d;
    }
    out = p;
    return true;
}

} // namespace

namespace {

// HDF5 1.10 can also loop forever on a corrupt global heap. While the
// metadata is read, each object read re-arms an alarm; a full minute without
// one ends the process with the message above. Data reads are not watched:
// a block may legitimately take long on a slow file system.
class MetadataWatchdog {
public:
    MetadataWatchdog() { progress(); }
    ~MetadataWatchdog() { alarm(0); }
    static void progress() { alarm(kWatchdogSeconds); }
};

} // namespace

// ---------------------------------------------------------------- Checkpoint

Error Checkpoint::error(const std::string &object, const std::string &what) const {
    return Error(file_ + ": " + (object.empty() ? "" : object + ": ") + what);
}

Checkpoint::Checkpoint(const std::string &file) : file_(file) {
    crash_context(file);
    const MetadataWatchdog watchdog;
    struct stat st;
    if (stat(file.c_str(), &st) != 0) throw Error(file + ": " + std::strerror(errno));
    if (S_ISDIR(st.st_mode)) throw Error(file + ": is a directory, not a checkpoint file");
    if (st.st_size == 0) throw Error(file + ": not an HDF5 file (empty)");
    // The integrity record (format version 2) before HDF5 parses anything:
    // a mismatch is a problem; the file is still read for the report (under
    // the crash guard).
    std::string why;
    const dsm::ckpt::Integrity integrity = dsm::ckpt::check_integrity(file, why);
    if (integrity == dsm::ckpt::Integrity::Corrupt) problem("/", why);
    const htri_t is = H5Fis_hdf5(file.c_str());
    if (is == 0) throw Error(file + ": not an HDF5 file");
    if (is < 0) throw Error(file + ": cannot read: " + hdf5_message());
    hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) throw Error(file + ": cannot open as HDF5: " + hdf5_message());
    h_ = Handle(f, H5Fclose);
    read_root_attributes();
    read_objects();
    check_root_attributes();
    check_optimizer_states();
    if (integrity == dsm::ckpt::Integrity::Absent && format_version() >= 2)
        warning("/", "no integrity record in the user block (the file was rewritten by another program?)");
}

const Attribute *Checkpoint::attribute(const std::string &name) const {
    for (const Attribute &a : attributes_)
        if (a.name == name) return &a;
    return nullptr;
}

namespace {

herr_t collect_attribute_name(hid_t, const char *name, const H5A_info_t *, void *data) {
    static_cast<std::vector<std::string> *>(data)->push_back(name);
    return 0;
}

} // namespace

void Checkpoint::read_root_attributes() {
    std::vector<std::string> names;
    hsize_t idx = 0;
    if (H5Aiterate2(h_.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, collect_attribute_name, &names) < 0)
        throw error("/", "cannot list attributes: " + hdf5_message());
    for (const std::string &name : names) {
        MetadataWatchdog::progress();
        Handle a(H5Aopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
        if (!a.valid()) throw error("/", "cannot open attribute " + name + ": " + hdf5_message());
        try {
            attributes_.push_back(read_attribute(a.get(), name));
        } catch (const Error &e) {
            throw error("/", "attribute " + name + ": " + e.what());
        }
    }
}

void Checkpoint::read_objects() {
    std::vector<std::string> names;
    try {
        names = link_names(h_.get());
    } catch (const Error &e) {
        throw error("/", e.what());
    }
    bool have_params = false;
    for (const std::string &name : names) {
        const std::string path = "/" + name;
        Handle obj(H5Oopen(h_.get(), name.c_str(), H5P_DEFAULT), H5Oclose);
        if (!obj.valid()) {
            problem(path, "cannot open: " + hdf5_message());
            continue;
        }
        const H5I_type_t type = H5Iget_type(obj.get());
        if (name == "params" || name == "optimizer") {
            if (type != H5I_GROUP) {
                problem(path, "is not a group");
                continue;
            }
            if (name == "params") {
                have_params = true;
                read_tensor_group(obj.get(), path, "");
            }
        } else if (name == "client_state") {
            if (type != H5I_DATASET) problem(path, "is not a dataset");
            else read_client_state_info();
        } else {
            warning(path, "not part of the format (ignored)");
        }
    }
    if (!have_params) problem("/params", "missing");
    else if (std::none_of(tensors_.begin(), tensors_.end(), [](const Tensor &t) { return t.param(); }))
        warning("/params", "holds no parameter");
    // Optimizer states after the parameters, whatever the link order.
    if (std::find(names.begin(), names.end(), "optimizer") != names.end()) {
        Handle opt(H5Gopen2(h_.get(), "optimizer", H5P_DEFAULT), H5Gclose);
        if (!opt.valid()) {
            hdf5_message();
            return;
        }
        std::vector<std::string> states;
        try {
            states = link_names(opt.get());
        } catch (const Error &e) {
            throw error("/optimizer", e.what());
        }
        for (const std::string &state : states) {
            const std::string path = "/optimizer/" + state;
            Handle g(H5Oopen(opt.get(), state.c_str(), H5P_DEFAULT), H5Oclose);
            if (!g.valid()) problem(path, "cannot open: " + hdf5_message());
            else if (H5Iget_type(g.get()) != H5I_GROUP) problem(path, "is not a group");
            else read_tensor_group(g.get(), path, state);
        }
    }
}

void Checkpoint::read_tensor_group(hid_t group, const std::string &prefix, const std::string &state) {
    std::vector<std::string> links;
    try {
        links = link_names(group);
    } catch (const Error &e) {
        throw error(prefix, e.what());
    }
    for (const std::string &link : links) {
        MetadataWatchdog::progress();
        Tensor t;
        t.path = prefix + "/" + link;
        t.link = link;
        t.state = state;
        Handle ds(H5Oopen(group, link.c_str(), H5P_DEFAULT), H5Oclose);
        if (!ds.valid()) {
            problem(t.path, "cannot open: " + hdf5_message());
            continue;
        }
        if (H5Iget_type(ds.get()) != H5I_DATASET) {
            problem(t.path, "is not a dataset");
            continue;
        }
        Handle type(H5Dget_type(ds.get()), H5Tclose), space(H5Dget_space(ds.get()), H5Sclose);
        if (!type.valid() || !space.valid()) {
            problem(t.path, "cannot read its type: " + hdf5_message());
            continue;
        }
        t.dtype = type_name(type.get());
        bool shape_ok = true;
        switch (H5Sget_simple_extent_type(space.get())) {
        case H5S_SCALAR:
            t.elements = 1;
            break;
        case H5S_SIMPLE: {
            const int rank = H5Sget_simple_extent_ndims(space.get());
            std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 0)));
            if (rank < 0 || H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0) {
                problem(t.path, "cannot read its shape: " + hdf5_message());
                shape_ok = false;
                break;
            }
            t.shape.assign(dims.begin(), dims.end());
            if (!checked_product(t.shape, t.elements)) {
                problem(t.path, "has an impossible shape " + shape_text(t.shape));
                shape_ok = false;
            }
            break;
        }
        default:
            problem(t.path, "has no dataspace (H5S_NULL)");
            shape_ok = false;
        }
        if (H5Tget_class(type.get()) == H5T_FLOAT && H5Tget_size(type.get()) == 4) {
            t.dtype = "float32";
            t.float32 = shape_ok;
            if (!shape_ok) t.unreadable = "has no valid shape";
            if (H5Tget_order(type.get()) != H5T_ORDER_LE)
                warning(t.path, "is big-endian float32; the format says H5T_IEEE_F32LE");
        } else {
            problem(t.path, "is " + t.dtype + ", expected float32");
            t.unreadable = "is " + t.dtype + ", not float32";
        }
        Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
        const H5D_layout_t layout = dcpl.valid() ? H5Pget_layout(dcpl.get()) : H5D_LAYOUT_ERROR;
        if (!dcpl.valid()) hdf5_message();
        if (layout != H5D_CONTIGUOUS)
            warning(t.path, "is not stored contiguously (the format says contiguous)");
        // Unlike a chunked one, a contiguous or compact dataset stores exactly
        // its logical bytes. Less means unwritten data, which HDF5 would return
        // as fill values, or a damaged shape claiming more than the file holds.
        if (t.float32 && (layout == H5D_CONTIGUOUS || layout == H5D_COMPACT)) {
            const hsize_t stored = H5Dget_storage_size(ds.get());
            if (stored != t.bytes()) {
                hdf5_message();
                t.unreadable = "stores " + std::to_string(stored) + " bytes of data, its shape " +
                               shape_text(t.shape) + " needs " + std::to_string(t.bytes());
                problem(t.path, t.unreadable);
                t.float32 = false;
            }
        }
        try {
            const std::optional<Attribute> name = find_attribute(ds.get(), "name");
            const std::optional<Attribute> trainable = find_attribute(ds.get(), "trainable");
            const std::optional<Attribute> checksum = find_attribute(ds.get(), "checksum");
            if (format_version() >= 2) {
                const std::string want = state.empty() ? std::string("params") : "optimizer/" + state;
                const std::optional<Attribute> group = find_attribute(ds.get(), "group");
                if (!group) problem(t.path, "missing attribute 'group'");
                else if (group->kind != Attribute::Kind::String || group->s != want)
                    problem(t.path, "attribute 'group' is " + group->text() + ", expected \"" + want +
                                        "\" (a tensor moved or swapped)");
            }
            if (!name) problem(t.path, "missing attribute 'name'");
            else if (name->kind != Attribute::Kind::String) problem(t.path, "attribute 'name' is " + name->type + ", expected a string");
            else {
                t.name = name->s;
                if (escape_name(name->s) != link)
                    problem(t.path, "attribute 'name' is \"" + name->s + "\", whose link name is \"" +
                                        escape_name(name->s) + "\", not \"" + link + "\"");
            }
            if (!trainable) problem(t.path, "missing attribute 'trainable'");
            else if (trainable->kind != Attribute::Kind::Int)
                problem(t.path, "attribute 'trainable' is " + trainable->type + ", expected int64");
            else if (trainable->i != 0 && trainable->i != 1)
                problem(t.path, "attribute 'trainable' is " + trainable->text() + ", expected 0 or 1");
            else t.trainable = trainable->i;
            if (!checksum) problem(t.path, "missing attribute 'checksum'");
            else if (checksum->kind != Attribute::Kind::Int || checksum->bits != 64)
                problem(t.path, "attribute 'checksum' is " + checksum->type + ", expected uint64");
            else {
                if (!checksum->is_unsigned) warning(t.path, "attribute 'checksum' is int64; the format says uint64");
                t.checksum = static_cast<uint64_t>(checksum->i);
            }
        } catch (const Error &e) {
            problem(t.path, e.what());
        }
        tensors_.push_back(std::move(t));
    }
}

void Checkpoint::read_client_state_info() {
    ClientState &c = client_state_;
    c.present = true;
    Handle ds(H5Dopen2(h_.get(), "client_state", H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) {
        problem("/client_state", "cannot open: " + hdf5_message());
        return;
    }
    Handle type(H5Dget_type(ds.get()), H5Tclose), space(H5Dget_space(ds.get()), H5Sclose);
    if (!type.valid() || !space.valid()) {
        problem("/client_state", "cannot read its type: " + hdf5_message());
        return;
    }
    hsize_t n = 0;
    if (H5Tget_class(type.get()) != H5T_INTEGER || H5Tget_size(type.get()) != 1) {
        problem("/client_state", "is " + type_name(type.get()) + ", expected uint8");
    } else if (H5Sget_simple_extent_type(space.get()) != H5S_SIMPLE || H5Sget_simple_extent_ndims(space.get()) != 1 ||
               H5Sget_simple_extent_dims(space.get(), &n, nullptr) < 0) {
        problem("/client_state", "is not 1-D");
        hdf5_message();
    } else {
        c.bytes = n;
        c.readable = true;
        if (H5Tget_sign(type.get()) != H5T_SGN_NONE) warning("/client_state", "is int8; the format says uint8");
    }
    try {
        const std::optional<Attribute> checksum = find_attribute(ds.get(), "checksum");
        if (!checksum) problem("/client_state", "missing attribute 'checksum'");
        else if (checksum->kind != Attribute::Kind::Int || checksum->bits != 64)
            problem("/client_state", "attribute 'checksum' is " + checksum->type + ", expected uint64");
        else c.checksum = static_cast<uint64_t>(checksum->i);
    } catch (const Error &e) {
        problem("/client_state", e.what());
    }
}

void Checkpoint::read_rows(const Tensor &t, uint64_t row0, uint64_t rows, float *out) const {
    if (!t.float32) throw error(t.path, t.unreadable);
    if (t.elements == 0 || rows == 0) return;
    crash_context(file_);
    Handle ds(H5Dopen2(h_.get(), t.path.c_str(), H5P_DEFAULT), H5Dclose);
    if (!ds.valid()) throw error(t.path, "cannot open: " + hdf5_message());
    if (t.shape.empty()) {
        if (H5Dread(ds.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out) < 0)
            throw error(t.path, "cannot read: " + hdf5_message());
        return;
    }
    // The file's dataspace, not the shape read at open: a file changed since
    // then must fail here rather than read out of bounds.
    Handle fspace(H5Dget_space(ds.get()), H5Sclose);
    if (!fspace.valid() || H5Sget_simple_extent_ndims(fspace.get()) != static_cast<int>(t.shape.size()))
        throw error(t.path, "cannot read its shape: " + hdf5_message());
    std::vector<hsize_t> start(t.shape.size(), 0), count(t.shape.begin(), t.shape.end());
    start[0] = row0;
    count[0] = rows;
    const hsize_t n = rows * (t.elements / t.shape[0]);
    Handle mspace(H5Screate_simple(1, &n, nullptr), H5Sclose);
    if (!mspace.valid() ||
        H5Sselect_hyperslab(fspace.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
        H5Dread(ds.get(), H5T_NATIVE_FLOAT, mspace.get(), fspace.get(), H5P_DEFAULT, out) < 0)
        throw error(t.path, "cannot read: " + hdf5_message());
}

void Checkpoint::read_blocks(const Tensor &t, const std::function<void(const Block &)> &fn,
                             uint64_t block_elements) const {
    if (!t.float32) throw error(t.path, t.unreadable);
    if (t.elements == 0) return;
    if (t.shape.empty()) {
        float x = 0;
        read_rows(t, 0, 1, &x);
        fn(Block{0, 1, 0, &x, 1});
        return;
    }
    // Whole rows of the first dimension: a hyperslab of consecutive rows is a
    // consecutive range of elements in row-major order, which the checksum needs.
    const uint64_t row = t.elements / t.shape[0];
    const uint64_t rows_per_block = std::max<uint64_t>(1, block_elements / std::max<uint64_t>(row, 1));
    // A row above the block size is read whole: this buffer, and diff's for
    // the other side, and the HDF5 conversion buffer of the same size.
    allow_memory(4 * 4 * std::min(rows_per_block, t.shape[0]) * row);
    std::vector<float> buf(static_cast<size_t>(std::min(rows_per_block, t.shape[0]) * row));
    for (uint64_t r0 = 0; r0 < t.shape[0]; r0 += rows_per_block) {
        const uint64_t nr = std::min(rows_per_block, t.shape[0] - r0);
        read_rows(t, r0, nr, buf.data());
        fn(Block{r0, nr, r0 * row, buf.data(), static_cast<size_t>(nr * row)});
    }
}

uint64_t Checkpoint::compute_checksum(const Tensor &t) const {
    Checksum sum;
    read_blocks(t, [&](const Block &b) { sum.add_floats(b.data, b.n); });
    return sum.value();
}

uint64_t Checkpoint::compute_checksum(const Tensor &t, NonFinite &nf) const {
    Checksum sum;
    nf = NonFinite{};
    read_blocks(t, [&](const Block &b) {
        sum.add_floats(b.data, b.n);
        for (size_t i = 0; i < b.n; ++i) {
            const float x = b.data[i];
            if (std::isfinite(x)) continue;
            if (nf.count() == 0) nf.first = b.offset + i;
            (std::isnan(x) ? nf.nan : nf.inf) += 1;
        }
    });
    return sum.value();
}

std::vector<uint8_t> Checkpoint::read_client_state() const {
    const ClientState &c = client_state_;
    if (!c.present) return {};
    if (!c.readable) throw error("/client_state", "is not a 1-D uint8 dataset");
    std::vector<uint8_t> bytes(static_cast<size_t>(c.bytes));
    if (bytes.empty()) return bytes;
    crash_context(file_);
    Handle ds(H5Dopen2(h_.get(), "client_state", H5P_DEFAULT), H5Dclose);
    if (!ds.valid() || H5Dread(ds.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) < 0)
        throw error("/client_state", "cannot read: " + hdf5_message());
    return bytes;
}

uint64_t Checkpoint::compute_client_checksum() const {
    const std::vector<uint8_t> bytes = read_client_state();
    Checksum sum;
    sum.add_bytes(bytes.data(), bytes.size());
    return sum.value();
}

static_assert(sizeof(float) == 4, "IEEE single precision floats");

} // namespace ckpt_tool
} // namespace dsm
