/* Decode attention straight from the paged KV cache, on CPU (one query token per sequence).
 *
 * Built at first use by superinfer/model/cpu_kernels.py and called through ctypes with
 * raw pointers (superinfer/model/cpu_attention.py). The cache is the engine's one tensor
 *     kv_cache[num_blocks][num_layers][2][block_size][num_kv_heads][head_dim]
 * and each sequence reads only its own blocks, in place: no gathered copy, no padding to
 * the longest sequence of the batch.
 *
 * Work is split flash-decoding style into (sequence, kv head, partition of the context)
 * items, so a single long sequence still keeps every core busy; each item keeps a running
 * max, sum and weighted V per query head, and a second pass merges the partitions.
 * A bfloat16 cache whose head size is a multiple of 32 takes AVX-512 BF16 dot products
 * where the compiler targets a CPU that has them (attend_partition_bf16): 1.7x faster at
 * 32 sequences of 100-600 tokens than converting every row to float.
 * On CPUs with AMX (q4_use_amx) and blocks of a multiple of 16 tokens, the same work runs
 * on AMX tiles (attend_amx).
 * OpenMP is the one torch is linked with (same libgomp), so both share one thread team.
 *
 * Compiled without -ffast-math on purpose: in a shared library it can switch the whole
 * process to flush-to-zero. The flags used only allow reassociating the dot products.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16         /* query heads per kv head */
#define PARTITION_TOKENS 256 /* context tokens per work item */

/* e^x for x <= 0 (scores minus their max), in a form the compiler vectorizes (libm's expf
 * is a scalar call): 2^(x log2 e) = 2^k * 2^f with k integer and |f| <= 1/2, 2^f from its
 * Taylor series to degree 6 (relative error about 1e-7, float rounding). */
