/* A linear layer over 4-bit weights in GGUF's blocks of 32 (or Q8_0's 8-bit ones, below),
 * with the activations quantized to 8 bits in blocks of 32 as ggml quantizes them for its
 * own dot products (Q8_1: a scale per 32 inputs, round to nearest), on the CPU.
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through
 * ctypes (superinfer/model/cpu_w4a8.py, for `--quantization gguf-w4a8`). Where
 * q4_linear.c dequantizes the weights to bfloat16 (a strip per call) and multiplies with
 * `vdpbf16ps`, here the 4-bit values go to `vpdpbusd` as they are: 64 multiply-adds an
 * instruction instead of 32 (at the same instruction rate on Zen 4), and no dequantization
 * pass. Per block of 32 inputs, a row's sum is exact in int32:
 *
 *   sum_k w_k x_k = d_w dx sum_k q_k xq_k + m_w (dx sum_k xq_k)
 *
 * for weights w = d_w q + m_w (q in 0..15; Q4_0 has m_w = -8 d_w) and activations
 * x ~ dx xq (xq in -127..127, dx = max |x| / 127 over the block). The sums of blocks are
 * float, as ggml sums them. The error is the activations' rounding: half a step in 127 of
 * each block's largest value.
 *
 * Packed layout (made by `pack_q4_q8`): strips of 16 columns, each a run of K / 32 blocks
 * of 256 bytes: four runs of 64 bytes, run t holding at byte 4 * column + j input
 * 4 t + j in its low nibble and input 16 + 4 t + j in its high one (the lanes of
 * `vpdpbusd`: 4 inputs of one column). Beside it the float d_w and m_w,
 * [strip][block][d, m][column].
 *
 * Q8_0 weights (w = d_w q, q in -128..127: lm_head tied to a Q8_0 embedding) go through
 * `q8_q8_linear`: `vpdpbusd` takes one operand unsigned, here the activations, offset
 * by 128 (xq + 128 in 1..255), and the offset's share, 128 sum_k q_k per column and
 * block, is taken off the int32 sum exactly. Layout (made by `pack_q8_q8`): strips of 16
 * columns, blocks of 512 bytes, run t (of 8) holding at byte 4 * column + j the weight of
 * input 4 t + j; beside it [strip][block] 16 float d_w, then 16 int32 offsets.
 */
#include <stdint.h>
#include <stdlib.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_INT8_DOT 1
#endif

#define Q8_STRIP 16
#define Q8_BLOCK 32
#define Q8_ROW_TILE 12 /* rows whose int and float sums stay in registers (24 of 32) */

/* Packs q (N, K) nibbles (one per byte, 0..15) and float scales d and mins m (N, K / 32)
 * into the layout above; columns past N (to a multiple of 16) get zero weights. packed
 * holds ceil(N / 16) * K * 8 bytes, scales_mins ceil(N / 16) * (K / 32) * 32 floats. */
void pack_q4_q8(const uint8_t *q, const float *scales, const float *mins, int64_t num_out,
                int64_t num_in, uint8_t *packed, float *scales_mins) {
    const int64_t num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP, num_blocks = num_in / Q8_BLOCK;
    for (int64_t s = 0; s < num_strips; s++)
        for (int64_t b = 0; b < num_blocks; b++) {
            uint8_t *out = packed + (s * num_blocks + b) * 256;
            float *sm = scales_mins + (s * num_blocks + b) * 32;
            for (int col = 0; col < Q8_STRIP; col++) {
                const int64_t n = s * Q8_STRIP + col;
                const int real = n < num_out;
                sm[col] = real ? scales[n * num_blocks + b] : 0.f;
                sm[16 + col] = real ? mins[n * num_blocks + b] : 0.f;
                const uint8_t *in = q + n * num_in + b * Q8_BLOCK;
                for (int t = 0; t < 4; t++)
                    for (int j = 0; j < 4; j++)
                        out[t * 64 + 4 * col + j] =
                            real ? (uint8_t)((in[4 * t + j] & 15) | (in[16 + 4 * t + j] & 15) << 4)
                                 : 0;
            }
        }
}

