/* A linear layer over GGUF weights for the few rows of a decode step (CPU), in bfloat16
 * activations and float sums: the layouts of q4_linear.c (4-bit) and q4_q8_linear.c
 * (Q8_0), and Q6_K's own (q6k.h), so no weights are kept twice.
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_gemv.py). A step of one sequence is bound by reading the weights.
 * PyTorch's int4 kernel reads 4 bits a weight but dequantizes every weight to float with
 * its scale and zero; the 4-bit GEMM of q4_linear.c first writes a whole strip of bfloat16
 * weights. Here a block's weights are turned into bfloat16 as they are (q - 8, small
 * integers, exact) and multiplied by the rows with `vdpbf16ps`; its scale and zero are
 * applied once per block and row:
 *
 *   sum_k w_k x_k = scale sum_k (q_k - 8) x_k + zero sum_k x_k       (4-bit)
 *   sum_k w_k x_k = d sum_k q_k x_k                                  (Q8_0, in float)
 *   sum_k w_k x_k = d_0 sum_{k<16} q_k x_k + d_1 sum_{k>=16} q_k x_k  (Q6_K, d_h = d sc)
 *
 * Q6_K weights (w = d sc (q - 32), a scale per 16 inputs) are read in Q6_K's own bits
 * (6.625 a weight, see pack_q6_k), their values turned into bfloat16 as the 4-bit ones are.
 *
 * `unpack_q8_bf16` writes Q8_0 weights back as bfloat16 rows, for a step of more rows than
 * these take (a MoE's Q8_0 experts, kept only in this layout: quant_moe.py).
 *
 * Every product is exact in float; sums are float. It is the same function of the same
 * weights as PyTorch's int4 kernel (bfloat16 scales and zeros) and as the dequantized
 * Q8_0 weights, rounded in another order.
 */
#include <stdint.h>
#include <stdlib.h>

#include "q6k.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_GEMV 1
#endif

#define MAX_ROWS 8   /* the most rows a call takes */
#define ROW_TILE 4   /* rows whose sums stay in registers */
#define Q4_STRIP 32  /* q4_linear.c's layout: 2 halves of 16 columns, 512 bytes a block */
#define Q8_STRIP 16  /* q4_q8_linear.c's Q8_0 layout: 512 bytes a block, 128 of scales */
#define BLOCK 32

