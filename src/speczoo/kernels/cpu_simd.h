// The instruction-set paths of the speczoo CPU kernels and the one float arithmetic they share.
//
// A path is picked at compile time from the compiler's target macros (kernels/native.py passes the
// flags chosen from the CPU's features); -DSZ_SCALAR forces the scalar reference on any target:
//   avx512vnni  x86-64-v4 + AVX512-VNNI   16 fp32 lanes in one zmm, vpdpbusd on 512 bits
//   avxvnni     x86-64-v3 + AVX-VNNI      16 lanes as two ymm, vpdpbusd on 256 bits
//   avx2        x86-64-v3                 16 lanes as two ymm, vpmaddubsw / vpmaddwd
//   i8mm        Armv8.2-A + dotprod + i8mm  16 lanes as four q registers, smmla for row pairs
//   dotprod     Armv8.2-A + dotprod       sdot
//   neon        Armv8-A                   smull / sadalp
//   scalar      anything                  plain C++, the reference
//
// Bit-identity across paths rests on two rules. Integer sums are exact (every path proves its own
// intermediate ranges), so their order is free. Float work is done on V16, a vector of 16 fp32 lanes
// whose every operation is one IEEE-754 lane-wise operation (add, mul, div, fused multiply-add, round
// to nearest even) or a reduction over the 16 lanes in one fixed tree; each path implements V16 with
// the registers it has, and the scalar path with a loop and fmaf. Compile with -ffp-contract=off so that
// no path fuses what the others round twice. Nothing here may depend on the register width in a way
// that changes a result.
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(SZ_SCALAR)
#define SZ_PATH_NAME "scalar"
#define SZ_FLOAT_SCALAR 1
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX512DQ__)
#define SZ_PATH_AVX512VNNI 1
#define SZ_PATH_NAME "avx512vnni"
#define SZ_FLOAT_512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__AVXVNNI__)
#define SZ_PATH_AVXVNNI 1
#define SZ_PATH_NAME "avxvnni"
#define SZ_FLOAT_256 1
#elif defined(__AVX2__) && defined(__FMA__)
#define SZ_PATH_AVX2 1
#define SZ_PATH_NAME "avx2"
#define SZ_FLOAT_256 1
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD) && \
    defined(__ARM_FEATURE_MATMUL_INT8)
#define SZ_PATH_I8MM 1
#define SZ_PATH_NAME "i8mm"
#define SZ_FLOAT_NEON 1
#elif defined(__aarch64__) && defined(__ARM_NEON) && defined(__ARM_FEATURE_DOTPROD)
#define SZ_PATH_DOTPROD 1
#define SZ_PATH_NAME "dotprod"
#define SZ_FLOAT_NEON 1
#elif defined(__aarch64__) && defined(__ARM_NEON)
#define SZ_PATH_NEON 1
#define SZ_PATH_NAME "neon"
#define SZ_FLOAT_NEON 1
#else
#define SZ_PATH_NAME "scalar"
#define SZ_FLOAT_SCALAR 1
#endif

#if defined(SZ_FLOAT_512) || defined(SZ_FLOAT_256)
#include <immintrin.h>
#define SZ_PREFETCH(p) _mm_prefetch((const char*)(p), _MM_HINT_T1)
#elif defined(SZ_FLOAT_NEON)
#include <arm_neon.h>
#define SZ_PREFETCH(p) __builtin_prefetch((const void*)(p), 0, 2)
#else
#define SZ_PREFETCH(p) ((void)(p))
#endif

// ---------------------------------------------------------------- V16: 16 fp32 lanes
struct V16 {
#if defined(SZ_FLOAT_512)
    __m512 v;
#elif defined(SZ_FLOAT_256)
    __m256 a, b;  // lanes 0-7, 8-15
#elif defined(SZ_FLOAT_NEON)
    float32x4_t q[4];
#else
    float f[16];
#endif
};