/* Packs q (N, K) int8 weights and float scales d (N, K / 32) into the Q8_0 layout above;
 * columns past N get zero weights. packed holds ceil(N / 16) * K * 16 bytes, scales_offsets
 * ceil(N / 16) * (K / 32) * 128 bytes. */
void pack_q8_q8(const int8_t *q, const float *scales, int64_t num_out, int64_t num_in,
                int8_t *packed, void *scales_offsets) {
    const int64_t num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP, num_blocks = num_in / Q8_BLOCK;
    for (int64_t s = 0; s < num_strips; s++)
        for (int64_t b = 0; b < num_blocks; b++) {
            int8_t *out = packed + (s * num_blocks + b) * 512;
            float *d = (float *)((char *)scales_offsets + (s * num_blocks + b) * 128);
            int32_t *offset = (int32_t *)((char *)scales_offsets + (s * num_blocks + b) * 128 + 64);
            for (int col = 0; col < Q8_STRIP; col++) {
                const int64_t n = s * Q8_STRIP + col;
                const int real = n < num_out;
                const int8_t *in = q + n * num_in + b * Q8_BLOCK;
                int32_t sum = 0;
                for (int k = 0; k < Q8_BLOCK; k++) {
                    out[(k / 4) * 64 + 4 * col + k % 4] = real ? in[k] : 0;
                    sum += real ? in[k] : 0;
                }
                d[col] = real ? scales[n * num_blocks + b] : 0.f;
                offset[col] = 128 * sum;
            }
        }
}

#ifdef HAVE_INT8_DOT
/* One row of x (bfloat16) as int8 blocks: xq, and per block its scale dx and dx * sum(xq). */
static void quantize_row(const uint16_t *x, int64_t num_blocks, int8_t *xq, float *dx,
                         float *dx_sum) {
    for (int64_t b = 0; b < num_blocks; b++) {
        const __m512i raw = _mm512_loadu_si512((const void *)(x + b * Q8_BLOCK));
        const __m512 lo = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm512_castsi512_si256(raw)), 16));
        const __m512 hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm512_extracti64x4_epi64(raw, 1)), 16));
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        const float d = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
        const __m512 scale = _mm512_set1_ps(inverse);
        /* round to nearest (even): the default rounding of the conversion */
        const __m512i qlo = _mm512_cvtps_epi32(_mm512_mul_ps(lo, scale));
        const __m512i qhi = _mm512_cvtps_epi32(_mm512_mul_ps(hi, scale));
        _mm_storeu_si128((__m128i *)(xq + b * Q8_BLOCK), _mm512_cvtsepi32_epi8(qlo));
        _mm_storeu_si128((__m128i *)(xq + b * Q8_BLOCK + 16), _mm512_cvtsepi32_epi8(qhi));
        dx[b] = d;
        dx_sum[b] = d * (float)_mm512_reduce_add_epi32(_mm512_add_epi32(qlo, qhi));
    }
}

/* y[r] (16 columns from col, num_cols of them real) for num_rows <= Q8_ROW_TILE rows. */
static inline __attribute__((always_inline)) void rows_times_strip_q8(
    const int8_t *xq, const float *dx, const float *dx_sum, int64_t num_in, int64_t num_blocks,
    const uint8_t *packed, const float *scales_mins, const float *bias, uint16_t *y,
    int64_t y_stride, int64_t col, int num_cols, const int num_rows) {
    const __m512i nibble = _mm512_set1_epi8(15);
    __m512 acc[Q8_ROW_TILE];
    for (int r = 0; r < num_rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        const uint8_t *w = packed + b * 256;
        __m512i sums[Q8_ROW_TILE];
        for (int r = 0; r < num_rows; r++) sums[r] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            const __m512i raw = _mm512_loadu_si512((const void *)(w + 64 * t));
            const __m512i low = _mm512_and_si512(raw, nibble);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
            for (int r = 0; r < num_rows; r++) {
                const int32_t *xr = (const int32_t *)(const void *)(xq + r * num_in + b * Q8_BLOCK);
                sums[r] = _mm512_dpbusd_epi32(sums[r], low, _mm512_set1_epi32(xr[t]));
                sums[r] = _mm512_dpbusd_epi32(sums[r], high, _mm512_set1_epi32(xr[4 + t]));
            }
        }
        const __m512 d = _mm512_loadu_ps(scales_mins + b * 32);
        const __m512 m = _mm512_loadu_ps(scales_mins + b * 32 + 16);
        for (int r = 0; r < num_rows; r++) {
            const int64_t i = r * num_blocks + b;
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r]),
                                     _mm512_mul_ps(d, _mm512_set1_ps(dx[i])), acc[r]);
            acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(dx_sum[i]), acc[r]);
        }
    }
    const __mmask16 mask = num_cols >= 16 ? 0xFFFF : (__mmask16)((1u << num_cols) - 1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
    for (int r = 0; r < num_rows; r++)
        _mm256_mask_storeu_epi16(y + r * y_stride + col, mask,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r], b0)));
}

