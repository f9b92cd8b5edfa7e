/*
 * counter_rng.h: the random numbers of the examples, one header they share.
 *
 * A counter-based generator: the value depends only on (stream, i), so every
 * rank computes the same number for the same element without sharing state.
 * That is what the engine's init_fn requires (under ZeRO-3 each rank fills
 * only the elements it stores), and it lets each rank make its own share of
 * a global batch. Header-only (static inline), written against nothing but
 * the C library.
 */
#ifndef EXAMPLES_COUNTER_RNG_H
#define EXAMPLES_COUNTER_RNG_H

#include <math.h>
#include <stdint.h>

/* splitmix64's finalizer. */
static inline uint64_t rng_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1): element i of stream `stream`. */
static inline double rng_uniform(uint64_t stream, uint64_t i) {
    return ((double)(rng_mix64(rng_mix64(stream) ^ i) >> 11) + 0.5) * 0x1p-53;
}

/* Standard normal (Box-Muller on the uniforms 2i and 2i + 1). */
static inline double rng_gauss(uint64_t stream, uint64_t i) {
    const double u1 = rng_uniform(stream, 2 * i), u2 = rng_uniform(stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif /* EXAMPLES_COUNTER_RNG_H */
