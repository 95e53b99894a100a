// Integer tiles of the linear kernels, one set per instruction-set path (cpu_simd.h picks the path).
//
// Every path provides the same templates over R, the rows of a register tile:
//   q8_tile<R>(w, nq, xk, S, acc, first): acc[r][16] int32 (in memory; zeroed first when `first`) += the
//     products of nq quads (4 inputs) of a q8 strip with rows r of the activation words xk. Where
//     SZ_Q8_UNSIGNED is 1 the tile sums the stored codes q + 128 and the strip subtracts 128 * xsum later;
//     elsewhere it sums q itself. Either way the strip ends with the exact integer sum of q * x.
//   q4_tile<R>(qb, scb, mnb, ddb, xk, xp, sab, S, ng, facc): one q4 super-block of ng groups; the exact
//     integers isb = sum_g sc_g * (sum_{k in g} q * x) and imn = sum_g m_g * (sum_{k in g} x) per (row,
//     column), then facc += ((float)isb * D - (float)imn * Dm) * sab[r], lane-wise, in that order (sab:
//     the rows' activation scales of this super-block).
//   group_sums<R>(quads, xk, xh, S, t): one group of 32 inputs of a q8b, q6, q40, q50 or q80 strip (the Quads
//     type reads its codes: Q8bQuads, Q6Quads, Q40Quads, Q50Quads): t[r][h][16] = the exact integer sums of q * x
//     over each half h of 16 inputs; q8b_tile / q8bm_tile / q6_tile / d16_tile (below, shared) then apply the float
//     step of their format. A path may define its own q6_tile (SZ_Q6_TILE: AVX2's and AVX-512's) or d16_tile
//     (SZ_D16_TILE: AVX2's, AVX-VNNI's and AVX-512's) with those sums and steps.
// Integer sums are exact in every path (each path states why its narrow intermediates cannot overflow
// or saturate), so the tiles may sum in any order; the float steps are the same lane-wise operations
// everywhere. That makes every path bit-identical to the scalar one. SZ_TILE is the most rows a tile
// holds in registers; tiling never changes a row's result.
#pragma once
#include <stdint.h>
#include <type_traits>
#include "cpu_simd.h"

// The codes of group g of a strip of q40 (qs: 256 bytes a group, q6's ql layout), q50 (the same, and qh: 64 bytes
// a group) or q80 (q8b's codes: 512 bytes a group), as the path's Quads type reads them (defined below it).
template <class Quads>
static inline Quads quads_at(const uint8_t* qs, const uint8_t* qh, int64_t g);

// The float step every path but AVX-512's shares: facc [R][16] += ((float)isb * D - (float)imn * Dm) * sab[r].
template <int R>
static inline void q4_float_update(const int32_t* isb, const int32_t* imn, const float* ddb, const float* sab,
                                   float* facc) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 16; ++c) {
            const float t = (float)isb[r * 16 + c] * ddb[c] - (float)imn[r * 16 + c] * ddb[16 + c];
            facc[r * 16 + c] = facc[r * 16 + c] + t * sab[r];
        }
}

// The codes of group g of the super-block SZ_PF ahead of qb (4 cache lines), fetched while this block's
// group g computes: spread over the tile's groups, the weight stream keeps going under a tile of many
// rows, where one burst a super-block would leave it idle while the rows compute. A tile of R = 1 rows
// (a one-row forward: balanced tiles are never 1 row otherwise) fetches only when sz_one_row_prefetch
// says so: it computes little per byte, and whether the hardware prefetchers alone keep its stream at the
// memory's pace depends on the CPU (on a Zen 4 a software prefetch only took their fill buffers, on a
// Xeon it made the one-row forward 10% faster: docs/results.md, "The one-row prefetch, timed per machine").
// Prefetches change no bit of any result.
template <int R>
static inline void q4_prefetch_group(const uint8_t* qb, int g) {
    if (R > 1 || sz_one_row_prefetch)
        for (int l = 0; l < 256; l += 64) SZ_PREFETCH(qb + SZ_PF * 2048 + g * 256 + l);
}
// q6's the same way: group g's ql (laid out as q4's codes, 4 lines) and qh (2 lines) SZ_PF super-blocks ahead.
template <int R>
static inline void q6_prefetch_group(const uint8_t* ql, const uint8_t* qh, int64_t g) {
    if (R > 1 || sz_one_row_prefetch) {
        for (int l = 0; l < 256; l += 64) SZ_PREFETCH(ql + SZ_PF * 2048 + g * 256 + l);
        for (int l = 0; l < 128; l += 64) SZ_PREFETCH(qh + SZ_PF * 1024 + g * 128 + l);
    }
}

// q40's, q50's or q80's group g (GA code bytes a group, q50's 64 bytes of fifth bits, its 16 fp16 scales) of the
// k-block SZ_PF ahead (8 groups a k-block), fetched while group g computes, as q4's, and in a one-row tile too:
// there the prefetch pays on every CPU timed (docs/results.md, "No software prefetch in a one-row tile").
static inline void d16_prefetch_group(const uint8_t* qs, const uint8_t* qh, const uint16_t* d, int64_t GA, int64_t g) {
    for (int64_t l = 0; l < GA; l += 64) SZ_PREFETCH(qs + (SZ_PF * 8 + g) * GA + l);
    if (qh) SZ_PREFETCH(qh + (SZ_PF * 8 + g) * 64);
    SZ_PREFETCH(d + (SZ_PF * 8 + g) * 16);
}

#if defined(SZ_PATH_AVX512VNNI)
#define SZ_TILE 12
#define SZ_Q8_UNSIGNED 1
// acc += dpbusd(w, broadcast of the 32-bit word at x): the broadcast is folded into the instruction
// ({1to16} memory operand), which the compiler does not do for the intrinsic on its own.
static inline __m512i dpbusd_bcst(__m512i acc, __m512i w, const int32_t* x) {
    __asm__("vpdpbusd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*x));
    return acc;
}
static inline __m512i dpwssd_bcst(__m512i acc, __m512i w, const int32_t* x) {
    __asm__("vpdpwssd %[x]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [x] "m"(*x));
    return acc;
}
// A loaded vector, opaque to the optimizer (no instruction): the q4 codes are loaded once and both nibbles
// taken from the register, where GCC would fold the load into the and and the shift alike and load every
// 64 bytes twice: a tile of few rows is bound by its loads (docs/results.md, the q4 tile against its floor).
static inline __m512i sz_loaded(__m512i v) {
    __asm__("" : "+v"(v));
    return v;
}
// q8: R rows x nq quads of one strip; acc[R][16] int32 in memory between k-blocks.
// w: strip weights at the block's first quad; xk: activation words at (first quad, first row).
template <int R>
static void q8_tile(const uint8_t* w, int64_t nq, const int32_t* xk, int64_t S, int32_t* acc, bool first) {
    constexpr int C = R >= 4 ? 1 : (R == 1 ? 4 : 2);  // chains per row: short tiles are latency bound
    __m512i a[C][R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        a[0][r] = first ? _mm512_setzero_si512() : _mm512_load_si512((const void*)(acc + r * 16));
#pragma GCC unroll 4
        for (int c = 1; c < C; ++c) a[c][r] = _mm512_setzero_si512();
    }
    for (int64_t q = 0; q < nq; q += C) {  // nq is a multiple of 8
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
            const __m512i wv = _mm512_loadu_si512((const void*)(w + (q + c) * 64));
            const int32_t* xr = xk + (q + c) * S;
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) a[c][r] = dpbusd_bcst(a[c][r], wv, xr + r);
        }
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        __m512i v = a[0][r];
#pragma GCC unroll 4
        for (int c = 1; c < C; ++c) v = _mm512_add_epi32(v, a[c][r]);
        _mm512_store_si512((void*)(acc + r * 16), v);
    }
}

// q4: R rows x one super-block of ng groups (8, or fewer in a strip's last block; even), nibbles unpacked
// in registers (a tile of up to SZ_TILE rows shares them). qb: the strip's packed super-block; xk, xp:
// activation words and group-sum pairs at (super-block, first row); sab: the rows' scales of this
// super-block. facc [R][16] += this block's term.
template <int R>
static void q4_tile(const uint8_t* qb, const uint8_t* scb, const uint8_t* mnb, const float* ddb, const int32_t* xk,
                    const int32_t* xp, const float* sab, int64_t S, int ng, float* facc) {
    constexpr int C = R >= 4 ? 1 : 2;
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m512i isb[R];
#pragma GCC unroll 1
    for (int g = 0; g < ng; ++g) {
        q4_prefetch_group<R>(qb, g);
        __m512i t[C][R];
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
            for (int c = 0; c < C; ++c) t[c][r] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m512i p = sz_loaded(_mm512_loadu_si512((const void*)(qb + g * 256 + j * 64)));
            const __m512i lo = _mm512_and_si512(p, nib);                            // k = 32g + 4j + i
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(p, 4), nib);  // k + 16
            const int32_t* xl = xk + (g * 8 + j) * S;
            const int32_t* xh = xl + 4 * S;
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) t[0][r] = dpbusd_bcst(t[0][r], lo, xl + r);
#pragma GCC unroll 16
            for (int r = 0; r < R; ++r) t[C - 1][r] = dpbusd_bcst(t[C - 1][r], hi, xh + r);
        }
        const __m512i scv = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(scb + g * 16)));
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) {
            __m512i v = t[0][r];
            if constexpr (C == 2) v = _mm512_add_epi32(v, t[C - 1][r]);
            v = _mm512_mullo_epi32(v, scv);
            isb[r] = g == 0 ? v : _mm512_add_epi32(isb[r], v);
        }
    }
    alignas(64) float fs[R * 16];  // (float)isb * D, while the registers sum the mins
    const __m512 dv = _mm512_loadu_ps(ddb);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        _mm512_store_ps(fs + r * 16, _mm512_mul_ps(_mm512_cvtepi32_ps(isb[r]), dv));
        isb[r] = _mm512_setzero_si512();  // reused below for the mins
    }