static inline float exp_nonpositive(float x) {
    x = x < -87.f ? -87.f : x; /* below that e^x is under float's normal range: 0 */
    float t = x * 1.4426950409f;
    float k = floorf(t + 0.5f), f = (t - k) * 0.6931471806f; /* 2^(t-k) = e^f */
    float p = 1.f / 720.f;
    p = p * f + 1.f / 120.f;
    p = p * f + 1.f / 24.f;
    p = p * f + 1.f / 6.f;
    p = p * f + 0.5f;
    p = p * f + 1.f;
    p = p * f + 1.f;
    int32_t bits = ((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

static inline void load_row(const void *src, int64_t index, int is_bf16, float *dst, int n) {
    if (is_bf16) {
        const uint16_t *s = (const uint16_t *)src + index;
        for (int i = 0; i < n; i++) dst[i] = bf16_to_float(s[i]);
    } else {
        memcpy(dst, (const float *)src + index, (size_t)n * sizeof(float));
    }
}

/* Ask for the rows of one head in the block after the current one: blocks lie anywhere
 * in the cache, so the hardware prefetcher cannot guess the jump. */
static inline void prefetch_rows(const void *cache, int64_t base, int is_bf16, int num_rows,
                                 int64_t row_stride, int head_dim) {
    const char *p = (const char *)cache + base * (is_bf16 ? 2 : 4);
    const int64_t row_bytes = (int64_t)head_dim * (is_bf16 ? 2 : 4);
    for (int r = 0; r < num_rows; r++)
        for (int64_t line = 0; line < row_bytes; line += 64)
            __builtin_prefetch(p + r * row_stride * (is_bf16 ? 2 : 4) + line, 0, 1);
}

/* One work item: query heads [kv_head * group, (kv_head + 1) * group) of sequence `seq`
 * against context tokens [begin, end). Writes the partition's max, sum and V sums. */
static void attend_partition(
    const void *q, const void *cache, int is_bf16, const int64_t *block_table,
    int64_t block_stride, int64_t layer_offset, int64_t v_offset, int block_size,
    int num_heads, int num_kv_heads, int head_dim, float scale, int seq, int kv_head,
    int begin, int end, float *part_max, float *part_sum, float *part_acc) {
    const int group = num_heads / num_kv_heads;
    const int token_stride = num_kv_heads * head_dim;
    float qf[MAX_GROUP][MAX_HEAD_DIM], row[MAX_HEAD_DIM];
    float scores[MAX_GROUP][PARTITION_TOKENS];
    for (int g = 0; g < group; g++) {
        int64_t head = (int64_t)kv_head * group + g;
        load_row(q, ((int64_t)seq * num_heads + head) * head_dim, is_bf16, qf[g], head_dim);
        for (int d = 0; d < head_dim; d++) qf[g][d] *= scale;
    }
    for (int t = begin; t < end; t++) {
        int64_t base = block_table[t / block_size] * block_stride + layer_offset +
                       (int64_t)(t % block_size) * token_stride + (int64_t)kv_head * head_dim;
        if (t % block_size == 0 && t + block_size < end)
            prefetch_rows(cache, block_table[t / block_size + 1] * block_stride + layer_offset +
                          (int64_t)kv_head * head_dim, is_bf16, block_size, token_stride, head_dim);
        load_row(cache, base, is_bf16, row, head_dim);
        for (int g = 0; g < group; g++) {
            float dot = 0.f;
            for (int d = 0; d < head_dim; d++) dot += qf[g][d] * row[d];
            scores[g][t - begin] = dot;
        }
    }
    float acc[MAX_GROUP][MAX_HEAD_DIM];
    for (int g = 0; g < group; g++) {
        float m = -INFINITY, s = 0.f;
        for (int i = 0; i < end - begin; i++) m = scores[g][i] > m ? scores[g][i] : m;
        for (int i = 0; i < end - begin; i++) scores[g][i] = exp_nonpositive(scores[g][i] - m);
        for (int i = 0; i < end - begin; i++) s += scores[g][i];
        part_max[g] = m;
        part_sum[g] = s;
        memset(acc[g], 0, (size_t)head_dim * sizeof(float));
    }
    for (int t = begin; t < end; t++) {
        int64_t base = block_table[t / block_size] * block_stride + layer_offset + v_offset +
                       (int64_t)(t % block_size) * token_stride + (int64_t)kv_head * head_dim;
        if (t % block_size == 0 && t + block_size < end)
            prefetch_rows(cache, block_table[t / block_size + 1] * block_stride + layer_offset +
                          v_offset + (int64_t)kv_head * head_dim, is_bf16, block_size,
                          token_stride, head_dim);
        load_row(cache, base, is_bf16, row, head_dim);
        for (int g = 0; g < group; g++) {
            float p = scores[g][t - begin];
            for (int d = 0; d < head_dim; d++) acc[g][d] += p * row[d];
        }
    }
    for (int g = 0; g < group; g++)
        memcpy(part_acc + (int64_t)g * head_dim, acc[g], (size_t)head_dim * sizeof(float));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "exp16.h"
#define HAVE_AVX512_BF16 1
#define PREFETCH_TOKENS 32 /* how far ahead the q.k loop asks for K rows */

/* Ask for the rows (bfloat16, head_dim long, `offset` past rows[i]) of tokens
 * [first, first + count): blocks lie anywhere in the cache, so the hardware prefetcher
 * cannot guess the jumps between them. */
static inline void prefetch_tokens(const uint16_t *const *rows, int first, int count,
                                   int64_t offset, int head_dim) {
    for (int i = first; i < first + count; i++)
        for (int line = 0; line < head_dim * 2; line += 64)
            __builtin_prefetch((const char *)(rows[i] + offset) + line, 0, 1);
}

/* Lane i of the result: the sum of the 16 lanes of v[i] (a transpose and add in 45
 * instructions, where 16 separate horizontal sums take about 130). */
static inline __m512 sum_lanes16(const __m512 v[16]) {
    __m512 t[8], u[4];
    for (int i = 0; i < 8; i++) /* per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] */
        t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                             _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
    for (int j = 0; j < 4; j++) { /* per 128-bit lane: the lane's sums of 4 vectors */
        __m512d a = _mm512_castps_pd(t[2 * j]), b = _mm512_castps_pd(t[2 * j + 1]);
        u[j] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                             _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
    }
    /* add the four 128-bit lanes: u[j]'s totals end in lane j */
    __m512 a = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], 0x44),
                             _mm512_shuffle_f32x4(u[0], u[1], 0xEE));
    __m512 b = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], 0x44),
                             _mm512_shuffle_f32x4(u[2], u[3], 0xEE));
    return _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xDD));
}

