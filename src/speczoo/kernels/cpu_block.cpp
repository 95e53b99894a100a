// Whole pre-norm decoder blocks of the Qwen2 shape, a run of them in one call and one OpenMP region
// (sz_qwen_blocks; one block is a run of one), each block:
//   h = rmsnorm(x) ; q, k, v = qkv(h) (+ bias) ; [rmsnorm of each q and k head (Qwen3's QK norm)] ;
//   rotate q (scaled) and k ; write k, v to the cache (fp32, or rounded once to fp16: sz_f16_from_f32) ;
//   x += wo(attention(q, cache)) ; h = rmsnorm(x) ; g, u = gate_up(h) ; x += down(silu(g) * u).
// It exists to remove the per-operation overhead of running those ~40 small steps from Python (about a
// fifth of a decode step on two cores); the linears and the attention are the very routines the separate
// entry points run. Batch invariance holds as in cpu_kernels.cpp: every step is row-wise with a fixed
// order of operations (the norm's sum uses 16 lanes and a fixed tree, whatever the build), so row i of
// an S-row call is bit-identical to the 1-row call of row i. Compile with -ffp-contract=off.
// This file must never keep state between calls beyond its grown scratch, nor touch cache slots other
// than the S rows' own: [l0, l0 + S) of the layer it is given, or dst[0 .. S) when the caller names them
// (several sequences in one forward, each row written into its own sequence's slot range).

#include <stdlib.h>
#include <string.h>
#include "cpu_kernels.h"

// y = x / sqrt(mean(x^2) + eps) * w: squares summed in 16 lanes (k mod 16), lanes by a fixed tree.
static void rmsnorm_row(const float* x, int64_t D, const float* w, float eps, float* y) {
    float lane[16] = {0};
    int64_t k0 = 0;
    for (; k0 + 16 <= D; k0 += 16)
        for (int l = 0; l < 16; ++l) lane[l] = lane[l] + x[k0 + l] * x[k0 + l];
    for (int l = 0; k0 + l < D; ++l) lane[l] = lane[l] + x[k0 + l] * x[k0 + l];
    for (int w2 = 8; w2 >= 1; w2 /= 2)
        for (int l = 0; l < w2; ++l) lane[l] = lane[l] + lane[l + w2];
    const float r = 1.0f / sqrtf(lane[0] / (float)D + eps);
    for (int64_t k = 0; k < D; ++k) y[k] = x[k] * r * w[k];
}

// NEOX rotation of nh heads of Dh (rotate halves) with cos = (c, c), sin = (-s, s): y = x*cos + swap(x)*sin.
static void rope_row(const float* x, int64_t nh, int64_t Dh, const float* cs, const float* sn, float* y) {
    const int64_t half = Dh / 2;
    for (int64_t h = 0; h < nh; ++h) {
        const float* xh = x + h * Dh;
        float* yh = y + h * Dh;
        for (int64_t d = 0; d < half; ++d) yh[d] = xh[d] * cs[d] + xh[d + half] * sn[d];
        for (int64_t d = half; d < Dh; ++d) yh[d] = xh[d] * cs[d] + xh[d - half] * sn[d];
    }
}

// y = silu(g) * u = g * sigmoid(g) * u, lane-wise on V16, sigmoid from e = exp(-|g|) so that exp never
// overflows: g >= 0: 1 / (1 + e), else e / (1 + e).
static void silu_mul_row(const float* g, const float* u, int64_t F, float* y) {
    const V16 one = v_set1(1.0f), zero = v_zero();
    for (int64_t j = 0; j < F; j += 16) {
        const int cnt = (int)(F - j);
        const V16 gv = v_loadn(g + j, cnt);
        const V16 e = v_exp_neg(v_sub(zero, v_abs(gv)));
        const V16 den = v_add(one, e);
        const V16 sig = v_select_ge(gv, zero, v_div(one, den), v_div(e, den));
        v_storen(y + j, v_mul(v_mul(gv, sig), v_loadn(u + j, cnt)), cnt);
    }
}

static float* g_buf = nullptr;  // block scratch (h, qkv, q, attention out, gate/up, act), grown on demand
static int64_t g_cap = 0;

static SzLinear linear_at(const int64_t* p) {  // p: fmt, N, K, a, b, c, d, bias (pointers as int64)
    return SzLinear{p[0], p[1], p[2], (const uint8_t*)p[3], (const uint8_t*)p[4], (const uint8_t*)p[5],
                    (const float*)p[6], (const float*)p[7]};
}

