#include "dgr_argmax.h"

#include <math.h>

static int argmax_from(const float *x, int from, int n, int best, float best_value) {
    for (int i = from; i < n; i++) {
        if (x[i] > best_value) { best_value = x[i]; best = i; }
    }
    return best;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* One pass over a 262k-entry row per output row, vectorized. Four independent
   (value, index) accumulators: one blend chain would bound the loop by its
   latency, not by memory. */
__attribute__((target("avx2")))
static int argmax_avx2(const float *x, int n) {
    __m256 best[4];
    __m256i best_i[4], idx[4];
    for (int a = 0; a < 4; a++) {
        best[a] = _mm256_set1_ps(-INFINITY);
        best_i[a] = _mm256_set1_epi32(-1);
        idx[a] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                  _mm256_set1_epi32(8 * a));
    }
    const __m256i step = _mm256_set1_epi32(32);
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int a = 0; a < 4; a++) {
            const __m256 v = _mm256_loadu_ps(x + i + 8 * a);
            const __m256 gt = _mm256_cmp_ps(v, best[a], _CMP_GT_OQ);  /* strict: a lane keeps its first maximum */
            best[a] = _mm256_blendv_ps(best[a], v, gt);
            best_i[a] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_i[a]),
                                                             _mm256_castsi256_ps(idx[a]), gt));
            idx[a] = _mm256_add_epi32(idx[a], step);
        }
    }
    float vals[32];
    int ids[32];
    for (int a = 0; a < 4; a++) {
        _mm256_storeu_ps(vals + 8 * a, best[a]);
        _mm256_storeu_si256((__m256i *) (ids + 8 * a), best_i[a]);
    }
    int b = -1;
    float bv = -INFINITY;
    for (int l = 0; l < 32; l++) {  /* the largest value; among equal ones the first index */
        if (ids[l] >= 0 && (vals[l] > bv || (vals[l] == bv && ids[l] < b))) { bv = vals[l]; b = ids[l]; }
    }
    return argmax_from(x, i, n, b, bv);
}
#endif

int dgr_argmax(const float *x, int n) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (__builtin_cpu_supports("avx2")) return argmax_avx2(x, n);
#endif
    return argmax_from(x, 0, n, -1, -INFINITY);
}
