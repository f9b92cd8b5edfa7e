// dsm-ckpt: inspect, verify, export, compare and clean libdsm checkpoints.
//
//   dsm-ckpt info PATH [--tag TAG] [--json]
//   dsm-ckpt verify PATH [--tag TAG] [--fail-nonfinite] [--json]
//   dsm-ckpt export PATH [--tag TAG] --output OUT.h5|OUT.safetensors [--json]
//   dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--json]
//   dsm-ckpt clean DIR [--dry-run] [--json]
//
// PATH is a checkpoint directory (DIR/<tag>.h5 and DIR/latest) or one
// checkpoint file. The tool reads the files with serial HDF5 and needs no MPI
// launcher; doc/checkpoint.md specifies the files, doc/dsm-ckpt.md the output.
//
// Exit status: 0 success (diff: equal), 1 failure (verify: a problem found;
// diff: different; any command: an unreadable or invalid file), 2 usage error.
// Text output escapes the control characters of anything read from a file
// (printable()); JSON output is ASCII, with \u escapes.
#include <cstdio>
#include <new>
#include <string>

#include <hdf5.h>

#include "dsm_version.h"
#include "tool.hpp"

namespace {

const char *const kUsage =
    "usage: dsm-ckpt info PATH [--tag TAG] [--json]\n"
    "       dsm-ckpt verify PATH [--tag TAG] [--fail-nonfinite] [--json]\n"
    "       dsm-ckpt export PATH [--tag TAG] --output OUT.h5|OUT.safetensors [--dtype fp32|bf16|fp16] [--json]\n"
    "       dsm-ckpt diff A B [--tag-a TAG] [--tag-b TAG] [--atol X] [--rtol X] [--json]\n"
    "       dsm-ckpt clean DIR [--dry-run] [--json]\n"
    "       dsm-ckpt --help | --version\n";

} // namespace

int main(int argc, char **argv) {
    using namespace dsm::ckpt_tool;
    if (argc < 2) {
        std::fputs(kUsage, stderr);
        return 2;
    }
    const std::string sub = argv[1];
    if (sub == "--help" || sub == "-h") {
        std::fputs(kUsage, stdout);
        std::puts("Run 'dsm-ckpt SUBCOMMAND --help' for its options; doc/dsm-ckpt.md describes the output.");
        return 0;
    }
    if (sub == "--version") {
        std::printf("dsm-ckpt (libdsm) %s\n", DSM_VERSION_STRING);
        return 0;
    }
    int (*cmd)(int, char **) = sub == "info"     ? cmd_info
                               : sub == "verify" ? cmd_verify
                               : sub == "export" ? cmd_export
                               : sub == "diff"   ? cmd_diff
                               : sub == "clean"  ? cmd_clean
                                                 : nullptr;
    if (cmd == nullptr) {
        std::fprintf(stderr, "dsm-ckpt: unknown subcommand '%s' (info, verify, export, diff, clean; see dsm-ckpt --help)\n",
                     sub.c_str());
        return 2;
    }
    // Failures become one line of ours; HDF5's own stack dump would bury it.
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    install_crash_guard("dsm-ckpt " + sub);
    limit_memory();
    try {
        return cmd(argc - 1, argv + 1);
    } catch (const UsageError &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 2;
    } catch (const Error &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 1;
    } catch (const std::bad_alloc &) {
        std::fprintf(stderr, "dsm-ckpt %s: out of memory\n", sub.c_str());
        return 1;
    } catch (const std::exception &e) {
        std::fprintf(stderr, "dsm-ckpt %s: %s\n", printable(sub).c_str(), printable(e.what()).c_str());
        return 1;
    }
}