#ifdef HAVE_GEMV
static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* sums[r][h][p % 2] += w . (row r's inputs 2p, 2p + 1), for the rows of a block */
static inline __attribute__((always_inline)) void add_pair(
    __m512 sums[ROW_TILE][2][2], __m512bh w, const uint16_t *x, int64_t x_stride, int p, int h,
    const int num_rows) {
    for (int r = 0; r < num_rows; r++) {
        int32_t pair;
        __builtin_memcpy(&pair, x + r * x_stride + 2 * p, sizeof pair);
        sums[r][h][p % 2] =
            _mm512_dpbf16_ps(sums[r][h][p % 2], w, (__m512bh)_mm512_set1_epi32(pair));
    }
}

/* A block's 4-bit weights against its rows: sums[r][h][p % 2] over the 16 input pairs p of
 * each half h. A pair's weights are 16 columns' (q_2p - 8, q_2p+1 - 8) as bfloat16 pairs,
 * looked up (vpermw, which reads the low 5 bits of each index word) from index words
 * holding q_2p in the low word's low nibble and q_2p+1 in the high word's. */
static inline __attribute__((always_inline)) void q4_block(
    __m512 sums[ROW_TILE][2][2], const uint16_t *x, int64_t x_stride, const uint8_t *packed,
    const __m512i table, const int num_rows) {
#ifdef __AVX512VBMI__
    /* From 64 bytes (4 pairs of a half) at once: vpermb puts column c's bytes of pairs p and
     * p + 1 in dword c as [p, p + 1, p, p + 1]; shifting the high word right by 4 makes the
     * index words of pair p (the low nibbles of the byte above each word's bit 4 are
     * ignored: the table repeats past 16); shifting both words right by 8 more, pair p + 1's. */
    static const uint8_t order[2][64] = {
#define BYTES(c, k) 16 * (2 * k) + c, 16 * (2 * k + 1) + c, 16 * (2 * k) + c, 16 * (2 * k + 1) + c
#define LANES(k)                                                                             \
    BYTES(0, k), BYTES(1, k), BYTES(2, k), BYTES(3, k), BYTES(4, k), BYTES(5, k), BYTES(6, k), \
        BYTES(7, k), BYTES(8, k), BYTES(9, k), BYTES(10, k), BYTES(11, k), BYTES(12, k),     \
        BYTES(13, k), BYTES(14, k), BYTES(15, k)
        {LANES(0)}, {LANES(1)}};
#undef LANES
#undef BYTES
    const __m512i high_by_4 = _mm512_set1_epi32(4 << 16);
    for (int p0 = 0; p0 < 16; p0 += 4)
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i bytes = _mm512_loadu_si512(packed + h * 256 + p0 * 16);
#pragma GCC unroll 2
            for (int k = 0; k < 2; k++) {
                const __m512i spread = _mm512_loadu_si512(order[k]);
                const __m512i index =
                    _mm512_srlv_epi16(_mm512_permutexvar_epi8(spread, bytes), high_by_4);
                add_pair(sums, (__m512bh)_mm512_permutexvar_epi16(index, table), x, x_stride,
                         p0 + 2 * k, h, num_rows);
                add_pair(sums,
                         (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(index, 8), table),
                         x, x_stride, p0 + 2 * k + 1, h, num_rows);
            }
        }
#else
    const __m512i mask = _mm512_set1_epi32(0x000F000F);
    for (int p0 = 0; p0 < 16; p0 += 2)
#pragma GCC unroll 2
        for (int j = 0; j < 2; j++)
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                /* a byte per column: input 2p in its low nibble, 2p + 1 in its high one */
                const int p = p0 + j;
                const __m512i bytes = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(packed + h * 256 + p * 16)));
                const __m512i index = _mm512_ternarylogic_epi32(
                    bytes, _mm512_slli_epi32(bytes, 12), mask, 0xA8); /* (a | b) & c */
                add_pair(sums, (__m512bh)_mm512_permutexvar_epi16(index, table), x, x_stride, p,
                         h, num_rows);
            }
#endif
}

/* y (16 columns of each half) for num_rows <= ROW_TILE rows, 4-bit weights of one strip.
 * x: bfloat16 rows x_stride apart; x_sums: per row and block, the float sum of its 32 x.
 * Each row's sums run in the same order whatever num_rows is: a row's result does not
 * depend on the rows beside it. */
static inline __attribute__((always_inline)) void q4_strip(
    const uint16_t *x, int64_t x_stride, const float *x_sums, int64_t num_blocks,
    const uint8_t *packed, const uint16_t *scales_zeros, const __m512i table,
    __m512 acc[ROW_TILE][2], const int num_rows) {
    for (int r = 0; r < num_rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++, packed += 512, scales_zeros += 64) {
        /* per row and half, the even and odd input pairs: 4 chains of vdpbf16ps a row */
        __m512 sums[ROW_TILE][2][2];
        for (int r = 0; r < num_rows; r++)
            sums[r][0][0] = sums[r][0][1] = sums[r][1][0] = sums[r][1][1] = _mm512_setzero_ps();
        q4_block(sums, x + b * BLOCK, x_stride, packed, table, num_rows);
        for (int h = 0; h < 2; h++) {
            const __m512 scale = load_bf16(scales_zeros + h * 32);
            const __m512 zero = load_bf16(scales_zeros + h * 32 + 16);
            for (int r = 0; r < num_rows; r++) {
                const __m512 s = _mm512_add_ps(sums[r][h][0], sums[r][h][1]);
                acc[r][h] = _mm512_fmadd_ps(s, scale, acc[r][h]);
                acc[r][h] = _mm512_fmadd_ps(zero, _mm512_set1_ps(x_sums[r * num_blocks + b]),
                                            acc[r][h]);
            }
        }
    }
}

/* The same for Q8_0 weights (16 columns, a float scale per block): x as float rows
 * (num_in apart). */