#if defined(SZ_FLOAT_512)
static inline V16 v_wrap(__m512 x) { V16 r; r.v = x; return r; }
static inline V16 v_zero() { return v_wrap(_mm512_setzero_ps()); }
static inline V16 v_set1(float x) { return v_wrap(_mm512_set1_ps(x)); }
static inline V16 v_load(const float* p) { return v_wrap(_mm512_loadu_ps(p)); }
static inline void v_store(float* p, V16 x) { _mm512_storeu_ps(p, x.v); }
static inline __mmask16 v_mask(int n) { return n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1); }
static inline V16 v_loadn(const float* p, int n) { return v_wrap(_mm512_maskz_loadu_ps(v_mask(n), p)); }
static inline void v_storen(float* p, V16 x, int n) { _mm512_mask_storeu_ps(p, v_mask(n), x.v); }
static inline V16 v_keep(V16 x, int n) { return v_wrap(_mm512_maskz_mov_ps(v_mask(n), x.v)); }
static inline V16 v_add(V16 x, V16 y) { return v_wrap(_mm512_add_ps(x.v, y.v)); }
static inline V16 v_sub(V16 x, V16 y) { return v_wrap(_mm512_sub_ps(x.v, y.v)); }
static inline V16 v_mul(V16 x, V16 y) { return v_wrap(_mm512_mul_ps(x.v, y.v)); }
static inline V16 v_div(V16 x, V16 y) { return v_wrap(_mm512_div_ps(x.v, y.v)); }
static inline V16 v_max(V16 x, V16 y) { return v_wrap(_mm512_max_ps(x.v, y.v)); }
static inline V16 v_min(V16 x, V16 y) { return v_wrap(_mm512_min_ps(x.v, y.v)); }
static inline V16 v_fma(V16 x, V16 y, V16 z) { return v_wrap(_mm512_fmadd_ps(x.v, y.v, z.v)); }    // x*y + z
static inline V16 v_fnma(V16 x, V16 y, V16 z) { return v_wrap(_mm512_fnmadd_ps(x.v, y.v, z.v)); }  // z - x*y
static inline V16 v_abs(V16 x) { return v_wrap(_mm512_abs_ps(x.v)); }
static inline V16 v_round(V16 x) {
    return v_wrap(_mm512_roundscale_ps(x.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline V16 v_pow2i(V16 n) {  // 2^n for integral n in [-126, 127]
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n.v), _mm512_set1_epi32(127)), 23);
    return v_wrap(_mm512_castsi512_ps(e));
}
static inline V16 v_select_ge(V16 x, V16 y, V16 a, V16 b) {  // x >= y ? a : b, lane-wise
    return v_wrap(_mm512_mask_blend_ps(_mm512_cmp_ps_mask(x.v, y.v, _CMP_GE_OQ), b.v, a.v));
}
static inline void v_lanes(V16 x, float* out) { _mm512_storeu_ps(out, x.v); }
static inline V16 v_cvt_i32(const int32_t* p) { return v_wrap(_mm512_cvtepi32_ps(_mm512_loadu_si512((const void*)p))); }  // 16 int32 -> fp32
static inline V16 v_load_f16(const uint16_t* p) { return v_wrap(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p))); }
static inline V16 v_load_bf16(const uint16_t* p) {
    return v_wrap(_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)), 16)));
}
#elif defined(SZ_FLOAT_256)
static inline V16 v_wrap(__m256 a, __m256 b) { V16 r; r.a = a; r.b = b; return r; }
static inline V16 v_zero() { return v_wrap(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline V16 v_set1(float x) { return v_wrap(_mm256_set1_ps(x), _mm256_set1_ps(x)); }
static inline V16 v_load(const float* p) { return v_wrap(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline void v_store(float* p, V16 x) { _mm256_storeu_ps(p, x.a); _mm256_storeu_ps(p + 8, x.b); }
static inline __m256i v_mask8(int n) {  // lanes < n all ones
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}
static inline V16 v_loadn(const float* p, int n) {
    if (n >= 16) return v_load(p);
    const __m256 a = n > 0 ? _mm256_maskload_ps(p, v_mask8(n)) : _mm256_setzero_ps();
    const __m256 b = n > 8 ? _mm256_maskload_ps(p + 8, v_mask8(n - 8)) : _mm256_setzero_ps();
    return v_wrap(a, b);
}
static inline void v_storen(float* p, V16 x, int n) {
    if (n >= 16) return v_store(p, x);
    if (n > 0) _mm256_maskstore_ps(p, v_mask8(n), x.a);
    if (n > 8) _mm256_maskstore_ps(p + 8, v_mask8(n - 8), x.b);
}
static inline V16 v_keep(V16 x, int n) {
    if (n >= 16) return x;
    return v_wrap(_mm256_and_ps(x.a, _mm256_castsi256_ps(v_mask8(n))),
                  _mm256_and_ps(x.b, _mm256_castsi256_ps(v_mask8(n - 8))));
}
#define SZ_V2(name, op) \
    static inline V16 name(V16 x, V16 y) { return v_wrap(op(x.a, y.a), op(x.b, y.b)); }
SZ_V2(v_add, _mm256_add_ps)
SZ_V2(v_sub, _mm256_sub_ps)
SZ_V2(v_mul, _mm256_mul_ps)
SZ_V2(v_div, _mm256_div_ps)
SZ_V2(v_max, _mm256_max_ps)
SZ_V2(v_min, _mm256_min_ps)
#undef SZ_V2
static inline V16 v_fma(V16 x, V16 y, V16 z) { return v_wrap(_mm256_fmadd_ps(x.a, y.a, z.a), _mm256_fmadd_ps(x.b, y.b, z.b)); }
static inline V16 v_fnma(V16 x, V16 y, V16 z) {
    return v_wrap(_mm256_fnmadd_ps(x.a, y.a, z.a), _mm256_fnmadd_ps(x.b, y.b, z.b));
}
static inline V16 v_abs(V16 x) {
    const __m256 m = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    return v_wrap(_mm256_and_ps(x.a, m), _mm256_and_ps(x.b, m));
}
static inline V16 v_round(V16 x) {
    return v_wrap(_mm256_round_ps(x.a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                  _mm256_round_ps(x.b, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline __m256 v_pow2i8(__m256 n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
}
static inline V16 v_pow2i(V16 n) { return v_wrap(v_pow2i8(n.a), v_pow2i8(n.b)); }
static inline V16 v_select_ge(V16 x, V16 y, V16 a, V16 b) {
    return v_wrap(_mm256_blendv_ps(b.a, a.a, _mm256_cmp_ps(x.a, y.a, _CMP_GE_OQ)),
                  _mm256_blendv_ps(b.b, a.b, _mm256_cmp_ps(x.b, y.b, _CMP_GE_OQ)));
}
static inline void v_lanes(V16 x, float* out) { v_store(out, x); }
static inline V16 v_cvt_i32(const int32_t* p) {  // 16 int32 -> fp32, round to nearest even
    return v_wrap(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)p)),
                  _mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i*)(p + 8))));
}
static inline V16 v_load_f16(const uint16_t* p) {  // F16C (part of x86-64-v3)
    return v_wrap(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)), _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 8))));
}
static inline __m256 v_bf16x8(const uint16_t* p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)), 16));
}
static inline V16 v_load_bf16(const uint16_t* p) { return v_wrap(v_bf16x8(p), v_bf16x8(p + 8)); }
#elif defined(SZ_FLOAT_NEON)
#define SZ_V4(expr)                             \
    V16 r;                                      \
    for (int i = 0; i < 4; ++i) r.q[i] = (expr); \
    return r;
