// speczoo CPU linear kernels: y[S, N] = x[S, K] @ W[N, K]^T (+ bias), int8 activations quantized per
// block of 256 inputs of a row, int8 ("q8") or 4-bit ("q4") weights, int32 accumulation, fp32 scales
// applied in a fixed order.
//
// Batch invariance is the contract: every output element y[s, n] is computed by one thread with one
// fixed sequence of operations that depends only on row s of x and column n of W, never on S, on the
// row tiling, or on the number of threads. Integer sums are exact, so only the order of the fp32 steps
// matters, and that order is spelled out below and mirrored exactly by the PyTorch twins
// (speczoo/kernels/quantized.py) and by every instruction-set path (cpu_simd.h picks one at compile time,
// cpu_tiles.h holds each path's integer tiles). Compile with -ffp-contract=off: a fused multiply-add
// would round differently from the reference.
//
// Activations: row s, block b (inputs 256b .. 256b + 255): sa[b, s] = amax|x[s, block]| / 127,
// xq = round_half_even(x / sa) clamped to [-127, 127] (0 if sa == 0). The scale is the block's own, as
// llama.cpp's Q8_K has it: one outlier costs only its block the resolution (a row scale cost the whole row
// it), and a block is still row-local, so batch invariance holds. Stored quad-major so that one pointer
// plus constant offsets reaches every row of a tile:
//   xw i32 [KP/4, S]: word (kq, s) holds xq[s, 4kq .. 4kq+3];  xg i32 [KP/64, S]: word (p, s) holds the
//   int16 pair (sum of xq[s] over group 2p, over group 2p+1);  sa f32 [KB, S];  xsum i32 [KB, S]: the sum
//   of xq[s] over block b.
//
// Weight layouts (built by speczoo/kernels/pack.py; NB = ceil(N/16) strips of 16 output columns):
//   q8: w8 u8 [NB, KP/4, 16, 4] = q + 128 (q in [-127, 127]), KP = K rounded up to 32;
//       sw f32 [NB*16] per-column scale.
//       F = sum_b (float)(sum_{k in b} xq*q) * sa[b, s]      (b in order, from 0.0f)
//       y = F * sw[n]  (+ bias[n])
//   q4: groups of 32 along K, G = 2 * ceil(K / 64) of them (K rounded up to a pair of groups, not to a
//       super-block); super-blocks of 8 groups (KB = ceil(G / 8); the last may hold fewer, never 0 or an
//       odd number); w = D*sc_g*q - Dm*m_g, q in [0, 15]
//       qs u8 [NB, G groups, 4 j, 16 col, 4 i]: low nibble q[k = 32g + 4j + i], high nibble k + 16
//       sc u8 [NB, G, 16]; mn u8 [NB, G/2 pairs, 16 col, 2] (m of groups 2p, 2p+1)
//       dd f32 [NB, KB, 2, 16] (D then Dm)
//       F = sum_b ((float)(sum_g sc_g * sum_{k in g} xq*q) * D_b - (float)(sum_g m_g * sum_{k in g} xq) * Dm_b)
//           * sa[b, s]                                          (b in order, from 0.0f; g in b)
//       y = F  (+ bias[n])
//   q8b, q6: see q8b_strip and q6_strip (activation blocks of 32 inputs):
//       F = sum_g ((float)t_2g * a_2g + (float)t_2g+1 * a_2g+1) * sa[g, s]   (g in order, from 0.0f)
//       with t_j the exact sum of q * xq over inputs 16j .. 16j + 15 and a_j their weight scale; y = F (+ bias)
//   q8bm: q8b plus an offset m_g per group of 32 and column (w = a * q + m; llama.cpp's Q4_1 and Q5_1):
//       F = sum_g (((float)t_2g * a_2g + (float)t_2g+1 * a_2g+1) + (float)xs_g * m_g) * sa[g, s]
//       with xs_g the exact sum of xq[s] over the group (see q8bm_float_update)
//   q40: llama.cpp's Q4_0 in its own 4.5 bits a weight: qs u8 [NB, KP/32, 4, 16, 4] (q6's ql: low nibble
//       u of quad j, high nibble quad j + 4; q = u - 8), sd fp16 [NB, KP/32, 16] one scale d per group of 32:
//       q8b's F with a_2g = a_2g+1 = d_g, bit for bit its q8b twin's (see d16_float_update)
//   q50: llama.cpp's Q5_0 in its own 5.5 bits: q40's qs (the low 4 bits u) and qh u8 [NB, KP/32, 16, 4]: bit j
//       of byte (col, i) is the fifth bit of quad j's input i (q = u + 16 * bit - 16), sd as q40's; q40's F
//   q80: llama.cpp's Q8_0 in its own 8.5 bits: w8 as q8b's (q + 128), sd as q40's; q40's F
//   f32, f16, bf16: float weights and fp32 activations, not quantized: see cpu_float.h.

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <mutex>
#include <type_traits>
#include "cpu_kernels.h"
#if defined(_OPENMP)
#include <omp.h>
#define SZ_TEAM_SIZE() omp_get_num_threads()
#else
#define SZ_TEAM_SIZE() 1
#endif
#ifndef SZ_PF
#define SZ_PF 12  // q4: software prefetch distance in super-blocks (2 KiB of codes each), into L2
#endif
// Whether one-row tiles (and the q4 strip at S = 1) prefetch their weights in software (cpu_tiles.h, q4's and
// q6's prefetch groups): set per forward by sz_set_one_row_prefetch, outside any parallel region, from the
// model's cost profile, which times both on the machine at hand. It changes no bit of any result.
static bool sz_one_row_prefetch = false;
#include "cpu_tiles.h"
#include "cpu_float.h"
// q8: quads (4 inputs) per k-block, one activation block; one k-block of a strip stays in L1 across row tiles
#define SZ_KBLOCK (SZ_ABLOCK / 4)

SZ_API const char* sz_path(void) { return SZ_PATH_NAME; }
SZ_API int sz_abi_version(void) { return 16; }
SZ_API void sz_set_one_row_prefetch(int on) { sz_one_row_prefetch = on != 0; }
SZ_API int sz_get_one_row_prefetch(void) { return sz_one_row_prefetch ? 1 : 0; }
SZ_API int sz_openmp(void) {
#if defined(_OPENMP)
    return 1;
#else
    return 0;
#endif
}

// ---------------------------------------------------------------- activation quantization (per block)
// Row s, block b of AB inputs (AB = sz_ablock(format): inputs AB*b .. AB*b + AB - 1; the last block of a
// row may be shorter, the padding past K quantizes to zeros): sa[b, s] = amax / 127 over the block,
// xq = round_half_even(x / sa) in [-127, 127] (all zeros where sa == 0); xh[j, s] = the sum of xq over
// inputs 16j .. 16j + 15. KP, AB: multiples of 32; [k0, k1) is the block's part of [0, KP).
static void quantize_block(const float* x, int64_t K, int64_t k0, int64_t k1, int64_t S, int64_t s, int32_t* xw,
                           int32_t* xh, float* sa, int64_t b) {
    const int64_t kend = K < k1 ? K : k1;  // inputs read: [k0, kend)
#if defined(SZ_PATH_AVX512VNNI)
    __m512 vmax = _mm512_setzero_ps();
    for (int64_t k = k0; k < kend; k += 16) {
        const __mmask16 m = kend - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (kend - k)) - 1);
        vmax = _mm512_max_ps(vmax, _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + k)));
    }
    const float amax = _mm512_reduce_max_ps(vmax);
