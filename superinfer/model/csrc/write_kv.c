/* Store a step's K and V rows in their paged cache slots, on CPU.
 *
 * Built with paged_decode.c by superinfer/model/cpu_kernels.py and called through ctypes
 * (superinfer/model/cpu_attention.py). One copy per token and tensor, where the indexed
 * assignment in PyTorch stacks k and v into a new tensor first and then scatters it.
 * The cache layout is paged_decode.c's:
 *     kv_cache[num_blocks][num_layers][2][block_size][num_kv_heads][head_dim]
 */
#include <stdint.h>
#include <string.h>

/* k, v: num_tokens rows of row_size elements (all kv heads of a token, contiguous), rows
 * k_stride / v_stride elements apart. Token t goes to block slot_blocks[t], offset
 * slot_offsets[t] of `layer`. Returns 0, or -1 if a slot lies outside the cache (nothing
 * after the bad slot is written). */
int write_kv(const void *k, int64_t k_stride, const void *v, int64_t v_stride, void *kv_cache,
             const int64_t *slot_blocks, const int64_t *slot_offsets, int64_t num_tokens,
             int64_t num_blocks, int num_layers, int layer, int block_size, int row_size,
             int element_size) {
    const int64_t row_bytes = (int64_t)row_size * element_size;
    for (int64_t t = 0; t < num_tokens; t++) {
        const int64_t block = slot_blocks[t], offset = slot_offsets[t];
        if (block < 0 || block >= num_blocks || offset < 0 || offset >= block_size) return -1;
        char *slot = (char *)kv_cache +
                     (((block * num_layers + layer) * 2) * block_size + offset) * row_bytes;
        memcpy(slot, (const char *)k + t * k_stride * element_size, (size_t)row_bytes);
        memcpy(slot + (int64_t)block_size * row_bytes,
               (const char *)v + t * v_stride * element_size, (size_t)row_bytes);
    }
    return 0;
}
