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

#if defined(__AVX512F__)
#include <immintrin.h>

/* x's bits rounded to bfloat16's (nearest even) in the top half, as PyTorch rounds in
 * software: vcvtneps2bf16 would flush denormals, which PyTorch keeps. NaN -> 0x7FC0. */
static inline __m512i rounded_bits(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    const __m512i sum = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
    const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_mov_epi32(sum, is_nan, _mm512_set1_epi32(0x7FC00000));
}
#endif

#endif