static inline V16 v_zero() { SZ_V4(vdupq_n_f32(0.0f)) }
static inline V16 v_set1(float x) { SZ_V4(vdupq_n_f32(x)) }
static inline V16 v_load(const float* p) { SZ_V4(vld1q_f32(p + 4 * i)) }
static inline void v_store(float* p, V16 x) {
    for (int i = 0; i < 4; ++i) vst1q_f32(p + 4 * i, x.q[i]);
}
static inline V16 v_loadn(const float* p, int n) {
    if (n >= 16) return v_load(p);
    float t[16] = {0};
    for (int i = 0; i < n; ++i) t[i] = p[i];
    return v_load(t);
}
static inline void v_storen(float* p, V16 x, int n) {
    if (n >= 16) return v_store(p, x);
    float t[16];
    v_store(t, x);
    for (int i = 0; i < n; ++i) p[i] = t[i];
}
static inline V16 v_keep(V16 x, int n) {
    const int32_t base[4] = {0, 1, 2, 3};
    const int32x4_t idx = vld1q_s32(base);
    SZ_V4(vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x.q[i]), vcltq_s32(idx, vdupq_n_s32(n - 4 * i)))))
}
static inline V16 v_add(V16 x, V16 y) { SZ_V4(vaddq_f32(x.q[i], y.q[i])) }
static inline V16 v_sub(V16 x, V16 y) { SZ_V4(vsubq_f32(x.q[i], y.q[i])) }
static inline V16 v_mul(V16 x, V16 y) { SZ_V4(vmulq_f32(x.q[i], y.q[i])) }
static inline V16 v_div(V16 x, V16 y) { SZ_V4(vdivq_f32(x.q[i], y.q[i])) }
static inline V16 v_max(V16 x, V16 y) { SZ_V4(vmaxq_f32(x.q[i], y.q[i])) }
static inline V16 v_min(V16 x, V16 y) { SZ_V4(vminq_f32(x.q[i], y.q[i])) }
static inline V16 v_fma(V16 x, V16 y, V16 z) { SZ_V4(vfmaq_f32(z.q[i], x.q[i], y.q[i])) }
static inline V16 v_fnma(V16 x, V16 y, V16 z) { SZ_V4(vfmsq_f32(z.q[i], x.q[i], y.q[i])) }
static inline V16 v_abs(V16 x) { SZ_V4(vabsq_f32(x.q[i])) }
static inline V16 v_round(V16 x) { SZ_V4(vrndnq_f32(x.q[i])) }
static inline V16 v_pow2i(V16 n) {
    SZ_V4(vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n.q[i]), vdupq_n_s32(127)), 23)))
}
static inline V16 v_select_ge(V16 x, V16 y, V16 a, V16 b) { SZ_V4(vbslq_f32(vcgeq_f32(x.q[i], y.q[i]), a.q[i], b.q[i])) }
static inline void v_lanes(V16 x, float* out) { v_store(out, x); }
static inline V16 v_cvt_i32(const int32_t* p) { SZ_V4(vcvtq_f32_s32(vld1q_s32(p + 4 * i))) }  // round to nearest even
static inline V16 v_load_f16(const uint16_t* p) { SZ_V4(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p + 4 * i)))) }
static inline V16 v_load_bf16(const uint16_t* p) { SZ_V4(vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(p + 4 * i), 16))) }
#undef SZ_V4
#else
#define SZ_V1(expr)                          \
    V16 r;                                   \
    for (int i = 0; i < 16; ++i) r.f[i] = (expr); \
    return r;
