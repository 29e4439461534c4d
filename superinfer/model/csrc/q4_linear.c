/* A linear layer over 4-bit weights in GGUF's blocks of 32, for any number of rows (CPU),
 * and the same GEMM over Q6_K weights in their own layout (q6k_linear, at the end).
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through
 * ctypes (superinfer/model/cpu_q4.py). PyTorch's int4 kernel reads 4 bits a weight, which
 * wins while a step is bound by reading the weights, but it dequantizes each weight once
 * per row: from 9 rows on a dense bfloat16 GEMM was faster, so every layer also kept a
 * bfloat16 copy of its weights (200 MB of the default model's 1 GB server). Here a thread
 * dequantizes a strip of 32 output columns once into a scratch buffer that stays in its
 * cache and then runs every row against it with `vdpbf16ps`: one pass over 4-bit weights,
 * the arithmetic of a bfloat16 GEMM.
 *
 * The weights are the dense copy's to the bit: w = fma(q - 8, scale, zero) in float,
 * rounded to bfloat16 (nearest even), with scale and zero already bfloat16 values (Q4_0:
 * zero 0; Q4_1: zero m + 8 d). Products of bfloat16 pairs are summed in float, as in a
 * bfloat16 GEMM, in another order than oneDNN's.
 *
 * On CPUs with AMX (q4_use_amx), the rows run on AMX tiles (amx_rows) against the same
 * scratch strip, whose layout is AMX's for the weights' operand.
 *
 * Packed layout (made by `pack_q4`): strips of 32 columns, each a run of K / 32 blocks of
 * 512 bytes: [half of the strip (2)][input pair within the block (16)][column (16)], the
 * byte holding input 2p in its low nibble and input 2p + 1 in its high one; beside it
 * the bfloat16 scales and zeros, [strip][block][half][scale, zero][column].
 */
#include <stdint.h>
#include <stdlib.h>

#include "q6k.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>
#define HAVE_BF16_DOT 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define HAVE_AMX 1
#endif
#endif

#define STRIP 32
#define BLOCK 32
#define ROW_TILE 12 /* rows whose 2 x 16 float sums stay in registers (24 of 32) */

static int is_amx_on = 0; /* see q4_use_amx */

/* Packs q (N, K) nibbles (one per byte, 0..15), bfloat16 scales and zeros (N, K / 32)
 * into the layout above; columns past N (to a multiple of 32) get zero weights. packed
 * holds ceil(N / 32) * K * 16 bytes, scales_zeros ceil(N / 32) * (K / 32) * 64 bfloat16. */
void pack_q4(const uint8_t *q, const uint16_t *scales, const uint16_t *zeros, int64_t num_out,
             int64_t num_in, uint8_t *packed, uint16_t *scales_zeros) {
    const int64_t num_strips = (num_out + STRIP - 1) / STRIP, num_blocks = num_in / BLOCK;
    for (int64_t s = 0; s < num_strips; s++)
        for (int64_t b = 0; b < num_blocks; b++) {
            uint8_t *out = packed + (s * num_blocks + b) * 512;
            uint16_t *sz = scales_zeros + (s * num_blocks + b) * 64;
            for (int h = 0; h < 2; h++)
                for (int col = 0; col < 16; col++) {
                    const int64_t n = s * STRIP + h * 16 + col;
                    const int real = n < num_out;
                    sz[h * 32 + col] = real ? scales[n * num_blocks + b] : 0;
                    sz[h * 32 + 16 + col] = real ? zeros[n * num_blocks + b] : 0;
                    for (int p = 0; p < 16; p++) {
                        const uint8_t *pair = q + n * num_in + b * BLOCK + 2 * p;
                        out[h * 256 + p * 16 + col] =
                            real ? (uint8_t)((pair[0] & 15) | (pair[1] & 15) << 4) : 0x88;
                    }
                }
        }
}

#ifdef HAVE_BF16_DOT
static inline __m512 load_bf16(const uint16_t *p) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}

/* One strip's weights as bfloat16 pairs, [input pair][half][column] (32-bit lanes). A
 * table lookup (vpermps, on the low 4 bits of each lane) gives q - 8 as a float; both
 * halves of a pair are rounded in one instruction and interleaved by one vpermw. */
