/* Prefill attention straight from the paged KV cache, on CPU: the query tokens of one
 * sequence's chunk against its cached keys, causal, optionally windowed.
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_attention.py). The chunk's own K/V are written to the cache first,
 * so every key, cached context and chunk alike, is read in place: no gathered copy.
 * PyTorch's CPU flash attention ran a 256-token causal prefill at about 70 GFLOP/s here
 * (1.1 ms a layer of SmolLM2), and attention grows with the square of the prompt.
 *
 * bfloat16 cache, head_dim a multiple of 32, and AVX-512 BF16 only; anything else returns
 * -1 and the caller keeps SDPA. Flash attention on tiles of KEY_TILE keys, transposed:
 * - a work item is one kv head and QUERY_TILE (64) query tokens, fewer when a short chunk
 *   would leave a thread idle: its group's query heads share every K and V tile it loads;
 * - its (query, head) rows go 16 at a time as the 16 lanes of a vector: S^T = K . Q^T,
 *   a running max and sum per lane down the tile's keys (no horizontal sums, no scalar
 *   exp), then O^T += V^T . P^T, rescaled tile by tile. K is read where it lies in its
 *   blocks, Q^T laid out once per item, V once per key tile for all the item's rows;
 * - P is rounded to bfloat16 for p.V, as FlashAttention rounds it;
 * - on the diagonal a group of rows reads only the keys up to its last position;
 * - on AMX both products are tile multiply-adds, elsewhere `vdpbf16ps` with a key's dim
 *   pair (or two keys' values of a dim) broadcast.
 * Against the earlier form (16-token items, a row per (query, head) and a softmax each),
 * benchmarks/prefill_attention.py on a Xeon: AMX 0.53-0.72x the time from 512 tokens,
 * AVX-512 0.67-0.92x (docs/results/models/prefill_transposed_1206/).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_HEAD_DIM 256
#define MAX_GROUP 16
#define QUERY_TILE 64
#define KEY_TILE 64 /* keys per softmax update: its max, rescale and sums are paid once per 64 */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
#include <immintrin.h>

#include "exp16.h"
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
int q4_use_amx(int is_on); /* q4_linear.c: whether this process runs AMX (-1 only asks) */
#endif

/* Where a work item reads and writes. Positions are the sequence's; block_table[0] holds
 * position first_position. */
struct chunk {
    const uint16_t *q, *cache;
    uint16_t *out;
    const int64_t *block_table;
    int64_t q_stride, first_position, block_stride, layer_offset, v_offset;
    int num_context, window, block_size, num_heads, num_kv_heads, head_dim;
    float scale;
};

/* The first key tile a work item reads: the one holding its first query's earliest
 * visible key (past the window, and never before the blocks the table holds). */
static int64_t first_key_tile(const struct chunk *c, int64_t first_pos) {
    int64_t lo = c->window > 0 ? first_pos - c->window + 1 : 0;
    if (lo < c->first_position) lo = c->first_position;
    return lo - (lo - c->first_position) % KEY_TILE;
}

/* A work item's transposed state. Row r of the item (token r / group, head r % group) is
 * lane r % 16 of row group r / 16. On AMX, tiles 0-3 hold sums (4 groups of 16 keys, or 4
 * blocks of 16 dims), 4 the second operand (Q^T, P^T), 6 and 7 the first (K, V^T); 16 keys
 * of a block are a K tile as they lie, so block_size must be a multiple of 16 there. */
struct cols_scratch {
    uint32_t *q_t;                                 /* Q^T: [row group][dim pair][16 rows] */
    float *acc_t;                                  /* O^T: [row group][head_dim][16 rows] */
    float scores_t[KEY_TILE][16] __attribute__((aligned(64)));
    uint32_t p_t[KEY_TILE / 2][16] __attribute__((aligned(64))); /* P^T, key pairs */
    union {
        uint16_t v_t[MAX_HEAD_DIM][KEY_TILE];       /* AMX: V^T */
        uint32_t v_pairs[KEY_TILE / 2][MAX_HEAD_DIM]; /* AVX-512: (V[2i][d], V[2i+1][d]) */
    } __attribute__((aligned(64)));
    float pv_t[MAX_HEAD_DIM][16] __attribute__((aligned(64)));
    __mmask16 visible[KEY_TILE];
};