#pragma GCC unroll 4
    for (int p = 0; p < ng / 2; ++p) {
        const __m512i mv = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(mnb + p * 32)));
        const int32_t* xr = xp + p * S;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) isb[r] = dpwssd_bcst(isb[r], mv, xr + r);
    }
    const __m512 dmv = _mm512_loadu_ps(ddb + 16);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const __m512 t = _mm512_sub_ps(_mm512_load_ps(fs + r * 16), _mm512_mul_ps(_mm512_cvtepi32_ps(isb[r]), dmv));
        _mm512_store_ps(facc + r * 16,
                        _mm512_add_ps(_mm512_load_ps(facc + r * 16), _mm512_mul_ps(t, _mm512_set1_ps(sab[r]))));
    }
}

// q8b and q6 codes of quad jq (0..7) of a group of 32 inputs, as u8 (the stored code + BIAS): q8b's stored
// bytes (q + 128); q6's nibble of ql[jq % 4] (low for jq < 4, high for jq >= 4) and the 2 bits of
// qh[jq / 4] at 2 * (jq % 4), placed at bits 4-5 (no 16-bit lane shift below moves a bit into a kept
// position of the next byte: shifts are at most 6, masks keep 2 or 4).
struct Q8bQuads {
    static constexpr int SHIFT = 7;  // BIAS = 128
    const uint8_t* w;
    __m512i operator()(int jq) const { return _mm512_loadu_si512((const void*)(w + jq * 64)); }
};
struct Q6Quads {
    static constexpr int SHIFT = 5;  // BIAS = 32
    const uint8_t *ql, *qh;
    __m512i operator()(int jq) const {
        const __m512i p = _mm512_loadu_si512((const void*)(ql + (jq % 4) * 64));
        const __m512i h = _mm512_loadu_si512((const void*)(qh + (jq / 4) * 64));
        const __m512i nib = _mm512_and_si512(jq < 4 ? p : _mm512_srli_epi16(p, 4), _mm512_set1_epi8(0x0F));
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(h, 2 * (jq % 4)), _mm512_set1_epi8(0x03));
        return _mm512_or_si512(nib, _mm512_slli_epi16(hi, 4));
    }
};

// q40 (Q4_0): the nibble of qs[jq % 4] (low for jq < 4, high for jq >= 4), as q6's ql without the high bits.
struct Q40Quads {
    static constexpr int SHIFT = 3;  // BIAS = 8
    const uint8_t* qs;
    __m512i operator()(int jq) const {
        const __m512i p = _mm512_loadu_si512((const void*)(qs + (jq % 4) * 64));
        return _mm512_and_si512(jq < 4 ? p : _mm512_srli_epi16(p, 4), _mm512_set1_epi8(0x0F));
    }
};
// q50 (Q5_0): q40's nibble with bit jq of qh's byte (the input's fifth bit) at bit 4. No 16-bit lane shift
// below moves a bit of one byte onto bit 4 of the other (that would take a left shift of 5 or a right shift of
// 4), so the mask keeps exactly the byte's own bit.
struct Q50Quads {
    static constexpr int SHIFT = 4;  // BIAS = 16
    const uint8_t *qs, *qh;
    __m512i operator()(int jq) const {
        const __m512i p = _mm512_loadu_si512((const void*)(qs + (jq % 4) * 64));
        const __m512i h = _mm512_loadu_si512((const void*)qh);
        const __m512i nib = _mm512_and_si512(jq < 4 ? p : _mm512_srli_epi16(p, 4), _mm512_set1_epi8(0x0F));
        const __m512i hb = jq <= 4 ? _mm512_slli_epi16(h, 4 - jq) : _mm512_srli_epi16(h, jq - 4);
        return _mm512_or_si512(nib, _mm512_and_si512(hb, _mm512_set1_epi8(0x10)));
    }
};

// q8b, q6, q40, q50, q80: half h (16 inputs) of one group of 32 of a strip, a[r] = the exact sums of
// (u - BIAS) * x for rows r (group_sums stores both halves as t[r][h][16]): each row's sum starts at -BIAS *
// the half's activation sum (xh, a scalar made in a general register and broadcast once), then vpdpbusd adds
// u * x (unsigned by signed). Starting there rather than subtracting at the end keeps no second vector a row
// live (a 9-row tile spilled 9 of them).
template <int R, class Quads>
static inline void half_sums(Quads quads, int h, const int32_t* xk, const int32_t* xh, int64_t S, __m512i (&a)[R]) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) a[r] = _mm512_set1_epi32(-xh[h * S + r] * (1 << Quads::SHIFT));
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) {
        const __m512i wv = quads(4 * h + q);
        const int32_t* xr = xk + (4 * h + q) * S;
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) a[r] = dpbusd_bcst(a[r], wv, xr + r);
    }
}

template <int R, class Quads>
static inline void group_sums(Quads quads, const int32_t* xk, const int32_t* xh, int64_t S, int32_t* t) {
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        __m512i a[R];
        half_sums<R>(quads, h, xk, xh, S, a);
#pragma GCC unroll 16
        for (int r = 0; r < R; ++r) _mm512_store_si512((void*)(t + (2 * r + h) * 16), a[r]);
    }
}

// One group's float step on registers, q8b_float_update's lane-wise operations in its order: facc[r] +
// ((float)t0 * a0 + (float)t1 * a1) * sag[r], the half sums t0, t1 made by half_sums beside it (m holds
// (float)t0 * a0 while the second half sums).
template <int R, class Quads>
static inline void group_float_step(Quads quads, const int32_t* xq, const int32_t* xg, int64_t S, __m512 a0,
                                    __m512 a1, const float* sag, float* facc) {
    __m512i a[R];
    __m512 m[R];
    half_sums<R>(quads, 0, xq, xg, S, a);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) m[r] = _mm512_mul_ps(_mm512_cvtepi32_ps(a[r]), a0);
    half_sums<R>(quads, 1, xq, xg, S, a);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
        const __m512 u = _mm512_add_ps(m[r], _mm512_mul_ps(_mm512_cvtepi32_ps(a[r]), a1));
        float* f = facc + r * 16;
        _mm512_storeu_ps(f, _mm512_add_ps(_mm512_loadu_ps(f), _mm512_mul_ps(u, _mm512_set1_ps(sag[r]))));
    }
}

// q6 on AVX-512: the shared q6_tile's sums and float step (group_float_step) with nothing but facc going
// through memory, the halves' scales a = D * (float)sc made in registers; each group's codes fetched SZ_PF
// super-blocks ahead, as q4's. Not the shared tile: it stores the sums, makes the 32 scales one at a time and
// reads the codes unprefetched, which a verify's rows pay for (docs/results.md, "AVX-512 q6 and d16 tiles").
#define SZ_Q6_TILE 1
// a = D * (float)sc for a half's 16 columns: sc8 its int8 sub-scales, d the super-block's D
static inline __m512 q6_half_scales(const int8_t* sc8, __m512 d) {
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)sc8))));
}

template <int R>
static void q6_tile(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* dd, int64_t nq,
                    const int32_t* xk, const int32_t* xh, const float* sag, int64_t S, float* facc) {
    for (int64_t g = 0; g < nq / 8; ++g) {
        q6_prefetch_group<R>(ql, qh, g);
        const __m512 d = _mm512_loadu_ps(dd + (g / 8) * 16);
        group_float_step<R>(Q6Quads{ql + g * 256, qh + g * 128}, xk + g * 8 * S, xh + g * 2 * S, S,
                            q6_half_scales(sc + g * 32, d), q6_half_scales(sc + g * 32 + 16, d), sag + g * S, facc);
    }
}