#else
    V16 vmax = v_zero();  // the max is exact, so the lane split cannot change it
    for (int64_t k = k0; k < kend; k += 16) vmax = v_max(vmax, v_abs(v_loadn(x + k, (int)(kend - k))));
    const float amax = v_max_lanes(vmax);
#endif
    const float scale = amax / 127.0f;
    sa[b * S + s] = scale;
    if (!(scale > 0.0f)) {  // an all-zero block (or one wholly past K) quantizes to zeros
        for (int64_t kq = k0 / 4; kq < k1 / 4; ++kq) xw[kq * S + s] = 0;
        for (int64_t j = k0 / 16; j < k1 / 16; ++j) xh[j * S + s] = 0;
        return;
    }
#if defined(SZ_PATH_AVX512VNNI)
    const __m512 vs = _mm512_set1_ps(scale);
    const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
    for (int64_t k = k0; k < k1; k += 16) {
        const __mmask16 m = k >= K ? 0 : (K - k >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (K - k)) - 1));
        // x / scale rounded half to even (MXCSR default), exactly like torch.round(x / sa)
        __m512i q = _mm512_cvtps_epi32(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + k), vs));
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        alignas(16) int32_t words[4];
        _mm_store_si128((__m128i*)words, _mm512_cvtepi32_epi8(q));
        for (int i = 0; i < 4; ++i) xw[(k / 4 + i) * S + s] = words[i];
        xh[(k / 16) * S + s] = _mm512_reduce_add_epi32(q);
    }
#else
    const V16 vs = v_set1(scale), lo = v_set1(-127.0f), hi = v_set1(127.0f);
    for (int64_t k = k0; k < k1; k += 16) {  // x / scale rounded half to even, clamped: integral floats
        float v[16];
        v_store(v, v_min(v_max(v_round(v_div(v_loadn(x + k, (int)(K - k)), vs)), lo), hi));
        for (int t = 0; t < 16; t += 4) {
            const int8_t q4[4] = {(int8_t)v[t], (int8_t)v[t + 1], (int8_t)v[t + 2], (int8_t)v[t + 3]};
            memcpy(&xw[((k + t) / 4) * S + s], q4, 4);
        }
        int32_t part = 0;
        for (int t = 0; t < 16; ++t) part += (int32_t)v[t];
        xh[(k / 16) * S + s] = part;
    }
#endif
}

// Row s of x: every block of its KP inputs (KP a multiple of 64), then from the 16-input sums xh the
// int16 pairs xg[p, s] = (sum over group 2p, sum over group 2p + 1) (groups of 32) and the block sums
// xsum[b, s]. A group's sum is at most 32 * 127 in size: an int16 holds it.
static void quantize_row(const float* x, int64_t K, int64_t KP, int64_t AB, int64_t S, int64_t s, int32_t* xw,
                         int32_t* xh, int32_t* xg, float* sa, int32_t* xsum) {
    for (int64_t k0 = 0; k0 < KP; k0 += AB)
        quantize_block(x, K, k0, KP < k0 + AB ? KP : k0 + AB, S, s, xw, xh, sa, k0 / AB);
    for (int64_t p = 0; p < KP / 64; ++p) {
        const int32_t* h = xh + 4 * p * S + s;
        const int16_t pair[2] = {(int16_t)(h[0] + h[S]), (int16_t)(h[2 * S] + h[3 * S])};
        memcpy(&xg[p * S + s], pair, 4);
    }
    for (int64_t k0 = 0; k0 < KP; k0 += AB) {
        int32_t total = 0;
        for (int64_t j = k0 / 16; j < (KP < k0 + AB ? KP : k0 + AB) / 16; ++j) total += xh[j * S + s];
        xsum[(k0 / AB) * S + s] = total;
    }
}

// Scratch for the quantized activations, grown on demand and never shrunk; one call at a time.
struct Scratch {
    int32_t* xw = nullptr;
    int32_t* xh = nullptr;
    int32_t* xg = nullptr;
    float* sa = nullptr;
    int32_t* xsum = nullptr;
    int64_t cap_w = 0, cap_h = 0, cap_g = 0, cap_sa = 0, cap_xsum = 0;
};
static Scratch g_scratch;
static std::mutex g_lock;
std::mutex& sz_lock() { return g_lock; }

template <typename T>
static bool grow(T** p, int64_t* cap, int64_t need) {
    if (need <= *cap) return true;
    free(*p);
    *p = (T*)aligned_alloc(64, ((need * (int64_t)sizeof(T) + 63) / 64) * 64);
    *cap = *p ? need : 0;
    return *p != nullptr;
}

// Grow the scratch for S rows of KP inputs (KP a multiple of 64; the padding quantizes to zeros), in
// activation blocks of any size down to 32.
int sz_reserve_scratch(int64_t S, int64_t KP) {
    Scratch& sc = g_scratch;
    const int64_t KB = KP / 32;  // the most activation blocks a row can have
    if (!grow(&sc.xw, &sc.cap_w, S * (KP / 4)) || !grow(&sc.xh, &sc.cap_h, S * (KP / 16)) ||
        !grow(&sc.xg, &sc.cap_g, S * (KP / 64)) || !grow(&sc.sa, &sc.cap_sa, S * KB) ||
        !grow(&sc.xsum, &sc.cap_xsum, S * KB))
        return -1;
    return 0;
}

// Inside a parallel region: quantize all rows in blocks of AB (work-shared; the loop's implicit barrier
// ends it). Static over the S rows: cpu_block.cpp's rows_omp relies on row s going to the thread that wrote it.
static void quantize_rows_omp(const float* x, int64_t S, int64_t K, int64_t ldx, int64_t KP, int64_t AB) {
    Scratch& sc = g_scratch;
#pragma omp for schedule(static)
    for (int64_t s = 0; s < S; ++s) quantize_row(x + s * ldx, K, KP, AB, S, s, sc.xw, sc.xh, sc.xg, sc.sa, sc.xsum);
}

static inline void store_cols(float* y, const float* v, int64_t ncols, bool accum) {  // accum: y += v (a residual)
    if (accum)
        for (int64_t c = 0; c < ncols; ++c) y[c] = y[c] + v[c];
    else
        for (int64_t c = 0; c < ncols; ++c) y[c] = v[c];
}

// ---------------------------------------------------------------- work split
// A linear's strips go out in chunks, each to whichever thread asks next, a chunk the remaining strips over
// the team's size, down to about 1 / SZ_CHUNKS of a thread's share (schedule(guided)): a thread slowed by
// another program on its core takes fewer of them, instead of holding the whole team at the barrier until
// it has done a fixed share, while a quiet team streams its weights in few long runs: each new chunk is a
// jump the hardware prefetchers must catch up with, which equal small chunks (dynamic) pay at every one
// (docs/results.md, "Guided chunks"). Which thread computes a strip never changes the strip's arithmetic (one
// thread, its own workspace, one fixed order), so the results stay bit-identical and batch-invariant.
#ifndef SZ_CHUNKS
#define SZ_CHUNKS 16
#endif
static inline int64_t strip_chunk(int64_t NB) {
    const int64_t n = NB / (SZ_CHUNKS * (int64_t)SZ_TEAM_SIZE());
    return n > 1 ? n : 1;
}

