// libFuzzer target for the configuration reader: any bytes given as inline
// JSON must end in a Config or a dsm::Error, never in a crash, a hang or
// another exception. Built and run by test/fuzz/run-fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/config.hpp"
#include "core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    std::string text(reinterpret_cast<const char *>(data), size);
    // Text that does not start with '{' would be taken as a file path.
    size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') return 0;
    for (int64_t world : {1, 8}) {
        dsm::config::ConfigContext ctx;
        ctx.world_size = world;
        ctx.strict = world == 8;
        try {
            dsm::config::Config cfg = dsm::config::parse_config(text, ctx);
            (void)dsm::config::config_to_json(cfg);
        } catch (const dsm::Error &) {
            // A clear error is the right answer to a bad configuration.
        }
    }
    return 0;
}
