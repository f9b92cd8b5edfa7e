#include "dsm_config.h"

#include "core/info.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/error.hpp"
#include "core/param.hpp"

namespace dsm {

namespace {
const std::pair<const char *, int> features[] = {
    {"mpi", 1},
    {"hwloc", DSM_HAVE_HWLOC},
    {"hdf5", DSM_HAVE_HDF5},
    {"cuda", DSM_HAVE_CUDA},
    {"nccl", DSM_HAVE_NCCL},
    {"fortran", DSM_HAVE_FORTRAN},
};

std::string mpi_library() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
    (void)len; // some MPI libraries count the terminating NUL
    std::string s(text);
    size_t nl = s.find_first_of("\r\n");
    if (nl != std::string::npos) s.resize(nl);
    while (!s.empty() && (s.back() == ',' || s.back() == ' ')) s.pop_back();
    return s;
}
} // namespace

int feature_enabled(const std::string &name) {
    std::string known;
    for (const auto &f : features) {
        if (name == f.first) return f.second;
        known += known.empty() ? "" : ", ";
        known += f.first;
    }
    DSM_FAIL(DSM_ERR_NOT_FOUND, "unknown feature \"", name, "\" (known: ", known, ")");
}

std::string describe_build(dsm_format_t format) {
    if (format == DSM_FORMAT_JSON) {
        nlohmann::ordered_json j;
        j["format"] = "dsm-info";
        j["format_version"] = 1;
        j["version"] = DSM_VERSION_STRING;
        j["mpi_library"] = mpi_library();
        j["features"] = nlohmann::ordered_json::object();
        for (const auto &f : features) j["features"][f.first] = f.second != 0;
        j["parameters"] = nlohmann::ordered_json::array();
        for (const ParamBase *p : params())
            j["parameters"].push_back({{"name", p->name()},
                                       {"type", p->type()},
                                       {"default", p->default_value()},
                                       {"value", p->raw()},
                                       {"set", p->is_set()},
                                       {"help", p->help()}});
        return j.dump(2) + "\n";
    }
    DSM_REQUIRE(format == DSM_FORMAT_TEXT, DSM_ERR_INVALID_ARGUMENT, "format ",
                static_cast<int>(format), " is not DSM_FORMAT_TEXT or DSM_FORMAT_JSON");
    std::ostringstream os;
    os << "libdsm " << DSM_VERSION_STRING << "\n";
    os << "MPI library: " << mpi_library() << "\n";
    os << "features:";
    for (const auto &f : features) os << " " << f.first << "=" << (f.second ? "yes" : "no");
    os << "\n\nenvironment parameters:\n";
    for (const ParamBase *p : params()) {
        os << "  " << p->name() << " = \"" << p->raw() << "\"" << (p->is_set() ? " (set, " : " (default, ")
           << p->type() << ")\n";
        os << "      " << p->help() << "\n";
    }
    return os.str();
}

char *to_c_string(const std::string &s) {
    char *out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out == nullptr) throw std::bad_alloc();
    std::memcpy(out, s.c_str(), s.size() + 1);
    return out;
}

} // namespace dsm