static inline __attribute__((always_inline)) void q8_strip(
    const float *xf, int64_t num_in, int64_t num_blocks, const int8_t *packed,
    const char *scales_offsets, __m512 acc[ROW_TILE], const int num_rows) {
    for (int r = 0; r < num_rows; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++) {
        const int8_t *w = packed + b * 512;
        const __m512 d = _mm512_loadu_ps((const float *)(const void *)(scales_offsets + b * 128));
        __m512 sums[ROW_TILE][4]; /* one per input of a run: four chains a row */
        for (int r = 0; r < num_rows; r++)
            for (int j = 0; j < 4; j++) sums[r][j] = _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int t = 0; t < 8; t++) {
            /* lane c: column c's inputs 4t .. 4t + 3, a byte each */
            const __m512i run = _mm512_loadu_si512((const void *)(w + 64 * t));
            for (int j = 0; j < 4; j++) {
                const __m512i shifted = j == 3 ? run : _mm512_slli_epi32(run, 24 - 8 * j);
                const __m512 q = _mm512_cvtepi32_ps(_mm512_srai_epi32(shifted, 24));
                for (int r = 0; r < num_rows; r++)
                    sums[r][j] = _mm512_fmadd_ps(
                        q, _mm512_set1_ps(xf[r * num_in + b * BLOCK + 4 * t + j]), sums[r][j]);
            }
        }
        for (int r = 0; r < num_rows; r++) {
            const __m512 s = _mm512_add_ps(_mm512_add_ps(sums[r][0], sums[r][1]),
                                           _mm512_add_ps(sums[r][2], sums[r][3]));
            acc[r] = _mm512_fmadd_ps(s, d, acc[r]);
        }
    }
}

static inline void store_row(const __m512 acc, const float *bias, int64_t col, int num_cols,
                             uint16_t *y) {
    const __mmask16 mask = num_cols >= 16 ? 0xFFFF : (__mmask16)((1u << num_cols) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(mask, bias + col) : _mm512_setzero_ps();
    _mm256_mask_storeu_epi16(y + col, mask, (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc, b)));
}

#define Q4_TILE(n)                                                                         \
    case n:                                                                                \
        q4_strip(xr, x_stride, x_sums + r * num_blocks, num_blocks, strip, sz, table, acc, \
                 n);                                                                       \
        break;
#define Q8_TILE(n)                                                                         \
    case n:                                                                                \
        q8_strip(xf + r * num_in, num_in, num_blocks, strip, sz, acc, n);                  \
        break;
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float), w
 * packed by q4_linear.c's pack_q4 (4-bit, 32-column strips, bfloat16 scales and zeros).
 * x rows are x_stride elements apart (even: pairs are read as 32 bits), each contiguous.
 * Returns 0; -1 where this kernel does not run (no AVX-512 BF16, num_in not a multiple of
 * 32, more than MAX_ROWS rows); -2 when out of memory. */
int q4_gemv(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
            const uint8_t *packed, const uint16_t *scales_zeros, const float *bias, void *y,
            int64_t num_out, int num_threads) {
#ifdef HAVE_GEMV
    if (num_in % BLOCK || num_rows > MAX_ROWS || num_rows < 1) return -1;
    const int64_t num_blocks = num_in / BLOCK, num_strips = (num_out + Q4_STRIP - 1) / Q4_STRIP;
    float *x_sums = malloc(sizeof(float) * (size_t)(num_rows * num_blocks));
    if (!x_sums) return -2;
    for (int64_t r = 0; r < num_rows; r++)
        for (int64_t b = 0; b < num_blocks; b++) {
            const __m512 lo = load_bf16((const uint16_t *)x + r * x_stride + b * BLOCK);
            const __m512 hi = load_bf16((const uint16_t *)x + r * x_stride + b * BLOCK + 16);
            x_sums[r * num_blocks + b] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
        }
    /* word i: bfloat16 of i - 8 (vpermw reads the low 5 bits of each index word) */
    uint16_t values[32];
    for (int i = 0; i < 32; i++) {
        const float v = (float)((i & 15) - 8);
        uint32_t bits;
        __builtin_memcpy(&bits, &v, sizeof bits);
        values[i] = (uint16_t)(bits >> 16); /* exact: small integers */
    }
    const __m512i table = _mm512_loadu_si512(values);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_strips > 1)
    for (int64_t s = 0; s < num_strips; s++) {
        const uint8_t *strip = packed + s * num_blocks * 512;
        const uint16_t *sz = scales_zeros + s * num_blocks * 64;
        for (int64_t r = 0; r < num_rows; r += ROW_TILE) {
            const int n = num_rows - r < ROW_TILE ? (int)(num_rows - r) : ROW_TILE;
            const uint16_t *xr = (const uint16_t *)x + r * x_stride;
            __m512 acc[ROW_TILE][2] = {{_mm512_setzero_ps()}}; /* every row set below */
            switch (n) { Q4_TILE(1) Q4_TILE(2) Q4_TILE(3) Q4_TILE(4) }
            for (int i = 0; i < n; i++)
                for (int h = 0; h < 2; h++) {
                    const int64_t col = s * Q4_STRIP + h * 16;
                    if (col < num_out)
                        store_row(acc[i][h], bias, col,
                                  num_out - col < 16 ? (int)(num_out - col) : 16,
                                  (uint16_t *)y + (r + i) * num_out);
                }
        }
    }
    free(x_sums);
    return 0;
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)scales_zeros;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* The same for Q8_0 weights packed by q4_q8_linear.c's pack_q8_q8 (16-column strips, float
 * scales; its int32 offsets are not read). */
