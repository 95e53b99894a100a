// speczoo CPU linear kernels: y[S, N] = x[S, K] @ W[N, K]^T (+ bias), int8 activations quantized per
// row, int8 ("q8") or 4-bit ("q4") weights, int32 accumulation, fp32 scales applied in a fixed order.
//
// Batch invariance is the contract: every output element y[s, n] is computed by one thread with one
// fixed sequence of operations that depends only on row s of x and column n of W, never on S, on the
// row tiling, or on the number of threads. Integer sums are exact, so only the order of the fp32 steps
// matters, and that order is spelled out below and mirrored exactly by the PyTorch reference
// (speczoo/kernels/reference.py). Compile with -ffp-contract=off: a fused multiply-add would round
// differently from the reference.
//
// Weight layouts (built by speczoo/kernels/pack.py; NB = ceil(N/16) strips of 16 output columns):
//   q8: w8 u8 [NB, KP/4, 16, 4] = q + 128 (q in [-127, 127]), KP = K rounded up to 16;
//       sw f32 [NB*16] per-column scale.
//       y = ((float)(sum_k xq*q) * sa[s]) * sw[n]  (+ bias[n])
//   q4: super-blocks of 256 along K (KB of them), groups of 32; w = D*sc_g*q - Dm*m_g, q in [0, 15]
//       qs u8 [NB, KB, 8 groups, 4 j, 16 col, 4 i]: low nibble q[k = 32g + 4j + i], high nibble k + 16
//       sc u8 [NB, KB, 8, 16]; mn u8 [NB, KB, 4 pairs, 16 col, 2] (m of groups 2p, 2p+1)
//       dd f32 [NB, KB, 2, 16] (D then Dm)
//       F = sum_b (float)(sum_g sc_g * sum_{k in g} xq*q) * D_b        (b in order, from 0.0f)
//       M = sum_b (float)(sum_g m_g * sum_{k in g} xq) * Dm_b          (b in order, from 0.0f)
//       y = (F - M) * sa[s]  (+ bias[n])
// Activations: sa = amax|x[s]| / 127, xq = round_half_even(x / sa) clamped to [-127, 127] (0 if sa == 0).

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
#include <mutex>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)
#include <immintrin.h>
#define SZ_VNNI 1
#else
#define SZ_VNNI 0
#endif

#define SZ_RMAX 20  // most activation rows kept in registers per pass over a weight strip

extern "C" int sz_has_vnni(void) { return SZ_VNNI; }
extern "C" int sz_abi_version(void) { return 3; }

// ---------------------------------------------------------------- activation quantization (per row)
// xq int8 [S, KP] (zero padded), sa f32 [S], xs16 int16 [S, KP/32] (sum of xq per group of 32),
// xsum int32 [S] (sum of xq over the row).
static void quantize_row(const float* x, int64_t K, int64_t KP, int8_t* xq, float* sa, int16_t* xs16,
                         int32_t* xsum) {
    float amax = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
        float a = fabsf(x[k]);
        amax = a > amax ? a : amax;
    }
    float s = amax / 127.0f;
    *sa = s;
    int32_t total = 0;
    for (int64_t k = 0; k < KP; ++k) {
        int32_t q = 0;
        if (k < K && s > 0.0f) {
            float v = nearbyintf(x[k] / s);  // default rounding mode: half to even
            v = v > 127.0f ? 127.0f : (v < -127.0f ? -127.0f : v);
            q = (int32_t)v;
        }
        xq[k] = (int8_t)q;
        total += q;
    }
    for (int64_t g = 0; g < KP / 32; ++g) {
        int32_t t = 0;
        for (int i = 0; i < 32; ++i) t += xq[g * 32 + i];
        xs16[g] = (int16_t)t;
    }
    *xsum = total;
}

// Per-thread scratch for the quantized activations, grown on demand and never shrunk.
struct Scratch {
    int8_t* xq = nullptr;
    float* sa = nullptr;
    int16_t* xs16 = nullptr;
    int32_t* xsum = nullptr;
    int64_t cap_xq = 0, cap_s = 0, cap_g = 0;
};
static Scratch g_scratch;
static std::mutex g_lock;  // the scratch is shared: one call at a time