// ---------------------------------------------------------------- row tiles
// Rows are split into balanced tiles of at most SZ_TILE; the split changes which rows share registers,
// never the arithmetic of one row.
static inline int64_t row_tile(int64_t S) {
    const int64_t ntiles = (S + SZ_TILE - 1) / SZ_TILE;
    return (S + ntiles - 1) / ntiles;
}

// ---------------------------------------------------------------- strips (16 output columns, all S rows)
// ws: per-thread workspace of 48 * S 32-bit words. out: y + nb*16, row stride N, ncols valid columns.
// sa, xsum: the activation blocks' [KB, S] scales and code sums.
static void q8_strip(const uint8_t* w, int64_t KP, const int32_t* xw, int64_t S, const float* sa,
                     const int32_t* xsum, const float* sw, const float* bias, int32_t* ws, float* out, int64_t N,
                     int64_t ncols, bool accum) {
    int32_t* acc = ws;                    // [S][16]: one k-block's integer sums
    float* f = (float*)(ws + S * 16);     // [S][16]: sum over the k-blocks so far of (float)sum * sa
    for (int64_t i = 0; i < S * 16; ++i) f[i] = 0.0f;
    const int64_t tile = row_tile(S), KQ = KP / 4;
    for (int64_t q0 = 0; q0 < KQ; q0 += SZ_KBLOCK) {  // a k-block is one activation block (SZ_ABLOCK inputs)
        const int64_t nq = KQ - q0 < SZ_KBLOCK ? KQ - q0 : SZ_KBLOCK, b = q0 / SZ_KBLOCK;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            TL::q8[R - 1](w + q0 * 64, nq, xw + q0 * S + r0, S, acc + r0 * 16, true);
        }
        const float* sab = sa + b * S;
        const int32_t* xsb = xsum + b * S;
        for (int64_t r = 0; r < S; ++r)
            for (int c = 0; c < 16; ++c) {
                const int32_t a = SZ_Q8_UNSIGNED ? acc[r * 16 + c] - 128 * xsb[r] : acc[r * 16 + c];  // sum of q * x
                f[r * 16 + c] = f[r * 16 + c] + (float)a * sab[r];
            }
    }
    alignas(64) float v[16];
    for (int64_t r = 0; r < S; ++r) {
        for (int c = 0; c < 16; ++c) {
            v[c] = f[r * 16 + c] * sw[c];
            if (bias) v[c] = v[c] + bias[c];
        }
        store_cols(out + r * N, v, ncols, accum);
    }
}

static void q4_strip(const uint8_t* qs, const uint8_t* sc, const uint8_t* mn, const float* dd, int64_t G,
                     const int32_t* xw, const int32_t* xg, int64_t S, const float* sa, const float* bias,
                     int32_t* ws, float* out, int64_t N, int64_t ncols, bool accum) {
    float* facc = (float*)ws;  // [S][16]
    for (int64_t i = 0; i < S * 16; ++i) facc[i] = 0.0f;
    const int64_t KB = (G + 7) / 8;  // super-blocks; block b holds groups 8b .. min(8b + 8, G) - 1
    const int64_t tile = row_tile(S);
    for (int64_t b = 0; b < KB; ++b) {
        // prefetch SZ_PF super-blocks ahead (past the strip's end this runs into the next strip, which is
        // stored right after it; a prefetch past the array is harmless): the scales here, the codes a
        // group at a time inside the tile (q4_prefetch_group); one row as sz_one_row_prefetch says, as there
        const int64_t bp = b + SZ_PF;
        for (int l = 0; (S > 1 || sz_one_row_prefetch) && l < 128; l += 64) {
            SZ_PREFETCH(sc + bp * 128 + l);
            SZ_PREFETCH(mn + bp * 128 + l);
            SZ_PREFETCH(dd + bp * 32 + l / 4);
        }
        const int ng = (int)(G - 8 * b < 8 ? G - 8 * b : 8);
        for (int64_t r0 = 0; r0 < S; r0 += tile) {  // a super-block is one activation block
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            TL::q4[R - 1](qs + b * 2048, sc + b * 128, mn + b * 128, dd + b * 32, xw + b * 64 * S + r0,
                          xg + b * 4 * S + r0, sa + b * S + r0, S, ng, facc + r0 * 16);
        }
    }
    alignas(64) float f[16];
    for (int64_t r = 0; r < S; ++r) {
        for (int c = 0; c < 16; ++c) f[c] = bias ? facc[r * 16 + c] + bias[c] : facc[r * 16 + c];
        store_cols(out + r * N, f, ncols, accum);
    }
}

// q8b: w as q8 (codes + 128), a f32 [KP/16, 16] one scale per 16 inputs of a column; activation blocks
// of 32 (xh: their halves' sums, sa: [KP/32, S]). q8bm: m f32 [KP/32, 16], the offset of each group of 32
// of a column; null for q8b.
static void q8b_strip(const uint8_t* w, const float* a, const float* m, int64_t KP, const int32_t* xw,
                      const int32_t* xh, const float* sa, int64_t S, const float* bias, int32_t* ws, float* out,
                      int64_t N, int64_t ncols, bool accum) {
    float* facc = (float*)ws;  // [S][16]
    for (int64_t i = 0; i < S * 16; ++i) facc[i] = 0.0f;
    const int64_t tile = row_tile(S), KQ = KP / 4;
    for (int64_t q0 = 0; q0 < KQ; q0 += SZ_KBLOCK) {  // k-blocks of 256 inputs, each 8 activation blocks
        const int64_t nq = KQ - q0 < SZ_KBLOCK ? KQ - q0 : SZ_KBLOCK;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            if (m)
                TL::q8bm[R - 1](w + q0 * 64, a + (q0 / 4) * 16, m + (q0 / 8) * 16, nq, xw + q0 * S + r0,
                                xh + (q0 / 4) * S + r0, sa + (q0 / 8) * S + r0, S, facc + r0 * 16);
            else
                TL::q8b[R - 1](w + q0 * 64, a + (q0 / 4) * 16, nq, xw + q0 * S + r0, xh + (q0 / 4) * S + r0,
                               sa + (q0 / 8) * S + r0, S, facc + r0 * 16);
        }
    }
    alignas(64) float f[16];
    for (int64_t r = 0; r < S; ++r) {
        for (int c = 0; c < 16; ++c) f[c] = bias ? facc[r * 16 + c] + bias[c] : facc[r * 16 + c];
        store_cols(out + r * N, f, ncols, accum);
    }
}

// q40, q50, q80 (one fp16 d per group of 32): codes qs (ga bytes a group: 256, or q80's 512) and q50's qh (64
// bytes a group; null for the others), sd fp16 [KP/32, 16] of one strip; activation blocks of 32 as q8b's.
static void d16_strip(const d16_tile_fn* tiles, const uint8_t* qs, const uint8_t* qh, int64_t ga, const uint16_t* sd,
                      int64_t KP, const int32_t* xw, const int32_t* xh, const float* sa, int64_t S, const float* bias,
                      int32_t* ws, float* out, int64_t N, int64_t ncols, bool accum) {
    float* facc = (float*)ws;  // [S][16]
    for (int64_t i = 0; i < S * 16; ++i) facc[i] = 0.0f;
    const int64_t tile = row_tile(S), KQ = KP / 4;
    for (int64_t q0 = 0; q0 < KQ; q0 += SZ_KBLOCK) {  // k-blocks of 256 inputs (8 groups) stay in L1 across tiles
        const int64_t nq = KQ - q0 < SZ_KBLOCK ? KQ - q0 : SZ_KBLOCK, g0 = q0 / 8;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            tiles[R - 1](qs + g0 * ga, qh ? qh + g0 * 64 : nullptr, sd + g0 * 16, nq, xw + q0 * S + r0,
                         xh + (q0 / 4) * S + r0, sa + g0 * S + r0, S, facc + r0 * 16);
        }
    }
    alignas(64) float f[16];
    for (int64_t r = 0; r < S; ++r) {
        for (int c = 0; c < 16; ++c) f[c] = bias ? facc[r * 16 + c] + bias[c] : facc[r * 16 + c];
        store_cols(out + r * N, f, ncols, accum);
    }
}

