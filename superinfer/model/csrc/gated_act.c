/* The gated MLP's activation, silu(gate) * up, in one pass over the fused gate/up
 * projection's output (CPU, bfloat16).
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_act.py). PyTorch runs it as three ops (chunk, silu, an in-place
 * multiply), each a pass over the rows with its own dispatch: 7.6 us a call for one row and
 * 200 us for 256 rows on the default model's 1536 columns, 30 calls a step.
 *
 * The arithmetic is PyTorch's: in float, silu(g) = g / (1 + exp(-g)), rounded to bfloat16,
 * then times up in float and rounded again (PyTorch's bfloat16 multiply). exp is a
 * Cephes-style polynomial on the reduced argument (about 1 ulp in float, as PyTorch's
 * vectorized exp), so a result can differ from PyTorch's only where the float lands within
 * an ulp of a bfloat16 rounding boundary.
 */
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define HAVE_ACT 1

static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

static inline __m512 load_bf16_part(const uint16_t *p, __mmask16 mask) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, p)), 16));
}

static inline __m512 round_bf16(__m512 x) {
    return _mm512_castsi512_ps(_mm512_and_si512(rounded_bits(x), _mm512_set1_epi32(~0xFFFF)));
}

/* exp(x): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' expf polynomial, times 2^n
 * (vscalefps: overflow to inf, underflow to 0, NaN kept). */
static inline __m512 exp_ps(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
    return _mm512_scalef_ps(p, n);
}

/* out (16 or `mask`'s lanes) = round(round(silu(gate)) * up) */
static inline void silu_mul_16(const uint16_t *gate, const uint16_t *up, uint16_t *out,
                               __mmask16 mask) {
    const __m512 g = mask == 0xFFFF ? load_bf16(gate) : load_bf16_part(gate, mask);
    const __m512 u = mask == 0xFFFF ? load_bf16(up) : load_bf16_part(up, mask);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = round_bf16(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
    const __m512i product = rounded_bits(_mm512_mul_ps(silu, u));
    const __m256i y = _mm512_cvtepi32_epi16(_mm512_srli_epi32(product, 16));
    _mm256_mask_storeu_epi16(out, mask, y);
}
#endif

/* out (num_rows, inner) bfloat16 = silu(x[:, :inner]) * x[:, inner:], x (num_rows,
 * 2 * inner) bfloat16, rows x_stride elements apart, each contiguous. Returns 0, or -1
 * where this kernel does not run (no AVX-512). */
int silu_mul(const void *x, int64_t x_stride, void *out, int64_t num_rows, int64_t inner,
             int num_threads) {
#ifdef HAVE_ACT
    const int64_t num_full = inner / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (inner - num_full)) - 1);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_rows * inner >= 16384)
    for (int64_t r = 0; r < num_rows; r++) {
        const uint16_t *gate = (const uint16_t *)x + r * x_stride, *up = gate + inner;
        uint16_t *y = (uint16_t *)out + r * inner;
        for (int64_t i = 0; i < num_full; i += 16) silu_mul_16(gate + i, up + i, y + i, 0xFFFF);
        if (tail) silu_mul_16(gate + num_full, up + num_full, y + num_full, tail);
    }
    return 0;
#else
    (void)x, (void)x_stride, (void)out, (void)num_rows, (void)inner, (void)num_threads;
    return -1;
#endif
}
