// dsm-ckpt: finding the checkpoint file of a PATH and a tag (see ckpt_read.hpp).
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

// ---------------------------------------------------------------- locate

namespace {

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }

// "global_step2" < "global_step10": digit runs compare as numbers.
bool natural_less(const std::string &a, const std::string &b) {
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
        if (is_ascii_digit(a[i]) && is_ascii_digit(b[j])) {
            size_t i2 = i, j2 = j;
            while (i2 < a.size() && is_ascii_digit(a[i2])) ++i2;
            while (j2 < b.size() && is_ascii_digit(b[j2])) ++j2;
            std::string x = a.substr(i, i2 - i), y = b.substr(j, j2 - j);
            x.erase(0, std::min(x.find_first_not_of('0'), x.size()));
            y.erase(0, std::min(y.find_first_not_of('0'), y.size()));
            if (x.size() != y.size()) return x.size() < y.size();
            if (x != y) return x < y;
            i = i2;
            j = j2;
        } else {
            if (a[i] != b[j]) return a[i] < b[j];
            ++i;
            ++j;
        }
    }
    return a.size() - i < b.size() - j || (a.size() - i == b.size() - j && a < b);
}

std::string join_path(const std::string &dir, const std::string &name) {
    return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}

std::string join(const std::vector<std::string> &items, const char *sep) {
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) out += (k ? sep : "") + items[k];
    return out;
}

// DIR/latest: one line holding a tag. Returns the tag, or "" with `why` set.
std::string read_latest(const std::string &dir, std::string &why, bool &exists) {
    const std::string path = join_path(dir, "latest");
    exists = false;
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
        why = path + ": " + std::strerror(errno);
        return "";
    }
    exists = true;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
        why = path + ": cannot read: " + std::strerror(errno);
        return "";
    }
    std::string text;
    char buf[512];
    // A tag has at most 200 characters: more than a few hundred bytes is not a tag.
    in.read(buf, sizeof buf);
    text.assign(buf, static_cast<size_t>(in.gcount()));
    std::string tag = text;
    if (!tag.empty() && tag.back() == '\n') tag.pop_back();
    if (!tag.empty() && tag.back() == '\r') tag.pop_back();
    if (!valid_tag(tag)) {
        why = path + ": does not hold a tag (1 to 200 of A-Z a-z 0-9 . _ -, one line)";
        return "";
    }
    return tag;
}

} // namespace

Location locate(const std::string &path, const std::optional<std::string> &tag) {
    if (tag && !valid_tag(*tag))
        throw UsageError("--tag '" + *tag + "' is not a tag (1 to 200 of A-Z a-z 0-9 . _ -, not starting with .)");
    struct stat st;
    if (stat(path.c_str(), &st) != 0) throw Error(path + ": " + std::strerror(errno));
    Location loc;
    if (!S_ISDIR(st.st_mode)) {
        if (tag) throw UsageError("--tag applies to a checkpoint directory; " + path + " is a file");
        loc.file = path;
        return loc;
    }
    loc.directory = true;
    loc.dir = path;
    std::unique_ptr<DIR, int (*)(DIR *)> d(opendir(path.c_str()), closedir);
    if (!d) throw Error(path + ": cannot list: " + std::strerror(errno));
    for (struct dirent *e = readdir(d.get()); e != nullptr; e = readdir(d.get())) {
        const std::string name = e->d_name;
        if (name[0] == '.') {
            if (ends_with(name, ".tmp") || ends_with(name, ".h5.reserve") || name.rfind(".dsm-dircheck-", 0) == 0)
                loc.temporary.push_back(name);
            continue;
        }
        struct stat fst;
        if (!ends_with(name, ".h5") || name.size() <= 3 || stat(join_path(path, name).c_str(), &fst) != 0 ||
            !S_ISREG(fst.st_mode))
            continue;
        loc.tags.push_back(name.substr(0, name.size() - 3));
    }
    std::sort(loc.tags.begin(), loc.tags.end(), natural_less);
    std::sort(loc.temporary.begin(), loc.temporary.end());
    bool latest_exists = false;
    std::string why;
    const std::string latest = read_latest(path, why, latest_exists);
    if (!latest.empty()) loc.latest = latest;
    else loc.latest_problem = why;
    const bool listed = loc.latest && std::find(loc.tags.begin(), loc.tags.end(), *loc.latest) != loc.tags.end();
    if (loc.latest && !listed)
        loc.latest_problem = join_path(path, "latest") + " names tag '" + *loc.latest + "', but " +
                             join_path(path, *loc.latest + ".h5") + " does not exist";

    if (tag) {
        loc.tag = *tag;
        if (std::find(loc.tags.begin(), loc.tags.end(), *tag) == loc.tags.end())
            throw Error(path + ": no tag '" + *tag + "' (" + join_path(path, *tag + ".h5") + " does not exist; tags: " +
                        (loc.tags.empty() ? "none" : join(loc.tags, ", ")) + ")");
    } else if (!loc.latest_problem.empty()) {
        if (loc.tags.empty() && !latest_exists) throw Error(path + ": not a checkpoint directory (no latest, no *.h5)");
        if (!latest_exists)
            throw Error(loc.latest_problem + "; choose a tag with --tag (tags: " +
                        (loc.tags.empty() ? "none" : join(loc.tags, ", ")) + ")");
        throw Error(loc.latest_problem);
    } else {
        loc.tag = *loc.latest;
    }
    loc.file = join_path(path, loc.tag + ".h5");
    return loc;
}

} // namespace ckpt_tool
} // namespace dsm