int q8_gemv(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
            const int8_t *packed, const void *scales_offsets, const float *bias, void *y,
            int64_t num_out, int num_threads) {
#ifdef HAVE_GEMV
    if (num_in % BLOCK || num_rows > MAX_ROWS || num_rows < 1) return -1;
    const int64_t num_blocks = num_in / BLOCK, num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP;
    float *xf = malloc(sizeof(float) * (size_t)(num_rows * num_in));
    if (!xf) return -2;
    for (int64_t r = 0; r < num_rows; r++)
        for (int64_t k = 0; k < num_in; k += 16)
            _mm512_storeu_ps(xf + r * num_in + k, load_bf16((const uint16_t *)x + r * x_stride + k));
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_strips > 1)
    for (int64_t s = 0; s < num_strips; s++) {
        const int8_t *strip = packed + s * num_blocks * 512;
        const char *sz = (const char *)scales_offsets + s * num_blocks * 128;
        const int64_t col = s * Q8_STRIP;
        const int num_cols = num_out - col < Q8_STRIP ? (int)(num_out - col) : Q8_STRIP;
        for (int64_t r = 0; r < num_rows; r += ROW_TILE) {
            const int n = num_rows - r < ROW_TILE ? (int)(num_rows - r) : ROW_TILE;
            __m512 acc[ROW_TILE] = {_mm512_setzero_ps()}; /* every row set below */
            switch (n) { Q8_TILE(1) Q8_TILE(2) Q8_TILE(3) Q8_TILE(4) }
            for (int i = 0; i < n; i++)
                store_row(acc[i], bias, col, num_cols, (uint16_t *)y + (r + i) * num_out);
        }
    }
    free(xf);
    return 0;
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)scales_offsets;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* w (row_end - row_start, num_in) bfloat16, row-major = rows row_start .. row_end - 1 of the
 * Q8_0 weights q8_gemv reads, w = q d rounded to nearest even: what a larger step multiplies
 * by, unpacked for that step only. Returns 0; -1 where this kernel does not run (no AVX-512
 * BF16, num_in not a multiple of 32, rows out of range). */
int unpack_q8_bf16(const int8_t *packed, const void *scales_offsets, int64_t num_out,
                   int64_t num_in, int64_t row_start, int64_t row_end, void *w, int num_threads) {
#ifdef HAVE_GEMV
    if (num_in % BLOCK || row_start < 0 || row_end > num_out || row_start > row_end) return -1;
    const int64_t num_blocks = num_in / BLOCK, first = row_start / Q8_STRIP;
    const int64_t last = (row_end + Q8_STRIP - 1) / Q8_STRIP;
    /* run t holds column c's inputs 4t .. 4t + 3 at bytes 64 t + 4 c */
    const __m256i runs = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (last - first > 1)
    for (int64_t s = first; s < last; s++)
        for (int64_t b = 0; b < num_blocks; b++) {
            const int8_t *block = packed + (s * num_blocks + b) * 512;
            const float *d = (const float *)(const void *)((const char *)scales_offsets
                                                             + (s * num_blocks + b) * 128);
            for (int c = 0; c < Q8_STRIP; c++) {
                const int64_t n = s * Q8_STRIP + c;
                if (n < row_start || n >= row_end) continue;
                const __m256i q = _mm256_i32gather_epi32((const int *)(const void *)block + c,
                                                         runs, 4);
                uint16_t *out = (uint16_t *)w + (n - row_start) * num_in + b * BLOCK;
                const __m512 scale = _mm512_set1_ps(d[c]);
                for (int h = 0; h < 2; h++) {
                    const __m512 v = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                        h ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q)));
                    _mm256_storeu_si256((__m256i *)(out + 16 * h),
                                        (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(v, scale)));
                }
            }
        }
    return 0;
