/* bfloat16 <-> float for the CPU kernels: a bfloat16 is the top half of a float. */
#ifndef SUPERINFER_BF16_H
#define SUPERINFER_BF16_H

#include <math.h>
#include <stdint.h>

static inline float bf16_to_float(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static inline uint16_t float_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    if (isnan(f)) return 0x7FC0;
    v.u += 0x7FFF + ((v.u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(v.u >> 16);
}

#endif