// q40, q50, q80 on AVX-512: the shared d16_tile's sums and float step the same way (a0 = a1 = the group's d,
// widened exactly), each group's codes (and q50's fifth bits) fetched SZ_PF k-blocks ahead.
#define SZ_D16_TILE 1
template <int R, class Quads>
static void d16_tile(const uint8_t* qs, const uint8_t* qh, const uint16_t* d, int64_t nq, const int32_t* xk,
                     const int32_t* xh, const float* sag, int64_t S, float* facc) {
    constexpr int64_t GA = std::is_same_v<Quads, Q8bQuads> ? 512 : 256;  // code bytes a group
    for (int64_t g = 0; g < nq / 8; ++g) {
        d16_prefetch_group(qs, qh, d, GA, g);
        const __m512 dv = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(d + g * 16)));
        group_float_step<R>(quads_at<Quads>(qs, qh, g), xk + g * 8 * S, xh + g * 2 * S, S, dv, dv, sag + g * S, facc);
    }
}
#elif defined(SZ_PATH_AVXVNNI) || defined(SZ_PATH_AVX2)
#define SZ_TILE 5  // 2 accumulators a row + 4 weight registers + 2 broadcasts fit the 16 ymm
#if defined(SZ_PATH_AVXVNNI)
#define SZ_Q8_UNSIGNED 1
#else
#define SZ_Q8_UNSIGNED 0
#endif
// 16 columns as two ymm halves (columns 0-7, 8-15), each 32-bit lane holding one column's 4 inputs.

// The accumulator, opaque to the optimizer from here on (no instruction): integer adds are associative, and
// without it GCC rebalances a tile's unrolled chain of acc + product into a tree that computes every
// product first, so an R-row tile spills most of them to the stack (q4_tile<5>: 232 ymm stack moves a
// group against 80 vpmaddubsw). One chain a register keeps the products transient.
static inline __m256i sz_chain(__m256i acc) {
    __asm__("" : "+x"(acc));
    return acc;
}

// The rows' activation words, opaque to the optimizer (no instruction). The 8-bit tiles below work one
// column half at a time, so that two code registers (the signed codes and their size) are live instead of
// four and an R-row tile's 2R sums stay in registers; each half then broadcasts the rows' words again, one
// load each, where the compiler would otherwise keep all R broadcasts from the first half and spill them.
static inline const int32_t* sz_half_words(const int32_t* x) {
    __asm__ volatile("" : "+r"(x));  // volatile: two halves' identical statements must not merge
    return x;
}

template <int R>
static void q8_tile(const uint8_t* w, int64_t nq, const int32_t* xk, int64_t S, int32_t* acc, bool first) {
    __m256i a[R][2];
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h)
            a[r][h] = first ? _mm256_setzero_si256() : _mm256_load_si256((const __m256i*)(acc + r * 16 + h * 8));
#if defined(SZ_PATH_AVXVNNI)
    for (int64_t q = 0; q < nq; ++q) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i*)(w + q * 64));
        const __m256i w1 = _mm256_loadu_si256((const __m256i*)(w + q * 64 + 32));
        const int32_t* xr = xk + q * S;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m256i xb = _mm256_set1_epi32(xr[r]);
            a[r][0] = _mm256_dpbusd_avx_epi32(a[r][0], w0, xb);
            a[r][1] = _mm256_dpbusd_avx_epi32(a[r][1], w1, xb);
        }
    }
#else
    // |q| * (x * sign(q)): u8 <= 127 times s8 in [-127, 127], so a pair of products is at most
    // 2 * 127 * 127 = 32258 and vpmaddubsw cannot saturate; vpmaddwd by ones widens the pairs exactly.
    const __m256i flip = _mm256_set1_epi8((char)0x80), ones = _mm256_set1_epi16(1);
    for (int64_t q = 0; q < nq; ++q) {
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {  // a column half's codes at a time (see sz_half_words)
            const __m256i s = _mm256_xor_si256(_mm256_loadu_si256((const __m256i*)(w + q * 64 + 32 * c)), flip);
            const __m256i u = _mm256_abs_epi8(s);
            const int32_t* xr = sz_half_words(xk + q * S);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i xb = _mm256_set1_epi32(xr[r]);
                a[r][c] = sz_chain(_mm256_add_epi32(a[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(xb, s)), ones)));
            }
        }
    }
#endif
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) _mm256_store_si256((__m256i*)(acc + r * 16 + h * 8), a[r][h]);
}

// q4: the rows' sums over the groups so far in one L1 array (isb); the mins and the float step on registers
// (q4_float_update's lane-wise operations in its order). One plain loop over the groups: peeling the first
// group (storing isb instead of zeroing it) streams the weights from DRAM slower at S = 1 (docs/results.md,
// "The AVX2 q4 tile on Zen 3 against its instruction bound").
template <int R>
static void q4_tile(const uint8_t* qb, const uint8_t* scb, const uint8_t* mnb, const float* ddb, const int32_t* xk,
                    const int32_t* xp, const float* sab, int64_t S, int ng, float* facc) {
    alignas(32) int32_t isb[R * 16];
    const __m256i nib = _mm256_set1_epi8(0x0F);
#if !defined(SZ_PATH_AVXVNNI)
    // vpshufb indices: each column's scale byte twice as an int16 pair (-1 writes a zero byte)
    const __m256i sc_pairs0 = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,  // 0-3
                                               4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    const __m256i sc_pairs1 = _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1,  // 8-11
                                               12, -1, 12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1);
#endif
    for (int i = 0; i < R * 16; ++i) isb[i] = 0;
    for (int g = 0; g < ng; ++g) {
        q4_prefetch_group<R>(qb, g);
        __m256i t[R][2];
        for (int r = 0; r < R; ++r) t[r][0] = t[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
            const __m256i p0 = _mm256_loadu_si256((const __m256i*)(qb + g * 256 + j * 64));
            const __m256i p1 = _mm256_loadu_si256((const __m256i*)(qb + g * 256 + j * 64 + 32));
            const int32_t* xl = xk + (g * 8 + j) * S;
            const int32_t* xh = xl + 4 * S;
#if defined(SZ_PATH_AVXVNNI)
            const __m256i l0 = _mm256_and_si256(p0, nib), h0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), nib);
            const __m256i l1 = _mm256_and_si256(p1, nib), h1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), nib);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i xlv = _mm256_set1_epi32(xl[r]), xhv = _mm256_set1_epi32(xh[r]);
                t[r][0] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(t[r][0], l0, xlv), h0, xhv);
                t[r][1] = _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(t[r][1], l1, xlv), h1, xhv);
            }
#else
            // int16 lanes: vpmaddubsw takes the nibble codes as its unsigned operand (u8, 0..15) and the
            // activations as its signed one (s8, |x| <= 127), so a pair is at most 2 * 15 * 127 = 3810 in size
            // (its saturation never engages), and a lane sums 8 of them over the group (4 quads, low and high
            // nibbles): at most 30480 < 32767, exact; one vpmaddwd a group then widens it with the scale. The
            // low nibbles for every row, then the high ones: two code registers live instead of four, so a
            // 5-row tile's 10 sums stay in registers.
            const __m256i l0 = _mm256_and_si256(p0, nib), l1 = _mm256_and_si256(p1, nib);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i xlv = _mm256_set1_epi32(xl[r]);
                t[r][0] = sz_chain(_mm256_add_epi16(t[r][0], _mm256_maddubs_epi16(l0, xlv)));
                t[r][1] = sz_chain(_mm256_add_epi16(t[r][1], _mm256_maddubs_epi16(l1, xlv)));
            }
            const __m256i h0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), nib);
            const __m256i h1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), nib);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i xhv = _mm256_set1_epi32(xh[r]);
                t[r][0] = sz_chain(_mm256_add_epi16(t[r][0], _mm256_maddubs_epi16(h0, xhv)));
                t[r][1] = sz_chain(_mm256_add_epi16(t[r][1], _mm256_maddubs_epi16(h1, xhv)));
            }
#endif
        }
#if defined(SZ_PATH_AVXVNNI)
        const __m128i s16 = _mm_loadu_si128((const __m128i*)(scb + g * 16));
        const __m256i sc0 = _mm256_cvtepu8_epi32(s16), sc1 = _mm256_cvtepu8_epi32(_mm_srli_si128(s16, 8));
        for (int r = 0; r < R; ++r) {
            __m256i* is = (__m256i*)(isb + r * 16);
            _mm256_store_si256(is, _mm256_add_epi32(_mm256_load_si256(is), _mm256_mullo_epi32(t[r][0], sc0)));
            _mm256_store_si256(is + 1, _mm256_add_epi32(_mm256_load_si256(is + 1), _mm256_mullo_epi32(t[r][1], sc1)));
        }
#else
        // (sc, sc) in each lane's two int16 halves: vpmaddwd gives sc * (both halves' sums) = sc * t_g, exact
        const __m256i s32 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)(scb + g * 16)));
        const __m256i sp0 = _mm256_shuffle_epi8(s32, sc_pairs0), sp1 = _mm256_shuffle_epi8(s32, sc_pairs1);
        for (int r = 0; r < R; ++r) {
            __m256i* is = (__m256i*)(isb + r * 16);
            _mm256_store_si256(is, _mm256_add_epi32(_mm256_load_si256(is), _mm256_madd_epi16(t[r][0], sp0)));
            _mm256_store_si256(is + 1, _mm256_add_epi32(_mm256_load_si256(is + 1), _mm256_madd_epi16(t[r][1], sp1)));
        }
