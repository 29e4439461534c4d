/* The kernels that one C file of this library calls in another, declared once: the files
 * that define them include this too, so the compiler checks that both agree. */
#ifndef SUPERINFER_KERNELS_H
#define SUPERINFER_KERNELS_H

#include <stdint.h>

/* rms_norm.c */
int add_rms_norm(const void *x, int64_t x_stride, void *residual, int64_t residual_stride,
                 const float *weight, void *out, int64_t num_rows, int hidden, int is_bf16,
                 float eps, int num_threads);
int rms_norm_heads(const void *x, int64_t x_stride, void *out, int64_t out_stride,
                   int64_t num_tokens, int num_heads, int head_dim, const float *weight,
                   int is_bf16, float eps, int num_threads);

/* gated_act.c */
int silu_mul(const void *x, int64_t x_stride, void *out, int64_t num_rows, int64_t inner,
             int num_threads);

/* paged_decode.c */
int paged_decode_attention(const void *q, const void *kv_cache, void *out, int is_bf16,
                           const int64_t *block_tables, const int64_t *seq_lens,
                           const int64_t *key_starts, int num_seqs, int max_blocks,
                           int num_layers, int layer, int block_size, int num_heads,
                           int num_kv_heads, int head_dim, float scale, int num_threads);

/* rotary_decode.c */
int rotary_decode_attention(const void *qkv, int64_t qkv_stride, const float *rotation,
                            void *q_rotated, void *kv_cache, const int64_t *slot_blocks,
                            const int64_t *slot_offsets, int64_t num_blocks,
                            const int64_t *block_tables, const int64_t *seq_lens, int num_seqs,
                            int max_blocks, int num_layers, int layer, int block_size,
                            int num_heads, int num_kv_heads, int head_dim, float scale,
                            int is_bf16, void *out, int num_threads);

#endif