static const uint16_t *key_row(const struct chunk *c, int kv_head, int64_t key) {
    const int64_t at = key - c->first_position;
    return c->cache + c->block_table[at / c->block_size] * c->block_stride + c->layer_offset +
           (at % c->block_size) * c->num_kv_heads * c->head_dim + (int64_t)kv_head * c->head_dim;
}

/* r[i][j] -> r[j][i], 16 x 16 dwords: pairs, then quads, then 128-bit lanes. */
static void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) { /* r[i + c], lane L: column 4L + c of rows i..i+3 */
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int col = 0; col < 4; col++) {
        const __m512i a = _mm512_shuffle_i32x4(r[col], r[4 + col], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i b = _mm512_shuffle_i32x4(r[col], r[4 + col], _MM_SHUFFLE(3, 1, 3, 1));
        const __m512i e = _mm512_shuffle_i32x4(r[8 + col], r[12 + col], _MM_SHUFFLE(2, 0, 2, 0));
        const __m512i f = _mm512_shuffle_i32x4(r[8 + col], r[12 + col], _MM_SHUFFLE(3, 1, 3, 1));
        t[col] = _mm512_shuffle_i32x4(a, e, _MM_SHUFFLE(2, 0, 2, 0));
        t[8 + col] = _mm512_shuffle_i32x4(a, e, _MM_SHUFFLE(3, 1, 3, 1));
        t[4 + col] = _mm512_shuffle_i32x4(b, f, _MM_SHUFFLE(2, 0, 2, 0));
        t[12 + col] = _mm512_shuffle_i32x4(b, f, _MM_SHUFFLE(3, 1, 3, 1));
    }
    for (int i = 0; i < 16; i++) r[i] = t[i];
}

static const uint16_t ZEROS[MAX_HEAD_DIM];
/* two rows of 32 bfloat16 into dwords of (a[d], b[d]): dims 0-15, then 16-31 */
static const uint16_t PAIR_PICK[2][32] = {
    {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
     8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47},
    {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
     24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63}};

/* AVX-512: the tile's values as dwords of two keys' values of a dim (0 past num_keys). */
static void load_value_pairs(const struct chunk *c, int kv_head, int64_t k0, int num_keys,
                             struct cols_scratch *s) {
    const __m512i first_half = _mm512_loadu_si512((const void *)PAIR_PICK[0]);
    const __m512i second_half = _mm512_loadu_si512((const void *)PAIR_PICK[1]);
    for (int i = 0; 2 * i < num_keys; i++) {
        const uint16_t *a = key_row(c, kv_head, k0 + 2 * i) + c->v_offset;
        const uint16_t *b =
            2 * i + 1 < num_keys ? key_row(c, kv_head, k0 + 2 * i + 1) + c->v_offset : ZEROS;
        for (int d = 0; d < c->head_dim; d += 32) {
            const __m512i va = _mm512_loadu_si512((const void *)(a + d));
            const __m512i vb = _mm512_loadu_si512((const void *)(b + d));
            _mm512_store_si512((void *)(s->v_pairs[i] + d),
                               _mm512_permutex2var_epi16(va, first_half, vb));
            _mm512_store_si512((void *)(s->v_pairs[i] + d + 16),
                               _mm512_permutex2var_epi16(va, second_half, vb));
        }
    }
}

/* AVX-512: S^T of the row group (Q^T at q_t) against the tile's first num_keys keys. */
static void scores_t_avx(const struct chunk *c, int kv_head, int64_t k0, int num_keys,
                         const uint32_t *q_t, struct cols_scratch *s) {
    for (int k = 0; k < num_keys; k += 16) {
        const uint32_t *keys[16];
        for (int i = 0; i < 16; i++) /* past the last key: the first again, masked later */
            keys[i] = (const uint32_t *)key_row(c, kv_head, k0 + k + (k + i < num_keys ? i : 0));
        __m512 sums[16];
        for (int i = 0; i < 16; i++) sums[i] = _mm512_setzero_ps();
        for (int j = 0; j < c->head_dim / 2; j++) {
            const __m512bh q = (__m512bh)_mm512_loadu_si512((const void *)(q_t + 16 * j));
            for (int i = 0; i < 16; i++)
                sums[i] = _mm512_dpbf16_ps(sums[i], q,
                                           (__m512bh)_mm512_set1_epi32((int)keys[i][j]));
        }
        for (int i = 0; i < 16; i++) _mm512_store_ps(s->scores_t[k + i], sums[i]);
    }
}