static int ensure_scratch(int64_t S, int64_t KP) {
    Scratch& sc = g_scratch;
    if (S * KP > sc.cap_xq) {
        free(sc.xq);
        sc.xq = (int8_t*)aligned_alloc(64, ((S * KP + 63) / 64) * 64);
        sc.cap_xq = sc.xq ? S * KP : 0;
    }
    if (S > sc.cap_s) {
        free(sc.sa);
        free(sc.xsum);
        sc.sa = (float*)malloc(sizeof(float) * S);
        sc.xsum = (int32_t*)malloc(sizeof(int32_t) * S);
        sc.cap_s = (sc.sa && sc.xsum) ? S : 0;
    }
    if (S * (KP / 32) > sc.cap_g) {
        free(sc.xs16);
        sc.xs16 = (int16_t*)malloc(sizeof(int16_t) * S * (KP / 32) + 64);
        sc.cap_g = sc.xs16 ? S * (KP / 32) : 0;
    }
    return (sc.xq && sc.sa && sc.xsum && sc.xs16) ? 0 : -1;
}

static inline int32_t load_i32(const void* p) {
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline void store_cols(float* y, const float* v, int64_t ncols) {
    for (int64_t c = 0; c < ncols; ++c) y[c] = v[c];
}

// ---------------------------------------------------------------- q8 strip kernels
// One strip of 16 columns, R rows. out[r][c] gets the finished fp32 value.
template <int R>
static void q8_strip(const uint8_t* w, int64_t KP, const int8_t* xq, int64_t ldq, const float* sa,
                     const int32_t* xsum, const float* sw, const float* bias, float out[][16]) {
#if SZ_VNNI
    __m512i acc[R];
    __m512i acc2[R];
    for (int r = 0; r < R; ++r) acc[r] = acc2[r] = _mm512_setzero_si512();
    const int64_t KQ = KP / 4;
    for (int64_t kq = 0; kq < KQ; kq += 2) {  // KP is a multiple of 16, so KQ is even
        __m512i w0 = _mm512_loadu_si512((const void*)(w + kq * 64));
        __m512i w1 = _mm512_loadu_si512((const void*)(w + kq * 64 + 64));
        for (int r = 0; r < R; ++r) {
            const int8_t* xr = xq + r * ldq + kq * 4;
            acc[r] = _mm512_dpbusd_epi32(acc[r], w0, _mm512_set1_epi32(load_i32(xr)));
            acc2[r] = _mm512_dpbusd_epi32(acc2[r], w1, _mm512_set1_epi32(load_i32(xr + 4)));
        }
    }
    const __m512 swv = _mm512_loadu_ps(sw);
    for (int r = 0; r < R; ++r) {
        __m512i a = _mm512_add_epi32(acc[r], acc2[r]);
        a = _mm512_sub_epi32(a, _mm512_set1_epi32(128 * xsum[r]));
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(a), _mm512_set1_ps(sa[r]));
        f = _mm512_mul_ps(f, swv);
        if (bias) f = _mm512_add_ps(f, _mm512_loadu_ps(bias));
        _mm512_storeu_ps(out[r], f);
    }
#else
    for (int r = 0; r < R; ++r) {
        const int8_t* xr = xq + r * ldq;
        for (int c = 0; c < 16; ++c) {
            int32_t a = 0;
            for (int64_t k = 0; k < KP; ++k) a += (int32_t)xr[k] * ((int32_t)w[(k / 4) * 64 + c * 4 + (k % 4)] - 128);
            float f = (float)a * sa[r];
            f = f * sw[c];
            if (bias) f = f + bias[c];
            out[r][c] = f;
        }
    }
#endif
}