static inline V16 v_zero() { SZ_V1(0.0f) }
static inline V16 v_set1(float x) { SZ_V1(x) }
static inline V16 v_load(const float* p) { SZ_V1(p[i]) }
static inline void v_store(float* p, V16 x) {
    for (int i = 0; i < 16; ++i) p[i] = x.f[i];
}
static inline V16 v_loadn(const float* p, int n) { SZ_V1(i < n ? p[i] : 0.0f) }
static inline void v_storen(float* p, V16 x, int n) {
    for (int i = 0; i < 16 && i < n; ++i) p[i] = x.f[i];
}
static inline V16 v_keep(V16 x, int n) { SZ_V1(i < n ? x.f[i] : 0.0f) }
static inline V16 v_add(V16 x, V16 y) { SZ_V1(x.f[i] + y.f[i]) }
static inline V16 v_sub(V16 x, V16 y) { SZ_V1(x.f[i] - y.f[i]) }
static inline V16 v_mul(V16 x, V16 y) { SZ_V1(x.f[i] * y.f[i]) }
static inline V16 v_div(V16 x, V16 y) { SZ_V1(x.f[i] / y.f[i]) }
static inline V16 v_max(V16 x, V16 y) { SZ_V1(x.f[i] > y.f[i] ? x.f[i] : y.f[i]) }
static inline V16 v_min(V16 x, V16 y) { SZ_V1(x.f[i] < y.f[i] ? x.f[i] : y.f[i]) }
static inline V16 v_fma(V16 x, V16 y, V16 z) { SZ_V1(fmaf(x.f[i], y.f[i], z.f[i])) }
static inline V16 v_fnma(V16 x, V16 y, V16 z) { SZ_V1(fmaf(-x.f[i], y.f[i], z.f[i])) }
static inline V16 v_abs(V16 x) { SZ_V1(fabsf(x.f[i])) }
static inline V16 v_round(V16 x) { SZ_V1(nearbyintf(x.f[i])) }
static inline float sz_pow2i(float n) {
    const int32_t bits = ((int32_t)n + 127) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline V16 v_pow2i(V16 n) { SZ_V1(sz_pow2i(n.f[i])) }
static inline V16 v_select_ge(V16 x, V16 y, V16 a, V16 b) { SZ_V1(x.f[i] >= y.f[i] ? a.f[i] : b.f[i]) }
static inline void v_lanes(V16 x, float* out) { v_store(out, x); }
static inline V16 v_cvt_i32(const int32_t* p) { SZ_V1((float)p[i]) }  // round to nearest even
// fp16 -> fp32 as F16C's vcvtph2ps and Arm's fcvtl do it: exact for every value, a signalling NaN quieted
static inline float sz_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3FFu;
    uint32_t bits;
    if (e == 31)
        bits = sign | 0x7F800000u | (m << 13) | (m ? 0x00400000u : 0u);  // inf; NaN with its payload, quiet
    else if (e != 0)
        bits = sign | ((e + 112u) << 23) | (m << 13);  // normal: rebias 15 -> 127
    else {
        const float sub = (float)m * 5.9604644775390625e-8f;  // subnormal (or zero): m * 2^-24, exact
        memcpy(&bits, &sub, 4);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline float sz_bf16_to_f32(uint16_t h) {  // the top half of an fp32
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline V16 v_load_f16(const uint16_t* p) { SZ_V1(sz_f16_to_f32(p[i])) }
static inline V16 v_load_bf16(const uint16_t* p) { SZ_V1(sz_bf16_to_f32(p[i])) }
#undef SZ_V1
#endif

// v_load_f16 / v_load_bf16: 16 fp16 / bf16 values -> 16 fp32 lanes. Both conversions are exact (fp32 holds
// every fp16 and bf16 value), so every path gives the same lanes.

// The sum of the 16 lanes by one fixed tree: s1[m] = a[m] + a[m+8], s2[m] = s1[m] + s1[m+4],
// s3[m] = s2[m] + s2[m+2], sum = s3[0] + s3[1].
static inline float v_sum_tree(V16 x) {
    float l[16];
    v_lanes(x, l);
    for (int w = 8; w >= 1; w /= 2)
        for (int m = 0; m < w; ++m) l[m] = l[m] + l[m + w];
    return l[0];
}

#if defined(SZ_FLOAT_512)
// 16 lane vectors -> one vector whose lane k is the lane sum of a[k], by v_sum_tree's tree for every k
// (16 sums at once, e.g. 16 keys' attention scores, instead of one horizontal sum each).
static inline __m512 lane_sums16(__m512* a) {
    __m512 r1[8], r2[4], r3[2];
    for (int p = 0; p < 8; ++p)  // s1[m] = x[m] + x[m+8]
        r1[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                              _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xEE));
    for (int p = 0; p < 4; ++p)  // s2[m] = s1[m] + s1[m+4]
        r2[p] = _mm512_add_ps(_mm512_shuffle_f32x4(r1[2 * p], r1[2 * p + 1], 0x88),
                              _mm512_shuffle_f32x4(r1[2 * p], r1[2 * p + 1], 0xDD));
    for (int p = 0; p < 2; ++p)  // s3[m] = s2[m] + s2[m+2]
        r3[p] = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(r2[2 * p]), _mm512_castps_pd(r2[2 * p + 1]))),
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(r2[2 * p]), _mm512_castps_pd(r2[2 * p + 1]))));
    // s4 = s3[0] + s3[1]; lane 4L + t holds the sum of a[4t + L]
    const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(r3[0], r3[1], 0x88), _mm512_shuffle_ps(r3[0], r3[1], 0xDD));
    const __m512i perm = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(perm, r);
}
#endif