/* Lane 4L+k of the low pair sums is dim 8L+k of their 32 dims; of the high ones, dim
 * 8L+4+k (the order unpacklo/unpackhi_epi16 leave): those 32 dims in order at out. */
static inline void store_pair_sums(float *out, __m512 lo, __m512 hi) {
    const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i second =
        _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    _mm512_storeu_ps(out, _mm512_permutex2var_ps(lo, first, hi));
    _mm512_storeu_ps(out + 16, _mm512_permutex2var_ps(lo, second, hi));
}

/* One query head's softmax over its n scores, 16 lanes at a time: their max and sum, and
 * the weights e^(s - max) rounded to bfloat16 (vcvtneps2bf16 rounds to nearest even, as
 * float_to_bf16; e^x >= e^-87 is never subnormal) into weights[0, padded), zeros past n. */
static inline void softmax_weights(const float *scores, int n, int padded, uint16_t *weights,
                                   float *max_out, float *sum_out) {
    __m512 top = _mm512_set1_ps(-INFINITY);
    for (int i = 0; i < n; i += 16)
        top = _mm512_mask_max_ps(top, (__mmask16)(n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1),
                                 top, _mm512_loadu_ps(scores + i));
    const float m = _mm512_reduce_max_ps(top);
    __m512 sum = _mm512_setzero_ps();
    for (int i = 0; i < padded; i += 16) {
        const __mmask16 live =
            (__mmask16)(n - i >= 16 ? 0xFFFF : n <= i ? 0 : (1u << (n - i)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(
            live, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(live, scores + i), _mm512_set1_ps(m))));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(weights + i), (__m256i)_mm512_cvtneps_pbh(e));
    }
    *max_out = m;
    *sum_out = _mm512_reduce_add_ps(sum);
}

static inline __m512bh load_bf16x32(const uint16_t *p) {
    return (__m512bh)_mm512_loadu_si512((const void *)p);
}

/* attend_partition for a bfloat16 cache and head_dim a multiple of 32, with AVX-512 BF16
 * dot products (vdpbf16ps: pairs of bfloat16 products added in float32) instead of
 * converting every K and V row to float:
 * - q.k for 16 tokens at a time, their 16 horizontal sums done together;
 * - p.V two tokens at a time: their V rows interleaved into (v_t, v_t+1) pairs and the
 *   weights rounded to bfloat16 pairs (p_t, p_t+1), as FlashAttention rounds P before
 *   its PV product. The interleave permutes the dims inside each 32; undone at the end;
 * - every token's row address from one walk over the block table, then K rows prefetched
 *   PREFETCH_TOKENS ahead and each 16 tokens' V rows while their q.k runs (1.2-1.4x
 *   faster than a division and a next-block prefetch per token). */