static void dequantize_strip(const uint8_t *packed, const uint16_t *sz, int64_t num_blocks,
                             uint32_t *w) {
    float values[16];
    uint16_t order[32]; /* lane j: the low input's word j, then the high input's word 16 + j */
    for (int i = 0; i < 16; i++) {
        values[i] = (float)(i - 8);
        order[2 * i] = (uint16_t)i, order[2 * i + 1] = (uint16_t)(16 + i);
    }
    const __m512 table = _mm512_loadu_ps(values);
    const __m512i interleave = _mm512_loadu_si512(order);
    for (int64_t b = 0; b < num_blocks; b++, packed += 512, sz += 64)
        for (int h = 0; h < 2; h++) {
            const __m512 scale = load_bf16(sz + h * 32);
            const __m512 zero = load_bf16(sz + h * 32 + 16);
            for (int p = 0; p < 16; p++) {
                const __m512i bytes = _mm512_cvtepu8_epi32(
                    _mm_loadu_si128((const __m128i *)(packed + h * 256 + p * 16)));
                const __m512 lo = _mm512_permutexvar_ps(bytes, table);
                const __m512 hi = _mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
                const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(
                    _mm512_fmadd_ps(hi, scale, zero), _mm512_fmadd_ps(lo, scale, zero));
                _mm512_storeu_si512(w + ((b * 16 + p) * 2 + h) * 16,
                                    _mm512_permutexvar_epi16(interleave, halves));
            }
        }
}

/* The masks of a strip's two halves of 16 columns, num_cols of its 32 real. */
static inline __mmask16 half_mask(int num_cols, int h) {
    const int n = num_cols - 16 * h;
    return n >= 16 ? 0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
}

/* out[0..32) (num_cols of them real) = (s0, s1) + (b0, b1), rounded to bfloat16 in one
 * conversion and stored in one write where the strip is whole. */
static inline __attribute__((always_inline)) void store_row(
    uint16_t *out, __m512 s0, __m512 s1, __m512 b0, __m512 b1, int num_cols) {
    const __m512i both =
        (__m512i)_mm512_cvtne2ps_pbh(_mm512_add_ps(s1, b1), _mm512_add_ps(s0, b0));
    if (num_cols == STRIP) {
        _mm512_storeu_si512(out, both);
    } else {
        _mm256_mask_storeu_epi16(out, half_mask(num_cols, 0), _mm512_castsi512_si256(both));
        _mm256_mask_storeu_epi16(out + 16, half_mask(num_cols, 1),
                                 _mm512_extracti64x4_epi64(both, 1));
    }
}

/* The bias of columns [col, col + 32), zero past num_cols (or without a bias). */
static inline void load_bias(const float *bias, int64_t col, int num_cols, __m512 *b0,
                             __m512 *b1) {
    *b0 = *b1 = _mm512_setzero_ps();
    if (bias) {
        *b0 = _mm512_maskz_loadu_ps(half_mask(num_cols, 0), bias + col);
        *b1 = _mm512_maskz_loadu_ps(half_mask(num_cols, 1), bias + col + 16);
    }
}

/* y[r] (32 columns from col, num_cols of them real) = acc[r] + bias, rounded to bfloat16. */
static inline __attribute__((always_inline)) void store_rows(
    __m512 acc[][2], const float *bias, uint16_t *y, int64_t y_stride, int64_t col,
    int num_cols, const int num_rows) {
    __m512 b0, b1;
    load_bias(bias, col, num_cols, &b0, &b1);
    for (int r = 0; r < num_rows; r++)
        store_row(y + r * y_stride + col, acc[r][0], acc[r][1], b0, b1, num_cols);
}

/* acc[r] += the products of rows r of x with the strip's input pairs [begin, end), for
 * num_rows rows (2 x 16 float sums each, in registers). */
static inline __attribute__((always_inline)) void add_pairs(
    __m512 acc[][2], const uint32_t *x, int64_t x_stride, const uint32_t *w, int64_t begin,
    int64_t end, const int num_rows) {
    for (int64_t p = begin; p < end; p++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + p * 32);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + p * 32 + 16);
        for (int r = 0; r < num_rows; r++) {
            const __m512bh xr = (__m512bh)_mm512_set1_epi32((int)x[r * x_stride + p]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xr, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xr, w1);
        }
    }
}