#endif
    }
    __m256i ai[R][2];
    for (int r = 0; r < R; ++r) ai[r][0] = ai[r][1] = _mm256_setzero_si256();
    // mins: (m_2p, m_2p+1) of a column times the row's (xs_2p, xs_2p+1) int16 pair, summed by vpmaddwd
    for (int p = 0; p < ng / 2; ++p) {
        const __m256i mb = _mm256_loadu_si256((const __m256i*)(mnb + p * 32));
        const __m256i m0 = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(mb));
        const __m256i m1 = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(mb, 1));
        const int32_t* xr = xp + p * S;
        for (int r = 0; r < R; ++r) {
            const __m256i xv = _mm256_set1_epi32(xr[r]);
            ai[r][0] = _mm256_add_epi32(ai[r][0], _mm256_madd_epi16(m0, xv));
            ai[r][1] = _mm256_add_epi32(ai[r][1], _mm256_madd_epi16(m1, xv));
        }
    }
    // q4_float_update on the halves: facc += ((float)isb * D - (float)imn * Dm) * sab[r], imn = ai
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
        const __m256 d = _mm256_loadu_ps(ddb + 8 * h), dm = _mm256_loadu_ps(ddb + 16 + 8 * h);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m256 is = _mm256_cvtepi32_ps(_mm256_load_si256((const __m256i*)(isb + r * 16 + 8 * h)));
            const __m256 t = _mm256_sub_ps(_mm256_mul_ps(is, d), _mm256_mul_ps(_mm256_cvtepi32_ps(ai[r][h]), dm));
            float* f = facc + r * 16 + 8 * h;
            _mm256_storeu_ps(f, _mm256_add_ps(_mm256_loadu_ps(f), _mm256_mul_ps(t, _mm256_set1_ps(sab[r]))));
        }
    }
}


// q8b and q6 codes of quad jq (0..7) of a group, as u8 (the code + BIAS), columns 0-7 (part 0) or 8-15
// (part 1): as on AVX-512, on 32 bytes.
struct Q8bQuads {
    static constexpr int SHIFT = 7;  // BIAS = 128
    const uint8_t* w;
    __m256i operator()(int jq, int part) const { return _mm256_loadu_si256((const __m256i*)(w + jq * 64 + 32 * part)); }
};
struct Q6Quads {
    static constexpr int SHIFT = 5;  // BIAS = 32
    const uint8_t *ql, *qh;
    __m256i operator()(int jq, int part) const {
        const __m256i p = _mm256_loadu_si256((const __m256i*)(ql + (jq % 4) * 64 + 32 * part));
        const __m256i h = _mm256_loadu_si256((const __m256i*)(qh + (jq / 4) * 64 + 32 * part));
        const __m256i nib = _mm256_and_si256(jq < 4 ? p : _mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(h, 2 * (jq % 4)), _mm256_set1_epi8(0x03));
        return _mm256_or_si256(nib, _mm256_slli_epi16(hi, 4));
    }
};

struct Q40Quads {
    static constexpr int SHIFT = 3;  // BIAS = 8
    const uint8_t* qs;
    __m256i operator()(int jq, int part) const {
        const __m256i p = _mm256_loadu_si256((const __m256i*)(qs + (jq % 4) * 64 + 32 * part));
        return _mm256_and_si256(jq < 4 ? p : _mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
    }
};
struct Q50Quads {
    static constexpr int SHIFT = 4;  // BIAS = 16
    const uint8_t *qs, *qh;
    __m256i operator()(int jq, int part) const {
        const __m256i p = _mm256_loadu_si256((const __m256i*)(qs + (jq % 4) * 64 + 32 * part));
        const __m256i h = _mm256_loadu_si256((const __m256i*)(qh + 32 * part));
        const __m256i nib = _mm256_and_si256(jq < 4 ? p : _mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
        const __m256i hb = jq <= 4 ? _mm256_slli_epi16(h, 4 - jq) : _mm256_srli_epi16(h, jq - 4);
        return _mm256_or_si256(nib, _mm256_and_si256(hb, _mm256_set1_epi8(0x10)));
    }
};

// q8b, q40, q50, q80 (and q6 on AVX-VNNI): one group of 32 inputs: t[r][h][16] = the exact sums of
// (u - BIAS) * x over half h for rows r. AVX-VNNI: vpdpbusd sums u * x, then BIAS * the half's activation
// sum comes off. AVX2, codes below 32 (q40's and q50's, BIAS 8 and 16): the same, u * x by vpmaddubsw (a
// pair at most 2 * 31 * 127 = 7874, the half's 4 quads summed in int16 at most 31496: exact), widened once
// by vpmaddwd, BIAS * the half's activation sum off at the end. AVX2, wider codes (q8b's): the signed codes
// s = u - BIAS (|s| <= BIAS) as q8_tile does, |s| * (x * sign(s)): a vpmaddubsw pair is at most 2 * BIAS *
// 127 = 32512 and cannot saturate, widened by vpmaddwd at once (q6's own AVX2 tile is below; AVX-VNNI's goes
// through here with BIAS 32).
template <int R, class Quads>
static inline void half_sums(Quads quads, int h, const int32_t* xk, const int32_t* xh, int64_t S, __m256i (&a)[R][2]) {
#if !defined(SZ_PATH_AVXVNNI)
    const __m256i bias = _mm256_set1_epi8((char)(1 << Quads::SHIFT)), ones = _mm256_set1_epi16(1);
    constexpr bool UNSIGNED = Quads::SHIFT <= 4;     // codes u < 32: u * x with the bias taken off at the end
    static_assert(!UNSIGNED || 4 * 2 * 31 * 127 <= 32767, "a half's int16 sums must not overflow");
#endif
    for (int r = 0; r < R; ++r) a[r][0] = a[r][1] = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
#if defined(SZ_PATH_AVXVNNI)
        const __m256i w0 = quads(4 * h + q, 0), w1 = quads(4 * h + q, 1);
        const int32_t* xr = xk + (4 * h + q) * S;
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            const __m256i xb = _mm256_set1_epi32(xr[r]);
            a[r][0] = _mm256_dpbusd_avx_epi32(a[r][0], w0, xb);
            a[r][1] = _mm256_dpbusd_avx_epi32(a[r][1], w1, xb);
        }
#else
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {  // a column half's codes at a time (see sz_half_words)
            const int32_t* xr = sz_half_words(xk + (4 * h + q) * S);
            if constexpr (UNSIGNED) {
                const __m256i u = quads(4 * h + q, c);
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const __m256i p = _mm256_maddubs_epi16(u, _mm256_set1_epi32(xr[r]));
                    a[r][c] = sz_chain(_mm256_add_epi16(a[r][c], p));
                }
            } else {
                const __m256i s = _mm256_sub_epi8(quads(4 * h + q, c), bias), u = _mm256_abs_epi8(s);
#pragma GCC unroll 8
                for (int r = 0; r < R; ++r) {
                    const __m256i p = _mm256_maddubs_epi16(u, _mm256_sign_epi8(_mm256_set1_epi32(xr[r]), s));
                    a[r][c] = sz_chain(_mm256_add_epi32(a[r][c], _mm256_madd_epi16(p, ones)));
                }
            }
        }
#endif
    }
    for (int r = 0; r < R; ++r) {
#if !defined(SZ_PATH_AVXVNNI)
        if constexpr (UNSIGNED) {
            const __m256i corr = _mm256_slli_epi32(_mm256_set1_epi32(xh[h * S + r]), Quads::SHIFT);
            a[r][0] = _mm256_sub_epi32(_mm256_madd_epi16(a[r][0], ones), corr);
            a[r][1] = _mm256_sub_epi32(_mm256_madd_epi16(a[r][1], ones), corr);
        }
#else
        const __m256i corr = _mm256_slli_epi32(_mm256_set1_epi32(xh[h * S + r]), Quads::SHIFT);
        a[r][0] = _mm256_sub_epi32(a[r][0], corr);
        a[r][1] = _mm256_sub_epi32(a[r][1], corr);
#endif
    }
}

template <int R, class Quads>
static inline void group_sums(Quads quads, const int32_t* xk, const int32_t* xh, int64_t S, int32_t* t) {
    for (int h = 0; h < 2; ++h) {
        __m256i a[R][2];
        half_sums<R>(quads, h, xk, xh, S, a);
        for (int r = 0; r < R; ++r) {
            _mm256_storeu_si256((__m256i*)(t + (2 * r + h) * 16), a[r][0]);
            _mm256_storeu_si256((__m256i*)(t + (2 * r + h) * 16 + 8), a[r][1]);
        }
    }
}