/* The same for Q8_0 weights (layout of pack_q8_q8). */
static inline __attribute__((always_inline)) void rows_times_strip_q8w(
    const int8_t *xq, const float *dx, int64_t num_in, int64_t num_blocks, const int8_t *packed,
    const char *scales_offsets, const float *bias, uint16_t *y, int64_t y_stride, int64_t col,
    int num_cols, const int num_rows) {
    const __m512i to_unsigned = _mm512_set1_epi32((int32_t)0x80808080); /* xq + 128 */
    __m512 acc[Q8_ROW_TILE];
    for (int r = 0; r < num_rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        const int8_t *w = packed + b * 512;
        __m512i sums[Q8_ROW_TILE];
        for (int r = 0; r < num_rows; r++) sums[r] = _mm512_setzero_si512();
        for (int t = 0; t < 8; t++) {
            const __m512i weights = _mm512_loadu_si512((const void *)(w + 64 * t));
            for (int r = 0; r < num_rows; r++) {
                const int32_t *xr = (const int32_t *)(const void *)(xq + r * num_in + b * Q8_BLOCK);
                const __m512i x4 = _mm512_xor_si512(_mm512_set1_epi32(xr[t]), to_unsigned);
                sums[r] = _mm512_dpbusd_epi32(sums[r], x4, weights);
            }
        }
        const __m512 d = _mm512_loadu_ps((const float *)(const void *)(scales_offsets + b * 128));
        const __m512i offset = _mm512_loadu_si512((const void *)(scales_offsets + b * 128 + 64));
        for (int r = 0; r < num_rows; r++) {
            const __m512i exact = _mm512_sub_epi32(sums[r], offset);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact),
                                     _mm512_mul_ps(d, _mm512_set1_ps(dx[r * num_blocks + b])),
                                     acc[r]);
        }
    }
    const __mmask16 mask = num_cols >= 16 ? 0xFFFF : (__mmask16)((1u << num_cols) - 1);
    const __m512 b0 = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
    for (int r = 0; r < num_rows; r++)
        _mm256_mask_storeu_epi16(y + r * y_stride + col, mask,
                                 (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r], b0)));
}

#define Q8W_ROWS_CASE(n)                                                                 \
    case n:                                                                              \
        rows_times_strip_q8w(xq, dx, num_in, num_blocks, packed, scales_offsets, bias, y, \
                             y_stride, col, num_cols, n);                                \
        break;

static void tile_rows_q8w(const int8_t *xq, const float *dx, int64_t num_in, int64_t num_blocks,
                          const int8_t *packed, const char *scales_offsets, const float *bias,
                          uint16_t *y, int64_t y_stride, int64_t col, int num_cols,
                          int num_rows) {
    switch (num_rows) {
        Q8W_ROWS_CASE(1) Q8W_ROWS_CASE(2) Q8W_ROWS_CASE(3) Q8W_ROWS_CASE(4) Q8W_ROWS_CASE(5)
        Q8W_ROWS_CASE(6) Q8W_ROWS_CASE(7) Q8W_ROWS_CASE(8) Q8W_ROWS_CASE(9) Q8W_ROWS_CASE(10)
        Q8W_ROWS_CASE(11) Q8W_ROWS_CASE(12)
    }
}