/* AVX-512: O^T (16 rows' acc_t) = O^T * rescale + V^T . P^T over the first num_keys keys. */
static void values_t_avx(const struct chunk *c, int num_keys, __m512 rescale, float *acc_t,
                         struct cols_scratch *s) {
    for (int d0 = 0; d0 < c->head_dim; d0 += 16) {
        __m512 sums[16];
        for (int i = 0; i < 16; i++) sums[i] = _mm512_setzero_ps();
        for (int kp = 0; 2 * kp < num_keys; kp++) {
            const __m512bh p = (__m512bh)_mm512_load_si512((const void *)s->p_t[kp]);
            const uint32_t *v = s->v_pairs[kp] + d0;
            for (int i = 0; i < 16; i++)
                sums[i] = _mm512_dpbf16_ps(sums[i], p, (__m512bh)_mm512_set1_epi32((int)v[i]));
        }
        for (int i = 0; i < 16; i++) {
            float *a = acc_t + 16 * (d0 + i);
            _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_load_ps(a), rescale, sums[i]));
        }
    }
}

#ifdef HAVE_AMX
struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
};

/* V^T of the tile's first num_keys keys (0 past them): two keys' rows interleaved into
 * dwords of (key 2i, key 2i + 1) for 16 dims, then 16 such pairs transposed into 16 dims'
 * rows of 32 keys. */
static void load_values_t(const struct chunk *c, int kv_head, int64_t k0, int num_keys,
                          struct cols_scratch *s) {
    const __m512i first_half = _mm512_loadu_si512((const void *)PAIR_PICK[0]);
    const __m512i second_half = _mm512_loadu_si512((const void *)PAIR_PICK[1]);
    const uint16_t *rows[KEY_TILE];
    for (int i = 0; i < KEY_TILE; i++)
        rows[i] = i < num_keys ? key_row(c, kv_head, k0 + i) + c->v_offset : ZEROS;
    for (int kb = 0; kb < KEY_TILE / 32; kb++)
        for (int d = 0; d < c->head_dim; d += 32) {
            __m512i lo[16], hi[16];
            for (int i = 0; i < 16; i++) {
                const __m512i a = _mm512_loadu_si512((const void *)(rows[32 * kb + 2 * i] + d));
                const __m512i b = _mm512_loadu_si512((const void *)(rows[32 * kb + 2 * i + 1] + d));
                lo[i] = _mm512_permutex2var_epi16(a, first_half, b);
                hi[i] = _mm512_permutex2var_epi16(a, second_half, b);
            }
            transpose16(lo);
            transpose16(hi);
            for (int j = 0; j < 16; j++) {
                _mm512_store_si512((void *)&s->v_t[d + j][32 * kb], lo[j]);
                _mm512_store_si512((void *)&s->v_t[d + 16 + j][32 * kb], hi[j]);
            }
        }
}

/* S^T of the row group (Q^T at q_t) against the tile's first num_keys keys -> scores_t.
 * A group of 16 keys is read whole from its block: keys past the last one the rows see
 * (or past the sequence's last, still in its block) are masked out by the softmax. */