// q40, q50, q80 on AVX2 and AVX-VNNI: the shared d16_tile's integer sums (half_sums) and float step with neither
// going through memory, d16_float_update's lane-wise operations in its order: facc + ((float)t0 * d + (float)t1 *
// d) * sag[r]; each group's codes (and q50's fifth bits) fetched SZ_PF k-blocks ahead, as q4's.
#define SZ_D16_TILE 1
template <int R, class Quads>
static void d16_tile(const uint8_t* qs, const uint8_t* qh, const uint16_t* d, int64_t nq, const int32_t* xk,
                     const int32_t* xh, const float* sag, int64_t S, float* facc) {
    constexpr int64_t GA = std::is_same_v<Quads, Q8bQuads> ? 512 : 256;  // code bytes a group
    __m256 f[R][2];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2; ++c) f[r][c] = _mm256_loadu_ps(facc + r * 16 + 8 * c);
    for (int64_t g = 0; g < nq / 8; ++g) {
        d16_prefetch_group(qs, qh, d, GA, g);
        const Quads quads = quads_at<Quads>(qs, qh, g);
        const int32_t *xq = xk + g * 8 * S, *xg = xh + g * 2 * S;
        __m256 dv[2];
        for (int c = 0; c < 2; ++c) dv[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(d + g * 16 + 8 * c)));
        __m256i a[R][2];
        __m256 m[R][2];  // (float)t0 * d
        half_sums<R>(quads, 0, xq, xg, S, a);
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < 2; ++c) m[r][c] = _mm256_mul_ps(_mm256_cvtepi32_ps(a[r][c]), dv[c]);
        half_sums<R>(quads, 1, xq, xg, S, a);
        for (int r = 0; r < R; ++r)
            for (int c = 0; c < 2; ++c) {
                const __m256 u = _mm256_add_ps(m[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(a[r][c]), dv[c]));
                f[r][c] = _mm256_add_ps(f[r][c], _mm256_mul_ps(u, _mm256_set1_ps(sag[g * S + r])));
            }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2; ++c) _mm256_storeu_ps(facc + r * 16 + 8 * c, f[r][c]);
}

#if !defined(SZ_PATH_AVXVNNI)
#define SZ_Q6_TILE 1  // q6_tile below, in place of the shared one
// q6 on AVX2: the shared q6_tile's integer sums and float step, with neither going through memory. The
// unsigned codes u (0..63) times the activations: a vpmaddubsw pair is at most 2 * 63 * 128 = 16128 in size,
// two quads' pairs summed in int16 at most 32256 (exact), widened by vpmaddwd; each half starts at -32 times
// its activation sum (xh), so it ends at the sum of (u - 32) * x, without group_sums' sign and abs a code.
// The high bits of quad m come to bits 4-5 with one 16-bit shift by 4 - 2m (none for m = 2; a bit shifted
// in from the neighbouring byte lands outside 0x30). Each half's scales are made in registers
// (a = D * (float)sc) and q8b_float_update's operations follow on registers in its order:
// facc + ((float)t0 * a0 + (float)t1 * a1) * sag[r].
template <int M>
static inline __m256i q6_high_bits(__m256i h) {
    const __m256i v = M == 0 ? _mm256_slli_epi16(h, 4) : M == 1 ? _mm256_slli_epi16(h, 2)
                    : M == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x30));
}

// u of quad 4h + q, columns 8c .. 8c + 7 (p: ql of quad q, hb: qh of half h, both at column part c)
template <int H, int Q>
static inline __m256i q6_codes(__m256i p, __m256i hb) {
    const __m256i nib = _mm256_and_si256(H == 0 ? p : _mm256_srli_epi16(p, 4), _mm256_set1_epi8(0x0F));
    return _mm256_or_si256(nib, q6_high_bits<Q>(hb));
}

// one half H of group g: acc[r][c] = the exact sums of (u - 32) * x for rows r, column parts c
template <int R, int H>
static inline void q6_half_sums(const uint8_t* lg, const uint8_t* hg, const int32_t* xq, const int32_t* xh, int64_t S,
                                __m256i (&acc)[R][2]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_set1_epi32(-32 * xh[r]);
#pragma GCC unroll 2
    for (int c = 0; c < 2; ++c) {  // a column half's codes at a time (see sz_half_words)
        const __m256i hb = _mm256_loadu_si256((const __m256i*)(hg + H * 64 + 32 * c));
#pragma GCC unroll 2
        for (int jp = 0; jp < 2; ++jp) {  // quads 2 jp, 2 jp + 1: their pairs summed in int16
            const __m256i p0 = _mm256_loadu_si256((const __m256i*)(lg + (2 * jp) * 64 + 32 * c));
            const __m256i p1 = _mm256_loadu_si256((const __m256i*)(lg + (2 * jp + 1) * 64 + 32 * c));
            const __m256i u0 = jp == 0 ? q6_codes<H, 0>(p0, hb) : q6_codes<H, 2>(p0, hb);
            const __m256i u1 = jp == 0 ? q6_codes<H, 1>(p1, hb) : q6_codes<H, 3>(p1, hb);
            const int32_t* x0 = sz_half_words(xq + (2 * jp) * S);
            const int32_t* x1 = x0 + S;
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                const __m256i s = _mm256_add_epi16(_mm256_maddubs_epi16(u0, _mm256_set1_epi32(x0[r])),
                                                   _mm256_maddubs_epi16(u1, _mm256_set1_epi32(x1[r])));
                acc[r][c] = sz_chain(_mm256_add_epi32(acc[r][c], _mm256_madd_epi16(s, ones)));
            }
        }
    }
}

// a = D * (float)sc for 8 columns of a half: sc8 its int8 sub-scales, d the super-block's D of those columns
static inline __m256 q6_half_scales(const int8_t* sc8, const float* d) {
    const __m128i s8 = _mm_loadl_epi64((const __m128i*)sc8);
    return _mm256_mul_ps(_mm256_loadu_ps(d), _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s8)));
}

// q6: R rows x nq quads (whole groups of 32) of one strip, as the shared q6_tile (below) computes them.
template <int R>
static void q6_tile(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* dd, int64_t nq,
                    const int32_t* xk, const int32_t* xh, const float* sag, int64_t S, float* facc) {
    __m256 f[R][2];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2; ++c) f[r][c] = _mm256_loadu_ps(facc + r * 16 + 8 * c);
    for (int64_t g = 0; g < nq / 8; ++g) {
        const uint8_t *lg = ql + g * 256, *hg = qh + g * 128;
        const float* d = dd + (g / 8) * 16;  // read where used: D held in registers would push f out of them
        q6_prefetch_group<R>(ql, qh, g);
        const int32_t* xq = xk + g * 8 * S;
        __m256i acc[R][2];
        __m256 m[R][2];  // (float)t0 * a0
        q6_half_sums<R, 0>(lg, hg, xq, xh + 2 * g * S, S, acc);
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {
            const __m256 a = q6_half_scales(sc + g * 32 + 8 * c, d + 8 * c);
            for (int r = 0; r < R; ++r) m[r][c] = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][c]), a);
        }
        q6_half_sums<R, 1>(lg, hg, xq + 4 * S, xh + (2 * g + 1) * S, S, acc);
#pragma GCC unroll 2
        for (int c = 0; c < 2; ++c) {
            const __m256 a = q6_half_scales(sc + g * 32 + 16 + 8 * c, d + 8 * c);
            for (int r = 0; r < R; ++r) {
                const __m256 u = _mm256_add_ps(m[r][c], _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][c]), a));
                f[r][c] = _mm256_add_ps(f[r][c], _mm256_mul_ps(u, _mm256_set1_ps(sag[g * S + r])));
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 2; ++c) _mm256_storeu_ps(facc + r * 16 + 8 * c, f[r][c]);
}
#endif
#elif defined(SZ_FLOAT_NEON)
#define SZ_TILE 4
#define SZ_Q8_UNSIGNED 0
// 16 columns as four q registers (columns 4m .. 4m+3), each 32-bit lane holding one column's 4 inputs.

// acc[c] += the dot product of the 4 bytes of lane c of a and b (both int8).
static inline int32x4_t sz_dot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
    return vdotq_s32(acc, a, b);
#else
    // an int8 product fits int16 exactly (|a b| <= 128 * 128); the pairwise widening sums are exact
    const int16x8_t lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    const int16x8_t hi = vmull_high_s8(a, b);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}

static inline int8x16_t sz_bcast(const int32_t* x) { return vreinterpretq_s8_s32(vld1q_dup_s32(x)); }

