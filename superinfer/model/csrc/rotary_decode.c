/* A decode layer's attention from its fused q/k/v projection, in one call, on CPU: the
 * rotary embedding of q and k, the K/V write into the paged cache, and paged decode
 * attention (paged_decode.c). And the rotary embedding alone, of many tokens (rotary_rows:
 * a prefill's q and k, superinfer/model/cpu_rotary.py).
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * by superinfer/model/cpu_decode.py. Through the modules, the same work is about twenty
 * PyTorch ops and Python calls per layer (split, upcast, complex multiply, downcast, the
 * write, the attention call and their checks), which cost a small model's decode step more
 * than the arithmetic.
 *
 * The results are the module path's bit for bit. The rotation is PyTorch's complex
 * multiply of interleaved pairs, (a + ib)(c + id) = (ac - bd) + i(ad + bc), where each
 * product is rounded to float before the sum: contracting them into fused multiply-adds
 * would change the last bit, so contraction is off in this file (GCC contracts across
 * statements by default; clang only within one expression, and the products are
 * separate statements). Rotated values are rounded to the cache's dtype once, as
 * `apply_rotary` rounds them.
 */
#pragma GCC optimize("fp-contract=off")

#include <stdint.h>
#include <string.h>

#include "bf16.h"
#include "kernels.h"

#ifdef __AVX512F__
/* 8 pairs (a, b) of x, each times its rotation (c, d), 16 floats at rot: (ac - bd, ad + bc),
 * each product rounded to float before the sum, as the scalar form below */
static inline __m512 rotate8(__m512 x, const float *rot) {
    const __m512 r = _mm512_loadu_ps(rot);
    const __m512 p = _mm512_mul_ps(x, _mm512_moveldup_ps(r));                          /* ac, bc */
    const __m512 q = _mm512_mul_ps(_mm512_permute_ps(x, 0xB1), _mm512_movehdup_ps(r)); /* bd, ad */
    return _mm512_mask_sub_ps(_mm512_add_ps(p, q), 0x5555, p, q);
}

static inline __m512 bf16_half(__m256i words) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(words), 16));
}

static inline __m256i bf16_words(__m512 x) {
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(rounded_bits(x), 16));
}
#endif

/* Rotate the head_dim / 2 interleaved pairs of `num_heads` rows of `src` (consecutive, each
 * head_dim long) by `rotation` (head_dim / 2 complex numbers, float re/im pairs) into
 * `dst`: with AVX-512, 16 pairs at a time (bfloat16) or 8 (float) where the head divides
 * into them, the same arithmetic. */
static void rotate_heads(const void *src, void *dst, const float *rotation, int num_heads,
                         int head_dim, int is_bf16) {
#ifdef __AVX512F__
    if (is_bf16 && head_dim % 32 == 0) {
        for (int64_t i = 0; i < (int64_t)num_heads * head_dim; i += 32) {
            const __m512i words = _mm512_loadu_si512((const uint16_t *)src + i);
            const float *rot = rotation + i % head_dim;
            const __m512 lo = rotate8(bf16_half(_mm512_castsi512_si256(words)), rot);
            const __m512 hi = rotate8(bf16_half(_mm512_extracti64x4_epi64(words, 1)), rot + 16);
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i), bf16_words(lo));
            _mm256_storeu_si256((__m256i *)((uint16_t *)dst + i + 16), bf16_words(hi));
        }
        return;
    }
    if (!is_bf16 && head_dim % 16 == 0) {
        for (int64_t i = 0; i < (int64_t)num_heads * head_dim; i += 16)
            _mm512_storeu_ps((float *)dst + i,
                             rotate8(_mm512_loadu_ps((const float *)src + i), rotation + i % head_dim));
        return;
    }
