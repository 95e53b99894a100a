// Internals shared by the translation units of the speczoo CPU kernel library (cpu_kernels.cpp: linears
// and attention; cpu_block.cpp: a whole decoder block in one call). Not a public API: Python reaches the
// library only through the extern "C" entry points. Everything here keeps the batch-invariance contract
// of cpu_kernels.cpp: a row's result never depends on S, on the other rows or on the thread count.
#pragma once
#include <math.h>
#include <stdint.h>
#include <mutex>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

enum { SZ_FMT_Q4 = 0, SZ_FMT_Q8 = 1 };
#define SZ_WS_WORDS 48  // per-thread linear workspace, in 32-bit words per activation row

// One packed linear layer (kernels/pack.py layouts). q4: a = qs, b = sc, c = mn, d = dd; q8: a = w8, d = sw.
struct SzLinear {
    int64_t fmt, N, K;
    const uint8_t *a, *b, *c;
    const float* d;
    const float* bias;  // [N] or null
};

std::mutex& sz_lock();                             // serializes users of the shared activation scratch
int sz_reserve_scratch(int64_t S, int64_t KP);     // call under sz_lock(), outside a parallel region
int64_t sz_linear_kpad(const SzLinear& w);
void sz_linear_omp(const SzLinear& w, const float* x, int64_t S, int64_t ldx, float* y, int64_t ldy, bool accum,
                   int32_t* ws);
int64_t sz_attend_plan(int64_t S, int64_t H, int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi,
                       const int64_t* off, const int64_t* idx);
int64_t sz_attend_slots_len(int64_t nmax);
int64_t sz_attend_scores_len(int64_t nmax, int64_t G);
void sz_attend_omp(const float* q, int64_t S, int64_t H, int64_t Dh, const float* kc, const float* vc, int64_t Hkv,
                   int64_t C, const int64_t* lo, const int64_t* hi, const int64_t* off, const int64_t* idx,
                   int64_t nmax, float* out, int32_t* slots, float* scores);

#if defined(__AVX512F__)
static inline __m512 exp_neg_ps(__m512 x) {  // e^x for x <= 0 (x = -inf gives 0)
    const __m512 log2e = _mm512_set1_ps(1.44269504088896341f);
    const __m512 ln2_hi = _mm512_set1_ps(0.693359375f), ln2_lo = _mm512_set1_ps(-2.12194440e-4f);
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));  // below: exp underflows to 0 through scalef
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, log2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, ln2_hi, x);
    r = _mm512_fnmadd_ps(n, ln2_lo, r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

#endif
