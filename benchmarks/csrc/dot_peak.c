/* The CPU's peak rate of AVX-512 dot-product instructions, for benchmarks/roofline.py.
 *
 * Each thread runs 12 independent chains of one instruction (enough to cover its latency on
 * the CPUs measured), so the loop is bound by the instruction's throughput alone: no loads,
 * no other work. The rate is reported in the instruction's own arithmetic:
 *   vdpbf16ps zmm: 16 lanes x 2 bfloat16 products, 64 FLOP (a multiply-add is 2);
 *   vpdpbusd zmm:  16 lanes x 4 uint8 x int8 products, 128 OP.
 *
 *   cc -O2 -march=native -fopenmp dot_peak.c -o dot_peak && OMP_NUM_THREADS=2 ./dot_peak
 * prints one line per instruction: "<name> <giga-ops per second>" (the best of 3 runs).
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define CHAINS(OP)                                                                         \
    OP(a0, x0) OP(a1, x1) OP(a2, x2) OP(a3, x3) OP(a4, x0) OP(a5, x1) OP(a6, x2) OP(a7, x3)  \
    OP(a8, x0) OP(a9, x1) OP(a10, x2) OP(a11, x3)

/* The seed comes from argc so that the compiler cannot fold the chains into one. */
static double bf16_rate(long num_iters, int seed) {
    double sink = 0, start = now();
#pragma omp parallel reduction(+ : sink)
    {
        /* distinct starts: equal chains would be merged into one */
        __m512 a0 = _mm512_set1_ps(seed), a1 = _mm512_set1_ps(seed + 1);
        __m512 a2 = _mm512_set1_ps(seed + 2), a3 = _mm512_set1_ps(seed + 3);
        __m512 a4 = _mm512_set1_ps(seed + 4), a5 = _mm512_set1_ps(seed + 5);
        __m512 a6 = _mm512_set1_ps(seed + 6), a7 = _mm512_set1_ps(seed + 7);
        __m512 a8 = _mm512_set1_ps(seed + 8), a9 = _mm512_set1_ps(seed + 9);
        __m512 a10 = _mm512_set1_ps(seed + 10), a11 = _mm512_set1_ps(seed + 11);
        __m512bh x0 = (__m512bh)_mm512_set1_epi16(0x3f80 + seed);
        __m512bh x1 = (__m512bh)_mm512_set1_epi16(0x3f81 + seed);
        __m512bh x2 = (__m512bh)_mm512_set1_epi16(0x3f82 + seed);
        __m512bh x3 = (__m512bh)_mm512_set1_epi16(0x3f83 + seed);
        __m512bh y = (__m512bh)_mm512_set1_epi16(0x3a00 + seed);
#define BF16(a, x) a = _mm512_dpbf16_ps(a, x, y);
        for (long i = 0; i < num_iters; i++) {
            CHAINS(BF16)
        }
        __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
        s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
        sink += _mm512_reduce_add_ps(s);
    }
    double seconds = now() - start;
    if (sink == 1.2345) printf("\n"); /* keeps the result alive */
    return num_iters * 12.0 * omp_get_max_threads() * 64 / seconds / 1e9;
}

static double int8_rate(long num_iters, int seed) {
    long sink = 0;
    double start = now();
#pragma omp parallel reduction(+ : sink)
    {
        __m512i a0 = _mm512_set1_epi32(seed), a1 = _mm512_set1_epi32(seed + 1);
        __m512i a2 = _mm512_set1_epi32(seed + 2), a3 = _mm512_set1_epi32(seed + 3);
        __m512i a4 = _mm512_set1_epi32(seed + 4), a5 = _mm512_set1_epi32(seed + 5);
        __m512i a6 = _mm512_set1_epi32(seed + 6), a7 = _mm512_set1_epi32(seed + 7);
        __m512i a8 = _mm512_set1_epi32(seed + 8), a9 = _mm512_set1_epi32(seed + 9);
        __m512i a10 = _mm512_set1_epi32(seed + 10), a11 = _mm512_set1_epi32(seed + 11);
        __m512i x0 = _mm512_set1_epi8(1 + seed), x1 = _mm512_set1_epi8(2 + seed);
        __m512i x2 = _mm512_set1_epi8(3 + seed), x3 = _mm512_set1_epi8(4 + seed);
        __m512i y = _mm512_set1_epi8(seed);
#define INT8(a, x) a = _mm512_dpbusd_epi32(a, x, y);
        for (long i = 0; i < num_iters; i++) {
            CHAINS(INT8)
        }
        __m512i s = _mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                                     _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)));
        s = _mm512_add_epi32(s, _mm512_add_epi32(_mm512_add_epi32(a8, a9), _mm512_add_epi32(a10, a11)));
        sink += _mm512_reduce_add_epi32(s);
    }
    double seconds = now() - start;
    if (sink == 12345) printf("\n");
    return num_iters * 12.0 * omp_get_max_threads() * 128 / seconds / 1e9;
}

int main(int argc, char **argv) {
    (void)argv;
    const long num_iters = 50000000; /* about 0.6 s a run on a 3.6 GHz core */
    double best_bf16 = 0, best_int8 = 0;
    for (int run = 0; run < 3; run++) {
        double r = bf16_rate(num_iters, argc);
        best_bf16 = r > best_bf16 ? r : best_bf16;
        r = int8_rate(num_iters, argc);
        best_int8 = r > best_int8 ? r : best_int8;
    }
    printf("vdpbf16ps %.1f\nvpdpbusd %.1f\n", best_bf16, best_int8);
    return 0;
}
