// dsm-bench: see harness.hpp and doc/dsm-bench.md.
#include "harness.hpp"

int main(int argc, char **argv) { return dsm::bench::main(argc, argv); }