// A linear whose outputs are computed by up to 3 calls side by side (a run of columns each, in order):
// q|k|v or gate|up as one call when their weights share a format, else one call per run of one format.
struct Runs {
    SzLinear part[3];
    int n;
    int64_t N, K;  // the outputs of all parts; their common input width (-1 when the parts disagree)
};

// lin: 3 descriptors of 8 int64; a part of N = 0 ends the runs.
static Runs runs_at(const int64_t* lin, int most) {
    Runs r{};
    r.K = -1;
    for (int i = 0; i < most && lin[8 * i + 1] > 0; ++i) {
        r.part[r.n++] = linear_at(lin + 8 * i);
        r.K = (r.n == 1 || r.part[r.n - 1].K == r.K) ? r.part[r.n - 1].K : -2;
        r.N += r.part[r.n - 1].N;
    }
    return r;
}

// y [S, runs.N] (row stride runs.N) = the parts' outputs side by side, each part's call as it would be alone.
static void runs_omp(const Runs& r, const float* x, int64_t S, int64_t ldx, float* y, int32_t* ws) {
    int64_t col = 0;
    for (int i = 0; i < r.n; ++i) {
        sz_linear_omp(r.part[i], x, S, ldx, y + col, r.N, false, ws);
        col += r.part[i].N;
    }
}

// One layer's parameters: its two norms, its linears (qkv and gate_up as runs, wo, down), its cache, and the
// per-head norms of q and k [Dh] (null when the block has none).
struct Layer {
    const float *norm1, *norm2;
    Runs wqkv, wgu;
    SzLinear wo, wd;
    void *kc, *vc;  // [Hkv, C, Dh] of fp32, or of fp16 (the call's kvfmt)
    const float *qnorm, *knorm;
};

// p: norm1, norm2, lin, kc, vc, qnorm, knorm (pointers as int64); lin: 8 descriptors: qkv runs 0-2, wo,
// gate_up runs 4-5, down, (unused).
static Layer layer_at(const int64_t* p) {
    const int64_t* lin = (const int64_t*)p[2];
    return Layer{(const float*)p[0], (const float*)p[1], runs_at(lin, 3), runs_at(lin + 32, 2), linear_at(lin + 24),
                 linear_at(lin + 48), (void*)p[3], (void*)p[4], (const float*)p[5], (const float*)p[6]};
}

#define SZ_KV_ROW_MAX 1024  // the longest head an fp16 cache row is rotated in (a stack buffer of fp32)

static bool shapes_fit(const Layer& L, int64_t S, int64_t D, int64_t H, int64_t Hkv, int64_t Dh) {
    const int64_t HD = H * Dh, KVD = Hkv * Dh, F = L.wgu.N / 2;
    return L.wqkv.K == D && L.wqkv.N == HD + 2 * KVD && L.wo.K == HD && L.wo.N == D && L.wgu.K == D &&
           L.wgu.N == 2 * F && L.wd.K == F && L.wd.N == D && Dh % 2 == 0 && Dh <= SZ_KV_ROW_MAX;
}

// The rows' cache slots lie inside the cache: [l0, l0 + S), or each dst[s] when dst is given.
static bool slots_fit(int64_t S, int64_t C, int64_t l0, const int64_t* dst) {
    if (!dst) return l0 >= 0 && l0 + S <= C;
    for (int64_t s = 0; s < S; ++s)
        if (dst[s] < 0 || dst[s] >= C) return false;
    return true;
}

// Under sz_lock(), outside a parallel region: grow the activation scratch and the block buffers for
// layers[0 .. n). Returns 0, or -1 when memory ran out.
static int reserve(const Layer* layers, int64_t n, int64_t S, int64_t D, int64_t HD) {
    int64_t kp = 0, need = 0;
    for (int64_t i = 0; i < n; ++i) {
        const Layer& L = layers[i];
        for (const SzLinear* w : {&L.wqkv.part[0], &L.wqkv.part[1], &L.wqkv.part[2], &L.wo, &L.wgu.part[0],
                                  &L.wgu.part[1], &L.wd})
            if (w->N > 0) kp = sz_linear_kpad(*w) > kp ? sz_linear_kpad(*w) : kp;
        const int64_t nd = S * (D + L.wqkv.N + HD + HD + L.wgu.N + L.wgu.N / 2);
        need = nd > need ? nd : need;
    }
    if (sz_reserve_scratch(S, kp) != 0) return -1;
    if (need > g_cap) {
        free(g_buf);
        g_buf = (float*)aligned_alloc(64, ((need * (int64_t)sizeof(float) + 63) / 64) * 64);
        g_cap = g_buf ? need : 0;
        if (!g_buf) return -1;
    }
    return 0;
}