static inline __attribute__((always_inline)) void attend_bf16(
    const uint16_t *q, const uint16_t *cache, const int64_t *block_table, int64_t block_stride,
    int64_t layer_offset, int64_t v_offset, int block_size, int num_heads, int num_kv_heads,
    int head_dim, float scale, int seq, int kv_head, int begin, int end, float *part_max,
    float *part_sum, float *part_acc, const int group, const int num_chunks) {
    const int n = end - begin;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    const int64_t head_offset = layer_offset + (int64_t)kv_head * head_dim;
    const uint16_t *qh = q + ((int64_t)seq * num_heads + (int64_t)kv_head * group) * head_dim;
    float scores[MAX_GROUP][PARTITION_TOKENS];
    uint16_t weights[MAX_GROUP][PARTITION_TOKENS + 16]; /* P in bfloat16, for p.V */
    /* each token's K row (its V row is v_offset further), from one walk over the blocks:
     * a division per token cost more than its dot products */
    const uint16_t *k_rows[PARTITION_TOKENS];
    for (int i = 0, block = begin / block_size, offset = begin % block_size; i < n; i++) {
        k_rows[i] = cache + block_table[block] * block_stride + head_offset +
                    (int64_t)offset * token_stride;
        if (++offset == block_size) offset = 0, block++;
    }
    prefetch_tokens(k_rows, 0, n < PREFETCH_TOKENS ? n : PREFETCH_TOKENS, 0, head_dim);
    for (int t0 = 0; t0 < n; t0 += 16) {
        const int m = n - t0 < 16 ? n - t0 : 16;
        const uint16_t *const *rows = k_rows + t0;
        /* K rows PREFETCH_TOKENS ahead, and these tokens' V rows for p.V below */
        const int ahead = t0 + PREFETCH_TOKENS;
        prefetch_tokens(k_rows, ahead, n - ahead < 16 ? n - ahead : 16, 0, head_dim);
        prefetch_tokens(k_rows, t0, m, v_offset, head_dim);
        for (int g = 0; g < group; g++) {
            __m512 acc[16];
            for (int i = 0; i < 16; i++) acc[i] = _mm512_setzero_ps();
            for (int c = 0; c < num_chunks; c++) {
                const __m512bh qc = load_bf16x32(qh + (int64_t)g * head_dim + 32 * c);
                for (int i = 0; i < m; i++)
                    acc[i] = _mm512_dpbf16_ps(acc[i], qc, load_bf16x32(rows[i] + 32 * c));
            }
            _mm512_mask_storeu_ps(&scores[g][t0], (__mmask16)((1u << m) - 1),
                                  _mm512_mul_ps(sum_lanes16(acc), _mm512_set1_ps(scale)));
        }
    }
    for (int g = 0; g < group; g++) /* the partner of an odd last token weighs 0 */
        softmax_weights(scores[g], n, (n + 16) & ~15, weights[g], &part_max[g], &part_sum[g]);
    __m512 acc[MAX_GROUP][MAX_HEAD_DIM / 16]; /* per 32 dims: the low, then the high pairs */
    for (int g = 0; g < group; g++)
        for (int c = 0; c < 2 * num_chunks; c++) acc[g][c] = _mm512_setzero_ps();
    static const uint16_t zeros[MAX_HEAD_DIM]; /* the V row after an odd last token */
    for (int t0 = 0; t0 < n; t0 += 2) {
        const uint16_t *rows[2] = {k_rows[t0] + v_offset,
                                   t0 + 1 < n ? k_rows[t0 + 1] + v_offset : zeros};
        __m512i lo[MAX_HEAD_DIM / 32], hi[MAX_HEAD_DIM / 32];
        for (int c = 0; c < num_chunks; c++) {
            const __m512i a = _mm512_loadu_si512((const void *)(rows[0] + 32 * c));
            const __m512i b = _mm512_loadu_si512((const void *)(rows[1] + 32 * c));
            lo[c] = _mm512_unpacklo_epi16(a, b);
            hi[c] = _mm512_unpackhi_epi16(a, b);
        }
        for (int g = 0; g < group; g++) {
            int32_t pair; /* (p_t0, p_t0+1) */
            memcpy(&pair, &weights[g][t0], sizeof pair);
            const __m512bh pp = (__m512bh)_mm512_set1_epi32(pair);
            for (int c = 0; c < num_chunks; c++) {
                acc[g][2 * c] = _mm512_dpbf16_ps(acc[g][2 * c], (__m512bh)lo[c], pp);
                acc[g][2 * c + 1] = _mm512_dpbf16_ps(acc[g][2 * c + 1], (__m512bh)hi[c], pp);
            }
        }
    }
    for (int g = 0; g < group; g++)
        for (int c = 0; c < num_chunks; c++)
            store_pair_sums(part_acc + (int64_t)g * head_dim + 32 * c, acc[g][2 * c],
                            acc[g][2 * c + 1]);
}

/* attend_bf16 with the group and head size known at compile time for the common shapes
 * (1-8 query heads per kv head, head_dim 64 or 128): the compiler then keeps the sums in
 * registers instead of stack arrays indexed at run time (1.1-1.2x faster on SmolLM2's
 * shape, benchmarks/decode_attention.py). */