#if defined(SZ_FLOAT_256)
// The rest of v_sum_tree for 8 V16s at once, from its first level: s1[k] holds s1[m] = x[m] + x[m+8] of V16 k
// (its lanes 0-7 plus its lanes 8-15, one ymm add). Returns one vector whose lane k is v_sum_tree of V16 k:
// the same pairs added in the same order as for one (8 sums at once, e.g. 8 keys' attention scores, by
// shuffles across the 8 vectors instead of 8 horizontal sums).
static inline __m256 lane_sums8(const __m256* s1) {
    __m256 r2[4], r3[2];
    for (int p = 0; p < 4; ++p)  // s2[m] = s1[m] + s1[m+4]; lanes 0-3 of V16 2p, 4-7 of V16 2p+1
        r2[p] = _mm256_add_ps(_mm256_permute2f128_ps(s1[2 * p], s1[2 * p + 1], 0x20),
                              _mm256_permute2f128_ps(s1[2 * p], s1[2 * p + 1], 0x31));
    for (int p = 0; p < 2; ++p)  // s3[m] = s2[m] + s2[m+2]; lanes 0-1: V16 4p, 2-3: 4p+2, 4-5: 4p+1, 6-7: 4p+3
        r3[p] = _mm256_add_ps(
            _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(r2[2 * p]), _mm256_castps_pd(r2[2 * p + 1]))),
            _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(r2[2 * p]), _mm256_castps_pd(r2[2 * p + 1]))));
    // sum = s3[0] + s3[1]; lanes 0-7 hold V16 0, 2, 4, 6, 1, 3, 5, 7
    const __m256 r = _mm256_add_ps(_mm256_shuffle_ps(r3[0], r3[1], 0x88), _mm256_shuffle_ps(r3[0], r3[1], 0xDD));
    return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}