// ---------------------------------------------------------------- q4 strip kernels
template <int R>
static void q4_strip(const uint8_t* qs, const uint8_t* sc, const uint8_t* mn, const float* dd, int64_t KB,
                     const int8_t* xq, int64_t ldq, const int16_t* xs16, int64_t ldg, const float* sa,
                     const float* bias, float out[][16]) {
#if SZ_VNNI
    alignas(64) float facc[R][16];
    alignas(64) int32_t isb[R][16];
    for (int r = 0; r < R; ++r) _mm512_store_ps(facc[r], _mm512_setzero_ps());
    const __m512i nib = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < KB; ++b) {
        const uint8_t* qb = qs + b * 2048;
        const uint8_t* sb = sc + b * 128;
        for (int g = 0; g < 8; ++g) {
            constexpr int R2 = R < 4 ? R : 1;  // short tiles get a second chain: latency, not throughput, bound
            __m512i t[R], t2[R2];
            for (int r = 0; r < R; ++r) t[r] = _mm512_setzero_si512();
            for (int r = 0; r < R2; ++r) t2[r] = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j) {
                __m512i p = _mm512_loadu_si512((const void*)(qb + g * 256 + j * 64));
                __m512i lo = _mm512_and_si512(p, nib);
                __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), nib);
                for (int r = 0; r < R; ++r) {
                    const int8_t* xr = xq + r * ldq + b * 256 + g * 32 + j * 4;
                    t[r] = _mm512_dpbusd_epi32(t[r], lo, _mm512_set1_epi32(load_i32(xr)));
                    if constexpr (R < 4)
                        t2[r] = _mm512_dpbusd_epi32(t2[r], hi, _mm512_set1_epi32(load_i32(xr + 16)));
                    else
                        t[r] = _mm512_dpbusd_epi32(t[r], hi, _mm512_set1_epi32(load_i32(xr + 16)));
                }
            }
            const __m512i scv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(sb + g * 16)));
            for (int r = 0; r < R; ++r) {
                __m512i tt = t[r];
                if constexpr (R < 4) tt = _mm512_add_epi32(tt, t2[r]);
                __m512i v = _mm512_mullo_epi32(tt, scv);
                if (g == 0)
                    _mm512_store_si512((void*)isb[r], v);
                else
                    _mm512_store_si512((void*)isb[r], _mm512_add_epi32(_mm512_load_si512((const void*)isb[r]), v));
            }
        }
        const __m512 dv = _mm512_loadu_ps(dd + b * 32);
        for (int r = 0; r < R; ++r) {
            __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_load_si512((const void*)isb[r])), dv);
            _mm512_store_ps(facc[r], _mm512_add_ps(_mm512_load_ps(facc[r]), f));
        }
    }
    // mins: M = sum_b (float)(sum_g m_g * xs_g) * Dm_b
    __m512 fmin[R];
    for (int r = 0; r < R; ++r) fmin[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < KB; ++b) {
        __m512i im[R];
        for (int r = 0; r < R; ++r) im[r] = _mm512_setzero_si512();
        for (int p = 0; p < 4; ++p) {
            __m512i mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(mn + b * 128 + p * 32)));
            for (int r = 0; r < R; ++r)
                im[r] = _mm512_dpwssd_epi32(im[r], mv, _mm512_set1_epi32(load_i32(xs16 + r * ldg + b * 8 + p * 2)));
        }
        const __m512 dmv = _mm512_loadu_ps(dd + b * 32 + 16);
        for (int r = 0; r < R; ++r) fmin[r] = _mm512_add_ps(fmin[r], _mm512_mul_ps(_mm512_cvtepi32_ps(im[r]), dmv));
    }
    for (int r = 0; r < R; ++r) {
        __m512 f = _mm512_mul_ps(_mm512_sub_ps(_mm512_load_ps(facc[r]), fmin[r]), _mm512_set1_ps(sa[r]));
        if (bias) f = _mm512_add_ps(f, _mm512_loadu_ps(bias));
        _mm512_storeu_ps(out[r], f);
    }
#else
    for (int r = 0; r < R; ++r) {
        const int8_t* xr = xq + r * ldq;
        const int16_t* gr = xs16 + r * ldg;
        for (int c = 0; c < 16; ++c) {
            float F = 0.0f, M = 0.0f;
            for (int64_t b = 0; b < KB; ++b) {
                int32_t isb = 0, imn = 0;
                for (int g = 0; g < 8; ++g) {
                    int32_t t = 0;
                    for (int k = 0; k < 32; ++k) {
                        int j = (k % 16) / 4, i = k % 4;
                        uint8_t byte = qs[b * 2048 + g * 256 + j * 64 + c * 4 + i];
                        int32_t q = k < 16 ? (byte & 15) : (byte >> 4);
                        t += (int32_t)xr[b * 256 + g * 32 + k] * q;
                    }
                    isb += t * (int32_t)sc[b * 128 + g * 16 + c];
                    imn += (int32_t)mn[b * 128 + (g / 2) * 32 + c * 2 + (g % 2)] * (int32_t)gr[b * 8 + g];
                }
                F = F + (float)isb * dd[b * 32 + c];
                M = M + (float)imn * dd[b * 32 + 16 + c];
            }
            float f = (F - M) * sa[r];
            if (bias) f = f + bias[c];
            out[r][c] = f;
        }
    }
