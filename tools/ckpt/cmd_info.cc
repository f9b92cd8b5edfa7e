// dsm-ckpt info: a checkpoint's training state, setup and tensors.
#include "tool.hpp"

#include <cstdio>
#include <string>

namespace dsm {
namespace ckpt_tool {

namespace {

const char *const kInfoHelp =
    "usage: dsm-ckpt info PATH [--tag TAG] [--json]\n"
    "  Describe a checkpoint: its training state (steps, samples, loss scale, learning-rate\n"
    "  schedule step), the setup that wrote it (ZeRO stage, group sizes, mesh, dtype,\n"
    "  optimizer, libdsm version) and every tensor with its shape, elements and bytes.\n"
    "  PATH is a checkpoint directory (its tags are listed; the one `latest` names is\n"
    "  described, or --tag TAG) or one checkpoint .h5 file.\n"
    "  --tag TAG   the tag to describe in a directory\n"
    "  --json      one JSON document (format in doc/dsm-ckpt.md)\n";

Json info_json(const Opened &o) {
    const Checkpoint &ck = o.ck;
    Json attrs = Json::object();
    for (const Attribute &a : ck.attributes()) attrs[a.name] = attribute_json(a);
    Json tensors = Json::array();
    struct Total {
        uint64_t count = 0, elements = 0, bytes = 0;
        Json json() const { return Json{{"count", count}, {"elements", elements}, {"bytes", bytes}}; }
    } params, optimizer;
    for (const Tensor &t : ck.tensors()) {
        tensors.push_back({{"path", t.path},
                           {"kind", t.param() ? "param" : "optimizer_state"},
                           {"state", t.param() ? Json(nullptr) : Json(t.state)},
                           {"name", t.name ? Json(*t.name) : Json(nullptr)},
                           {"trainable", t.trainable ? Json(*t.trainable == 1) : Json(nullptr)},
                           {"dtype", t.dtype},
                           {"shape", shape_json(t.shape)},
                           {"elements", t.elements},
                           {"bytes", t.float32 ? Json(t.bytes()) : Json(nullptr)}});
        Total &tot = t.param() ? params : optimizer;
        ++tot.count;
        tot.elements += t.elements;
        tot.bytes += t.float32 ? t.bytes() : 0;
    }
    const ClientState &cs = ck.client_state();
    return Json{{"format", "dsm-ckpt-info"},
                {"format_version", 1},
                {"path", o.loc.directory ? o.loc.dir : o.loc.file},
                {"file", ck.file()},
                {"tag", o.loc.directory ? Json(o.loc.tag) : Json(nullptr)},
                {"directory", directory_json(o.loc)},
                {"attributes", attrs},
                {"tensors", tensors},
                {"totals", {{"params", params.json()}, {"optimizer_states", optimizer.json()}}},
                {"client_state", cs.present ? Json{{"bytes", cs.bytes}} : Json(nullptr)},
                {"problems", issues_json(ck.problems())},
                {"warnings", issues_json(ck.warnings())}};
}

void info_text(const Opened &o) {
    const Checkpoint &ck = o.ck;
    const Location &loc = o.loc;
    std::printf("checkpoint %s\n", printable(ck.file()).c_str());
    if (loc.directory) {
        std::string tags;
        for (const std::string &t : loc.tags) tags += (tags.empty() ? "" : ", ") + t;
        std::printf("directory  %s: %s %s; latest %s\n", printable(loc.dir).c_str(), loc.tags.size() == 1 ? "tag" : "tags",
                    printable(tags).c_str(), loc.latest ? printable(*loc.latest).c_str() : "(none)");
        if (!loc.latest_problem.empty()) std::printf("           %s\n", printable(loc.latest_problem).c_str());
        for (const std::string &t : loc.temporary)
            std::printf("           leftover temporary file %s (%s)\n", printable(t).c_str(),
                        leftover_tag(t) ? "an interrupted save; dsm-ckpt clean removes it"
                                                   : "not left by a save; dsm-ckpt clean keeps it");
    }
    std::printf("format     %s %s, written by libdsm %s, tag %s\n", printable(attr_plain(ck, "format")).c_str(),
                printable(attr_plain(ck, "format_version")).c_str(),
                printable(attr_plain(ck, "libdsm_version")).c_str(),
                printable(attr_plain(ck, "tag")).c_str());

    std::printf("\ntraining state\n");
    for (const std::string &name : training_state_attributes())
        std::printf("  %-31s %s\n", name.c_str(), printable(attr_text(ck, name.c_str())).c_str());
    std::printf("setup\n");
    for (const char *name : {"zero_stage", "data_parallel_size", "sequence_parallel_size", "mesh_shape", "mesh_names",
                             "compute_dtype", "optimizer"})
        std::printf("  %-31s %s\n", name, printable(attr_text(ck, name)).c_str());
    if (const Attribute *c = ck.attribute("config"))
        std::printf("  %-31s %s\n", "config",
                    c->kind == Attribute::Kind::String ? (std::to_string(c->s.size()) + " bytes of JSON (--json shows it)").c_str()
                                                       : printable(c->text()).c_str());
    // Attributes the format does not name: shown, since a newer writer may add some.
    static const std::set<std::string> known = {"format", "format_version", "libdsm_version", "tag", "zero_stage",
                                                "data_parallel_size", "sequence_parallel_size", "mesh_shape",
                                                "mesh_names", "compute_dtype", "optimizer", "config"};
    bool header = false;
    for (const Attribute &a : ck.attributes()) {
        const auto &ts = training_state_attributes();
        if (known.count(a.name) || std::find(ts.begin(), ts.end(), a.name) != ts.end()) continue;
        if (!header) std::printf("other attributes\n");
        header = true;
        std::printf("  %-31s %s\n", printable(a.name).c_str(), printable(a.text()).c_str());
    }

    uint64_t nparams = 0, ntrainable = 0, nstates = 0, elements = 0, bytes = 0;
    size_t width = 7;
    std::set<std::string> states;
    for (const Tensor &t : ck.tensors()) {
        (t.param() ? nparams : nstates) += 1;
        if (t.param() && t.trainable && *t.trainable == 1) ++ntrainable;
        if (!t.param()) states.insert(t.state);
        elements += t.elements;
        bytes += t.float32 ? t.bytes() : 0;
        width = std::max(width, printable(t.path).size());
    }
    std::string state_list;
    for (const std::string &s : states) state_list += (state_list.empty() ? "" : ", ") + s;
    std::printf("\ntensors: %s (%llu trainable), %s%s%s%s; %s, %s\n", plural(nparams, "parameter", "parameters").c_str(),
                static_cast<unsigned long long>(ntrainable),
                plural(nstates, "optimizer state tensor", "optimizer state tensors").c_str(),
                states.empty() ? "" : " (", printable(state_list).c_str(), states.empty() ? "" : ")",
                plural(elements, "element", "elements").c_str(), plural(bytes, "byte", "bytes").c_str());
    std::printf("  %-*s  %-16s %12s %14s  %s\n", static_cast<int>(width), "dataset", "shape", "elements", "bytes",
                "trainable");
    for (const Tensor &t : ck.tensors()) {
        std::string note;
        if (t.name && *t.name != t.link) note = "  name \"" + *t.name + "\"";
        if (!t.float32) note += "  (" + t.unreadable + ")";
        std::printf("  %-*s  %-16s %12llu %14llu  %s%s\n", static_cast<int>(width), printable(t.path).c_str(),
                    shape_text(t.shape).c_str(), static_cast<unsigned long long>(t.elements),
                    static_cast<unsigned long long>(t.float32 ? t.bytes() : 0),
                    !t.trainable ? "-" : *t.trainable ? "yes" : "no", printable(note).c_str());
    }
    const ClientState &cs = ck.client_state();
    if (cs.present) std::printf("client_state: %s\n", plural(cs.bytes, "byte", "bytes").c_str());
    else std::printf("client_state: none\n");
    if (!ck.problems().empty())
        std::printf("\n%s in the file's structure (dsm-ckpt verify lists them)\n",
                    plural(ck.problems().size(), "problem", "problems").c_str());
}

} // namespace

int cmd_info(int argc, char **argv) {
    Args a;
    if (int rc = parse_args("info", argc, argv, {"--tag"}, 1, kInfoHelp, a)) return rc < 0 ? 0 : rc;
    const Opened o = open_checkpoint(a.positional[0], value(a, "--tag"));
    if (a.json) print_json(info_json(o));
    else info_text(o);
    return 0;
}

} // namespace ckpt_tool
} // namespace dsm
