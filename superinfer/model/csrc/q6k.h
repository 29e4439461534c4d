/* GGUF Q6_K weights in superinfer's own layout, at 6.625 bits a weight: made by pack_q6_k
 * (q_gemv.c), read by q6k_gemv (q_gemv.c, a few rows) and q6k_linear (q4_linear.c, any
 * number of rows, and q6k_rows for an embedding's lookups).
 *
 * w = d sc (q - 32), q = u in 0..63 (6 bits), sc an int8 per 16 inputs, d a float per 256
 * (a Q6_K super-block). Strips of 16 columns; per strip and block of 32 inputs a record of
 * Q6K_RECORD bytes:
 *
 *   [0, 256)    chunk k (0..7) at 32 k: byte 2 c + i holds, in its low nibble, the low 4
 *               bits of u of column c's input 2 k + i (pair k), in its high nibble those of
 *               input 16 + 2 k + i (pair k + 8);
 *   [256, 384)  chunk m (0..3) at 256 + 32 m: byte 2 c + i holds, in bits 2 s and 2 s + 1,
 *               u >> 4 of column c's input 2 (m + 4 s) + i (pair m + 4 s), s in 0..3;
 *   [384, 416)  sc of the 16 columns' inputs 0..15, then of inputs 16..31 (int8);
 *
 * and per strip and super-block, in `d`, the 16 columns' float d. Columns past the layer's
 * last (to a multiple of 16) hold u = 32, sc = 0 and d = 0: zero weights.
 */
#ifndef SUPERINFER_Q6K_H
#define SUPERINFER_Q6K_H

#define Q6K_STRIP 16  /* columns of a strip */
#define Q6K_RECORD 416
#define Q6K_SUPER 8   /* blocks of 32 in a super-block */

#endif