/* y[r] (32 columns from col, num_cols of them real) for num_rows <= ROW_TILE rows of x. */
static inline __attribute__((always_inline)) void rows_times_strip(
    const uint32_t *x, int64_t x_stride, const uint32_t *w, int64_t num_pairs,
    const float *bias, uint16_t *y, int64_t y_stride, int64_t col, int num_cols,
    const int num_rows) {
    __m512 acc[ROW_TILE][2];
    for (int r = 0; r < num_rows; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    add_pairs(acc, x, x_stride, w, 0, num_pairs, num_rows);
    store_rows(acc, bias, y, y_stride, col, num_cols, num_rows);
}

#define ROWS_CASE(n)                                                                       \
    case n:                                                                                \
        rows_times_strip(x, x_stride, w, num_pairs, bias, y, y_stride, col, num_cols, n); \
        break;

static void tile_rows(const uint32_t *x, int64_t x_stride, const uint32_t *w, int64_t num_pairs,
                      const float *bias, uint16_t *y, int64_t y_stride, int64_t col,
                      int num_cols, int num_rows) {
    switch (num_rows) {
        ROWS_CASE(1) ROWS_CASE(2) ROWS_CASE(3) ROWS_CASE(4) ROWS_CASE(5) ROWS_CASE(6)
        ROWS_CASE(7) ROWS_CASE(8) ROWS_CASE(9) ROWS_CASE(10) ROWS_CASE(11) ROWS_CASE(12)
    }
}

#ifdef HAVE_AMX
/* AMX (Sapphire Rapids and later): a tile multiply-add takes 16 rows of x by 16 input
 * pairs against 16 columns' pairs, where vdpbf16ps takes one row and one pair. The
 * scratch strip is already AMX's layout for the second operand: a row of tile per input
 * pair, 16 columns' bfloat16 pairs in it, a half's rows 128 bytes apart. Each row of the
 * result still depends on that row of x alone; the sums run in AMX's order, not the
 * AVX-512 rows' (both are float sums of exact products). Linux lends AMX's registers to
 * a process only when asked (arch_prctl), once. */
#define AMX_ROWS 32
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

/* The row count of the tile shapes this thread loaded last inside gemm_by_strips (0: none
 * yet in this call). */
static __thread int amx_num_rows;

/* The tile shapes for a group of num_rows <= AMX_ROWS rows: tiles 0-3 sum (group of 16
 * rows, half of the strip), 4 and 5 hold the groups' pairs of x, 6 and 7 the strip's
 * halves' pairs. */
static void amx_configure(int num_rows) {
    const int rows0 = num_rows < 16 ? num_rows : 16, rows1 = num_rows - rows0;
    struct amx_config config __attribute__((aligned(64))) = {.palette = 1};
    const int rows_of[8] = {rows0, rows0, rows1, rows1, rows0, rows1, 16, 16}; /* per tile */
    for (int t = 0; t < 8; t++) {
        config.rows[t] = (uint8_t)rows_of[t];
        config.bytes_per_row[t] = rows_of[t] ? 64 : 0;
    }
    _tile_loadconfig(&config);
    amx_num_rows = num_rows;
}

/* y[r] (32 columns from col, num_cols of them real) for num_rows <= AMX_ROWS rows of x, in
 * two groups of up to 16 (tiles as amx_configure lays them out), the strip's pairs loaded
 * once for both groups. The tile shapes are loaded only when the row count differs from
 * the last group's: a configuration costs as much as a few tile products, and every
 * strip of a call has the same groups. Runs inside gemm_by_strips, which forgets the
 * shapes at the start of a call (other code may load its own) and releases the tiles. */
static void amx_rows(const uint32_t *x, int64_t x_stride, const uint32_t *w, int64_t num_pairs,
                     const float *bias, uint16_t *y, int64_t y_stride, int64_t col,
                     int num_cols, int num_rows) {
    const int rows1 = num_rows > 16 ? num_rows - 16 : 0;
    if (num_rows != amx_num_rows) amx_configure(num_rows);
    _tile_zero(0);
    _tile_zero(1);
    if (rows1) {
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t p = 0; p < num_pairs; p += 16) {
        _tile_loadd(6, w + p * 32, 128);
        _tile_loadd(7, w + p * 32 + 16, 128);
        _tile_loadd(4, x + p, x_stride * 4);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        if (rows1) {
            _tile_loadd(5, x + 16 * x_stride + p, x_stride * 4);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
    float sums[2][2][16][16] __attribute__((aligned(64))); /* [group][half][row][column] */
    _tile_stored(0, sums[0][0], 64);
    _tile_stored(1, sums[0][1], 64);
    if (rows1) {
        _tile_stored(2, sums[1][0], 64);
        _tile_stored(3, sums[1][1], 64);
    }
    /* straight from the tiles' stores: copying them into an array of rows first, as the
     * AVX-512 rows keep theirs, made a 512-row GEMM 2-15% slower */
    __m512 b0, b1;
    load_bias(bias, col, num_cols, &b0, &b1);
    for (int r = 0; r < num_rows; r++)
        store_row(y + r * y_stride + col, _mm512_load_ps(sums[r / 16][0][r % 16]),
                  _mm512_load_ps(sums[r / 16][1][r % 16]), b0, b1, num_cols);
}

#define ROWS_FN (is_amx_on ? amx_rows : tile_rows)
#define ROW_TILE_OR_AMX (is_amx_on ? AMX_ROWS : ROW_TILE)
#else
#define ROWS_FN tile_rows
#define ROW_TILE_OR_AMX ROW_TILE
#endif

/* What a GEMM reads: a layer's packed weights and their scales, and how its layout runs:
 * `dequantize` writes strip s (32 columns) into a thread's scratch (bfloat16 pairs, then
 * `num_scratch_floats` more a pair of inputs), and `rows` runs up to `row_tile` rows of x
 * against it. */
struct gguf_weights;
typedef void (*dequantize_fn)(const struct gguf_weights *weights, int64_t s, uint32_t *w);
typedef void (*rows_fn)(const uint32_t *x, int64_t x_stride, const uint32_t *w,
                        int64_t num_pairs, const float *bias, uint16_t *y, int64_t y_stride,
                        int64_t col, int num_cols, int num_rows);
struct gguf_weights {
    const uint8_t *packed;
    const void *scales;
    int64_t num_out, num_in;
    dequantize_fn dequantize;
    rows_fn rows;
    int row_tile;
    int num_scratch_floats;
};

/* Rows of x one pass over the strips runs: at most ROW_BLOCK_BYTES of them, in blocks of
 * equal size (multiples of 32 rows). Every strip's pass reads all of a block's rows again;
 * past the L2 cache (2 MB a core on this project's Xeon) each pass streamed them from
 * memory, and 2,048 rows of K = 576 ran at about half of 512 rows' speed. Each block
 * dequantizes the strips again, a few percent of its work. */
#define ROW_BLOCK_BYTES (3 << 19)

static int64_t rows_per_block(int64_t num_rows, int64_t num_in) {
    int64_t most = ROW_BLOCK_BYTES / (num_in * 2) / 32 * 32;
    if (most < 32) most = 32;
    if (num_rows <= most) return most;
    const int64_t num_blocks = (num_rows + most - 1) / most;
    const int64_t rows = (num_rows + num_blocks - 1) / num_blocks;
    return (rows + 31) / 32 * 32;
}

/* y = x @ w.T (+ bias): for each block of rows, each thread dequantizes a strip into its
 * scratch buffer, then runs the block's rows of x against it. Returns 0, or -2 when out of
 * memory. */
static int gemm_by_strips(const void *x, int64_t x_stride, int64_t num_rows,
                          const struct gguf_weights *weights, const float *bias, void *y,
                          int num_threads) {
    const int64_t num_out = weights->num_out, num_pairs = weights->num_in / 2;
    const int64_t num_strips = (num_out + STRIP - 1) / STRIP;
    const int64_t block = rows_per_block(num_rows, weights->num_in);
    const int tile = weights->row_tile;
    const size_t scratch = (size_t)num_pairs * (STRIP + weights->num_scratch_floats) * 4;
    int status = 0;
#pragma omp parallel num_threads(num_threads)
    {
        uint32_t *w = aligned_alloc(64, scratch);
        if (!w) {
#pragma omp atomic write
            status = -2;
        }
#ifdef HAVE_AMX
        const int is_amx = weights->rows == amx_rows;
        amx_num_rows = 0; /* see amx_rows */
#endif
        for (int64_t r0 = 0; r0 < num_rows; r0 += block) {
            const int64_t r1 = num_rows - r0 < block ? num_rows : r0 + block;
#pragma omp for schedule(static)
            for (int64_t s = 0; s < num_strips; s++) {
                if (!w) continue;
                weights->dequantize(weights, s, w);
                const int64_t col = s * STRIP;
                const int num_cols = num_out - col < STRIP ? (int)(num_out - col) : STRIP;
                for (int64_t r = r0; r < r1; r += tile) {
                    const int n = r1 - r < tile ? (int)(r1 - r) : tile;
                    weights->rows((const uint32_t *)((const uint16_t *)x + r * x_stride),
                                  x_stride / 2, w, num_pairs, bias,
                                  (uint16_t *)y + r * num_out, num_out, col, num_cols, n);
                }
            }
        }
#ifdef HAVE_AMX
        if (is_amx && amx_num_rows) _tile_release();
        amx_num_rows = 0;
#endif
        free(w);
    }
    return status;
}

static void dequantize_q4_strip(const struct gguf_weights *weights, int64_t s, uint32_t *w) {
    const int64_t num_blocks = weights->num_in / BLOCK;
    dequantize_strip(weights->packed + s * num_blocks * 512,
                     (const uint16_t *)weights->scales + s * num_blocks * 64, num_blocks, w);
}
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float),
 * w packed by pack_q4. x rows are x_stride elements apart, each contiguous; y is
 * contiguous. Returns 0; -1 where this kernel does not run (no AVX-512 BF16, num_in not a
 * multiple of 32); -2 when out of memory. */
int q4_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
              const uint8_t *packed, const uint16_t *scales_zeros, const float *bias, void *y,
              int64_t num_out, int num_threads) {
#ifdef HAVE_BF16_DOT
    if (num_in % BLOCK || x_stride % 2) return -1;
    const struct gguf_weights weights = {packed, scales_zeros, num_out, num_in,
                                         dequantize_q4_strip, ROWS_FN, ROW_TILE_OR_AMX, 0};
    return gemm_by_strips(x, x_stride, num_rows, &weights, bias, y, num_threads);
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)scales_zeros;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* Q8_0 weights (lm_head tied to a Q8_0 embedding) for any number of rows, read in the
 * few-row GEMV's own 8-bit layout (q4_q8_linear.c's pack_q8_q8: strips of 16 columns,
 * blocks of 512 bytes whose run t of 64 holds input 4t + j of column c at byte 4c + j;
 * beside each block 16 float d, then 16 int32 offsets, not read here), so the layer keeps
 * no dense copy. A strip of 32 columns here is two of those; each weight d q in float,
 * rounded to bfloat16: the dense copy's and unpack_q8_bf16's weights. */