#else
    (void)packed, (void)scales_offsets, (void)num_out, (void)num_in, (void)row_start;
    (void)row_end, (void)w, (void)num_threads;
    return -1;
#endif
}

/* Q6_K weights in their own layout (q6k.h). A chunk widened to 32 words (column c's pair
 * in lane c) gives each weight's u in the low 6 bits of a word once its high bits are moved
 * beside its nibble (bits above 5 are not read), and `vpermi2w` turns u into the bfloat16
 * of u - 32 (exact): the pairs then go to `vdpbf16ps` with the rows' bfloat16 pairs, as
 * q4_strip does. Each half-block's sums are scaled by d sc, computed here in float (exact:
 * an 11-bit d times an int8). */

#ifdef HAVE_GEMV
/* `q4_strip` for Q6_K records: y (16 columns) for num_rows <= ROW_TILE rows of bfloat16 x. */
static inline __attribute__((always_inline)) void q6k_strip(
    const uint16_t *x, int64_t x_stride, int64_t num_blocks, const uint8_t *record,
    const float *d, const __m512i table_lo, const __m512i table_hi, __m512 acc[ROW_TILE],
    const int num_rows) {
    for (int r = 0; r < num_rows; r++) acc[r] = _mm512_setzero_ps();
    __m512 dv = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++, record += Q6K_RECORD) {
        if (b % Q6K_SUPER == 0) dv = _mm512_loadu_ps(d + (b / Q6K_SUPER) * 16);
        /* per row and half, the even and odd pairs: 4 chains of vdpbf16ps a row */
        __m512 sums[ROW_TILE][2][2];
        for (int r = 0; r < num_rows; r++)
            sums[r][0][0] = sums[r][0][1] = sums[r][1][0] = sums[r][1][1] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) {
            const __m512i high = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256((const __m256i *)(record + 256 + 32 * m)));
#pragma GCC unroll 2
            for (int s = 0; s < 2; s++) {
                const int k = m + 4 * s; /* pairs k (half 0, slot s) and k + 8 (slot s + 2) */
                __m512i i0, i1;
                q6k_pairs(record, high, m, s, &i0, &i1);
                const __m512bh w0 = (__m512bh)_mm512_permutex2var_epi16(table_lo, i0, table_hi);
                const __m512bh w1 = (__m512bh)_mm512_permutex2var_epi16(table_lo, i1, table_hi);
                for (int r = 0; r < num_rows; r++) {
                    int32_t p0, p1;
                    const uint16_t *xb = x + r * x_stride + b * BLOCK + 2 * k;
                    __builtin_memcpy(&p0, xb, sizeof p0);
                    __builtin_memcpy(&p1, xb + 16, sizeof p1);
                    sums[r][0][s] = _mm512_dpbf16_ps(sums[r][0][s], w0,
                                                     (__m512bh)_mm512_set1_epi32(p0));
                    sums[r][1][s] = _mm512_dpbf16_ps(sums[r][1][s], w1,
                                                     (__m512bh)_mm512_set1_epi32(p1));
                }
            }
        }
        for (int h = 0; h < 2; h++) {
            const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(record + 384 + 16 * h))));
            const __m512 scale = _mm512_mul_ps(dv, sc);
            for (int r = 0; r < num_rows; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_add_ps(sums[r][h][0], sums[r][h][1]), scale,
                                         acc[r]);
        }
    }
}

#define Q6K_TILE(n)                                                                        \
    case n:                                                                                \
        q6k_strip(xr, x_stride, num_blocks, strip, ds, table_lo, table_hi, acc, n);        \
        break;
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float), w
 * Q6_K weights packed by pack_q6_k (records and d). x as q4_gemv takes it. Returns 0; -1
 * where this kernel does not run (no AVX-512 BF16, num_in not a multiple of 256, more than
 * MAX_ROWS rows). */