#endif

// out[k] = v_sum_tree(a[k]) for the 16 vectors a[0 .. 15], the very same tree for each (on AVX-512 by
// shuffles across the 16 vectors at once instead of 16 horizontal sums).
static inline void v_sum_tree16(V16* a, float* out) {
#if defined(SZ_FLOAT_512)
    __m512 r[16];
    for (int k = 0; k < 16; ++k) r[k] = a[k].v;
    _mm512_storeu_ps(out, lane_sums16(r));
#else
    for (int k = 0; k < 16; ++k) out[k] = v_sum_tree(a[k]);
#endif
}

static inline float v_max_lanes(V16 x) {  // max is exact: any order gives the same value
    float l[16];
    v_lanes(x, l);
    float m = l[0];
    for (int i = 1; i < 16; ++i) m = l[i] > m ? l[i] : m;
    return m;
}

// e^x for x <= 0, lane-wise: Cody-Waite reduction x = n ln2 + r, a degree-6 polynomial in r, times 2^n.
// Below -87 (where e^x leaves the normal range) the result is 0, so that 2^n is always a normal float.
static inline V16 v_exp_neg(V16 x) {
    const V16 lo = v_set1(-87.0f);
    const V16 xc = v_max(x, lo);
    const V16 n = v_round(v_mul(xc, v_set1(1.44269504088896341f)));
    V16 r = v_fnma(n, v_set1(0.693359375f), xc);
    r = v_fnma(n, v_set1(-2.12194440e-4f), r);
    V16 p = v_set1(1.9875691500e-4f);
    p = v_fma(p, r, v_set1(1.3981999507e-3f));
    p = v_fma(p, r, v_set1(8.3334519073e-3f));
    p = v_fma(p, r, v_set1(4.1665795894e-2f));
    p = v_fma(p, r, v_set1(1.6666665459e-1f));
    p = v_fma(p, r, v_set1(5.0000001201e-1f));
    p = v_fma(p, v_mul(r, r), v_add(r, v_set1(1.0f)));
    return v_select_ge(x, lo, v_mul(p, v_pow2i(n)), v_zero());
}

// cap * tanh(x / cap), lane-wise (attention logit soft-capping). With y = x / cap: for |y| >= 1/8,
// tanh|y| = (1 - e) / (1 + e) with e = e^(-2|y|); below, where 1 - e would cancel, the Taylor series of
// tanh to y^9 (relative error under 1e-11 there). The sign of y is put back last.
static inline V16 v_softcap(V16 x, V16 cap) {
    const V16 one = v_set1(1.0f), zero = v_zero();
    const V16 y = v_div(x, cap);
    const V16 a = v_abs(y);
    const V16 e = v_exp_neg(v_sub(zero, v_add(a, a)));
    const V16 far = v_div(v_sub(one, e), v_add(one, e));
    const V16 a2 = v_mul(a, a);
    V16 p = v_set1(62.0f / 2835.0f);
    p = v_fma(p, a2, v_set1(-17.0f / 315.0f));
    p = v_fma(p, a2, v_set1(2.0f / 15.0f));
    p = v_fma(p, a2, v_set1(-1.0f / 3.0f));
    const V16 near = v_fma(v_mul(p, a2), a, a);
    const V16 t = v_select_ge(a, v_set1(0.125f), far, near);
    return v_mul(cap, v_select_ge(y, zero, t, v_sub(zero, t)));
}
