// The instruction sets the CPU offers, for the kernels that pick theirs at
// run time (optim/optimizer.cc, comm/quantize.cc). libgcc checks that the OS
// saves the YMM/ZMM state (XGETBV) before it reports AVX2 or AVX-512.
#pragma once

namespace dsm {

// AVX2 with FMA.
inline bool cpu_has_avx2() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    return false;
#endif
}

// AVX-512 F, VL, BW and DQ, and AVX2.
inline bool cpu_has_avx512() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && cpu_has_avx2();
#else
    return false;
#endif
}

} // namespace dsm