// q6: ql u8 [NB, KP/32, 4, 16, 4] (nibbles, as q4's qs), qh u8 [NB, KP/32, 2, 16, 4] (the 2 high bits of
// quad 4h + m at bits 2m of half h's bytes), sc i8 [NB, KP/16, 16], dd f32 [NB, KB, 16]:
// w = D_b * sc_j * (u - 32), u in [0, 63]; the tiles make each half's scales a = D * sc themselves (q6_tile),
// from there it is q8b's arithmetic.
static void q6_strip(const uint8_t* ql, const uint8_t* qh, const int8_t* sc, const float* dd, int64_t KP,
                     const int32_t* xw, const int32_t* xh, const float* sa, int64_t S, const float* bias, int32_t* ws,
                     float* out, int64_t N, int64_t ncols, bool accum) {
    float* facc = (float*)ws;  // [S][16]
    for (int64_t i = 0; i < S * 16; ++i) facc[i] = 0.0f;
    const int64_t tile = row_tile(S), KQ = KP / 4;
    // super-blocks of 256 inputs, each in L1 across the row tiles; one tile takes the whole strip in one call
    const int64_t step = tile < S ? SZ_KBLOCK : KQ;
    for (int64_t q0 = 0; q0 < KQ; q0 += step) {
        const int64_t nq = KQ - q0 < step ? KQ - q0 : step, b = q0 / SZ_KBLOCK;
        for (int64_t r0 = 0; r0 < S; r0 += tile) {
            const int64_t R = (S - r0) < tile ? (S - r0) : tile;
            TL::q6[R - 1](ql + (q0 / 8) * 256, qh + (q0 / 8) * 128, sc + (q0 / 4) * 16, dd + b * 16, nq,
                          xw + q0 * S + r0, xh + (q0 / 4) * S + r0, sa + (q0 / 8) * S + r0, S, facc + r0 * 16);
        }
    }
    alignas(64) float f[16];
    for (int64_t r = 0; r < S; ++r) {
        for (int c = 0; c < 16; ++c) f[c] = bias ? facc[r * 16 + c] + bias[c] : facc[r * 16 + c];
        store_cols(out + r * N, f, ncols, accum);
    }
}

// ---------------------------------------------------------------- entry points
static inline int64_t q4_groups(int64_t K) { return 2 * ((K + 63) / 64); }  // pack.py q4_groups

static inline bool is_float(int64_t fmt) { return fmt == SZ_FMT_F32 || fmt == SZ_FMT_F16 || fmt == SZ_FMT_BF16; }

int64_t sz_linear_kpad(const SzLinear& w) {  // inputs per row the activation scratch must hold (floats: none)
    if (is_float(w.fmt)) return 0;
    return w.fmt == SZ_FMT_Q4 ? q4_groups(w.K) * 32 : ((((w.K + 31) / 32) * 32 + 63) / 64) * 64;
}

// Inside a parallel region: the strips of a float format (x read as it is: no quantization, no barrier
// before the strips; the work-shared loop's barrier ends it).
template <class E>
static void float_linear_omp(const SzLinear& w, const float* x, int64_t S, int64_t ldx, float* y, int64_t ldy,
                             bool accum) {
    const int64_t NB = (w.N + 15) / 16, KP = ((w.K + 15) / 16) * 16;
    const typename E::T* wt = (const typename E::T*)w.a;
#pragma omp for schedule(guided, strip_chunk(NB))
    for (int64_t nb = 0; nb < NB; ++nb) {
        const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
        float_strip<E>(wt + nb * 16 * KP, KP, w.K, x, ldx, S, w.bias ? w.bias + nb * 16 : nullptr, y + nb * 16, ldy,
                       ncols, accum);
    }
}

static inline bool is_d16(int64_t fmt) { return fmt == SZ_FMT_Q40 || fmt == SZ_FMT_Q50 || fmt == SZ_FMT_Q80; }

// Inputs per activation scale: a q4 super-block, a q8 k-block, and the q8b / q6 / q40 / q50 / q80 group of 32
// (llama.cpp's Q8_0 activations, for the Q8_0 / Q5_0 / Q4_0 weights; finer than the Q8_K it uses for Q6_K).
static inline int64_t sz_ablock(int64_t fmt) {
    return fmt == SZ_FMT_Q8B || fmt == SZ_FMT_Q8BM || fmt == SZ_FMT_Q6 || is_d16(fmt) ? 32 : SZ_ABLOCK;
}

// Inside a parallel region (every thread calls it): quantize x's rows (barrier), then the strips (barrier).
// ws: this thread's workspace of SZ_WS_WORDS * S words. y: row stride ldy; accum adds to what y holds.
void sz_linear_omp(const SzLinear& w, const float* x, int64_t S, int64_t ldx, float* y, int64_t ldy, bool accum,
                   int32_t* ws) {
    if (w.fmt == SZ_FMT_F32) return float_linear_omp<ElemF32>(w, x, S, ldx, y, ldy, accum);
    if (w.fmt == SZ_FMT_F16) return float_linear_omp<ElemF16>(w, x, S, ldx, y, ldy, accum);
    if (w.fmt == SZ_FMT_BF16) return float_linear_omp<ElemBf16>(w, x, S, ldx, y, ldy, accum);
    const Scratch& s = g_scratch;
    const int64_t NB = (w.N + 15) / 16;
    quantize_rows_omp(x, S, w.K, ldx, sz_linear_kpad(w), sz_ablock(w.fmt));
    if (w.fmt == SZ_FMT_Q4) {
        const int64_t G = q4_groups(w.K), KB = (G + 7) / 8;
#pragma omp for schedule(guided, strip_chunk(NB))
        for (int64_t nb = 0; nb < NB; ++nb) {
            const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
            q4_strip(w.a + nb * G * 256, w.b + nb * G * 16, w.c + nb * G * 16, w.d + nb * KB * 32, G, s.xw,
                     s.xg, S, s.sa, w.bias ? w.bias + nb * 16 : nullptr, ws, y + nb * 16, ldy, ncols, accum);
        }
    } else if (w.fmt == SZ_FMT_Q8) {
        const int64_t KP = ((w.K + 31) / 32) * 32;
#pragma omp for schedule(guided, strip_chunk(NB))
        for (int64_t nb = 0; nb < NB; ++nb) {
            const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
            q8_strip(w.a + nb * 16 * KP, KP, s.xw, S, s.sa, s.xsum, w.d + nb * 16, w.bias ? w.bias + nb * 16 : nullptr,
                     ws, y + nb * 16, ldy, ncols, accum);
        }
    } else if (w.fmt == SZ_FMT_Q6) {
        const int64_t KP = ((w.K + 31) / 32) * 32, KB = (KP + SZ_ABLOCK - 1) / SZ_ABLOCK;
#pragma omp for schedule(guided, strip_chunk(NB))
        for (int64_t nb = 0; nb < NB; ++nb) {
            const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
            q6_strip(w.a + nb * KP * 8, w.b + nb * KP * 4, (const int8_t*)w.c + nb * KP, w.d + nb * KB * 16, KP, s.xw,
                     s.xh, s.sa, S, w.bias ? w.bias + nb * 16 : nullptr, ws, y + nb * 16, ldy, ncols, accum);
        }
    } else if (is_d16(w.fmt)) {
        const int64_t KP = ((w.K + 31) / 32) * 32, G = KP / 32, ga = w.fmt == SZ_FMT_Q80 ? 512 : 256;
        const d16_tile_fn* tiles = w.fmt == SZ_FMT_Q40 ? TL::q40 : w.fmt == SZ_FMT_Q50 ? TL::q50 : TL::q80;
#pragma omp for schedule(guided, strip_chunk(NB))
        for (int64_t nb = 0; nb < NB; ++nb) {
            const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
            d16_strip(tiles, w.a + nb * G * ga, w.b ? w.b + nb * G * 64 : nullptr, ga,
                      (const uint16_t*)w.d + nb * G * 16, KP, s.xw, s.xh, s.sa, S, w.bias ? w.bias + nb * 16 : nullptr,
                      ws, y + nb * 16, ldy, ncols, accum);
        }
    } else {
        const int64_t KP = ((w.K + 31) / 32) * 32;
#pragma omp for schedule(guided, strip_chunk(NB))
        for (int64_t nb = 0; nb < NB; ++nb) {
            const int64_t ncols = (nb + 1) * 16 <= w.N ? 16 : w.N - nb * 16;
            const float* m = w.fmt == SZ_FMT_Q8BM ? (const float*)w.c + nb * (KP / 2) : nullptr;
            q8b_strip(w.a + nb * 16 * KP, w.d + nb * KP, m, KP, s.xw, s.xh, s.sa, S,
                      w.bias ? w.bias + nb * 16 : nullptr, ws, y + nb * 16, ldy, ncols, accum);
        }
    }
}