#ifdef HAVE_BF16_DOT
#define Q8_STRIP 16
static void dequantize_q8_strip(const struct gguf_weights *weights, int64_t s, uint32_t *w) {
    const int64_t num_blocks = weights->num_in / BLOCK;
    const int64_t num_q8_strips = (weights->num_out + Q8_STRIP - 1) / Q8_STRIP;
    uint16_t order[32]; /* as dequantize_strip's: lane j holds the pair's words j, 16 + j */
    for (int i = 0; i < 16; i++) order[2 * i] = (uint16_t)i, order[2 * i + 1] = (uint16_t)(16 + i);
    const __m512i interleave = _mm512_loadu_si512(order);
    for (int h = 0; h < 2; h++) {
        const int64_t q8_strip = 2 * s + h;
        for (int64_t b = 0; b < num_blocks; b++) {
            uint32_t *out = w + (b * 16 * 2 + h) * 16; /* pair p at out + p * 32 */
            if (q8_strip >= num_q8_strips) { /* columns past num_out: zero weights */
                for (int p = 0; p < 16; p++)
                    _mm512_storeu_si512(out + p * 32, _mm512_setzero_si512());
                continue;
            }
            const int64_t record = q8_strip * num_blocks + b;
            const int8_t *q = (const int8_t *)weights->packed + record * 512;
            const __m512 d = _mm512_loadu_ps((const char *)weights->scales + record * 128);
            for (int t = 0; t < 8; t++) { /* inputs 4t .. 4t + 3: pairs 2t and 2t + 1 */
                const __m512i v = _mm512_loadu_si512(q + 64 * t);
                __m512 f[4];
                for (int j = 0; j < 4; j++)
                    f[j] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srai_epi32(
                                             _mm512_slli_epi32(v, 24 - 8 * j), 24)), d);
                for (int k = 0; k < 2; k++) {
                    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(f[2 * k + 1], f[2 * k]);
                    _mm512_storeu_si512(out + (2 * t + k) * 32,
                                        _mm512_permutexvar_epi16(interleave, halves));
                }
            }
        }
    }
}
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float),
 * w Q8_0 in pack_q8_q8's layout (packed int8, scales_offsets its float d and offsets).
 * Returns as q4_linear. */
