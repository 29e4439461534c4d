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

#include <stdint.h>

#define Q6K_STRIP 16  /* columns of a strip */
#define Q6K_RECORD 416
#define Q6K_SUPER 8   /* blocks of 32 in a super-block */

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Pairs k and k + 8 of a record's 16 columns, k = m + 4 s (m in 0..3, s in 0..1), as the u
 * of each weight in the low 6 bits of a word (bits above 5 are not cleared): word 2 c + i of
 * *u0 is column c's input 2 k + i, of *u1 its input 16 + 2 k + i. `high` is the record's
 * chunk m of high bits (at 256 + 32 m) widened to words. */
static inline __attribute__((always_inline)) void q6k_pairs(const uint8_t *record, __m512i high,
                                                            int m, int s, __m512i *u0,
                                                            __m512i *u1) {
    const __m512i low4 = _mm512_set1_epi16(0x000F);
    const __m512i nib = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256((const __m256i *)(record + 32 * (m + 4 * s))));
    /* bits 4, 5 of each word: u >> 4 of slot s, then of slot s + 2 */
    const __m512i h0 = s ? _mm512_slli_epi16(high, 2) : _mm512_slli_epi16(high, 4);
    const __m512i h1 = s ? _mm512_srli_epi16(high, 2) : high;
    /* (c ? a : b) bitwise: the nibble in bits 0..3, the high bits above */
    *u0 = _mm512_ternarylogic_epi32(nib, h0, low4, 0xE4);
    *u1 = _mm512_ternarylogic_epi32(_mm512_srli_epi16(nib, 4), h1, low4, 0xE4);
}
#endif

#endif