static void attend_partition_bf16(
    const uint16_t *q, const uint16_t *cache, const int64_t *block_table, int64_t block_stride,
    int64_t layer_offset, int64_t v_offset, int block_size, int num_heads, int num_kv_heads,
    int head_dim, float scale, int seq, int kv_head, int begin, int end, float *part_max,
    float *part_sum, float *part_acc) {
    const int group = num_heads / num_kv_heads, num_chunks = head_dim / 32;
#define ATTEND(G, C)                                                                          \
    attend_bf16(q, cache, block_table, block_stride, layer_offset, v_offset, block_size,     \
                num_heads, num_kv_heads, 32 * (C), scale, seq, kv_head, begin, end, part_max, \
                part_sum, part_acc, G, C)
#define SHAPE(G)                   \
    if (group == (G)) {            \
        if (num_chunks == 2) {     \
            ATTEND(G, 2);          \
            return;                \
        }                          \
        if (num_chunks == 4) {     \
            ATTEND(G, 4);          \
            return;                \
        }                          \
    }
    SHAPE(1) SHAPE(2) SHAPE(3) SHAPE(4) SHAPE(5) SHAPE(6) SHAPE(7) SHAPE(8)
#undef SHAPE
    ATTEND(group, num_chunks);
#undef ATTEND
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
int q4_use_amx(int is_on); /* q4_linear.c: whether this process runs AMX (-1 only asks) */

struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

/* Every tile 16 rows of 64 bytes; loaded once per thread and call (a configuration per
 * work item costs more than a short item's products). */
static void amx_configure(void) {
    struct amx_config config __attribute__((aligned(64))) = {.palette = 1};
    for (int t = 0; t < 8; t++) config.rows[t] = 16, config.bytes_per_row[t] = 64;
    _tile_loadconfig(&config);
}

/* attend_bf16 on AMX tiles, for a cache whose blocks hold a multiple of 16 tokens:
 * - S^T = K Q^T, 64 keys at a time: each 16 keys as they lie in their block are a tile
 *   (tiles 4-5; keys past the last token, still in the block, are masked out) against Q^T
 *   (tile 6: the group's query heads as its first columns, zeros after), laid out once
 *   per item; the sums in tiles 0-3, one column per query head;
 * - the softmax as attend_bf16's, P rounded to bfloat16;
 * - O = P V, 32 tokens and 64 dims at a time: P a row per query head (tile 0), V's rows
 *   interleaved in token pairs (tiles 1, 6, 7) as attend_bf16 interleaves them, the sums
 *   in tiles 2-5.
 * The group's heads fill a few columns of each tile: a tile product still does the work of
 * many vector ones, and the vector path's horizontal sums go (1.1-1.2x the speed on
 * SmolLM2's shape, benchmarks/decode_attention.py). */
static void attend_amx(const uint16_t *q, const uint16_t *cache, const int64_t *block_table,
                       int64_t block_stride, int64_t layer_offset, int64_t v_offset,
                       int block_size, int num_heads, int num_kv_heads, int head_dim,
                       float scale, int seq, int kv_head, int begin, int end, float *part_max,
                       float *part_sum, float *part_acc) {
    const int n = end - begin, group = num_heads / num_kv_heads, num_chunks = head_dim / 32;
    const int64_t token_stride = (int64_t)num_kv_heads * head_dim;
    const int64_t head_offset = layer_offset + (int64_t)kv_head * head_dim;
    const uint16_t *qh = q + ((int64_t)seq * num_heads + (int64_t)kv_head * group) * head_dim;
    float scores[MAX_GROUP][PARTITION_TOKENS];
    /* P in bfloat16, a row per query head (rows past the group unused), zeros past n */
    uint16_t weights[MAX_GROUP][PARTITION_TOKENS + 32] __attribute__((aligned(64)));
    uint32_t q_t[MAX_HEAD_DIM / 32][16][16] __attribute__((aligned(64)));
    float sums[4][16][16] __attribute__((aligned(64)));
    uint32_t v_pairs[4][16][16] __attribute__((aligned(64)));
    const uint16_t *k_rows[PARTITION_TOKENS + 64];
    for (int i = 0, block = begin / block_size, offset = begin % block_size; i < n; i++) {
        k_rows[i] = cache + block_table[block] * block_stride + head_offset +
                    (int64_t)offset * token_stride;
        if (++offset == block_size) offset = 0, block++;
    }
    /* groups of 16 past the last token read the last group's keys again (masked out): a
     * group starting past the sequence could run past its block */
    for (int i = n; i < ((n + 63) & ~63); i++) k_rows[i] = k_rows[(n - 1) & ~15];
    /* Q^T: row p of chunk c holds, for each query head (column), its dims 32c + 2p, + 1 */
    memset(q_t, 0, sizeof(uint32_t) * 16 * 16 * num_chunks);
    for (int g = 0; g < group; g++)
        for (int c = 0; c < num_chunks; c++)
            for (int p = 0; p < 16; p++)
                memcpy(&q_t[c][p][g], qh + (int64_t)g * head_dim + 32 * c + 2 * p, 4);
    const int64_t stride = token_stride * 2;
    const __m512i column0 = _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160,
                                              176, 192, 208, 224, 240);
    /* S^T, 64 keys at a time: tiles 0-3 their sums, 4-5 keys, 6-7 Q^T */
    for (int t0 = 0; t0 < n; t0 += 64) {
        prefetch_tokens(k_rows, t0 + 64, n - t0 - 64 < 64 ? n - t0 - 64 : 64, 0, head_dim);
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int c = 0; c < num_chunks; c++) {
            const int64_t d = 32 * c;
            _tile_loadd(6, q_t[c], 64);
            _tile_loadd(4, k_rows[t0] + d, stride);
            _tile_loadd(5, k_rows[t0 + 16] + d, stride);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 5, 6);
            _tile_loadd(4, k_rows[t0 + 32] + d, stride);
            _tile_loadd(5, k_rows[t0 + 48] + d, stride);
            _tile_dpbf16ps(2, 4, 6);
            _tile_dpbf16ps(3, 5, 6);
        }
        _tile_stored(0, sums[0], 64);
        _tile_stored(1, sums[1], 64);
        _tile_stored(2, sums[2], 64);
        _tile_stored(3, sums[3], 64);
        for (int k = 0; k < 4 && t0 + 16 * k < n; k++) {
            const int m = n - t0 - 16 * k;
            const __mmask16 in = (__mmask16)(m >= 16 ? 0xFFFF : (1u << m) - 1);
            for (int g = 0; g < group; g++) /* column g: head g's scores of the 16 keys */
                _mm512_mask_storeu_ps(
                    &scores[g][t0 + 16 * k], in,
                    _mm512_mul_ps(
                        _mm512_i32gather_ps(_mm512_add_epi32(column0, _mm512_set1_epi32(g)),
                                            &sums[k][0][0], 4),
                        _mm512_set1_ps(scale)));
        }
        prefetch_tokens(k_rows, t0, n - t0 < 64 ? n - t0 : 64, v_offset, head_dim);
    }
    for (int g = 0; g < group; g++)
        softmax_weights(scores[g], n, (n + 31) & ~31, weights[g], &part_max[g], &part_sum[g]);
    static const uint16_t zeros[MAX_HEAD_DIM]; /* V rows past the last token */
    /* O = P V, 64 dims at a time: tiles 2-5 their sums, 0 P, 1 and 6-7 V's token pairs */
    for (int c0 = 0; c0 < num_chunks; c0 += 2) {
        const int num_here = num_chunks - c0 < 2 ? 1 : 2;
        _tile_zero(2);
        _tile_zero(3);
        _tile_zero(4);
        _tile_zero(5);
        for (int t0 = 0; t0 < n; t0 += 32) {
            for (int i = 0; i < 16; i++) {
                const int ta = t0 + 2 * i, tb = ta + 1;
                const uint16_t *a = ta < n ? k_rows[ta] + v_offset : zeros;
                const uint16_t *b = tb < n ? k_rows[tb] + v_offset : zeros;
                for (int c = 0; c < num_here; c++) {
                    const __m512i va = _mm512_loadu_si512((const void *)(a + 32 * (c0 + c)));
                    const __m512i vb = _mm512_loadu_si512((const void *)(b + 32 * (c0 + c)));
                    _mm512_store_si512((void *)v_pairs[2 * c][i], _mm512_unpacklo_epi16(va, vb));
                    _mm512_store_si512((void *)v_pairs[2 * c + 1][i],
                                       _mm512_unpackhi_epi16(va, vb));
                }
            }
            _tile_loadd(0, &weights[0][t0], sizeof weights[0]);
            _tile_loadd(1, v_pairs[0], 64);
            _tile_loadd(6, v_pairs[1], 64);
            _tile_dpbf16ps(2, 0, 1);
            _tile_dpbf16ps(3, 0, 6);
            if (num_here == 2) {
                _tile_loadd(7, v_pairs[2], 64);
                _tile_loadd(1, v_pairs[3], 64);
                _tile_dpbf16ps(4, 0, 7);
                _tile_dpbf16ps(5, 0, 1);
            }
        }
        /* tile 2 + 2c: chunk c0 + c's low pairs' dims, tile 3 + 2c: its high ones' */
        _tile_stored(2, sums[0], 64);
        _tile_stored(3, sums[1], 64);
        _tile_stored(4, sums[2], 64);
        _tile_stored(5, sums[3], 64);
        for (int c = 0; c < num_here; c++)
            for (int g = 0; g < group; g++)
                store_pair_sums(part_acc + (int64_t)g * head_dim + 32 * (c0 + c),
                                _mm512_load_ps(sums[2 * c][g]),
                                _mm512_load_ps(sums[2 * c + 1][g]));
    }
}
#endif
#endif