int q8_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
              const int8_t *packed, const void *scales_offsets, const float *bias, void *y,
              int64_t num_out, int num_threads) {
#ifdef HAVE_BF16_DOT
    if (num_in % BLOCK || x_stride % 2) return -1;
    const struct gguf_weights weights = {(const uint8_t *)packed, scales_offsets, num_out, num_in,
                                         dequantize_q8_strip, ROWS_FN, ROW_TILE_OR_AMX, 0};
    return gemm_by_strips(x, x_stride, num_rows, &weights, bias, y, num_threads);
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)scales_offsets;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* Q6_K weights (q6k.h) for any number of rows: the 4-bit GEMM's loop over strips of 32
 * columns (two of Q6_K's strips of 16), dequantized from Q6_K's own bits into a thread's
 * scratch, so a Q6_K layer keeps no dense copy for prefill and batched decode. Two ways,
 * by the rows of the step:
 *
 * - up to Q6K_SCALED_MAX_ROWS rows (a batched decode step), a strip holds q - 32 (-32..31,
 *   exact in bfloat16, one table lookup a word) and, per 16 inputs, the columns' d sc;
 *   each row sums 16 inputs' products in float and adds that sum times d sc to its total,
 *   as q6k_gemv does. Dequantizing a weight with a multiply and a rounding costs more than
 *   these few rows' products with it (benchmarks/q6k_gemm.py: 0.85-0.95x the time at 9-16
 *   rows);
 * - beyond, a strip holds the weights, (d sc) (q - 32) in float rounded to bfloat16, and
 *   runs the 4-bit GEMM's rows: the sums' extra multiply-adds (one per 16 inputs) would
 *   cost more than the rounding saves.
 *
 * d sc is exact in float, as gguf's dequantizer computes it. Through a one-hot input
 * either way gives the dense copy's weight to the bit: (d sc) (q - 32) rounded to float,
 * then to bfloat16. */
