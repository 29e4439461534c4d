/* Greedy sampling's argmax over each row of float logits, on CPU.
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_argmax.py). PyTorch's CPU argmax over a (32, 49152) float tensor
 * took 1.6 ms here, ten times its amax: a batch-32 decode step's greedy pick cost more
 * than its sampling. The result is PyTorch's: the first index of the row's largest value;
 * a row holding a NaN is left to PyTorch (-1 returned, where PyTorch picks the first NaN).
 */
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>

/* The first index of row x's largest value (n values), or -1 if the row holds a NaN. */
static int64_t argmax_row(const float *x, int64_t n) {
    __m512 best = _mm512_set1_ps(-__builtin_inff());
    __m512i best_at = _mm512_set1_epi32(0);
    __m512i at = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 is_nan = 0;
    const int64_t num_full = n / 16 * 16;
    for (int64_t i = 0; i < num_full; i += 16) { /* per lane: the first of its largest */
        const __m512 v = _mm512_loadu_ps(x + i);
        const __mmask16 is_greater = _mm512_cmp_ps_mask(v, best, _CMP_GT_OQ);
        is_nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best = _mm512_mask_mov_ps(best, is_greater, v);
        best_at = _mm512_mask_mov_epi32(best_at, is_greater, at);
        at = _mm512_add_epi32(at, _mm512_set1_epi32(16));
    }
    if (is_nan) return -1;
    float top = _mm512_reduce_max_ps(best);
    int64_t top_at = -1;
    float lanes[16];
    int32_t lanes_at[16];
    _mm512_storeu_ps(lanes, best);
    _mm512_storeu_si512(lanes_at, best_at);
    for (int l = 0; l < 16; l++) /* the smallest index among lanes holding the maximum */
        if (num_full && lanes[l] == top && (top_at < 0 || lanes_at[l] < top_at))
            top_at = lanes_at[l];
    for (int64_t i = num_full; i < n; i++) {
        if (x[i] != x[i]) return -1;
        if (top_at < 0 || x[i] > top) top = x[i], top_at = i;
    }
    return top_at;
}
#endif

/* out[r] = argmax of row r of x (num_rows rows of n floats, x_stride apart). Returns 0;
 * 1 where a row holds a NaN (its out is -1); -1 where this kernel does not run (no
 * AVX-512, or an index past int32). */
int argmax_rows(const float *x, int64_t x_stride, int64_t num_rows, int64_t n, int64_t *out,
                int num_threads) {
#if defined(__AVX512F__)
    if (n > INT32_MAX - 16) return -1;
    int status = 0;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_rows * n >= 262144)
    for (int64_t r = 0; r < num_rows; r++) {
        out[r] = argmax_row(x + r * x_stride, n);
        if (out[r] < 0) {
#pragma omp atomic write
            status = 1;
        }
    }
    return status;
#else
    (void)x, (void)x_stride, (void)num_rows, (void)n, (void)out, (void)num_threads;
    return -1;
#endif
}