#endif
    for (int h = 0; h < num_heads; h++) {
        for (int j = 0; j < head_dim / 2; j++) {
            const int64_t i = (int64_t)h * head_dim + 2 * j;
            float a, b;
            if (is_bf16) {
                a = bf16_to_float(((const uint16_t *)src)[i]);
                b = bf16_to_float(((const uint16_t *)src)[i + 1]);
            } else {
                a = ((const float *)src)[i], b = ((const float *)src)[i + 1];
            }
            const float c = rotation[2 * j], d = rotation[2 * j + 1];
            const float ac = a * c, bd = b * d, ad = a * d, bc = b * c;
            const float re = ac - bd, im = ad + bc;
            if (is_bf16) {
                ((uint16_t *)dst)[i] = float_to_bf16(re);
                ((uint16_t *)dst)[i + 1] = float_to_bf16(im);
            } else {
                ((float *)dst)[i] = re, ((float *)dst)[i + 1] = im;
            }
        }
    }
}

/* out (num_tokens, num_heads, head_dim), contiguous = x's heads rotated, token t by its row
 * of rotation (num_tokens, head_dim / 2 complex numbers): `apply_rotary` of a prefill's q
 * and k. x: token t's heads consecutive at x + t * x_stride elements. Returns 0. */
int rotary_rows(const void *x, int64_t x_stride, const float *rotation, int64_t num_tokens,
                int num_heads, int head_dim, int is_bf16, void *out, int num_threads) {
    const int64_t element_size = is_bf16 ? 2 : 4, row = (int64_t)num_heads * head_dim;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_tokens * row >= 65536)
    for (int64_t t = 0; t < num_tokens; t++)
        rotate_heads((const char *)x + t * x_stride * element_size,
                     (char *)out + t * row * element_size, rotation + t * head_dim, num_heads,
                     head_dim, is_bf16);
    return 0;
}

/* Decode attention of num_seqs sequences, one query token each, token s of sequence s.
 *
 * qkv: num_seqs rows, qkv_stride elements apart, each [q heads | k heads | v heads]
 * (num_heads, num_kv_heads, num_kv_heads rows of head_dim). rotation: (num_seqs,
 * head_dim / 2) complex numbers as float re/im pairs. Token s's rotated K and its V go to
 * block slot_blocks[s], offset slot_offsets[s] of `layer` in kv_cache (paged_decode.c's
 * layout); its rotated q to q_rotated (num_seqs, num_heads, head_dim), a scratch buffer.
 * Then out (num_seqs, num_heads, head_dim) = paged_decode_attention over block_tables
 * (num_seqs, max_blocks) and seq_lens (the new token included).
 * Returns 0; -3 if a slot lies outside the cache (nothing is attended); else
 * paged_decode_attention's status. */
int rotary_decode_attention(const void *qkv, int64_t qkv_stride, const float *rotation,
                            void *q_rotated, void *kv_cache, const int64_t *slot_blocks,
                            const int64_t *slot_offsets, int64_t num_blocks,
                            const int64_t *block_tables, const int64_t *seq_lens, int num_seqs,
                            int max_blocks, int num_layers, int layer, int block_size,
                            int num_heads, int num_kv_heads, int head_dim, float scale,
                            int is_bf16, void *out, int num_threads) {
    const int64_t element_size = is_bf16 ? 2 : 4;
    const int64_t row_bytes = (int64_t)num_kv_heads * head_dim * element_size;
    for (int s = 0; s < num_seqs; s++) {
        const int64_t block = slot_blocks[s], offset = slot_offsets[s];
        if (block < 0 || block >= num_blocks || offset < 0 || offset >= block_size) return -3;
        const char *row = (const char *)qkv + s * qkv_stride * element_size;
        const char *k = row + (int64_t)num_heads * head_dim * element_size;
        const float *rot = rotation + (int64_t)s * head_dim;
        char *slot = (char *)kv_cache +
                     (((block * num_layers + layer) * 2) * block_size + offset) * row_bytes;
        rotate_heads(row, (char *)q_rotated + (int64_t)s * num_heads * head_dim * element_size,
                     rot, num_heads, head_dim, is_bf16);
        rotate_heads(k, slot, rot, num_kv_heads, head_dim, is_bf16);
        memcpy(slot + (int64_t)block_size * row_bytes, k + row_bytes, (size_t)row_bytes);
    }
    return paged_decode_attention(q_rotated, kv_cache, out, is_bf16, block_tables, seq_lens, NULL,
                                  num_seqs, max_blocks, num_layers, layer, block_size, num_heads,
                                  num_kv_heads, head_dim, scale, num_threads);
}