#ifdef HAVE_BF16_DOT
#define Q6K_SCALED_MAX_ROWS 24 /* cpu_q4.Q6K_SCALED_MAX_ROWS */
#define Q6K_ROW_TILE 6 /* rows whose totals and 16-input sums (4 x 6 of 32 registers) fit */
#define Q6K_GROUP_PAIRS 8 /* input pairs under one d sc */

/* y[r] (32 columns from col, num_cols of them real) for num_rows <= Q6K_ROW_TILE rows of x,
 * against a strip of q - 32 and d sc. */
static inline __attribute__((always_inline)) void rows_times_scaled_strip(
    const uint32_t *x, int64_t x_stride, const uint32_t *w, int64_t num_pairs,
    const float *bias, uint16_t *y, int64_t y_stride, int64_t col, int num_cols,
    const int num_rows) {
    const float *scales = (const float *)(w + num_pairs * STRIP);
    __m512 acc[Q6K_ROW_TILE][2];
    for (int r = 0; r < num_rows; r++)
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t g = 0; g < num_pairs / Q6K_GROUP_PAIRS; g++) {
        __m512 sum[Q6K_ROW_TILE][2];
        for (int r = 0; r < num_rows; r++)
            sum[r][0] = sum[r][1] = _mm512_setzero_ps();
        add_pairs(sum, x, x_stride, w, g * Q6K_GROUP_PAIRS, (g + 1) * Q6K_GROUP_PAIRS, num_rows);
        const __m512 s0 = _mm512_loadu_ps(scales + g * 32);
        const __m512 s1 = _mm512_loadu_ps(scales + g * 32 + 16);
        for (int r = 0; r < num_rows; r++) {
            acc[r][0] = _mm512_fmadd_ps(sum[r][0], s0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(sum[r][1], s1, acc[r][1]);
        }
    }
    store_rows(acc, bias, y, y_stride, col, num_cols, num_rows);
}

#define SCALED_ROWS_CASE(n)                                                                  \
    case n:                                                                                  \
        rows_times_scaled_strip(x, x_stride, w, num_pairs, bias, y, y_stride, col, num_cols, \
                                n);                                                          \
        break;

static void tile_scaled_rows(const uint32_t *x, int64_t x_stride, const uint32_t *w,
                             int64_t num_pairs, const float *bias, uint16_t *y,
                             int64_t y_stride, int64_t col, int num_cols, int num_rows) {
    switch (num_rows) {
        SCALED_ROWS_CASE(1) SCALED_ROWS_CASE(2) SCALED_ROWS_CASE(3)
        SCALED_ROWS_CASE(4) SCALED_ROWS_CASE(5) SCALED_ROWS_CASE(6)
    }
}

/* The lookups and permutation a strip's words go through (q6k_pairs gives them as words,
 * word 2 c + i: column c's input 2 k + i, where the scratch wants them). */
struct q6k_tables {
    __m512i low, high; /* q - 32 as bfloat16 for u = 0..31, 32..63 (exact: 6-bit integers) */
    __m512i interleave; /* as dequantize_strip's: lane j gets word j, then word 16 + j */
};

