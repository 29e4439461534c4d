/* A decode layer's attention from its fused q/k/v projection, in one call, on CPU: the
 * rotary embedding of q and k, the K/V write into the paged cache, and paged decode
 * attention (paged_decode.c).
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

int paged_decode_attention(const void *q, const void *kv_cache, void *out, int is_bf16,
                           const int64_t *block_tables, const int64_t *seq_lens,
                           const int64_t *key_starts, int num_seqs, int max_blocks,
                           int num_layers, int layer, int block_size, int num_heads,
                           int num_kv_heads, int head_dim, float scale, int num_threads);

/* Rotate the head_dim / 2 interleaved pairs of `num_heads` rows of `src` (consecutive, each
 * head_dim long) by `rotation` (head_dim / 2 complex numbers, float re/im pairs) into
 * `dst`. */
static void rotate_heads(const void *src, void *dst, const float *rotation, int num_heads,
                         int head_dim, int is_bf16) {
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