// Row-wise work over the S rows, work-shared statically, ending in a barrier unless `then_quantized`: then
// the next step is a linear whose first work-shared loop quantizes these same rows, statically over S
// (sz_linear_omp), and OpenMP gives row s of two static loops of one length in one region to the same
// thread, so each row is read by the thread that wrote it and the barrier would only make threads wait.
template <class F>
static void rows_omp(int64_t S, bool then_quantized, F&& f) {
    if (then_quantized) {
#pragma omp for schedule(static) nowait
        for (int64_t s = 0; s < S; ++s) f(s);
    } else {
#pragma omp for schedule(static)
        for (int64_t s = 0; s < S; ++s) f(s);
    }
}

static inline bool quantizes(const SzLinear& w) { return sz_linear_kpad(w) > 0; }  // float formats read x as is

// Inside a parallel region (every thread calls it): one block over x [S, D] in place. Ends with a
// barrier (the down projection's work-shared loop), so the next block may read x at once.
static void block_omp(const Layer& L, float* x, int64_t S, int64_t D, float eps, const float* cos_k,
                      const float* sin_k, const float* cos_q, const float* sin_q, int64_t H, int64_t Hkv, int64_t Dh,
                      int64_t C, int64_t kvfmt, int64_t l0, const int64_t* dst, const int64_t* lo,
                      const int64_t* hi, const int64_t* off, const int64_t* idx, int64_t nmax, int32_t* ws,
                      int32_t* slots, float* scores) {
    const int64_t HD = H * Dh, KVD = Hkv * Dh, F = L.wgu.N / 2;
    float* h = g_buf;                 // [S, D]
    float* qkv = h + S * D;           // [S, HD + 2 KVD]
    float* q = qkv + S * L.wqkv.N;    // [S, H, Dh] rotated, scaled
    float* att = q + S * HD;          // [S, H, Dh]
    float* gu = att + S * HD;         // [S, 2F]
    float* a = gu + S * L.wgu.N;      // [S, F]
    rows_omp(S, quantizes(L.wqkv.part[0]), [&](int64_t s) { rmsnorm_row(x + s * D, D, L.norm1, eps, h + s * D); });
    runs_omp(L.wqkv, h, S, D, qkv, ws);
#pragma omp for schedule(static)
    for (int64_t s = 0; s < S; ++s) {
        float* row = qkv + s * L.wqkv.N;
        if (L.qnorm)
            for (int64_t h2 = 0; h2 < H; ++h2) rmsnorm_row(row + h2 * Dh, Dh, L.qnorm, eps, row + h2 * Dh);
        if (L.knorm)
            for (int64_t g = 0; g < Hkv; ++g) rmsnorm_row(row + HD + g * Dh, Dh, L.knorm, eps, row + HD + g * Dh);
        rope_row(row, H, Dh, cos_q + s * Dh, sin_q + s * Dh, q + s * HD);
        const int64_t at = dst ? dst[s] : l0 + s;
        for (int64_t g = 0; g < Hkv; ++g) {
            const float* vrow = row + HD + KVD + g * Dh;
            if (kvfmt == SZ_FMT_F16) {
                float k[SZ_KV_ROW_MAX];
                rope_row(row + HD + g * Dh, 1, Dh, cos_k + s * Dh, sin_k + s * Dh, k);
                uint16_t* kslot = (uint16_t*)L.kc + (g * C + at) * Dh;
                uint16_t* vslot = (uint16_t*)L.vc + (g * C + at) * Dh;
                for (int64_t d = 0; d < Dh; ++d) kslot[d] = sz_f16_from_f32(k[d]);
                for (int64_t d = 0; d < Dh; ++d) vslot[d] = sz_f16_from_f32(vrow[d]);
            } else {
                rope_row(row + HD + g * Dh, 1, Dh, cos_k + s * Dh, sin_k + s * Dh, (float*)L.kc + (g * C + at) * Dh);
                memcpy((float*)L.vc + (g * C + at) * Dh, vrow, sizeof(float) * Dh);
            }
        }
    }
    sz_attend_omp(q, S, H, Dh, L.kc, L.vc, kvfmt, Hkv, C, lo, hi, off, idx, nmax, 0.0f, att, slots, scores);
    sz_linear_omp(L.wo, att, S, HD, x, D, true, ws);              // x += wo(att)
    rows_omp(S, quantizes(L.wgu.part[0]), [&](int64_t s) { rmsnorm_row(x + s * D, D, L.norm2, eps, h + s * D); });
    runs_omp(L.wgu, h, S, D, gu, ws);
    rows_omp(S, quantizes(L.wd),
             [&](int64_t s) { silu_mul_row(gu + s * L.wgu.N, gu + s * L.wgu.N + F, F, a + s * F); });
    sz_linear_omp(L.wd, a, S, F, x, D, true, ws);                 // x += down(a)
}