int q6k_gemv(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
             const uint8_t *packed, const float *d, const float *bias, void *y,
             int64_t num_out, int num_threads) {
#ifdef HAVE_GEMV
    if (num_in % (BLOCK * Q6K_SUPER) || num_rows > MAX_ROWS || num_rows < 1) return -1;
    const int64_t num_blocks = num_in / BLOCK, num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP;
    /* word u of the two tables: bfloat16 of u - 32 (exact: small integers) */
    uint16_t values[64];
    for (int u = 0; u < 64; u++) {
        const float v = (float)(u - 32);
        uint32_t bits;
        __builtin_memcpy(&bits, &v, sizeof bits);
        values[u] = (uint16_t)(bits >> 16);
    }
    const __m512i table_lo = _mm512_loadu_si512(values), table_hi = _mm512_loadu_si512(values + 32);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_strips > 1)
    for (int64_t s = 0; s < num_strips; s++) {
        const uint8_t *strip = packed + s * num_blocks * Q6K_RECORD;
        const float *ds = d + s * (num_blocks / Q6K_SUPER) * 16;
        const int64_t col = s * Q8_STRIP;
        const int num_cols = num_out - col < Q8_STRIP ? (int)(num_out - col) : Q8_STRIP;
        for (int64_t r = 0; r < num_rows; r += ROW_TILE) {
            const int n = num_rows - r < ROW_TILE ? (int)(num_rows - r) : ROW_TILE;
            const uint16_t *xr = (const uint16_t *)x + r * x_stride;
            __m512 acc[ROW_TILE] = {_mm512_setzero_ps()}; /* every row set below */
            switch (n) { Q6K_TILE(1) Q6K_TILE(2) Q6K_TILE(3) Q6K_TILE(4) }
            for (int i = 0; i < n; i++)
                store_row(acc[i], bias, col, num_cols, (uint16_t *)y + (r + i) * num_out);
        }
    }
    return 0;
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)d;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* Packs Q6_K weights, values q - 32 (N, K) int8 in -32..31, sc (N, K / 16) int8 and d
 * (N, K / 256) float, K a multiple of 256, into the records above (ceil(N / 16) * (K / 32)
 * * Q6K_RECORD bytes) and d_out (ceil(N / 16) * (K / 256) * 16 floats); columns past N get
 * u = 32, sc = 0 and d = 0 (zero weights). */
void pack_q6_k(const int8_t *values, const int8_t *sc, const float *d, int64_t num_out,
               int64_t num_in, uint8_t *packed, float *d_out) {
    const int64_t num_strips = (num_out + Q8_STRIP - 1) / Q8_STRIP, num_blocks = num_in / BLOCK;
    const int64_t num_supers = num_in / (BLOCK * Q6K_SUPER);
    for (int64_t s = 0; s < num_strips; s++) {
        for (int64_t b = 0; b < num_blocks; b++) {
            uint8_t *out = packed + (s * num_blocks + b) * Q6K_RECORD;
            for (int i = 0; i < Q6K_RECORD; i++) out[i] = 0;
            for (int c = 0; c < Q8_STRIP; c++) {
                const int64_t n = s * Q8_STRIP + c;
                const int real = n < num_out;
                for (int k = 0; k < BLOCK; k++) {
                    const int u = (real ? values[n * num_in + b * BLOCK + k] : 0) + 32;
                    const int p = k / 2, i = k % 2, byte = 2 * c + i;
                    out[32 * (p % 8) + byte] |= (uint8_t)((u & 15) << (4 * (p / 8)));
                    out[256 + 32 * (p % 4) + byte] |= (uint8_t)((u >> 4) << (2 * (p / 4)));
                }
                for (int h = 0; h < 2; h++)
                    out[384 + 16 * h + c] = (uint8_t)(real ? sc[n * (num_in / 16) + 2 * b + h] : 0);
            }
        }
        for (int64_t t = 0; t < num_supers; t++)
            for (int c = 0; c < Q8_STRIP; c++) {
                const int64_t n = s * Q8_STRIP + c;
                d_out[(s * num_supers + t) * 16 + c] = n < num_out ? d[n * num_supers + t] : 0.f;
            }
    }
}