#if defined(SZ_PATH_I8MM)
// Rows r, r+1 of 8 inputs (quads q and q+1) as the 2x8 left operand of smmla: bytes 0-7 row r, 8-15 row r+1.
static inline int8x16_t sz_rowpair(const int32_t* xq, const int32_t* xq1) {
    const int32x2_t a = vld1_s32(xq), b = vld1_s32(xq1);  // (quad q: rows r, r+1), (quad q+1: rows r, r+1)
    return vreinterpretq_s8_s32(vcombine_s32(vzip1_s32(a, b), vzip2_s32(a, b)));
}
// Columns of quads q (wq) and q+1 (wq1), 4 columns each, as two 2x8 right operands (columns 0-1, 2-3).
static inline void sz_colpairs(int8x16_t wq, int8x16_t wq1, int8x16_t* out) {
    out[0] = vreinterpretq_s8_s32(vzip1q_s32(vreinterpretq_s32_s8(wq), vreinterpretq_s32_s8(wq1)));
    out[1] = vreinterpretq_s8_s32(vzip2q_s32(vreinterpretq_s32_s8(wq), vreinterpretq_s32_s8(wq1)));
}
// smmla accumulators [row r: c, c+1 | row r+1: c, c+1] for column pairs (4m, 4m+1), (4m+2, 4m+3) -> rows.
static inline int32x4_t sz_row0(int32x4_t p01, int32x4_t p23) {
    return vreinterpretq_s32_s64(vzip1q_s64(vreinterpretq_s64_s32(p01), vreinterpretq_s64_s32(p23)));
}
static inline int32x4_t sz_row1(int32x4_t p01, int32x4_t p23) {
    return vreinterpretq_s32_s64(vzip2q_s64(vreinterpretq_s64_s32(p01), vreinterpretq_s64_s32(p23)));
}
#endif

template <int R>
static void q8_tile(const uint8_t* w, int64_t nq, const int32_t* xk, int64_t S, int32_t* acc, bool first) {
    int32x4_t a[R][4];
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < 4; ++m) a[r][m] = first ? vdupq_n_s32(0) : vld1q_s32(acc + r * 16 + m * 4);
    const uint8x16_t flip = vdupq_n_u8(0x80);  // stored q + 128 -> q
#if defined(SZ_PATH_I8MM)
    constexpr int P = R / 2;  // row pairs through smmla; an odd last row through sdot
    int32x4_t pa[P > 0 ? P : 1][8];
    for (int p = 0; p < P; ++p)
        for (int n = 0; n < 8; ++n) pa[p][n] = vdupq_n_s32(0);
    for (int64_t q = 0; q < nq; q += 2) {  // nq is even (a multiple of 8)
        int8x16_t w0[4], w1[4], b[8];
        for (int m = 0; m < 4; ++m) {
            w0[m] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + q * 64 + 16 * m), flip));
            w1[m] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + (q + 1) * 64 + 16 * m), flip));
            sz_colpairs(w0[m], w1[m], b + 2 * m);
        }
        for (int p = 0; p < P; ++p) {
            const int8x16_t x2 = sz_rowpair(xk + q * S + 2 * p, xk + (q + 1) * S + 2 * p);
            for (int n = 0; n < 8; ++n) pa[p][n] = vmmlaq_s32(pa[p][n], x2, b[n]);
        }
        if (R % 2) {
            const int8x16_t x0 = sz_bcast(xk + q * S + R - 1), x1 = sz_bcast(xk + (q + 1) * S + R - 1);
            for (int m = 0; m < 4; ++m) a[R - 1][m] = sz_dot(sz_dot(a[R - 1][m], w0[m], x0), w1[m], x1);
        }
    }
    for (int p = 0; p < P; ++p)
        for (int m = 0; m < 4; ++m) {
            a[2 * p][m] = vaddq_s32(a[2 * p][m], sz_row0(pa[p][2 * m], pa[p][2 * m + 1]));
            a[2 * p + 1][m] = vaddq_s32(a[2 * p + 1][m], sz_row1(pa[p][2 * m], pa[p][2 * m + 1]));
        }
#else
    for (int64_t q = 0; q < nq; ++q) {
        int8x16_t wq[4];
        for (int m = 0; m < 4; ++m) wq[m] = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(w + q * 64 + 16 * m), flip));
        const int32_t* xr = xk + q * S;
        for (int r = 0; r < R; ++r) {
            const int8x16_t xb = sz_bcast(xr + r);
            for (int m = 0; m < 4; ++m) a[r][m] = sz_dot(a[r][m], wq[m], xb);
        }
    }
#endif
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < 4; ++m) vst1q_s32(acc + r * 16 + m * 4, a[r][m]);
}

template <int R>
static void q4_tile(const uint8_t* qb, const uint8_t* scb, const uint8_t* mnb, const float* ddb, const int32_t* xk,
                    const int32_t* xp, const float* sab, int64_t S, int ng, float* facc) {
    alignas(16) int32_t isb[R * 16], imn[R * 16];
    int32x4_t ai[R][4];
    const uint8x16_t nib = vdupq_n_u8(0x0F);
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < 4; ++m) ai[r][m] = vdupq_n_s32(0);
    for (int g = 0; g < ng; ++g) {
        q4_prefetch_group<R>(qb, g);
        int32x4_t t[R][4];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < 4; ++m) t[r][m] = vdupq_n_s32(0);
#if defined(SZ_PATH_I8MM)
        constexpr int P = R / 2;
        int32x4_t pt[P > 0 ? P : 1][8];
        for (int p = 0; p < P; ++p)
            for (int n = 0; n < 8; ++n) pt[p][n] = vdupq_n_s32(0);
        for (int j = 0; j < 4; j += 2) {
            for (int half = 0; half < 2; ++half) {  // low nibbles: quads 8g + j, j+1; high: 4 quads later
                int8x16_t w0[4], w1[4], b[8];
                for (int m = 0; m < 4; ++m) {
                    const uint8x16_t p0 = vld1q_u8(qb + g * 256 + j * 64 + 16 * m);
                    const uint8x16_t p1 = vld1q_u8(qb + g * 256 + (j + 1) * 64 + 16 * m);
                    w0[m] = vreinterpretq_s8_u8(half ? vshrq_n_u8(p0, 4) : vandq_u8(p0, nib));
                    w1[m] = vreinterpretq_s8_u8(half ? vshrq_n_u8(p1, 4) : vandq_u8(p1, nib));
                    sz_colpairs(w0[m], w1[m], b + 2 * m);
                }
                const int32_t* x0 = xk + (g * 8 + j + 4 * half) * S;
                const int32_t* x1 = x0 + S;
                for (int p = 0; p < P; ++p) {
                    const int8x16_t x2 = sz_rowpair(x0 + 2 * p, x1 + 2 * p);
                    for (int n = 0; n < 8; ++n) pt[p][n] = vmmlaq_s32(pt[p][n], x2, b[n]);
                }
                if (R % 2) {
                    const int8x16_t xa = sz_bcast(x0 + R - 1), xb = sz_bcast(x1 + R - 1);
                    for (int m = 0; m < 4; ++m) t[R - 1][m] = sz_dot(sz_dot(t[R - 1][m], w0[m], xa), w1[m], xb);
                }
            }
        }
        for (int p = 0; p < P; ++p)
            for (int m = 0; m < 4; ++m) {
                t[2 * p][m] = sz_row0(pt[p][2 * m], pt[p][2 * m + 1]);
                t[2 * p + 1][m] = sz_row1(pt[p][2 * m], pt[p][2 * m + 1]);
            }
#else
        for (int j = 0; j < 4; ++j) {
            int8x16_t lo[4], hi[4];
            for (int m = 0; m < 4; ++m) {
                const uint8x16_t p = vld1q_u8(qb + g * 256 + j * 64 + 16 * m);
                lo[m] = vreinterpretq_s8_u8(vandq_u8(p, nib));
                hi[m] = vreinterpretq_s8_u8(vshrq_n_u8(p, 4));
            }
            const int32_t* xl = xk + (g * 8 + j) * S;
            const int32_t* xh = xl + 4 * S;
            for (int r = 0; r < R; ++r) {
                const int8x16_t xlv = sz_bcast(xl + r), xhv = sz_bcast(xh + r);
                for (int m = 0; m < 4; ++m) t[r][m] = sz_dot(sz_dot(t[r][m], lo[m], xlv), hi[m], xhv);
            }
        }
#endif
        const uint8x16_t s8 = vld1q_u8(scb + g * 16);
        const uint16x8_t s16l = vmovl_u8(vget_low_u8(s8)), s16h = vmovl_high_u8(s8);
        const int32x4_t scv[4] = {vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(s16l))),
                                  vreinterpretq_s32_u32(vmovl_high_u16(s16l)),
                                  vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(s16h))),
                                  vreinterpretq_s32_u32(vmovl_high_u16(s16h))};
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < 4; ++m) ai[r][m] = vmlaq_s32(ai[r][m], t[r][m], scv[m]);
    }
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < 4; ++m) {
            vst1q_s32(isb + r * 16 + m * 4, ai[r][m]);
            ai[r][m] = vdupq_n_s32(0);  // reused for the mins
        }
    for (int p = 0; p < ng / 2; ++p) {
        const uint8x16_t ma = vld1q_u8(mnb + p * 32), mb = vld1q_u8(mnb + p * 32 + 16);
        const int16x8_t m16[4] = {vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(ma))),
                                  vreinterpretq_s16_u16(vmovl_high_u8(ma)),
                                  vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mb))),
                                  vreinterpretq_s16_u16(vmovl_high_u8(mb))};
        const int32_t* xr = xp + p * S;
        for (int r = 0; r < R; ++r) {
            const int16x8_t xv = vreinterpretq_s16_s32(vld1q_dup_s32(xr + r));  // (xs_2p, xs_2p+1) x 4
            for (int m = 0; m < 4; ++m) {
                const int32x4_t lo = vmull_s16(vget_low_s16(m16[m]), vget_low_s16(xv));
                const int32x4_t hi = vmull_high_s16(m16[m], xv);
                ai[r][m] = vaddq_s32(ai[r][m], vpaddq_s32(lo, hi));
            }
        }
    }
    for (int r = 0; r < R; ++r)
        for (int m = 0; m < 4; ++m) vst1q_s32(imn + r * 16 + m * 4, ai[r][m]);
    q4_float_update<R>(isb, imn, ddb, sab, facc);
}