static void make_q6k_tables(struct q6k_tables *t) {
    uint16_t values[64], order[32];
    for (int i = 0; i < 64; i++) {
        const float v = (float)(i - 32);
        uint32_t bits;
        __builtin_memcpy(&bits, &v, 4);
        values[i] = (uint16_t)(bits >> 16);
    }
    for (int i = 0; i < 16; i++) order[2 * i] = (uint16_t)i, order[2 * i + 1] = (uint16_t)(16 + i);
    t->low = _mm512_loadu_si512(values), t->high = _mm512_loadu_si512(values + 32);
    t->interleave = _mm512_loadu_si512(order);
}

/* 16 columns' inputs 2p, 2p + 1 (u in the low 6 bits of each word of `u`, higher bits
 * ignored) as bfloat16 pairs at w[column]: q - 32 by vpermt2w's lookup of those 6 bits,
 * or, when `scale` (the columns' d sc) is given, (d sc) (q - 32) rounded. */
static inline __attribute__((always_inline)) void store_q6k_pairs(
    __m512i u, const __m512 *scale, const struct q6k_tables *t, uint32_t *w) {
    if (!scale) {
        _mm512_storeu_si512(w, _mm512_permutex2var_epi16(t->low, u, t->high));
        return;
    }
    const __m512i six = _mm512_set1_epi32(0x3F);
    const __m512 offset = _mm512_set1_ps(32.f);
    const __m512 lo = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(u, six)), offset);
    const __m512 hi = _mm512_sub_ps(
        _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(u, 16), six)), offset);
    const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, *scale),
                                                         _mm512_mul_ps(lo, *scale));
    _mm512_storeu_si512(w, _mm512_permutexvar_epi16(t->interleave, halves));
}

/* One Q6_K strip (16 columns) into half h of a scratch strip, [input pair][half][column]:
 * the weights rounded, or (`scales` given) q - 32, and d sc at scales[16 inputs][half]. */
static inline __attribute__((always_inline)) void dequantize_q6k_strip(
    const uint8_t *record, const float *d, int64_t num_blocks, int h, uint32_t *w,
    float *scales) {
    struct q6k_tables t;
    make_q6k_tables(&t);
    __m512 dv = _mm512_setzero_ps();
    for (int64_t b = 0; b < num_blocks; b++, record += Q6K_RECORD) {
        if (b % Q6K_SUPER == 0) dv = _mm512_loadu_ps(d + (b / Q6K_SUPER) * Q6K_STRIP);
        __m512 scale[2];
        for (int half = 0; half < 2; half++) {
            scale[half] = _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                _mm_loadu_si128((const __m128i *)(record + 384 + 16 * half)))));
            if (scales) _mm512_storeu_ps(scales + (b * 2 + half) * 32 + h * 16, scale[half]);
        }
        for (int m = 0; m < 4; m++) {
            const __m512i high = _mm512_cvtepu8_epi16(
                _mm256_loadu_si256((const __m256i *)(record + 256 + 32 * m)));
            for (int s = 0; s < 2; s++) {
                const int k = m + 4 * s; /* pairs k and k + 8 */
                __m512i u0, u1;
                q6k_pairs(record, high, m, s, &u0, &u1);
                store_q6k_pairs(u0, scales ? 0 : &scale[0], &t, w + ((b * 16 + k) * 2 + h) * 16);
                store_q6k_pairs(u1, scales ? 0 : &scale[1], &t,
                                w + ((b * 16 + k + 8) * 2 + h) * 16);
            }
        }
    }
}

/* Strip s of a GEMM: Q6_K's strips 2 s and 2 s + 1 (zero weights, and scales, past the
 * last one: a scale left unwritten could be a NaN). */
static inline __attribute__((always_inline)) void dequantize_q6k_strips(
    const struct gguf_weights *weights, int64_t s, uint32_t *w, int is_scaled) {
    const int64_t num_blocks = weights->num_in / BLOCK, num_supers = num_blocks / Q6K_SUPER;
    const int64_t num_pairs = weights->num_in / 2;
    const int64_t num_q6k_strips = (weights->num_out + Q6K_STRIP - 1) / Q6K_STRIP;
    float *scales = is_scaled ? (float *)(w + num_pairs * STRIP) : 0;
    for (int h = 0; h < 2; h++) {
        const int64_t t = 2 * s + h; /* the Q6_K strip in this half */
        if (t < num_q6k_strips) {
            dequantize_q6k_strip(weights->packed + t * num_blocks * Q6K_RECORD,
                                 (const float *)weights->scales + t * num_supers * Q6K_STRIP,
                                 num_blocks, h, w, scales);
            continue;
        }
        for (int64_t p = 0; p < num_pairs; p++)
            _mm512_storeu_si512(w + (p * 2 + h) * 16, _mm512_setzero_si512());
        for (int64_t g = 0; scales && g < num_pairs / Q6K_GROUP_PAIRS; g++)
            _mm512_storeu_ps(scales + g * 32 + h * 16, _mm512_setzero_ps());
    }
}