// layers[0 .. n) in turn over x [S, D] in place, in one OpenMP region. Returns 0, -1 (memory), -2 (plan),
// -3 (shapes).
static int run_layers(const Layer* layers, int64_t n, float* x, int64_t S, int64_t D, float eps, const float* cos_k,
                      const float* sin_k, const float* cos_q, const float* sin_q, int64_t H, int64_t Hkv, int64_t Dh,
                      int64_t C, int64_t kvfmt, int64_t l0, const int64_t* dst, const int64_t* lo,
                      const int64_t* hi, const int64_t* off, const int64_t* idx, int nthreads) {
    if (S <= 0 || n <= 0) return 0;
    if (kvfmt != SZ_FMT_F32 && kvfmt != SZ_FMT_F16) return -3;
    if (!slots_fit(S, C, l0, dst)) return -3;
    for (int64_t i = 0; i < n; ++i)
        if (!shapes_fit(layers[i], S, D, H, Hkv, Dh)) return -3;
    const int64_t nmax = sz_attend_plan(S, H, Hkv, C, lo, hi, off, idx);
    if (nmax < 0) return (int)nmax;

    std::lock_guard<std::mutex> guard(sz_lock());
    if (reserve(layers, n, S, D, H * Dh) != 0) return -1;
    int failed = 0;
#pragma omp parallel num_threads(nthreads)
    {
        int32_t* ws = (int32_t*)aligned_alloc(64, sizeof(int32_t) * SZ_WS_WORDS * S);
        int32_t* slots = (int32_t*)aligned_alloc(64, sizeof(int32_t) * sz_attend_slots_len(nmax));
        float* scores = (float*)aligned_alloc(64, sizeof(float) * sz_attend_scores_len(nmax, H / Hkv));
        if (!ws || !slots || !scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed)
            for (int64_t i = 0; i < n; ++i)
                block_omp(layers[i], x, S, D, eps, cos_k, sin_k, cos_q, sin_q, H, Hkv, Dh, C, kvfmt, l0, dst, lo, hi,
                          off, idx, nmax, ws, slots, scores);
        free(ws);
        free(slots);
        free(scores);
    }
    return failed ? -1 : 0;
}

// Blocks n in a row over x [S, D] (the residual stream, in place), each with the same arithmetic as a
// call of its own. layers: n x 7 int64 (pointers as int64): norm1, norm2 [D]; lin: 8 x 8 int64 (qkv runs
// 0-2, wo, gate_up runs 4-5, down, unused; see linear_at and runs_at); kc, vc [Hkv, C, Dh] of that block's
// layer, fp32 (kvfmt SZ_FMT_F32) or fp16 (SZ_FMT_F16); qnorm, knorm [Dh] or 0 (no per-head norm of q and k; rmsnorm_row in place, after the qkv bias,
// before the rotation). cos_k/sin_k, cos_q/sin_q [S, Dh] (the query pair has the query scale folded in);
// row s's key and value go to cache slot l0 + s, or dst[s] when dst is not null; lo/hi/off/idx: the key plan
// of kernels/attention.py (read after every row of the block is written). Returns 0; -1 when scratch could
// not be allocated; -2 on an invalid key plan; -3 when a block's shapes do not fit together or the cache, or
// kvfmt is neither.
SZ_API int sz_qwen_blocks(float* x, int64_t S, int64_t D, int64_t n, const int64_t* layers, float eps,
                              const float* cos_k, const float* sin_k, const float* cos_q, const float* sin_q,
                              int64_t H, int64_t Hkv, int64_t Dh, int64_t C, int64_t kvfmt, int64_t l0,
                              const int64_t* dst, const int64_t* lo, const int64_t* hi, const int64_t* off,
                              const int64_t* idx, int nthreads) {
    if (n <= 0) return 0;
    Layer* ls = (Layer*)malloc(sizeof(Layer) * n);
    if (!ls) return -1;
    for (int64_t i = 0; i < n; ++i) ls[i] = layer_at(layers + 7 * i);
    const int rc = run_layers(ls, n, x, S, D, eps, cos_k, sin_k, cos_q, sin_q, H, Hkv, Dh, C, kvfmt, l0, dst, lo, hi,
                              off, idx, nthreads);
    free(ls);
    return rc;
}
