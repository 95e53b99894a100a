// Float linear strips: weights stored as fp32, fp16 or bf16 (formats "f32", "f16", "bf16": a GGUF's F32,
// F16 and BF16 tensors held bit for bit), activations fp32 and never quantized.
//
// Layout (kernels/pack_float.py): w [NB, 4, KP/16, 4, 16] of the element type, NB = ceil(N / 16) strips of 16
// output columns, KP = K rounded up to 16: strip b, column group g, chunk c, column j, input i holds
// w[16b + 4g + j, 16c + i], so each group of 4 columns streams front to back; zero padding past N and K.
// Arithmetic: every output is one dot product in one fixed order, on V16 (cpu_simd.h):
//   acc = 0 (16 lanes); for c = 0 .. KP/16 - 1, in order: acc = fma(x[s, 16c .. 16c+15], w[n, 16c .. 16c+15], acc)
//   (lane j sums inputs k = j mod 16; x past K reads as 0, w there is 0);  y[s, n] = v_sum_tree(acc) (+ bias[n])
// The element conversion is exact, so the products are the same on every path; the fma chain and the tree
// are the same lane-wise IEEE operations. Tiles of R rows x C columns only choose which (row, column)
// chains share registers, never a chain's order: the result is bit-identical on every path and
// batch-invariant (it depends on row s of x and column n of w alone). This file must never round or
// quantize x, nor let R, C, S or the thread count reach an output's arithmetic.
#pragma once
#include <stdint.h>
#include "cpu_simd.h"

struct ElemF32 {
    typedef float T;
    static V16 load(const float* p) { return v_load(p); }
};
struct ElemF16 {
    typedef uint16_t T;
    static V16 load(const uint16_t* p) { return v_load_f16(p); }
};
struct ElemBf16 {
    typedef uint16_t T;
    static V16 load(const uint16_t* p) { return v_load_bf16(p); }
};

// Register tiles: up to SZ_FR rows x SZ_FC columns when S > 1, one row x SZ_FR * SZ_FC columns when S = 1
// (the same accumulators, enough independent fma chains to hide the latency). SZ_FR * SZ_FC divides 16.
#if defined(SZ_FLOAT_512)
#define SZ_FR 4
#define SZ_FC 4  // 16 zmm accumulators (summed by one v_sum_tree16) + 4 x + w
#elif defined(SZ_FLOAT_256)
#define SZ_FR 2
#define SZ_FC 2  // 4 V16 = 8 ymm accumulators + 4 x + 2 w of the 16 ymm
#elif defined(SZ_FLOAT_NEON)
#define SZ_FR 2
#define SZ_FC 2  // 16 q accumulators + 8 x + 4 w of the 32 q
#else
#define SZ_FR 1
#define SZ_FC 1
#endif
static_assert(SZ_FR >= 1 && SZ_FR <= 4 && 16 % (SZ_FR * SZ_FC) == 0, "float_strip tiles whole strips");

// Column n of a strip (n < 16), at its chunk 0: group n / 4 (4 KP elements each), place n % 4 in the chunk.
template <class T>
static inline const T* strip_col(const T* w, int64_t KP, int64_t n) { return w + (n >> 2) * 4 * KP + (n & 3) * 16; }

// out[r * C + j] = the dot product of row r of x (stride ldx, K inputs) with column j0 + j of the strip w
// (chunk c of a column 64 elements after chunk c - 1).
template <class E, int R, int C>
static inline void float_tile(const typename E::T* w, int64_t j0, int64_t KP, const float* x, int64_t ldx, int64_t K,
                              float* out) {
    const typename E::T* wc[C];
    for (int j = 0; j < C; ++j) wc[j] = strip_col(w, KP, j0 + j);
    V16 acc[R][C];
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j) acc[r][j] = v_zero();
    const int64_t full = K / 16;
    for (int64_t c = 0; c < full; ++c) {
        V16 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = v_load(x + r * ldx + 16 * c);
        for (int j = 0; j < C; ++j) {
            const V16 wv = E::load(wc[j] + 64 * c);
            for (int r = 0; r < R; ++r) acc[r][j] = v_fma(xv[r], wv, acc[r][j]);
        }
    }
    if (full * 16 < KP) {  // the last, partial chunk: x zero-filled past K
        const int rem = (int)(K - full * 16);
        V16 xv[R];
        for (int r = 0; r < R; ++r) xv[r] = v_loadn(x + r * ldx + 16 * full, rem);
        for (int j = 0; j < C; ++j) {
            const V16 wv = E::load(wc[j] + 64 * full);
            for (int r = 0; r < R; ++r) acc[r][j] = v_fma(xv[r], wv, acc[r][j]);
        }
    }
    if constexpr (R * C == 16)
        v_sum_tree16(&acc[0][0], out);  // the same tree for each, 16 at once
    else
        for (int r = 0; r < R; ++r)
            for (int j = 0; j < C; ++j) out[r * C + j] = v_sum_tree(acc[r][j]);
}

// A tile of R <= 4 rows (R chosen at run time: the last rows of S).
template <class E, int C>
static inline void float_rows(int64_t R, const typename E::T* w, int64_t j0, int64_t KP, const float* x, int64_t ldx,
                              int64_t K, float* out) {
    if (R >= 4)
        float_tile<E, 4, C>(w, j0, KP, x, ldx, K, out);
    else if (R == 3)
        float_tile<E, 3, C>(w, j0, KP, x, ldx, K, out);
    else if (R == 2)
        float_tile<E, 2, C>(w, j0, KP, x, ldx, K, out);
    else
        float_tile<E, 1, C>(w, j0, KP, x, ldx, K, out);
}

// One strip (16 columns) for all S rows. w: the strip [4, KP/16, 4, 16]; out: y + 16 * strip (row stride N), ncols
// valid columns; accum: y += the result (a residual), else y = it.
template <class E>
static void float_strip(const typename E::T* w, int64_t KP, int64_t K, const float* x, int64_t ldx, int64_t S,
                        const float* bias, float* out, int64_t N, int64_t ncols, bool accum) {
    constexpr int C1 = SZ_FR * SZ_FC;
    alignas(64) float t[4 * 16];  // a tile's outputs [R][cols], R <= 4 (float_rows), R * cols <= 16
    const int cols = S == 1 ? C1 : SZ_FC;
    for (int64_t j0 = 0; j0 < ncols; j0 += cols) {  // a column group's weights stay in L1 across row tiles
        for (int64_t r0 = 0; r0 < S; r0 += SZ_FR) {
            const int64_t R = S - r0 < SZ_FR ? S - r0 : SZ_FR;
            const float* xr = x + r0 * ldx;
            if (S == 1)
                float_tile<E, 1, C1>(w, j0, KP, xr, ldx, K, t);
            else
                float_rows<E, SZ_FC>(R, w, j0, KP, xr, ldx, K, t);
            for (int64_t r = 0; r < R; ++r)
                for (int64_t j = 0; j < cols && j0 + j < ncols; ++j) {
                    const int64_t n = j0 + j;
                    const float v = bias ? t[r * cols + j] + bias[n] : t[r * cols + j];
                    float* yp = out + (r0 + r) * N + n;
                    *yp = accum ? *yp + v : v;
                }
        }
    }
}