static void amx_scores_t(const struct chunk *c, int kv_head, int64_t k0, int num_keys,
                         const uint32_t *q_t, struct cols_scratch *s) {
    const int num_groups = (num_keys + 15) / 16, stride = c->num_kv_heads * c->head_dim * 2;
    const uint16_t *keys[4];
    for (int g = 0; g < num_groups; g++) keys[g] = key_row(c, kv_head, k0 + 16 * g);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int ks = 0; ks < c->head_dim / 32; ks++) {
        _tile_loadd(4, q_t + 16 * 16 * ks, 64);
#define QK_GROUP(g, b)                                          \
        if ((g) < num_groups) {                                 \
            _tile_loadd(b, keys[g] + 32 * ks, stride);          \
            _tile_dpbf16ps(g, b, 4);                            \
        }
        QK_GROUP(0, 6) QK_GROUP(1, 7) QK_GROUP(2, 6) QK_GROUP(3, 7)
#undef QK_GROUP
    }
    _tile_stored(0, s->scores_t[0], 64);
    if (num_groups > 1) _tile_stored(1, s->scores_t[16], 64);
    if (num_groups > 2) _tile_stored(2, s->scores_t[32], 64);
    if (num_groups > 3) _tile_stored(3, s->scores_t[48], 64);
}

#endif

/* The running softmax of 16 rows (lanes) over the tile's scores_t: P^T into p_t in key
 * pairs, row_max and row_sum (16 lanes at rm, rs) updated. `pos`: each lane's position
 * (-1 for a padding row, which sees nothing); num_keys: the keys of the tile the rows may
 * see (P is written up to the next 32, p.V's step: 0 past num_keys).
 * Returns the factor each lane's earlier O^T takes. */
static __m512 softmax_update_t(const struct chunk *c, int64_t k0, int num_keys, __m512i pos,
                               float *rm, float *rs, struct cols_scratch *s) {
    const __m512 scale = _mm512_set1_ps(c->scale), minus_inf = _mm512_set1_ps(-INFINITY);
    const int min_pos = _mm512_reduce_min_epi32(pos), max_pos = _mm512_reduce_max_epi32(pos);
    const int is_all_visible = min_pos >= 0 && k0 + KEY_TILE - 1 <= min_pos &&
                               (c->window <= 0 || k0 > max_pos - c->window);
    const __m512i low = _mm512_sub_epi32(pos, _mm512_set1_epi32(c->window));
    __m512 top = _mm512_loadu_ps(rm);
    const __m512 old_max = top;
    const int num_looked = (num_keys + 31) / 32 * 32;
    for (int k = 0; k < num_looked; k++) {
        __m512 x = _mm512_mul_ps(_mm512_load_ps(s->scores_t[k]), scale);
        if (!is_all_visible) {
            const __m512i key = _mm512_set1_epi32((int)(k0 + k));
            __mmask16 seen = k < num_keys ? _mm512_cmpge_epi32_mask(pos, key) : 0;
            if (c->window > 0) seen &= _mm512_cmplt_epi32_mask(low, key);
            s->visible[k] = seen;
            x = _mm512_mask_mov_ps(minus_inf, seen, x);
        }
        _mm512_store_ps(s->scores_t[k], x);
        top = _mm512_max_ps(top, x);
    }
    /* a lane that has seen no key yet keeps -inf: shift it by 0, its P is masked to 0 */
    const __mmask16 is_seen = _mm512_cmp_ps_mask(top, minus_inf, _CMP_NEQ_OQ);
    const __m512 shift = _mm512_maskz_mov_ps(is_seen, top);
    const __m512i interleave = _mm512_setr_epi32(0x00100000, 0x00110001, 0x00120002, 0x00130003,
        0x00140004, 0x00150005, 0x00160006, 0x00170007, 0x00180008, 0x00190009, 0x001a000a,
        0x001b000b, 0x001c000c, 0x001d000d, 0x001e000e, 0x001f000f);
    __m512 total = _mm512_setzero_ps();
    for (int k = 0; k < num_looked; k += 2) {
        __m512 p0 = exp16(_mm512_sub_ps(_mm512_load_ps(s->scores_t[k]), shift));
        __m512 p1 = exp16(_mm512_sub_ps(_mm512_load_ps(s->scores_t[k + 1]), shift));
        if (!is_all_visible) {
            p0 = _mm512_maskz_mov_ps(s->visible[k], p0);
            p1 = _mm512_maskz_mov_ps(s->visible[k + 1], p1);
        }
        total = _mm512_add_ps(total, _mm512_add_ps(p0, p1));
        const __m512i pair = (__m512i)_mm512_cvtne2ps_pbh(p1, p0); /* p0's 16, then p1's */
        _mm512_store_si512((void *)s->p_t[k / 2], _mm512_permutexvar_epi16(interleave, pair));
    }
    /* e^(old - new): 1 where the max stayed, 0 (well, under 1e-37, times 0) from -inf */
    const __m512 rescale = _mm512_mask_mov_ps(
        _mm512_set1_ps(1.f), _mm512_cmp_ps_mask(old_max, top, _CMP_NEQ_OQ),
        exp16(_mm512_sub_ps(old_max, shift)));
    _mm512_storeu_ps(rs, _mm512_fmadd_ps(_mm512_loadu_ps(rs), rescale, total));
    _mm512_storeu_ps(rm, top);
    return rescale;
}

