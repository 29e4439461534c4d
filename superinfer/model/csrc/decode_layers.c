/* A decode step's layers in one call, on CPU: the flat loop of superinfer/model/cpu_decode.py
 * (FlatDecode) run from C, for models whose projections all run C kernels at the step's
 * number of rows (bfloat16, GGUF weights kept quantized).
 *
 * Built with the other kernels by superinfer/model/cpu_kernels.py and called through ctypes
 * by cpu_decode.py. The flat loop makes nine ctypes calls a layer, and each costs 4-6 us of
 * Python around its kernel (converting the arguments, an output tensor, the thread count):
 * about a fifth of a one-sequence decode step of the default model. Here the same kernels
 * run in the same order on the same kinds of buffers, so the results are the flat loop's
 * bit for bit; only the Python between them is gone.
 *
 * Each projection comes as the C function its module calls for this many rows (the
 * few-row GEMV of q_gemv.c or a GEMM of q4_linear.c / q4_q8_linear.c) with its weights.
 * They all have `linear_fn`'s parameters, with their own pointer types for the weights
 * (ctypes calls them the same way).
 */
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

/* y (num_rows, num_out) bfloat16 = x (num_rows, num_in) bfloat16 @ w.T (+ bias) */
typedef int (*linear_fn)(const void *x, int64_t x_stride, int64_t num_rows, int64_t num_in,
                         const void *packed, const void *scales, const float *bias, void *y,
                         int64_t num_out, int num_threads);

/* A projection as its module runs this step's rows (cpu_kernels.KernelCall). */
struct linear_call {
    linear_fn fn;
    const void *packed, *scales;
    const float *bias; /* NULL: none */
    int64_t num_in, num_out;
};

/* One layer: its projections, its norms' weights (float32, offset included) and eps. */
struct decode_layer {
    struct linear_call qkv, o, gate_up, down;
    const float *input_norm, *post_norm;
    const float *q_norm, *k_norm; /* Qwen3's per-head norms, or NULL */
    float eps;
};

/* The step: its rows, buffers (bfloat16, contiguous, `num_rows` rows each) and what
 * rotary_decode_attention takes besides the layer. */
struct decode_step {
    int64_t num_rows;
    int hidden, num_threads;
    void *residual; /* in: the embeddings; the residual stream, added to in place */
    void *h, *qkv, *q_rotated, *attention, *y, *gate_up, *act;
    void *out; /* the final norm's output */
    const float *final_norm;
    float final_eps;
    const float *rotation;
    void *kv_cache;
    const int64_t *slot_blocks, *slot_offsets;
    int64_t num_blocks;
    const int64_t *block_tables, *seq_lens;
    int max_blocks, num_cached_layers, block_size, num_heads, num_kv_heads, head_dim;
    float scale;
};

#define TRY(call)                         \
    do {                                  \
        const int status_ = (call);       \
        if (status_ != 0) return status_; \
    } while (0)

static int linear(const struct linear_call *l, const void *x, const struct decode_step *s,
                  void *y) {
    return l->fn(x, l->num_in, s->num_rows, l->num_in, l->packed, l->scales, l->bias, y,
                 l->num_out, s->num_threads);
}

/* residual += x (unless x is NULL), then out = RMSNorm(residual) * weight */
static int norm(const struct decode_step *s, const void *x, const float *weight, float eps,
                void *out) {
    if (x == NULL)
        return add_rms_norm(s->residual, s->hidden, NULL, 0, weight, out, s->num_rows,
                            s->hidden, 1, eps, s->num_threads);
    return add_rms_norm(x, s->hidden, s->residual, s->hidden, weight, out, s->num_rows,
                        s->hidden, 1, eps, s->num_threads);
}

/* Qwen3's q and k norms, in place in the fused projection's output */
static int qk_norms(const struct decode_step *s, const struct decode_layer *l) {
    const int64_t width = l->qkv.num_out;
    char *k = (char *)s->qkv + (int64_t)s->num_heads * s->head_dim * 2;
    TRY(rms_norm_heads(s->qkv, width, s->qkv, width, s->num_rows, s->num_heads, s->head_dim,
                       l->q_norm, 1, l->eps, s->num_threads));
    return rms_norm_heads(k, width, k, width, s->num_rows, s->num_kv_heads, s->head_dim,
                          l->k_norm, 1, l->eps, s->num_threads);
}

static int attend(const struct decode_step *s, const struct decode_layer *l, int layer) {
    return rotary_decode_attention(
        s->qkv, l->qkv.num_out, s->rotation, s->q_rotated, s->kv_cache, s->slot_blocks,
        s->slot_offsets, s->num_blocks, s->block_tables, s->seq_lens, (int)s->num_rows,
        s->max_blocks, s->num_cached_layers, layer, s->block_size, s->num_heads,
        s->num_kv_heads, s->head_dim, s->scale, 1, s->attention, s->num_threads);
}

/* The layers and the final norm, as FlatDecode.__call__ runs them. Returns 0, or the first
 * failing kernel's status (rotary_decode_attention's -3: a slot outside the cache). */
int decode_layers(const struct decode_layer *layers, int num_layers,
                  const struct decode_step *s) {
    TRY(norm(s, NULL, layers[0].input_norm, layers[0].eps, s->h));
    for (int i = 0; i < num_layers; i++) {
        const struct decode_layer *l = &layers[i];
        if (i) TRY(norm(s, s->y, l->input_norm, l->eps, s->h));
        TRY(linear(&l->qkv, s->h, s, s->qkv));
        if (l->q_norm) TRY(qk_norms(s, l));
        TRY(attend(s, l, i));
        TRY(linear(&l->o, s->attention, s, s->y));
        TRY(norm(s, s->y, l->post_norm, l->eps, s->h));
        TRY(linear(&l->gate_up, s->h, s, s->gate_up));
        TRY(silu_mul(s->gate_up, l->gate_up.num_out, s->act, s->num_rows,
                     l->gate_up.num_out / 2, s->num_threads));
        TRY(linear(&l->down, s->act, s, s->y));
    }
    return norm(s, s->y, s->final_norm, s->final_eps, s->out);
}