// q8b and q6 codes of quad jq (0..7) of a group, as u8 (the code + BIAS), columns 4m .. 4m + 3.
struct Q8bQuads {
    static constexpr int SHIFT = 7;  // BIAS = 128
    const uint8_t* w;
    uint8x16_t operator()(int jq, int m) const { return vld1q_u8(w + jq * 64 + 16 * m); }
};
struct Q6Quads {
    static constexpr int SHIFT = 5;  // BIAS = 32
    const uint8_t *ql, *qh;
    uint8x16_t operator()(int jq, int m) const {
        const uint8x16_t p = vld1q_u8(ql + (jq % 4) * 64 + 16 * m), hb = vld1q_u8(qh + (jq / 4) * 64 + 16 * m);
        const uint8x16_t lo = jq < 4 ? vandq_u8(p, vdupq_n_u8(0x0F)) : vshrq_n_u8(p, 4);
        const uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(-2 * (jq % 4)))), vdupq_n_u8(0x03));
        return vorrq_u8(lo, vshlq_n_u8(hi, 4));
    }
};

struct Q40Quads {
    static constexpr int SHIFT = 3;  // BIAS = 8
    const uint8_t* qs;
    uint8x16_t operator()(int jq, int m) const {
        const uint8x16_t p = vld1q_u8(qs + (jq % 4) * 64 + 16 * m);
        return jq < 4 ? vandq_u8(p, vdupq_n_u8(0x0F)) : vshrq_n_u8(p, 4);
    }
};
struct Q50Quads {
    static constexpr int SHIFT = 4;  // BIAS = 16
    const uint8_t *qs, *qh;
    uint8x16_t operator()(int jq, int m) const {
        const uint8x16_t p = vld1q_u8(qs + (jq % 4) * 64 + 16 * m), hb = vld1q_u8(qh + 16 * m);
        const uint8x16_t lo = jq < 4 ? vandq_u8(p, vdupq_n_u8(0x0F)) : vshrq_n_u8(p, 4);
        const uint8x16_t hi = vandq_u8(vshlq_u8(hb, vdupq_n_s8((int8_t)(4 - jq))), vdupq_n_u8(0x10));
        return vorrq_u8(lo, hi);
    }
};

// q8b / q6: one group of 32 inputs: t[r][h][16] = the exact sums of (u - BIAS) * x over half h for rows r,
// on the signed codes u - BIAS (sdot, or smull with pairwise widening).
template <int R, class Quads>
static inline void group_sums(Quads quads, const int32_t* xk, const int32_t* xh, int64_t S, int32_t* t) {
    const uint8x16_t bias = vdupq_n_u8((uint8_t)(1 << Quads::SHIFT));
    for (int h = 0; h < 2; ++h) {
        int32x4_t a[R][4];
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < 4; ++m) a[r][m] = vdupq_n_s32(0);
        for (int q = 0; q < 4; ++q) {
            int8x16_t wq[4];
            for (int m = 0; m < 4; ++m) wq[m] = vreinterpretq_s8_u8(vsubq_u8(quads(4 * h + q, m), bias));
            const int32_t* xr = xk + (4 * h + q) * S;
            for (int r = 0; r < R; ++r) {
                const int8x16_t xb = sz_bcast(xr + r);
                for (int m = 0; m < 4; ++m) a[r][m] = sz_dot(a[r][m], wq[m], xb);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int m = 0; m < 4; ++m) vst1q_s32(t + (2 * r + h) * 16 + 4 * m, a[r][m]);
    }
    (void)xh;
}
#else  // scalar reference
#define SZ_TILE 4
#define SZ_Q8_UNSIGNED 0

static inline int32_t sz_act(const int32_t* xq, int i) { return ((const int8_t*)xq)[i]; }

template <int R>
static void q8_tile(const uint8_t* w, int64_t nq, const int32_t* xk, int64_t S, int32_t* acc, bool first) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 16; ++c) {
            int32_t a = first ? 0 : acc[r * 16 + c];
            for (int64_t q = 0; q < nq; ++q)
                for (int i = 0; i < 4; ++i) a += sz_act(xk + q * S + r, i) * ((int32_t)w[q * 64 + c * 4 + i] - 128);
            acc[r * 16 + c] = a;
        }
}

template <int R>
static void q4_tile(const uint8_t* qb, const uint8_t* scb, const uint8_t* mnb, const float* ddb, const int32_t* xk,
                    const int32_t* xp, const float* sab, int64_t S, int ng, float* facc) {
    int32_t isb[R * 16], imn[R * 16];
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < 16; ++c) {
            int32_t is = 0, im = 0;
            for (int g = 0; g < ng; ++g) {
                int32_t t = 0, xs = 0;
                for (int k = 0; k < 32; ++k) {  // k < 16: low nibble of quad k / 4; k >= 16: high nibble
                    const int j = (k % 16) / 4, i = k % 4;
                    const uint8_t byte = qb[g * 256 + j * 64 + c * 4 + i];
                    const int32_t q = k < 16 ? (byte & 15) : (byte >> 4);
                    const int32_t x = sz_act(xk + (g * 8 + k / 4) * S + r, i);
                    t += x * q;
                    xs += x;
                }
                is += t * (int32_t)scb[g * 16 + c];
                im += (int32_t)mnb[(g / 2) * 32 + c * 2 + (g % 2)] * xs;
            }
            isb[r * 16 + c] = is;
            imn[r * 16 + c] = im;
        }
    (void)xp;
    q4_float_update<R>(isb, imn, ddb, sab, facc);
}
// q8b and q6 code of column c, input i of quad jq (0..7) of a group, as the code + BIAS.
struct Q8bQuads {
    static constexpr int SHIFT = 7;  // BIAS = 128
    const uint8_t* w;
    int32_t operator()(int jq, int c, int i) const { return w[jq * 64 + c * 4 + i]; }
};
struct Q6Quads {
    static constexpr int SHIFT = 5;  // BIAS = 32
    const uint8_t *ql, *qh;
    int32_t operator()(int jq, int c, int i) const {
        const uint8_t p = ql[(jq % 4) * 64 + c * 4 + i], hb = qh[(jq / 4) * 64 + c * 4 + i];
        return (jq < 4 ? p & 15 : p >> 4) | (((hb >> (2 * (jq % 4))) & 3) << 4);
    }
};

struct Q40Quads {
    static constexpr int SHIFT = 3;  // BIAS = 8
    const uint8_t* qs;
    int32_t operator()(int jq, int c, int i) const {
        const uint8_t p = qs[(jq % 4) * 64 + c * 4 + i];
        return jq < 4 ? p & 15 : p >> 4;
    }
};
// q50 (Q5_0): q40's nibble, and bit jq of qh's byte (c, i) as its fifth bit.
struct Q50Quads {
    static constexpr int SHIFT = 4;  // BIAS = 16
    const uint8_t *qs, *qh;
    int32_t operator()(int jq, int c, int i) const {
        const uint8_t p = qs[(jq % 4) * 64 + c * 4 + i];
        return (jq < 4 ? p & 15 : p >> 4) | (((qh[c * 4 + i] >> jq) & 1) << 4);
    }
};

// q8b / q6: one group of 32 inputs: t[r][h][16] = the exact sums of (u - BIAS) * x over half h for rows r.
template <int R, class Quads>
static inline void group_sums(Quads quads, const int32_t* xk, const int32_t* xh, int64_t S, int32_t* t) {
    for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h)
            for (int c = 0; c < 16; ++c) {
                int32_t a = 0;
                for (int jq = 4 * h; jq < 4 * h + 4; ++jq)
                    for (int i = 0; i < 4; ++i) a += sz_act(xk + jq * S + r, i) * (quads(jq, c, i) - (1 << Quads::SHIFT));
                t[(2 * r + h) * 16 + c] = a;
            }
    (void)xh;
}
#endif