#define Q8_ROWS_CASE(n)                                                                  \
    case n:                                                                              \
        rows_times_strip_q8(xq, dx, dx_sum, num_in, num_blocks, packed, scales_mins, bias, \
                            y, y_stride, col, num_cols, n);                              \
        break;

static void tile_rows_q8(const int8_t *xq, const float *dx, const float *dx_sum, int64_t num_in,
                         int64_t num_blocks, const uint8_t *packed, const float *scales_mins,
                         const float *bias, uint16_t *y, int64_t y_stride, int64_t col,
                         int num_cols, int num_rows) {
    switch (num_rows) {
        Q8_ROWS_CASE(1) Q8_ROWS_CASE(2) Q8_ROWS_CASE(3) Q8_ROWS_CASE(4) Q8_ROWS_CASE(5)
        Q8_ROWS_CASE(6) Q8_ROWS_CASE(7) Q8_ROWS_CASE(8) Q8_ROWS_CASE(9) Q8_ROWS_CASE(10)
        Q8_ROWS_CASE(11) Q8_ROWS_CASE(12)
    }
}
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float),
 * w packed by pack_q4_q8 (is_q8 0) or pack_q8_q8 (is_q8 1), x quantized per block of 32 on
 * the way. x rows are x_stride elements apart, each contiguous; y is contiguous. Returns 0;
 * -1 where this kernel does not run (no AVX-512 VNNI and BF16, num_in not a multiple of
 * 32); -2 when out of memory. */
static int a8_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
                     const void *packed, const void *scales, const float *bias, void *y,
                     int64_t num_out, int num_threads, int is_q8) {
#ifdef HAVE_INT8_DOT
    if (num_in % Q8_BLOCK) return -1;
    const int64_t num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP, num_blocks = num_in / Q8_BLOCK;
    int8_t *xq = malloc((size_t)(num_rows * num_in));
    float *dx = malloc(sizeof(float) * (size_t)(2 * num_rows * num_blocks));
    if (!xq || !dx) {
        free(xq), free(dx);
        return -2;
    }
    float *dx_sum = dx + num_rows * num_blocks;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < num_rows; r++)
            quantize_row((const uint16_t *)x + r * x_stride, num_blocks, xq + r * num_in,
                         dx + r * num_blocks, dx_sum + r * num_blocks);
#pragma omp for schedule(static)
        for (int64_t s = 0; s < num_strips; s++) {
            const int64_t col = s * Q8_STRIP;
            const int num_cols = num_out - col < Q8_STRIP ? (int)(num_out - col) : Q8_STRIP;
            for (int64_t r = 0; r < num_rows; r += Q8_ROW_TILE) {
                const int n = num_rows - r < Q8_ROW_TILE ? (int)(num_rows - r) : Q8_ROW_TILE;
                uint16_t *out = (uint16_t *)y + r * num_out;
                if (is_q8)
                    tile_rows_q8w(xq + r * num_in, dx + r * num_blocks, num_in, num_blocks,
                                  (const int8_t *)packed + s * num_blocks * 512,
                                  (const char *)scales + s * num_blocks * 128, bias, out,
                                  num_out, col, num_cols, n);
                else
                    tile_rows_q8(xq + r * num_in, dx + r * num_blocks, dx_sum + r * num_blocks,
                                 num_in, num_blocks, (const uint8_t *)packed + s * num_blocks * 256,
                                 (const float *)scales + s * num_blocks * 32, bias, out,
                                 num_out, col, num_cols, n);
            }
        }
    }
    free(xq), free(dx);
    return 0;
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)scales;
    (void)bias, (void)y, (void)num_out, (void)num_threads, (void)is_q8;
    return -1;
#endif
}

int q4_q8_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
                 const uint8_t *packed, const float *scales_mins, const float *bias, void *y,
                 int64_t num_out, int num_threads) {
    return a8_linear(x, x_stride, num_rows, num_in, packed, scales_mins, bias, y, num_out,
                     num_threads, 0);
}

int q8_q8_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
                 const int8_t *packed, const void *scales_offsets, const float *bias, void *y,
                 int64_t num_out, int num_threads) {
    return a8_linear(x, x_stride, num_rows, num_in, packed, scales_offsets, bias, y, num_out,
                     num_threads, 1);
}
