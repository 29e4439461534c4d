/* e^x for 16 lanes (AVX-512), for the attention kernels' softmax. */
#ifndef SUPERINFER_EXP16_H
#define SUPERINFER_EXP16_H

#include <immintrin.h>

/* e^x for 16 lanes of x <= 0, as exp_nonpositive (paged_decode.c) computes one: 2^k * 2^f,
 * 2^f from its Taylor series to degree 6. */
static inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.f));
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.4426950409f));
    const __m512 k = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_mul_ps(_mm512_sub_ps(t, k), _mm512_set1_ps(0.6931471806f));
    __m512 p = _mm512_set1_ps(1.f / 720.f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 120.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 24.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f / 6.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, k);
}

#endif