static int linear_call(const SzLinear& w, const float* x, int64_t S, int64_t ldx, float* y, int nthreads) {
    if (S <= 0 || w.N <= 0) return 0;
    std::lock_guard<std::mutex> guard(g_lock);
    if (sz_reserve_scratch(S, sz_linear_kpad(w)) != 0) return -1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)  // one fork/join per call: quantize, barrier, strips
    {
        int32_t* ws = (int32_t*)aligned_alloc(64, sizeof(int32_t) * SZ_WS_WORDS * S);
        if (!ws) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) sz_linear_omp(w, x, S, ldx, y, w.N, false, ws);
        free(ws);
    }
    return failed ? -1 : 0;
}

SZ_API int sz_q8_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8,
                            const float* sw, int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q8, N, K, w8, nullptr, nullptr, sw, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

SZ_API int sz_q8b_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const float* sb,
                         int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q8B, N, K, w8, nullptr, nullptr, sb, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// q8bm: w8 and sb as q8b's, mb f32 [NB, KP/32, 16] the offset of each group of 32 inputs of a column
SZ_API int sz_q8bm_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const float* sb,
                          const float* mb, int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q8BM, N, K, w8, nullptr, (const uint8_t*)mb, sb, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// q40: qs u8 [NB, KP/32, 4, 16, 4], sd fp16 [NB, KP/32, 16] (kernels/pack_q40.py)
SZ_API int sz_q40_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs, const uint16_t* sd,
                         int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q40, N, K, qs, nullptr, nullptr, (const float*)sd, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// q50: qs as q40's, qh u8 [NB, KP/32, 16, 4], sd as q40's (kernels/pack_q50.py)
SZ_API int sz_q50_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs, const uint8_t* qh,
                         const uint16_t* sd, int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q50, N, K, qs, qh, nullptr, (const float*)sd, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// q80: w8 as q8b's, sd as q40's (kernels/pack_q80.py)
SZ_API int sz_q80_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const uint16_t* sd,
                         int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q80, N, K, w8, nullptr, nullptr, (const float*)sd, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

SZ_API int sz_q6_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* ql, const uint8_t* qh,
                        const int8_t* sc, const float* dd, int64_t N, const float* bias, float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q6, N, K, ql, qh, (const uint8_t*)sc, dd, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// f32, f16, bf16: w [NB, 4, KP/16, 4, 16] of fp32, fp16 or bf16 (cpu_float.h, kernels/pack_float.py)
SZ_API int sz_float_linear(int64_t fmt, const float* x, int64_t S, int64_t K, int64_t ldx, const void* w, int64_t N,
                           const float* bias, float* y, int nthreads) {
    if (!is_float(fmt)) return -2;
    const SzLinear lw{fmt, N, K, (const uint8_t*)w, nullptr, nullptr, nullptr, bias};
    return linear_call(lw, x, S, ldx, y, nthreads);
}

SZ_API int sz_q4_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs,
                            const uint8_t* sc, const uint8_t* mn, const float* dd, int64_t N, const float* bias,
                            float* y, int nthreads) {
    const SzLinear w{SZ_FMT_Q4, N, K, qs, sc, mn, dd, bias};
    return linear_call(w, x, S, ldx, y, nthreads);
}

// ================================================================ attention (batch-invariant, fp32)
// out[i, h] = softmax(q[i, h] . K[keys_i]^T) @ V[keys_i] for each query row i and q-head h, where kv-head
// g = h / (H / Hkv) and keys_i is row i's ordered key list: the slot range [lo[i], hi[i]) followed by the
// extra slots idx[off[i] .. off[i+1]) (a token tree's own new slots). q arrives scaled and rotated.
// The arithmetic of one (row, head) depends only on q[i, h] and the sequence of its key/value vectors:
//   score_j = lane tree of (fma chain over the Dh/16 chunks, in order) -- the same tree for every key;
//   m = max_j score_j (exact); p_j = exp(score_j - m) (own polynomial);
//   l = fixed tree over 16 lane sums, lane t summing p_j for j = t mod 16 in key order;
//   out[d] = (sum_j p_j * v_j[d], one fma chain in key order) / l.
// One thread computes one (kv-head, row) pair for all q-heads of the group, so neither S, the other rows
// nor the thread count can change a result. K/V: [Hkv, C, Dh] per layer (cache.py), fp32 or fp16: an fp16
// element is widened to fp32 exactly as it is loaded (v_load_f16: the same lanes on every path), so the
// arithmetic above is the fp32 one over the stored values, whatever the storage.

// A cache element type: loadn(p, n) = its first min(n, 16) values as fp32 lanes, zero past n.
struct KvF32 {
    typedef float T;
    static V16 loadn(const float* p, int n) { return v_loadn(p, n); }
};
struct KvF16 {
    typedef uint16_t T;
    static V16 loadn(const uint16_t* p, int n) {
        if (n >= 16) return v_load_f16(p);
        uint16_t t[16] = {0};  // fp16 +0.0
        memcpy(t, p, sizeof(uint16_t) * (n > 0 ? n : 0));
        return v_load_f16(t);
    }
};

#if defined(SZ_FLOAT_256)
// 8 values of a cache element type as fp32 lanes: half of a V16 chunk (exact, as E::loadn).
static inline __m256 kv_load8(const float* p) { return _mm256_loadu_ps(p); }
static inline __m256 kv_load8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }

