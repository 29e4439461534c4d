/* Residual add and RMSNorm in one pass over each row, on CPU.
 *
 * Built with paged_decode.c by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_norm.py). A decode step of a small model normalises a few rows of
 * a few hundred numbers 2 * num_layers + 1 times; PyTorch's CPU rms_norm runs that as about
 * ten separate ops (upcast, square, mean, rsqrt, two multiplies, downcast), whose dispatch
 * costs more than the arithmetic. Here it is one call.
 *
 * The arithmetic is PyTorch's: the sum is rounded to the tensor's dtype and stored in the
 * residual first; the norm is computed in float from that stored value,
 * out = x * rsqrt(mean(x^2) + eps) * weight, and rounded to the dtype once at the end.
 */
#include <math.h>
#include <stdint.h>

#include "bf16.h"
#include "kernels.h"

#define MAX_HIDDEN 65536

static inline float load(const void *p, int64_t i, int is_bf16) {
    return is_bf16 ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

static inline void store(void *p, int64_t i, float f, int is_bf16) {
    if (is_bf16)
        ((uint16_t *)p)[i] = float_to_bf16(f);
    else
        ((float *)p)[i] = f;
}

/* For each of num_rows rows of `hidden` numbers:
 *   residual != NULL: residual[r] += x[r] (rounded to the dtype), then normalise residual[r];
 *   residual == NULL: normalise x[r].
 * out[r] = normalised row * weight (float32, offset already added). Row strides are in
 * elements; each row's numbers are contiguous. out is contiguous. is_bf16: 1 for bfloat16
 * tensors, 0 for float32. Returns 0, or -1 for a row longer than MAX_HIDDEN. */
int add_rms_norm(const void *x, int64_t x_stride, void *residual, int64_t residual_stride,
                 const float *weight, void *out, int64_t num_rows, int hidden, int is_bf16,
                 float eps, int num_threads) {
    if (hidden > MAX_HIDDEN) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_rows * hidden >= 65536)
    for (int64_t r = 0; r < num_rows; r++) {
        const void *src = x;
        int64_t base = r * x_stride;
        if (residual) {
            const int64_t rb = r * residual_stride;
            for (int i = 0; i < hidden; i++)
                store(residual, rb + i, load(residual, rb + i, is_bf16) + load(x, base + i, is_bf16),
                      is_bf16);
            src = residual, base = rb;
        }
        float sum = 0.f;
        for (int i = 0; i < hidden; i++) {
            float v = load(src, base + i, is_bf16);
            sum += v * v;
        }
        const float inv = 1.f / sqrtf(sum / (float)hidden + eps);
        const int64_t ob = r * (int64_t)hidden;
        for (int i = 0; i < hidden; i++)
            store(out, ob + i, load(src, base + i, is_bf16) * inv * weight[i], is_bf16);
    }
    return 0;
}

/* RMSNorm of each head of num_tokens tokens: row (t, h), head_dim numbers, at x +
 * t * x_stride + h * head_dim, written to out + t * out_stride + h * head_dim (out may be x:
 * each row is read whole before it is written). Qwen3's and Gemma 3's per-head q/k norms,
 * on the heads of the fused q/k/v projection; the arithmetic of add_rms_norm without a
 * residual. Returns 0, or -1 for a head longer than MAX_HIDDEN. */
int rms_norm_heads(const void *x, int64_t x_stride, void *out, int64_t out_stride,
                   int64_t num_tokens, int num_heads, int head_dim, const float *weight,
                   int is_bf16, float eps, int num_threads) {
    if (head_dim > MAX_HIDDEN) return -1;
    const int64_t num_rows = num_tokens * num_heads;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_rows * head_dim >= 65536)
    for (int64_t r = 0; r < num_rows; r++) {
        const int64_t t = r / num_heads, h = r % num_heads;
        const int64_t base = t * x_stride + h * head_dim, ob = t * out_stride + h * head_dim;
        float sum = 0.f;
        for (int i = 0; i < head_dim; i++) {
            float v = load(x, base + i, is_bf16);
            sum += v * v;
        }
        const float inv = 1.f / sqrtf(sum / (float)head_dim + eps);
        for (int i = 0; i < head_dim; i++)
            store(out, ob + i, load(x, base + i, is_bf16) * inv * weight[i], is_bf16);
    }
    return 0;
}
