/* bits.h - the seeded generator and the hash of lstm_bits.c and live_bits.c: integer
 * arithmetic only, so the same numbers and hashes on every platform. */
#ifndef MB_CROSS_BITS_H
#define MB_CROSS_BITS_H
#include <stddef.h>
#include <stdint.h>

static uint64_t rng;
static uint64_t rng_next(void) { return rng = rng * 6364136223846793005ull + 1442695040888963407ull; }
static float unif(float lo, float hi) { return lo + (hi - lo) * (float)(rng_next() >> 40) * (1.0f / 16777216.0f); }
static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}
#endif