/* out[s][h][:] = softmax(q[s][h] . K_s^T * scale) V_s for every sequence s of the batch.
 * q, out: (num_seqs, num_heads, head_dim) contiguous, same dtype as the cache.
 * block_tables: (num_seqs, max_blocks) int64; seq_lens: (num_seqs,) int64, each >= 1.
 * key_starts: NULL, or (num_seqs,) int64: sequence s attends to tokens [key_starts[s],
 * seq_lens[s]) only (a sliding window); the blocks before are never read, so their table
 * entries may be placeholders.
 * Returns 0, or -1 for shapes this kernel does not handle (the caller checks first). */
int paged_decode_attention(
    const void *q, const void *kv_cache, void *out, int is_bf16, const int64_t *block_tables,
    const int64_t *seq_lens, const int64_t *key_starts, int num_seqs, int max_blocks,
    int num_layers, int layer,
    int block_size, int num_heads, int num_kv_heads, int head_dim, float scale,
    int num_threads) {
    if (head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads || num_heads / num_kv_heads > MAX_GROUP)
        return -1;
    const int64_t layer_size = 2LL * block_size * num_kv_heads * head_dim;
    const int64_t block_stride = num_layers * layer_size;
    const int64_t layer_offset = layer * layer_size, v_offset = layer_size / 2;
    int max_parts = 1;
    for (int s = 0; s < num_seqs; s++) {
        int64_t span = seq_lens[s] - (key_starts ? key_starts[s] : 0);
        int parts = (int)((span + PARTITION_TOKENS - 1) / PARTITION_TOKENS);
        if (parts > max_parts) max_parts = parts;
    }
    const int group = num_heads / num_kv_heads;
    const int64_t num_items = (int64_t)num_seqs * num_kv_heads * max_parts;
    /* per (seq, head, part): max, sum, and head_dim V sums */
    float *part_max = malloc(sizeof(float) * num_seqs * num_heads * max_parts);
    float *part_sum = malloc(sizeof(float) * num_seqs * num_heads * max_parts);
    float *part_acc = malloc(sizeof(float) * num_seqs * num_heads * max_parts * head_dim);
    if (!part_max || !part_sum || !part_acc) {
        free(part_max), free(part_sum), free(part_acc);
        return -2;
    }

    int is_amx = 0; /* a group of 16 tokens of a block is one tile */
#ifdef HAVE_AMX
    is_amx = is_bf16 && head_dim % 32 == 0 && block_size % 16 == 0 && q4_use_amx(-1);
#endif
#pragma omp parallel num_threads(num_threads)
    {
#ifdef HAVE_AMX
        if (is_amx) amx_configure();
#endif
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < num_items; item++) {
            int part = (int)(item % max_parts);
            int kv_head = (int)(item / max_parts % num_kv_heads);
            int seq = (int)(item / max_parts / num_kv_heads);
            int begin = (key_starts ? (int)key_starts[seq] : 0) + part * PARTITION_TOKENS;
            int end = begin + PARTITION_TOKENS;
            if (end > seq_lens[seq]) end = (int)seq_lens[seq];
            int64_t slot = ((int64_t)seq * num_heads + (int64_t)kv_head * group) * max_parts;
            if (begin >= end) { /* this sequence is shorter: an empty partition */
                for (int g = 0; g < group; g++) {
                    part_max[slot + (int64_t)g * max_parts + part] = -INFINITY;
                    part_sum[slot + (int64_t)g * max_parts + part] = 0.f;
                }
                continue;
            }
            float maxes[MAX_GROUP], sums[MAX_GROUP];
            float accs[MAX_GROUP * MAX_HEAD_DIM];
#ifdef HAVE_AMX
            if (is_amx && begin % 16 == 0) /* not at a window's start inside a group */
                attend_amx(q, kv_cache, block_tables + (int64_t)seq * max_blocks, block_stride,
                           layer_offset, v_offset, block_size, num_heads, num_kv_heads, head_dim,
                           scale, seq, kv_head, begin, end, maxes, sums, accs);
            else
#endif
#ifdef HAVE_AVX512_BF16
            if (is_bf16 && head_dim % 32 == 0)
                attend_partition_bf16(q, kv_cache, block_tables + (int64_t)seq * max_blocks,
                                      block_stride, layer_offset, v_offset, block_size,
                                      num_heads, num_kv_heads, head_dim, scale, seq, kv_head,
                                      begin, end, maxes, sums, accs);
            else
#endif
                attend_partition(q, kv_cache, is_bf16, block_tables + (int64_t)seq * max_blocks,
                                 block_stride, layer_offset, v_offset, block_size, num_heads,
                                 num_kv_heads, head_dim, scale, seq, kv_head, begin, end, maxes,
                                 sums, accs);
            for (int g = 0; g < group; g++) {
                int64_t at = slot + (int64_t)g * max_parts + part;
                part_max[at] = maxes[g];
                part_sum[at] = sums[g];
                memcpy(part_acc + at * head_dim, accs + (int64_t)g * head_dim,
                       (size_t)head_dim * sizeof(float));
            }
        }
#ifdef HAVE_AMX
        if (is_amx) _tile_release();
#endif
    }

#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t row = 0; row < (int64_t)num_seqs * num_heads; row++) {
        const int64_t first = row * max_parts;
        float m = -INFINITY, total = 0.f, result[MAX_HEAD_DIM];
        for (int p = 0; p < max_parts; p++) m = part_max[first + p] > m ? part_max[first + p] : m;
        memset(result, 0, (size_t)head_dim * sizeof(float));
        for (int p = 0; p < max_parts; p++) {
            if (part_sum[first + p] == 0.f) continue;
            float w = exp_nonpositive(part_max[first + p] - m);
            total += w * part_sum[first + p];
            const float *acc = part_acc + (first + p) * head_dim;
            for (int d = 0; d < head_dim; d++) result[d] += w * acc[d];
        }
        float inv = 1.f / total;
        if (is_bf16) {
            uint16_t *o = (uint16_t *)out + row * head_dim;
            for (int d = 0; d < head_dim; d++) o[d] = float_to_bf16(result[d] * inv);
        } else {
            float *o = (float *)out + row * head_dim;
            for (int d = 0; d < head_dim; d++) o[d] = result[d] * inv;
        }
    }
    free(part_max), free(part_sum), free(part_acc);
    return 0;
}