static void dequantize_q6k_rounded(const struct gguf_weights *weights, int64_t s, uint32_t *w) {
    dequantize_q6k_strips(weights, s, w, 0);
}

static void dequantize_q6k_scaled(const struct gguf_weights *weights, int64_t s, uint32_t *w) {
    dequantize_q6k_strips(weights, s, w, 1);
}
#endif

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias, float), w
 * Q6_K weights packed by pack_q6_k (records and d). x as q4_linear takes it. Returns 0; -1
 * where this kernel does not run (no AVX-512 BF16, num_in not a multiple of 256); -2 when
 * out of memory. */
int q6k_linear(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
               const uint8_t *packed, const float *d, const float *bias, void *y,
               int64_t num_out, int num_threads) {
#ifdef HAVE_BF16_DOT
    if (num_in % (BLOCK * Q6K_SUPER) || x_stride % 2) return -1;
    /* the scaled scratch's d sc: a float per column (32) and 16 inputs, 4 per pair */
    const struct gguf_weights scaled = {packed, d, num_out, num_in, dequantize_q6k_scaled,
                                        tile_scaled_rows, Q6K_ROW_TILE, 32 / Q6K_GROUP_PAIRS};
    const struct gguf_weights rounded = {packed, d, num_out, num_in, dequantize_q6k_rounded,
                                         ROWS_FN, ROW_TILE_OR_AMX, 0};
    const int is_scaled = num_rows <= Q6K_SCALED_MAX_ROWS && !is_amx_on; /* AMX: no need */
    return gemm_by_strips(x, x_stride, num_rows, is_scaled ? &scaled : &rounded, bias, y,
                          num_threads);
#else
    (void)x, (void)x_stride, (void)num_rows, (void)num_in, (void)packed, (void)d;
    (void)bias, (void)y, (void)num_out, (void)num_threads;
    return -1;
#endif
}

/* out (num_ids, num_in) float = rows ids[i] of Q6_K weights packed by pack_q6_k, each
 * weight (d sc) (u - 32) in float (exact products, as q6k_linear's before rounding): an
 * embedding's lookups. Returns 0; -1 where num_in is not a multiple of 256 or an id is out
 * of range. Plain C: a step looks up one row per token. */
int q6k_rows(const uint8_t *packed, const float *d, int64_t num_out, int64_t num_in,
             const int64_t *ids, int64_t num_ids, float *out) {
    if (num_in % (BLOCK * Q6K_SUPER)) return -1;
    for (int64_t i = 0; i < num_ids; i++)
        if (ids[i] < 0 || ids[i] >= num_out) return -1;
    const int64_t num_blocks = num_in / BLOCK, num_supers = num_blocks / Q6K_SUPER;
    for (int64_t i = 0; i < num_ids; i++) {
        const int64_t t = ids[i] / Q6K_STRIP;
        const int c = (int)(ids[i] % Q6K_STRIP);
        for (int64_t b = 0; b < num_blocks; b++) {
            const uint8_t *record = packed + (t * num_blocks + b) * Q6K_RECORD;
            const float dc = d[(t * num_supers + b / Q6K_SUPER) * Q6K_STRIP + c];
            for (int k = 0; k < BLOCK; k++) {
                const int p = k / 2, byte = 2 * c + k % 2;
                const int low = record[32 * (p % 8) + byte] >> (4 * (p / 8)) & 15;
                const int high = record[256 + 32 * (p % 4) + byte] >> (2 * (p / 4)) & 3;
                const float scale = dc * (float)(int8_t)record[384 + 16 * (k / 16) + c];
                out[i * num_in + b * BLOCK + k] = scale * (float)((low | high << 4) - 32);
            }
        }
    }
    return 0;
}

/* Turns AMX on (is_on 1: where this CPU and kernel have it) or off (0) for the GEMMs, or
 * asks (-1); returns whether it is on. Not to be called while a GEMM runs. */
int q4_use_amx(int is_on) {
#ifdef HAVE_AMX
    static int is_granted = -1;
    if (is_on == 1 && is_granted < 0)
        is_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    if (is_on >= 0) is_amx_on = is_on && is_granted > 0;
#else
    (void)is_on;
#endif
    return is_amx_on;
}
