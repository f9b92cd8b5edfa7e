// dsm-ckpt: reading the checkpoint files of doc/checkpoint.md with serial
// HDF5, independently of the library's writer, so that the tool checks the
// file against the format and not against the code that wrote it.
//
// Every HDF5 failure becomes an Error whose message names the file and the
// object ("ckpt/global_step4.h5: /params/w: cannot read: ..."); nothing here
// prints, and HDF5's own error printing is turned off by main().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <hdf5.h>
#include <nlohmann/json.hpp>

#include "ckpt/format.hpp"
#include "ckpt/h5.hpp"

namespace dsm {
namespace ckpt_tool {

using Json = nlohmann::ordered_json;

// A failure the tool reports as one line on stderr, exit status 1.
class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A command line that cannot work (--tag with a file, a bad tag): exit status 2.
class UsageError : public Error {
public:
    using Error::Error;
};

// HDF5 1.10 can crash on a corrupt file instead of failing (a global-heap
// object whose stored length runs past its buffer: a segfault in H5HG_read
// while reading a string attribute), or loop forever in the global heap.
// install_crash_guard() turns such a crash into the tool's one-line message,
// "PREFIX: FILE: HDF5 crashed reading this file (signal N): the file is
// corrupt", and exit status 1, and so does a minute without progress while
// a file's metadata is read (the Checkpoint constructor); crash_context()
// names the file that is being read from then on.
void install_crash_guard(const std::string &prefix);
constexpr unsigned kWatchdogSeconds = 60; // "a minute without progress"
void crash_context(const std::string &file);

// A corrupt length in a file can also make HDF5 allocate and clear tens of
// GiB (a variable-length string's stored size) before it fails, or the OOM
// killer ends the process. limit_memory() bounds the data segment (anonymous
// mappings included: RLIMIT_DATA) so that such a file fails with HDF5's
// "memory allocation failed" instead; the tool itself needs two blocks of
// rows. allow_memory() raises the bound for a tensor whose rows are larger.
// Neither does anything in a sanitizer build (whose shadow memory the bound
// would count).
void limit_memory();
void allow_memory(uint64_t bytes);

// The innermost message of HDF5's current error stack ("truncated file: eof =
// ..."), or "" when the stack is empty: what the library found, without the
// chain of API frames above it.
std::string hdf5_message();

using Handle = ckpt::Handle; // owns an HDF5 identifier

// ---------------------------------------------------------------- checksum

// The checksum of doc/checkpoint.md: sum over i of splitmix64(i * golden + b_i)
// mod 2^64, fed in element order, in pieces of any size.
class Checksum {
public:
    void add_floats(const float *x, size_t n);    // b_i: the float's bit pattern
    void add_bytes(const uint8_t *x, size_t n);    // b_i: the byte value
    uint64_t value() const { return sum_; }

private:
    uint64_t index_ = 0;
    uint64_t sum_ = 0;
};

std::string hex64(uint64_t v); // "0x0123456789abcdef": checksums in text and JSON

// ---------------------------------------------------------------- names

using ckpt::escape_name; // the link name of a parameter
using ckpt::valid_tag;   // a tag as doc/checkpoint.md allows it

// ---------------------------------------------------------------- locating

// Where a PATH argument leads: a .h5 file given directly, or the file of a
// tag in a checkpoint directory (--tag, else the tag `latest` names).
struct Location {
    std::string file;                   // the checkpoint file to open
    bool directory = false;             // PATH was a directory
    std::string dir;                    // that directory
    std::vector<std::string> tags;      // every DIR/<tag>.h5, natural order
    std::optional<std::string> latest;  // what DIR/latest names
    std::string latest_problem;         // why `latest` names nothing, when it does not
    std::vector<std::string> temporary; // leftover DIR/.*.tmp files (garbage)
    std::string tag;                    // the chosen tag (directory only)
};

// Throws Error for a missing path, an unreadable directory, a missing or bad
// `latest` (when no tag is given), a tag without its file; UsageError for a
// tag given with a file or a tag the format does not allow.
Location locate(const std::string &path, const std::optional<std::string> &tag);

// ---------------------------------------------------------------- contents

// A problem found in a file, by the HDF5 path of the object it concerns
// ("/" for the root attributes).
struct Issue {
    std::string path;
    std::string message;
};

// A root attribute as read, kept in the kind the file stores it in.
struct Attribute {
    enum class Kind { Int, Float, String, IntArray, FloatArray, Other };
    std::string name;
    Kind kind = Kind::Other;
    bool scalar = true;    // a scalar dataspace (arrays: a 1-D one)
    bool is_unsigned = false; // Int: an unsigned integer type (i holds its bits)
    int bits = 0;          // Int, Float: the stored width
    int64_t i = 0;
    double f = 0;
    std::string s;
    std::vector<int64_t> ints;
    std::vector<double> floats;
    std::string type; // what it is, for messages: "int64", "string", "float64[3]", ...