#ifdef HAVE_AMX
/* O^T (16 rows' acc_t) = O^T * rescale + V^T . P^T over the tile's num_keys keys. */
static void amx_values_t(const struct chunk *c, int num_keys, __m512 rescale, float *acc_t,
                         struct cols_scratch *s) {
    const int num_blocks = c->head_dim / 16, num_steps = (num_keys + 31) / 32;
    for (int d0 = 0; d0 < num_blocks; d0 += 4) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int ks = 0; ks < num_steps; ks++) {
            _tile_loadd(4, s->p_t[16 * ks], 64);
#define PV_BLOCK(n, b)                                                         \
            if (d0 + (n) < num_blocks) {                                       \
                _tile_loadd(b, &s->v_t[16 * (d0 + (n))][32 * ks], KEY_TILE * 2); \
                _tile_dpbf16ps(n, b, 4);                                       \
            }
            PV_BLOCK(0, 6) PV_BLOCK(1, 7) PV_BLOCK(2, 6) PV_BLOCK(3, 7)
#undef PV_BLOCK
        }
        _tile_stored(0, s->pv_t[16 * d0], 64);
        if (d0 + 1 < num_blocks) _tile_stored(1, s->pv_t[16 * (d0 + 1)], 64);
        if (d0 + 2 < num_blocks) _tile_stored(2, s->pv_t[16 * (d0 + 2)], 64);
        if (d0 + 3 < num_blocks) _tile_stored(3, s->pv_t[16 * (d0 + 3)], 64);
    }
    for (int d = 0; d < c->head_dim; d++)
        _mm512_store_ps(acc_t + 16 * d, _mm512_fmadd_ps(_mm512_load_ps(acc_t + 16 * d), rescale,
                                                        _mm512_load_ps(s->pv_t[d])));
}

#endif

/* One work item: query tokens [first, first + num_tokens) of the chunk and the query
 * heads of kv_head, 16 rows at a time in a vector's lanes (cols_scratch), on AMX tiles
 * where is_amx. */