// s1[h][t] for HB heads (q rows qh[h * Dh]) and the 8 keys kp[t] (Dh % 16 == 0): the first level of v_sum_tree
// over the score's fma chain, lanes 0-7 of the chain plus its lanes 8-15. Those two halves never meet before
// that level, so each runs alone: 8 / HB keys x HB heads of 8-lane accumulators (8 ymm) over the chunks in
// order, the first half then the second, and each 8 values of a key converted once for the HB heads.
template <class T, int HB>
static inline void attend_tile8(const float* qh, const T* const* kp, int64_t Dh, __m256 (*s1)[8]) {
    constexpr int KT = 8 / HB;
    const int64_t nc = Dh / 16;
    for (int t0 = 0; t0 < 8; t0 += KT)
        for (int half = 0; half < 2; ++half) {
            __m256 acc[KT][HB];
            for (int t = 0; t < KT; ++t)
                for (int h = 0; h < HB; ++h) acc[t][h] = _mm256_setzero_ps();
            for (int64_t c = 0; c < nc; ++c) {
                const int64_t o = 16 * c + 8 * half;
                __m256 qv[HB];
#pragma GCC unroll 4
                for (int h = 0; h < HB; ++h) qv[h] = _mm256_loadu_ps(qh + h * Dh + o);
#pragma GCC unroll 8
                for (int t = 0; t < KT; ++t) {
                    const __m256 k = kv_load8(kp[t0 + t] + o);
#pragma GCC unroll 4
                    for (int h = 0; h < HB; ++h) acc[t][h] = _mm256_fmadd_ps(qv[h], k, acc[t][h]);
                }
            }
            for (int t = 0; t < KT; ++t)
                for (int h = 0; h < HB; ++h)
                    s1[h][t0 + t] = half ? _mm256_add_ps(s1[h][t0 + t], acc[t][h]) : acc[t][h];
        }
}
#endif

#if defined(SZ_PATH_AVX512VNNI)
#define SZ_KTILE_DH 256  // the widest head whose 16 widened keys (16 KB) a tile keeps on the stack

// One head's scores of 16 keys: per key one fma chain over the nc chunks in order (key(t, c): key t's chunk
// c as fp32 lanes), then v_sum_tree's levels for the 16 at once (lane_sums16).
template <class Key>
static inline __m512 scores16(const float* q, int64_t nc, Key key) {
    __m512 acc[16];
    for (int t = 0; t < 16; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nc; ++c) {
        const __m512 qv = _mm512_loadu_ps(q + 16 * c);
#pragma GCC unroll 16
        for (int t = 0; t < 16; ++t) acc[t] = _mm512_fmadd_ps(qv, key(t, c), acc[t]);
    }
    return lane_sums16(acc);
}
#endif

// scores[h][j] = q_h . k_j for the G heads and n keys: per key, one fma chain over the 16-lane chunks of
// Dh in order (a last partial chunk zero-filled), then v_sum_tree. KeepKeys: the keys are likely in cache
// (see attend_omp), so widening them once for all heads pays; it never changes a bit.
template <class E, bool KeepKeys>
static void attend_scores(const float* qh, const typename E::T* kh, int64_t Dh, int64_t G, const int32_t* slots,
                          int64_t n, float* scores, int64_t n16) {
    const int64_t nc = (Dh + 15) / 16;
    int64_t j = 0;  // keys before j are scored by a SIMD tile
#if defined(SZ_PATH_AVX512VNNI)
    if (Dh % 16 == 0) {
        // KeepKeys: fp16 keys are widened once per tile, by the first head as it reads them, and kept in kt
        // (chunk-major: kt[c][t][16]) for the other heads; with keys in cache the widening, not the fma,
        // bound the scores when each of the G heads widened its own copy. A row streaming its keys from
        // memory is slower for the stores, so it widens per head. The values are E::loadn's: the same bits.
        constexpr bool widen = KeepKeys && std::is_same<E, KvF16>::value;
        alignas(64) float kt[widen ? 16 * SZ_KTILE_DH : 16];
        const bool tiled = widen && Dh <= SZ_KTILE_DH;
        for (int64_t j0 = 0; j0 < n; j0 += 16) {
            const typename E::T* kp[16];
            for (int t = 0; t < 16; ++t) kp[t] = kh + (int64_t)slots[j0 + t < n ? j0 + t : j0] * Dh;
            const auto widened = [&](int t, int64_t c) { return E::loadn(kp[t] + 16 * c, 16).v; };
            const auto kept = [&](int t, int64_t c) {  // widened, and kept for the heads after the first
                const __m512 k = widened(t, c);
                _mm512_store_ps(kt + (16 * c + t) * 16, k);
                return k;
            };
            const auto stored = [&](int t, int64_t c) { return _mm512_load_ps(kt + (16 * c + t) * 16); };
            for (int64_t h = 0; h < G; ++h) {
                const float* q = qh + h * Dh;
                const __m512 s = !tiled ? scores16(q, nc, widened) : h == 0 ? scores16(q, nc, kept)
                                                                             : scores16(q, nc, stored);
                _mm512_storeu_ps(scores + h * n16 + j0, s);
            }
        }
        return;
    }
#elif defined(SZ_FLOAT_256)
    if (Dh % 16 == 0)  // whole tiles of 8 keys, heads in blocks of 4, 2, 1; the last n % 8 keys below
        for (; j + 8 <= n; j += 8) {
            const typename E::T* kp[8];
            for (int t = 0; t < 8; ++t) kp[t] = kh + (int64_t)slots[j + t] * Dh;
            __m256 s1[4][8];
            for (int64_t h0 = 0; h0 < G;) {
                const int hb = G - h0 >= 4 ? 4 : G - h0 >= 2 ? 2 : 1;
                if (hb == 4)
                    attend_tile8<typename E::T, 4>(qh + h0 * Dh, kp, Dh, s1);
                else if (hb == 2)
                    attend_tile8<typename E::T, 2>(qh + h0 * Dh, kp, Dh, s1);
                else
                    attend_tile8<typename E::T, 1>(qh + h0 * Dh, kp, Dh, s1);
                for (int h = 0; h < hb; ++h) _mm256_storeu_ps(scores + (h0 + h) * n16 + j, lane_sums8(s1[h]));
                h0 += hb;
            }
        }
#endif
    for (; j < n; ++j) {
        const typename E::T* k = kh + (int64_t)slots[j] * Dh;
        for (int64_t h = 0; h < G; ++h) {
            const float* q = qh + h * Dh;
            V16 acc = v_zero();
            for (int64_t c = 0; c < nc; ++c) {
                const int rem = (int)(Dh - 16 * c);
                acc = v_fma(v_loadn(q + 16 * c, rem), E::loadn(k + 16 * c, rem), acc);
            }
            scores[h * n16 + j] = v_sum_tree(acc);
        }
    }
}

