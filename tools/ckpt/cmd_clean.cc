// dsm-ckpt clean: the leftovers of interrupted saves removed from a directory.
#include "tool.hpp"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace dsm {
namespace ckpt_tool {

namespace {

const char *const kCleanHelp =
    "usage: dsm-ckpt clean DIR [--dry-run] [--json]\n"
    "  Remove the leftovers of interrupted saves from a checkpoint directory: the\n"
    "  temporary files DIR/.<tag>.h5.tmp (a checkpoint being written),\n"
    "  DIR/.<tag>.h5.reserve (room kept for its metadata), DIR/.latest.tmp (`latest`\n"
    "  being replaced) and DIR/.dsm-dircheck-<hex> (the shared-directory check) that a\n"
    "  save killed before its commit leaves behind. Nothing else is ever removed: not\n"
    "  a checkpoint, not `latest`,\n"
    "  not another file, not a link or directory with such a name (listed as kept).\n"
    "  Do not run it while a job is saving into DIR: its temporary file would go.\n"
    "  --dry-run   list what would be removed, remove nothing\n"
    "  --json      one JSON document (format in doc/dsm-ckpt.md)\n";

// The kind of a leftover for clean's JSON: "checkpoint" (.T.h5.tmp),
// "reserve" (.T.h5.reserve), "latest" (.latest.tmp) or "token"
// (.dsm-dircheck-...), and what it is in words.
const char *leftover_kind(const std::string &name, const std::string &tag) {
    if (name.rfind(".dsm-dircheck-", 0) == 0) return "token";
    if (tag.empty()) return "latest";
    return name.size() > 8 && name.compare(name.size() - 8, 8, ".reserve") == 0 ? "reserve" : "checkpoint";
}

std::string leftover_what(const std::string &name, const std::string &tag) {
    const std::string kind = leftover_kind(name, tag);
    if (kind == "token") return "an interrupted shared-directory check";
    if (kind == "latest") return "an interrupted update of latest";
    if (kind == "reserve") return "the metadata reserve of an interrupted save of tag " + printable(tag);
    return "an interrupted save of tag " + printable(tag);
}

} // namespace

// What a save leaves when it is killed before its commit (src/ckpt: the file
// of tag T is written as DIR/.T.h5.tmp, with DIR/.T.h5.reserve beside it,
// and renamed; `latest` is written as DIR/.latest.tmp and renamed; the
// directory check's token is DIR/.dsm-dircheck-<16 hex>): the tag of such a
// name, "" for .latest.tmp and a token, nullopt for any other name.
std::optional<std::string> leftover_tag(const std::string &name) {
    if (name == ".latest.tmp") return std::string();
    const std::string token = ".dsm-dircheck-";
    if (name.size() == token.size() + 16 && name.compare(0, token.size(), token) == 0 &&
        name.find_first_not_of("0123456789abcdef", token.size()) == std::string::npos)
        return std::string();
    for (const std::string suffix : {".h5.tmp", ".h5.reserve"}) {
        if (name.size() <= 1 + suffix.size() || name[0] != '.' ||
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        const std::string tag = name.substr(1, name.size() - 1 - suffix.size());
        if (valid_tag(tag)) return tag;
    }
    return std::nullopt;
}

int cmd_clean(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("clean", argc, argv, {}, 1, kCleanHelp, a, {"--dry-run"})) return rc < 0 ? 0 : rc;
    const bool dry = a.flags.count("--dry-run") != 0;
    const std::string dir = a.positional[0];
    struct stat st;
    if (stat(dir.c_str(), &st) != 0) throw Error(dir + ": " + std::strerror(errno));
    if (!S_ISDIR(st.st_mode))
        throw UsageError(dir + " is not a directory: clean takes a checkpoint directory and removes only the "
                               "temporary files of interrupted saves in it");
    struct Entry {
        std::string name, tag;
        uint64_t bytes = 0;
        bool removed = false;
        std::string why_kept; // a name of ours that is not a regular file
    };
    std::vector<Entry> found;
    {
        std::unique_ptr<DIR, int (*)(DIR *)> d(opendir(dir.c_str()), closedir);
        if (!d) throw Error(dir + ": cannot list: " + std::strerror(errno));
        for (struct dirent *e = readdir(d.get()); e != nullptr; e = readdir(d.get())) {
            const std::string name = e->d_name;
            const std::optional<std::string> tag = leftover_tag(name);
            if (!tag) continue;
            Entry en;
            en.name = name;
            en.tag = *tag;
            struct stat fst;
            // lstat: a link with such a name is not followed, and not removed.
            if (lstat((dir + "/" + name).c_str(), &fst) != 0) continue; // gone meanwhile
            if (S_ISREG(fst.st_mode)) en.bytes = static_cast<uint64_t>(fst.st_size);
            else en.why_kept = S_ISLNK(fst.st_mode) ? "a symbolic link" : S_ISDIR(fst.st_mode) ? "a directory"
                                                                                                 : "not a regular file";
            found.push_back(en);
        }
    }
    std::sort(found.begin(), found.end(), [](const Entry &x, const Entry &y) { return x.name < y.name; });
    uint64_t bytes = 0;
    size_t removed = 0, listed = 0;
    std::string failure;
    for (Entry &en : found) {
        if (!en.why_kept.empty()) continue;
        ++listed;
        bytes += en.bytes;
        if (dry) continue;
        const std::string path = dir + "/" + en.name;
        if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
            if (failure.empty()) failure = path + ": cannot remove: " + std::strerror(errno);
            continue;
        }
        en.removed = true;
        ++removed;
    }
    if (a.json) {
        Json files = Json::array(), kept = Json::array();
        for (const Entry &en : found) {
            if (!en.why_kept.empty()) {
                kept.push_back({{"file", en.name}, {"reason", en.why_kept}});
                continue;
            }
            files.push_back({{"file", en.name},
                             {"kind", leftover_kind(en.name, en.tag)},
                             {"tag", en.tag.empty() ? Json(nullptr) : Json(en.tag)},
                             {"bytes", en.bytes},
                             {"removed", en.removed}});
        }
        print_json(Json{{"format", "dsm-ckpt-clean"},
                        {"format_version", 1},
                        {"path", dir},
                        {"dry_run", dry},
                        {"leftovers", files},
                        {"kept", kept},
                        {"bytes", bytes},
                        {"removed", removed}});
    } else {
        for (const Entry &en : found) {
            const std::string path = printable(dir + "/" + en.name);
            if (!en.why_kept.empty())
                std::printf("kept %s: %s, not a file a save leaves\n", path.c_str(), en.why_kept.c_str());
            else
                std::printf("%s %s (%s, %s)\n", dry ? "would remove" : en.removed ? "removed" : "could not remove",
                            path.c_str(),
                            leftover_what(en.name, en.tag).c_str(),
                            plural(en.bytes, "byte", "bytes").c_str());
        }
        if (listed == 0)
            std::printf("%s: no leftovers of interrupted saves\n", printable(dir).c_str());
        else if (dry)
            std::printf("%s: %s of interrupted saves (%s) would be removed\n", printable(dir).c_str(),
                        plural(listed, "leftover", "leftovers").c_str(), plural(bytes, "byte", "bytes").c_str());
        else
            std::printf("%s: removed %zu of %s of interrupted saves\n", printable(dir).c_str(), removed,
                        plural(listed, "leftover", "leftovers").c_str());
    }
    if (!failure.empty()) throw Error(failure);
    return 0;
}

} // namespace ckpt_tool
} // namespace dsm