static void attend_tile_cols(const struct chunk *c, int kv_head, int first, int num_tokens,
                             int is_amx, struct cols_scratch *s) {
    const int group = c->num_heads / c->num_kv_heads, num_rows = num_tokens * group;
    const int num_row_groups = (num_rows + 15) / 16, num_pairs = c->head_dim / 2;
    float row_max[QUERY_TILE * MAX_GROUP], row_sum[QUERY_TILE * MAX_GROUP];
    for (int r = 0; r < 16 * num_row_groups; r++) row_max[r] = -INFINITY, row_sum[r] = 0.f;
    memset(s->acc_t, 0, sizeof(float) * 16 * (size_t)num_row_groups * c->head_dim);
    const int64_t first_pos = c->num_context + first, last_pos = first_pos + num_tokens - 1;
    for (int g = 0; g < num_row_groups; g++) /* Q^T: q_t[g][pair][lane], 16 pairs at a time */
        for (int j = 0; j < num_pairs; j += 16) {
            __m512i rows[16];
            for (int lane = 0; lane < 16; lane++) {
                const int r = 16 * g + lane;
                rows[lane] = _mm512_setzero_si512(); /* a padding row */
                if (r >= num_rows) continue;
                const uint16_t *q = c->q + (int64_t)(first + r / group) * c->q_stride +
                                    (int64_t)(kv_head * group + r % group) * c->head_dim;
                rows[lane] = _mm512_loadu_si512((const void *)(q + 2 * j));
            }
            transpose16(rows);
            for (int i = 0; i < 16; i++)
                _mm512_storeu_si512((void *)(s->q_t + ((int64_t)g * num_pairs + j + i) * 16),
                                    rows[i]);
        }
    __m512i positions[QUERY_TILE * MAX_GROUP / 16]; /* each lane's query position; -1: padding */
    for (int g = 0; g < num_row_groups; g++) {
        int32_t lanes[16];
        for (int lane = 0; lane < 16; lane++) {
            const int r = 16 * g + lane;
            lanes[lane] = r < num_rows ? (int)first_pos + r / group : -1;
        }
        positions[g] = _mm512_loadu_si512((const void *)lanes);
    }
#ifdef HAVE_AMX
    if (is_amx) {
        struct amx_config config __attribute__((aligned(64))) = {.palette = 1};
        for (int t = 0; t < 8; t++) config.rows[t] = 16, config.bytes_per_row[t] = 64;
        _tile_loadconfig(&config);
    }
#endif
    for (int64_t k0 = first_key_tile(c, first_pos); k0 <= last_pos; k0 += KEY_TILE) {
        const int num_keys = last_pos - k0 + 1 < KEY_TILE ? (int)(last_pos - k0 + 1) : KEY_TILE;
#ifdef HAVE_AMX
        if (is_amx) load_values_t(c, kv_head, k0, num_keys, s);
        else
#endif
            load_value_pairs(c, kv_head, k0, num_keys, s);
        for (int g = 0; g < num_row_groups; g++) {
            const int last_row = 16 * g + 15 < num_rows - 1 ? 16 * g + 15 : num_rows - 1;
            if (first_pos + last_row / group < k0) continue; /* the group sees none of it */
            const __m512i pos = positions[g];
            /* on the diagonal, the keys up to the group's last position */
            const int64_t num_to_last = first_pos + last_row / group - k0 + 1;
            const int num_seen = num_to_last < num_keys ? (int)num_to_last : num_keys;
            const uint32_t *q_t = s->q_t + (int64_t)g * num_pairs * 16;
            float *acc_t = s->acc_t + (int64_t)g * c->head_dim * 16;
#ifdef HAVE_AMX
            if (is_amx) {
                amx_scores_t(c, kv_head, k0, num_seen, q_t, s);
                const __m512 rescale = softmax_update_t(c, k0, num_seen, pos, row_max + 16 * g,
                                                        row_sum + 16 * g, s);
                amx_values_t(c, num_seen, rescale, acc_t, s);
                continue;
            }
#endif
            scores_t_avx(c, kv_head, k0, num_seen, q_t, s);
            const __m512 rescale = softmax_update_t(c, k0, num_seen, pos, row_max + 16 * g,
                                                    row_sum + 16 * g, s);
            values_t_avx(c, num_seen, rescale, acc_t, s);
        }
    }
#ifdef HAVE_AMX
    if (is_amx) _tile_release();
#endif
    /* out rows = O / sum: O^T's blocks of 16 dims transposed back into rows */
    for (int g = 0; g < num_row_groups; g++) {
        float inv[16];
        _mm512_storeu_ps(inv,
                         _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_loadu_ps(row_sum + 16 * g)));
        const float *acc_t = s->acc_t + (int64_t)g * c->head_dim * 16;
        const int num_here = num_rows - 16 * g < 16 ? num_rows - 16 * g : 16;
        for (int d0 = 0; d0 < c->head_dim; d0 += 16) {
            __m512i block[16];
            for (int i = 0; i < 16; i++)
                block[i] = _mm512_load_si512((const void *)(acc_t + 16 * (d0 + i)));
            transpose16(block); /* block[lane]: that row's dims d0 .. d0 + 15 */
            for (int lane = 0; lane < num_here; lane++) {
                const int r = 16 * g + lane;
                const __m512 row =
                    _mm512_mul_ps(_mm512_castsi512_ps(block[lane]), _mm512_set1_ps(inv[lane]));
                uint16_t *out = c->out + ((int64_t)(first + r / group) * c->num_heads +
                                          kv_head * group + r % group) * c->head_dim + d0;
                _mm256_storeu_si256((__m256i *)out, (__m256i)_mm512_cvtneps_pbh(row));
            }
        }
    }
}
#endif