// The softmax-weighted values of HB heads: oh[h][:] = sum_j p[h][j] * v_j / lsum[h], per 16-lane chunk of Dh one
// fma chain over the keys in order (the same operations for any HB: a head's bits never depend on its block).
// HB is a constant so that the HB accumulators stay in registers (a runtime count left them on the stack,
// a load and a store around every fma); each loaded value vector serves the HB heads.
#if defined(SZ_FLOAT_256)
#define SZ_VHEADS 6  // 6 accumulators of 2 ymm, the value's 2 and a broadcast: 15 of the 16 registers
#else
#define SZ_VHEADS 8
#endif
template <class E, int HB>
static void attend_values(const typename E::T* vh, int64_t Dh, const int32_t* slots, int64_t n, const float* p,
                          int64_t n16, const float* lsum, float* oh) {
    const int64_t nc = (Dh + 15) / 16;
    for (int64_t c = 0; c < nc; ++c) {
        const int rem = (int)(Dh - 16 * c);
        V16 acc[HB];
        for (int h = 0; h < HB; ++h) acc[h] = v_zero();
        for (int64_t j = 0; j < n; ++j) {
            const V16 v = E::loadn(vh + (int64_t)slots[j] * Dh + 16 * c, rem);
#pragma GCC unroll 8
            for (int h = 0; h < HB; ++h) acc[h] = v_fma(v_set1(p[h * n16 + j]), v, acc[h]);
        }
        for (int h = 0; h < HB; ++h) v_storen(oh + h * Dh + 16 * c, v_div(acc[h], v_set1(lsum[h])), rem);
    }
}

// attend_values for 1 .. SZ_VHEADS heads, by the head count less one.
template <class E, int... Hs>
struct ValueBlocksOf {
    typedef void (*fn)(const typename E::T*, int64_t, const int32_t*, int64_t, const float*, int64_t, const float*,
                       float*);
    static constexpr fn by_heads[sizeof...(Hs)] = {&attend_values<E, Hs>...};
};
#if SZ_VHEADS == 8
template <class E>
using ValueBlocks = ValueBlocksOf<E, 1, 2, 3, 4, 5, 6, 7, 8>;
#else
template <class E>
using ValueBlocks = ValueBlocksOf<E, 1, 2, 3, 4, 5, 6>;
#endif

#if defined(SZ_PATH_AVX512VNNI)
#define SZ_VACC 128  // the most (head, chunk) accumulators values_by_key_blocks keeps (8 KB on the stack)
#define SZ_VKEYS 64  // keys a block: their values (16 KB at Dh 128) stay in L1 while every head reads them

// Keys j0 .. j1 of heads h0 .. h0 + HB and chunks c0 .. c0 + CB: acc[c][h] (accs[h][c] between blocks) +=
// p[h][j] * v_j[c], key by key in order, each chunk of a value widened once for the HB heads.
template <class E, int HB, int CB>
static inline void values_tile(const typename E::T* vh, int64_t Dh, const int32_t* slots, int64_t j0, int64_t j1,
                               const float* p, int64_t n16, int64_t nc, int64_t h0, int64_t c0, __m512* accs) {
    __m512 acc[CB][HB];
    for (int c = 0; c < CB; ++c)
        for (int h = 0; h < HB; ++h) acc[c][h] = accs[(h0 + h) * nc + c0 + c];
    for (int64_t j = j0; j < j1; ++j) {
        const typename E::T* v = vh + (int64_t)slots[j] * Dh + 16 * c0;
        __m512 vv[CB];
#pragma GCC unroll 4
        for (int c = 0; c < CB; ++c) vv[c] = E::loadn(v + 16 * c, 16).v;
#pragma GCC unroll 8
        for (int h = 0; h < HB; ++h) {
            const __m512 ph = _mm512_set1_ps(p[(h0 + h) * n16 + j]);
#pragma GCC unroll 4
            for (int c = 0; c < CB; ++c) acc[c][h] = _mm512_fmadd_ps(ph, vv[c], acc[c][h]);
        }
    }
    for (int c = 0; c < CB; ++c)
        for (int h = 0; h < HB; ++h) accs[(h0 + h) * nc + c0 + c] = acc[c][h];
}

template <class E, int HB>
static inline void values_heads(const typename E::T* vh, int64_t Dh, const int32_t* slots, int64_t j0, int64_t j1,
                                const float* p, int64_t n16, int64_t nc, int64_t h0, __m512* accs) {
    int64_t c0 = 0;
    for (; c0 + 4 <= nc; c0 += 4) values_tile<E, HB, 4>(vh, Dh, slots, j0, j1, p, n16, nc, h0, c0, accs);
    for (; c0 < nc; ++c0) values_tile<E, HB, 1>(vh, Dh, slots, j0, j1, p, n16, nc, h0, c0, accs);
}

// attend_values' sums for all G heads with the keys in blocks of SZ_VKEYS (a value read from memory once,
// not once per 16-lane chunk: the chunk-by-chunk passes strided over the values), each (head, chunk)
// accumulator the same fma chain over the keys in order, divided by lsum at the end: the same bits.
template <class E>
static void values_by_key_blocks(const typename E::T* vh, int64_t Dh, int64_t G, const int32_t* slots, int64_t n,
                                 const float* p, int64_t n16, const float* lsum, float* oh) {
    const int64_t nc = Dh / 16;
    __m512 accs[SZ_VACC];
    for (int64_t i = 0; i < G * nc; ++i) accs[i] = _mm512_setzero_ps();
    for (int64_t j0 = 0; j0 < n; j0 += SZ_VKEYS) {
        const int64_t j1 = j0 + SZ_VKEYS < n ? j0 + SZ_VKEYS : n;
        int64_t h0 = 0;
        for (; h0 + 4 <= G; h0 += 4) values_heads<E, 4>(vh, Dh, slots, j0, j1, p, n16, nc, h0, accs);
        switch (G - h0) {
            case 3: values_heads<E, 3>(vh, Dh, slots, j0, j1, p, n16, nc, h0, accs); break;
            case 2: values_heads<E, 2>(vh, Dh, slots, j0, j1, p, n16, nc, h0, accs); break;
            case 1: values_heads<E, 1>(vh, Dh, slots, j0, j1, p, n16, nc, h0, accs); break;
            default: break;
        }
    }
    for (int64_t h = 0; h < G; ++h)
        for (int64_t c = 0; c < nc; ++c)
            _mm512_storeu_ps(oh + h * Dh + 16 * c, _mm512_div_ps(accs[h * nc + c], _mm512_set1_ps(lsum[h])));
}
#endif

// One (kv-head, row): G q-heads qh[G][Dh] -> oh[G][Dh]. slots[n]; scores: scratch [G][n16] then lsum [G].
// softcap > 0: each score s becomes softcap * tanh(s / softcap) before the softmax (v_softcap).
template <class E, bool KeepKeys>
static void attend_task(const float* qh, const typename E::T* kh, const typename E::T* vh, int64_t Dh, int64_t G,
                        const int32_t* slots, int64_t n, float* scores, int64_t n16, float* oh, float softcap) {
    attend_scores<E, KeepKeys>(qh, kh, Dh, G, slots, n, scores, n16);
    if (softcap > 0.0f) {
        const V16 cap = v_set1(softcap);
        for (int64_t h = 0; h < G; ++h)
            for (int64_t j0 = 0; j0 < n; j0 += 16) {
                const int cnt = (int)(n - j0);
                v_storen(scores + h * n16 + j0, v_softcap(v_loadn(scores + h * n16 + j0, cnt), cap), cnt);
            }
    }
    float* lsum = scores + G * n16;
    for (int64_t h = 0; h < G; ++h) {  // softmax numerators in place, and their sum
        float* sh = scores + h * n16;
        V16 vm = v_set1(-INFINITY);  // the max is exact, so any order gives the same m
        int64_t j0 = 0;
        for (; j0 + 16 <= n; j0 += 16) vm = v_max(vm, v_load(sh + j0));
        float mx = v_max_lanes(vm);
        for (; j0 < n; ++j0) mx = sh[j0] > mx ? sh[j0] : mx;
        const V16 m = v_set1(mx);
        V16 ls = v_zero();
        for (j0 = 0; j0 < n; j0 += 16) {  // lane t sums p_j for j = t mod 16, in key order
            const int cnt = (int)(n - j0);
            const V16 p = v_keep(v_exp_neg(v_sub(v_loadn(sh + j0, cnt), m)), cnt);
            v_storen(sh + j0, p, cnt);
            ls = v_add(ls, p);
        }
        lsum[h] = v_sum_tree(ls);
    }
#if defined(SZ_PATH_AVX512VNNI)
    if (Dh % 16 == 0 && G * (Dh / 16) <= SZ_VACC) {
        values_by_key_blocks<E>(vh, Dh, G, slots, n, scores, n16, lsum, oh);
        return;
    }
#endif
    for (int64_t h0 = 0; h0 < G;) {  // up to SZ_VHEADS heads share each loaded value vector
        const int hb = (int)(G - h0 < SZ_VHEADS ? G - h0 : SZ_VHEADS);
        ValueBlocks<E>::by_heads[hb - 1](vh, Dh, slots, n, scores + h0 * n16, n16, lsum + h0, oh + h0 * Dh);
        h0 += hb;
    }
}