    Json json() const;        // the value as JSON (`config` stays a string here)
    std::string text() const; // the value for people
    bool operator==(const Attribute &o) const;
};

// One float tensor: /params/<link> or /optimizer/<state>/<link>.
struct Tensor {
    std::string path;  // "/params/fc1.weight"
    std::string link;  // "fc1.weight": the escaped name
    std::string state; // "" for /params, else the optimizer state ("exp_avg")
    std::optional<std::string> name;   // attribute `name`
    std::optional<int64_t> trainable;  // attribute `trainable`
    std::optional<uint64_t> checksum;  // attribute `checksum`
    std::vector<uint64_t> shape;       // empty: a scalar
    uint64_t elements = 0;
    bool float32 = false;              // a readable 4-byte IEEE float dataset
    std::string unreadable;            // why it is not, when it is not
    std::string dtype;                 // "float32", else what it is
    bool param() const { return state.empty(); }
    uint64_t bytes() const { return elements * 4; }
};

// The uint8 /client_state dataset.
struct ClientState {
    bool present = false;
    uint64_t bytes = 0;
    std::optional<uint64_t> checksum;
    bool readable = false; // a 1-D 1-byte integer dataset
};

// A piece of a tensor in row-major order: rows [row0, row0 + rows) of its
// first dimension (a scalar: row 0 of 1), elements [offset, offset + n).
struct Block {
    uint64_t row0 = 0, rows = 0;
    uint64_t offset = 0;
    const float *data = nullptr;
    size_t n = 0;
};

// An open checkpoint file: its root attributes, its tensors (params first,
// then each optimizer state, each in name order) and the problems its
// structure has against doc/checkpoint.md. Opening reads metadata only.
class Checkpoint {
public:
    // Throws Error when the file is not HDF5, truncated or unreadable.
    explicit Checkpoint(const std::string &file);

    const std::string &file() const { return file_; }
    const std::vector<Attribute> &attributes() const { return attributes_; }
    const Attribute *attribute(const std::string &name) const;
    const std::vector<Tensor> &tensors() const { return tensors_; }
    const ClientState &client_state() const { return client_state_; }
    // Departures from the format that make a file invalid / that do not.
    const std::vector<Issue> &problems() const { return problems_; }
    const std::vector<Issue> &warnings() const { return warnings_; }

    // Throws Error unless `format` is "dsm-checkpoint" and `format_version` 1:
    // nothing else in a file is meaningful without them.
    void require_format() const;
    // format_version as the file gives it (1 when missing or not an integer).
    int64_t format_version() const;
    // The checksum format version 2 keeps in `attrs_checksum`.
    uint64_t root_attributes_checksum() const;

    // Calls fn with consecutive blocks of at most about block_elements
    // elements (at least one row), read as native floats. Throws Error.
    void read_blocks(const Tensor &t, const std::function<void(const Block &)> &fn,
                     uint64_t block_elements = kBlockElements) const;
    // Rows [row0, row0 + rows) of the first dimension into out (a scalar: row
    // 0 of 1), for reading a second tensor in step with read_blocks.
    void read_rows(const Tensor &t, uint64_t row0, uint64_t rows, float *out) const;
    uint64_t compute_checksum(const Tensor &t) const;
    // The same in one read, also counting the elements that are NaN or
    // infinite and the row-major index of the first of them.
    struct NonFinite {
        uint64_t nan = 0, inf = 0;
        uint64_t first = 0; // meaningful when count() > 0
        uint64_t count() const { return nan + inf; }
    };
    uint64_t compute_checksum(const Tensor &t, NonFinite &nonfinite) const;
    std::vector<uint8_t> read_client_state() const;
    uint64_t compute_client_checksum() const;

    static constexpr uint64_t kBlockElements = uint64_t(1) << 22; // 16 MiB of floats

private:
    void read_root_attributes();
    void check_root_attributes();
    void read_objects();
    void read_tensor_group(hid_t group, const std::string &prefix, const std::string &state);
    void read_client_state_info();
    void check_optimizer_states();
    Error error(const std::string &object, const std::string &what) const;
    void problem(const std::string &path, const std::string &message) {
        problems_.push_back({path, message});
    }
    void warning(const std::string &path, const std::string &message) {
        warnings_.push_back({path, message});
    }

    std::string file_;
    Handle h_;
    std::vector<Attribute> attributes_;
    std::vector<Tensor> tensors_;
    ClientState client_state_;
    std::vector<Issue> problems_, warnings_;
};

// Text from a file (names, attribute values, tags, messages quoting them) made
// safe for a terminal: control characters (bytes below 0x20 and 0x7f, the C1
// controls U+0080 to U+009F) and bytes that are not UTF-8 become \xNN
// (\u00NN for a C1 control written as UTF-8), so that no escape sequence,
// carriage return or line break from a file reaches the output. Valid UTF-8
// text is kept as it is.
std::string printable(const std::string &s);

bool ends_with(const std::string &s, const std::string &suffix);

// The shape as "[16, 8]" ("[]" for a scalar).
std::string shape_text(const std::vector<uint64_t> &shape);

// The shortest text that reads back as the same double ("0.1", "65536", "inf").
std::string number_text(double v);
// A double for JSON, which has no infinities or NaN: those become the strings
// "inf", "-inf", "nan".
Json number_json(double v);

} // namespace ckpt_tool
} // namespace dsm