/* out (num_query, num_heads, head_dim) = causal attention of the chunk's queries, at
 * positions num_context .. num_context + num_query - 1, over the cached keys of the
 * sequence (its own written already): query at position p sees keys (p - window, p]
 * (window 0: all from 0). q: num_query tokens q_stride elements apart, each token's heads
 * contiguous. block_table: the sequence's blocks from the one holding position
 * first_position (a multiple of block_size; blocks before it are never read).
 * Returns 0; -1 where this kernel does not run (no AVX-512 BF16, a float32 cache, head_dim
 * not a multiple of 32); -2 when out of memory. */
int paged_prefill_attention(const void *q, int64_t q_stride, const void *kv_cache, void *out,
                            int is_bf16, const int64_t *block_table, int64_t first_position,
                            int num_context, int num_query, int window, int num_layers,
                            int layer, int block_size, int num_heads, int num_kv_heads,
                            int head_dim, float scale, int num_threads) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512BF16__)
    if (!is_bf16 || head_dim % 32 || head_dim > MAX_HEAD_DIM || num_heads % num_kv_heads ||
        num_heads / num_kv_heads > MAX_GROUP)
        return -1;
    const int64_t layer_size = 2LL * block_size * num_kv_heads * head_dim;
    const struct chunk c = {
        q, kv_cache, out, block_table, q_stride, first_position, num_layers * layer_size,
        layer * layer_size, layer_size / 2, num_context, window, block_size,
        num_heads, num_kv_heads, head_dim, scale,
    };
    /* QUERY_TILE tokens an item, fewer when that leaves a thread without two items (a
     * short chunk after a long context) */
    int query_tile = QUERY_TILE;
    while (query_tile > 16 &&
           (num_query + query_tile - 1) / query_tile * num_kv_heads < 2 * num_threads)
        query_tile /= 2;
    const int num_tiles = (num_query + query_tile - 1) / query_tile;
    const int group = num_heads / num_kv_heads;
    int status = 0;
    int is_amx = 0;
#ifdef HAVE_AMX
    is_amx = q4_use_amx(-1) && block_size % 16 == 0; /* a group of 16 keys in one block */
#endif
    const size_t num_padded = (size_t)(QUERY_TILE * group + 15) / 16 * 16;
#pragma omp parallel num_threads(num_threads)
    {
        struct cols_scratch *s = aligned_alloc(64, sizeof *s);
        if (s) {
            s->q_t = malloc(sizeof(uint32_t) * num_padded * (size_t)(head_dim / 2));
            s->acc_t = aligned_alloc(64, sizeof(float) * num_padded * (size_t)head_dim);
        }
        const int is_ok = s && s->q_t && s->acc_t;
        if (!is_ok) {
#pragma omp atomic write
            status = -2;
        }
        /* the last tiles see the most keys: hand them out first */
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < num_tiles * num_kv_heads; item++) {
            if (!is_ok) continue;
            const int first = (num_tiles - 1 - item / num_kv_heads) * query_tile;
            const int num_tokens = num_query - first < query_tile ? num_query - first : query_tile;
            attend_tile_cols(&c, item % num_kv_heads, first, num_tokens, is_amx, s);
        }
        if (s) free(s->q_t), free(s->acc_t);
        free(s);
    }
    return status;
#else
    (void)q, (void)q_stride, (void)kv_cache, (void)out, (void)is_bf16, (void)block_table;
    (void)first_position, (void)num_context, (void)num_query, (void)window, (void)num_layers;
    (void)layer, (void)block_size, (void)num_heads, (void)num_kv_heads, (void)head_dim;
    (void)scale, (void)num_threads;
    return -1;
#endif
}