// q8b's float step, shared by every path: facc [R][16] += ((float)t0 * a0 + (float)t1 * a1) * sag[r] for one
// group of 32 inputs (halves t0, t1 with their scales a0, a1 [16]; sag: the rows' activation scales).
template <int R>
static inline void q8b_float_update(const int32_t* t, const float* a, const float* sag, float* facc) {
    const V16 a0 = v_load(a), a1 = v_load(a + 16);
    for (int r = 0; r < R; ++r) {
        const V16 u = v_add(v_mul(v_cvt_i32(t + r * 32), a0), v_mul(v_cvt_i32(t + r * 32 + 16), a1));
        v_store(facc + r * 16, v_add(v_load(facc + r * 16), v_mul(u, v_set1(sag[r]))));
    }
}

// The float step of q40, q50 and q80, shared by every path: q8b's with both halves' scales the group's d (fp16
// [16], widened exactly), facc [R][16] += ((float)t0 * d + (float)t1 * d) * sag[r]: such a weight computes, bit
// for bit, what its q8b twin (the same codes, a = d for both halves) computes.
template <int R>
static inline void d16_float_update(const int32_t* t, const uint16_t* d, const float* sag, float* facc) {
    const V16 dv = v_load_f16(d);
    for (int r = 0; r < R; ++r) {
        const V16 u = v_add(v_mul(v_cvt_i32(t + r * 32), dv), v_mul(v_cvt_i32(t + r * 32 + 16), dv));
        v_store(facc + r * 16, v_add(v_load(facc + r * 16), v_mul(u, v_set1(sag[r]))));
    }
}

// q8bm's float step, shared by every path: q8b's with the group's offset term added before the activation
// scale, facc [R][16] += (((float)t0 * a0 + (float)t1 * a1) + (float)xs * m) * sag[r], where xs = xh0 + xh1 is
// the exact sum of the row's codes over the group (at most 32 * 127: exact in fp32) and m [16] the columns'
// offsets of the group (w = a * q + m).
template <int R>
static inline void q8bm_float_update(const int32_t* t, const float* a, const float* m, const int32_t* xh, int64_t S,
                                     const float* sag, float* facc) {
    const V16 a0 = v_load(a), a1 = v_load(a + 16), mv = v_load(m);
    for (int r = 0; r < R; ++r) {
        const V16 u = v_add(v_mul(v_cvt_i32(t + r * 32), a0), v_mul(v_cvt_i32(t + r * 32 + 16), a1));
        const V16 o = v_mul(v_set1((float)(xh[r] + xh[S + r])), mv);
        v_store(facc + r * 16, v_add(v_load(facc + r * 16), v_mul(v_add(u, o), v_set1(sag[r]))));
    }
}

// q8b: R rows x nq quads (whole groups of 32) of one strip. w: the codes at the first quad; a: the scales of
// its halves [nq / 4][16]; xk, xh, sag: activation words, half sums and group scales at (first quad, row).
template <int R>
static void q8b_tile(const uint8_t* w, const float* a, int64_t nq, const int32_t* xk, const int32_t* xh,
                     const float* sag, int64_t S, float* facc) {
    alignas(64) int32_t t[R * 32];
    for (int64_t g = 0; g < nq / 8; ++g) {
        group_sums<R>(Q8bQuads{w + g * 512}, xk + g * 8 * S, xh + g * 2 * S, S, t);
        q8b_float_update<R>(t, a + g * 32, sag + g * S, facc);
    }
}

// q8bm: q8b's codes and scales plus m, the offset of each group of 32 [nq / 8][16]; the integer sums are
// q8b's (the same group_sums), the float step q8bm_float_update.
template <int R>
static void q8bm_tile(const uint8_t* w, const float* a, const float* m, int64_t nq, const int32_t* xk,
                      const int32_t* xh, const float* sag, int64_t S, float* facc) {
    alignas(64) int32_t t[R * 32];
    for (int64_t g = 0; g < nq / 8; ++g) {
        group_sums<R>(Q8bQuads{w + g * 512}, xk + g * 8 * S, xh + g * 2 * S, S, t);
        q8bm_float_update<R>(t, a + g * 32, m + g * 16, xh + g * 2 * S, S, sag + g * S, facc);
    }
}


// q6: R rows x nq quads (whole groups of 32, from a super-block's first) of one strip. ql, qh: the codes of the
// first group (384 bytes a group); sc: the int8 sub-scales of its halves [nq / 4][16]; dd: the super-blocks'
// D [ceil(nq / 64)][16]; xk, xh, sag as for q8b. Each half's scales are a = D * (float)sc (exact: an fp16 D
// times an int8 is 19 bits), then the float step is q8b's: a q6 weight computes what its q8b twin (the same
// codes and scales) computes.
#if !defined(SZ_Q6_TILE)
template <int R>
static void q6_tile(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* dd, int64_t nq,
                    const int32_t* xk, const int32_t* xh, const float* sag, int64_t S, float* facc) {
    alignas(64) int32_t t[R * 32];
    alignas(64) float a[32];
    for (int64_t g = 0; g < nq / 8; ++g) {
        group_sums<R>(Q6Quads{ql + g * 256, qh + g * 128}, xk + g * 8 * S, xh + g * 2 * S, S, t);
        for (int i = 0; i < 32; ++i) a[i] = dd[(g / 8) * 16 + i % 16] * (float)sc[g * 32 + i];
        q8b_float_update<R>(t, a, sag + g * S, facc);
    }
}
#endif

template <>
inline Q40Quads quads_at<Q40Quads>(const uint8_t* qs, const uint8_t*, int64_t g) { return Q40Quads{qs + g * 256}; }
template <>
inline Q50Quads quads_at<Q50Quads>(const uint8_t* qs, const uint8_t* qh, int64_t g) {
    return Q50Quads{qs + g * 256, qh + g * 64};
}
template <>
inline Q8bQuads quads_at<Q8bQuads>(const uint8_t* w, const uint8_t*, int64_t g) { return Q8bQuads{w + g * 512}; }

// q40, q50, q80 (llama.cpp's Q4_0, Q5_0, Q8_0 in their own bits: one fp16 d per group of 32 of a column): R rows
// x nq quads (whole groups of 32) of one strip. qs, qh: the codes of the first group (quads_at; qh null but for
// q50); d: its groups' scales [nq / 8][16] fp16; xk, xh, sag as for q8b.
#if !defined(SZ_D16_TILE)
template <int R, class Quads>
static void d16_tile(const uint8_t* qs, const uint8_t* qh, const uint16_t* d, int64_t nq, const int32_t* xk,
                     const int32_t* xh, const float* sag, int64_t S, float* facc) {
    alignas(64) int32_t t[R * 32];
    for (int64_t g = 0; g < nq / 8; ++g) {
        group_sums<R>(quads_at<Quads>(qs, qh, g), xk + g * 8 * S, xh + g * 2 * S, S, t);
        d16_float_update<R>(t, d + g * 16, sag + g * S, facc);
    }
}
#endif

typedef void (*q8_tile_fn)(const uint8_t*, int64_t, const int32_t*, int64_t, int32_t*, bool);
typedef void (*q4_tile_fn)(const uint8_t*, const uint8_t*, const uint8_t*, const float*, const int32_t*,
                           const int32_t*, const float*, int64_t, int, float*);
typedef void (*q8b_tile_fn)(const uint8_t*, const float*, int64_t, const int32_t*, const int32_t*, const float*,
                            int64_t, float*);
typedef void (*q8bm_tile_fn)(const uint8_t*, const float*, const float*, int64_t, const int32_t*, const int32_t*,
                             const float*, int64_t, float*);
typedef void (*d16_tile_fn)(const uint8_t*, const uint8_t*, const uint16_t*, int64_t, const int32_t*, const int32_t*,
                            const float*, int64_t, float*);
typedef void (*q6_tile_fn)(const uint8_t*, const uint8_t*, const int8_t*, const float*, int64_t, const int32_t*,
                           const int32_t*, const float*, int64_t, float*);
template <int... Rs>
struct Tiles {
    static constexpr q8_tile_fn q8[sizeof...(Rs)] = {&q8_tile<Rs>...};
    static constexpr q4_tile_fn q4[sizeof...(Rs)] = {&q4_tile<Rs>...};
    static constexpr q8b_tile_fn q8b[sizeof...(Rs)] = {&q8b_tile<Rs>...};
    static constexpr q8bm_tile_fn q8bm[sizeof...(Rs)] = {&q8bm_tile<Rs>...};
    static constexpr q6_tile_fn q6[sizeof...(Rs)] = {&q6_tile<Rs>...};
    static constexpr d16_tile_fn q40[sizeof...(Rs)] = {&d16_tile<Rs, Q40Quads>...};
    static constexpr d16_tile_fn q50[sizeof...(Rs)] = {&d16_tile<Rs, Q50Quads>...};
    static constexpr d16_tile_fn q80[sizeof...(Rs)] = {&d16_tile<Rs, Q8bQuads>...};
};
#if SZ_TILE == 12
typedef Tiles<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12> TL;
#elif SZ_TILE == 5
typedef Tiles<1, 2, 3, 4, 5> TL;
#elif SZ_TILE == 4
typedef Tiles<1, 2, 3, 4> TL;
#endif