#endif
}

// ---------------------------------------------------------------- dispatch over tiles and threads
typedef void (*q8_fn)(const uint8_t*, int64_t, const int8_t*, int64_t, const float*, const int32_t*,
                      const float*, const float*, float (*)[16]);
typedef void (*q4_fn)(const uint8_t*, const uint8_t*, const uint8_t*, const float*, int64_t, const int8_t*,
                      int64_t, const int16_t*, int64_t, const float*, const float*, float (*)[16]);

template <int... Rs>
struct Tables {
    static constexpr q8_fn q8[sizeof...(Rs)] = {&q8_strip<Rs>...};
    static constexpr q4_fn q4[sizeof...(Rs)] = {&q4_strip<Rs>...};
};
typedef Tables<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20> T;

static void quantize_all(const float* x, int64_t S, int64_t K, int64_t ldx, int64_t KP, int nthreads) {
    Scratch& s = g_scratch;
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t r = 0; r < S; ++r)
        quantize_row(x + r * ldx, K, KP, s.xq + r * KP, s.sa + r, s.xs16 + r * (KP / 32), s.xsum + r);
}

// Rows are split into balanced tiles of at most SZ_RMAX; the split changes which rows share a pass over
// a strip, never the arithmetic of one row.
static inline void row_tiles(int64_t S, int64_t* ntiles, int64_t* tile) {
    *ntiles = (S + SZ_RMAX - 1) / SZ_RMAX;
    *tile = (S + *ntiles - 1) / *ntiles;
}

extern "C" int sz_q8_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8,
                            const float* sw, int64_t N, const float* bias, float* y, int nthreads) {
    const int64_t KP = ((K + 15) / 16) * 16;
    const int64_t NB = (N + 15) / 16;
    if (S <= 0 || N <= 0) return 0;
    std::lock_guard<std::mutex> guard(g_lock);
    if (ensure_scratch(S, ((KP + 255) / 256) * 256) != 0) return -1;
    quantize_all(x, S, K, ldx, KP, nthreads);
    Scratch& s = g_scratch;
    int64_t ntiles, tile;
    row_tiles(S, &ntiles, &tile);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nb = 0; nb < NB; ++nb) {
        alignas(64) float out[SZ_RMAX][16];
        const int64_t ncols = (nb + 1) * 16 <= N ? 16 : N - nb * 16;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            T::q8[R - 1](w8 + nb * 16 * KP, KP, s.xq + r0 * KP, KP, s.sa + r0, s.xsum + r0, sw + nb * 16,
                         bias ? bias + nb * 16 : nullptr, out);
            for (int64_t r = 0; r < R; ++r) store_cols(y + (r0 + r) * N + nb * 16, out[r], ncols);
        }
    }
    return 0;
}

extern "C" int sz_q4_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs,
                            const uint8_t* sc, const uint8_t* mn, const float* dd, int64_t N, const float* bias,
                            float* y, int nthreads) {
    const int64_t KB = (K + 255) / 256;
    const int64_t KP = KB * 256;
    const int64_t NB = (N + 15) / 16;
    if (S <= 0 || N <= 0) return 0;
    std::lock_guard<std::mutex> guard(g_lock);
    if (ensure_scratch(S, KP) != 0) return -1;
    quantize_all(x, S, K, ldx, KP, nthreads);
    Scratch& s = g_scratch;
    int64_t ntiles, tile;
    row_tiles(S, &ntiles, &tile);
#pragma omp parallel for num_threads(nthreads) schedule(static)
    for (int64_t nb = 0; nb < NB; ++nb) {
        alignas(64) float out[SZ_RMAX][16];
        const int64_t ncols = (nb + 1) * 16 <= N ? 16 : N - nb * 16;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            T::q4[R - 1](qs + nb * KB * 2048, sc + nb * KB * 128, mn + nb * KB * 128, dd + nb * KB * 32, KB,
                         s.xq + r0 * KP, KP, s.xs16 + r0 * (KP / 32), KP / 32, s.sa + r0,
                         bias ? bias + nb * 16 : nullptr, out);
            for (int64_t r = 0; r < R; ++r) store_cols(y + (r0 + r) * N + nb * 16, out[r], ncols);
        }
    }
    return 0;
}