// Checks a key plan; returns the longest row's key count (> 0), or -2 on an invalid slot or an empty row.
int64_t sz_attend_plan(int64_t S, int64_t H, int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi,
                       const int64_t* off, const int64_t* idx) {
    if (Hkv <= 0 || H % Hkv != 0) return -2;
    int64_t nmax = 0;
    for (int64_t i = 0; i < S; ++i) {
        if (lo[i] < 0 || hi[i] < lo[i] || hi[i] > C || off[i + 1] < off[i]) return -2;
        for (int64_t t = off[i]; t < off[i + 1]; ++t)
            if (idx[t] < 0 || idx[t] >= C) return -2;
        const int64_t n = (hi[i] - lo[i]) + (off[i + 1] - off[i]);
        if (n == 0) return -2;
        nmax = n > nmax ? n : nmax;
    }
    return nmax;
}

int64_t sz_attend_slots_len(int64_t nmax) { return ((nmax + 15) / 16) * 16; }
int64_t sz_attend_scores_len(int64_t nmax, int64_t G) {
    return (((sz_attend_slots_len(nmax) + 1) * G * (int64_t)sizeof(float) + 63) / 64) * 64 / (int64_t)sizeof(float);
}

// Inside a parallel region: every (kv-head, row) task, work-shared; ends with the loop's barrier.
// slots, scores: this thread's scratch of sz_attend_slots_len / sz_attend_scores_len(nmax, G) entries.
template <class E>
static void attend_omp(const float* q, int64_t S, int64_t H, int64_t Dh, const typename E::T* kc,
                       const typename E::T* vc, int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi,
                       const int64_t* off, const int64_t* idx, int64_t nmax, float softcap, float* out,
                       int32_t* slots, float* scores) {
    const int64_t G = H / Hkv, n16 = sz_attend_slots_len(nmax);
    const bool keep_keys = S > 1;  // a verify's rows share their keys, which the first row brings into cache
#pragma omp for schedule(static)
    for (int64_t task = 0; task < Hkv * S; ++task) {  // kv-head outermost: its K/V stay in cache
        const int64_t g = task / S, i = task % S;
        int64_t n = 0;
        for (int64_t s = lo[i]; s < hi[i]; ++s) slots[n++] = (int32_t)s;
        for (int64_t t = off[i]; t < off[i + 1]; ++t) slots[n++] = (int32_t)idx[t];
        const auto task_of = keep_keys ? &attend_task<E, true> : &attend_task<E, false>;
        task_of(q + (i * H + g * G) * Dh, kc + g * C * Dh, vc + g * C * Dh, Dh, G, slots, n, scores, n16,
                out + (i * H + g * G) * Dh, softcap);
    }
}

void sz_attend_omp(const float* q, int64_t S, int64_t H, int64_t Dh, const void* kc, const void* vc, int64_t kvfmt,
                   int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi, const int64_t* off,
                   const int64_t* idx, int64_t nmax, float softcap, float* out, int32_t* slots, float* scores) {
    if (kvfmt == SZ_FMT_F16)
        attend_omp<KvF16>(q, S, H, Dh, (const uint16_t*)kc, (const uint16_t*)vc, Hkv, C, lo, hi, off, idx, nmax,
                          softcap, out, slots, scores);
    else
        attend_omp<KvF32>(q, S, H, Dh, (const float*)kc, (const float*)vc, Hkv, C, lo, hi, off, idx, nmax, softcap,
                          out, slots, scores);
}

// fp32 -> fp16, rounded to nearest even as IEEE 754 (and torch's Tensor.half()) round it: overflow to
// infinity, subnormals rounded like the rest, a NaN kept a quiet NaN of its sign. Integer and exact
// float steps only (a multiplication by 2^24 and nearbyintf under the default rounding mode), the same on
// every path: it writes the fp16 KV cache (cpu_block.cpp) and must equal the cache writes PyTorch makes.
uint16_t sz_f16_from_f32(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax > 0x7F800000u) return sign | 0x7E00u;            // NaN
    if (ax >= 0x477FF000u) return sign | 0x7C00u;           // >= 65520 (or inf): rounds to infinity
    if (ax < 0x38800000u)                                    // below 2^-14: a subnormal (or zero, or 2^-14)
        return sign | (uint16_t)nearbyintf(fabsf(f) * 16777216.0f);  // m * 2^-24, m in [0, 1024]
    ax += 0xC8000FFFu + ((ax >> 13) & 1u);                   // rebias 127 -> 15, round half to even
    return sign | (uint16_t)(ax >> 13);
}

// q, out: [S, H, Dh]; kc, vc: [Hkv, C, Dh] of fp32 (kvfmt SZ_FMT_F32) or fp16 (SZ_FMT_F16); lo, hi: [S]; off: [S + 1]; idx: [off[S]] (all int64);
// softcap: 0, or the attention logit soft-cap (see attend_task).
// Returns 0, -1 when scratch could not be allocated, -2 on an invalid slot or an empty row or format.
SZ_API int sz_attend(const float* q, int64_t S, int64_t H, int64_t Dh, const void* kc, const void* vc,
                         int64_t kvfmt, int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi, const int64_t* off,
                         const int64_t* idx, float softcap, float* out, int nthreads) {
    if (kvfmt != SZ_FMT_F32 && kvfmt != SZ_FMT_F16) return -2;
    if (S <= 0) return 0;
    const int64_t nmax = sz_attend_plan(S, H, Hkv, C, lo, hi, off, idx);
    if (nmax < 0) return (int)nmax;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        int32_t* slots = (int32_t*)aligned_alloc(64, sizeof(int32_t) * sz_attend_slots_len(nmax));
        float* scores = (float*)aligned_alloc(64, sizeof(float) * sz_attend_scores_len(nmax, H / Hkv));
        if (!slots || !scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) sz_attend_omp(q, S, H, Dh, kc, vc, kvfmt, Hkv, C, lo, hi, off, idx, nmax, softcap, out, slots, scores);
        free(slots);
        free(scores);
    }
    return failed ? -1 : 0;
}

// y[i] = x[i] rounded to fp16 (sz_f16_from_f32), i < n: how the compiled blocks write an fp16 KV cache.
SZ_API void sz_f32_to_f16(const float* x, int64_t n, uint16_t* y) {
    for (int64_t i = 0; i < n; ++i) y[i] = sz_f16_from_f32(x[i]);
}
