// Kernel path driver: runs the compiled CPU kernels (src/speczoo/kernels/cpu_kernels.cpp, cpu_block.cpp)
// on deterministic random cases, with no torch and no Python, and prints one line per case:
//   <name> <digest>       digest: 64-bit FNV-1a of the output bytes, in hex
// after header lines that start with '#' (the compiled path, the ABI). Every build of the kernels (scalar
// reference, AVX2, AVX-VNNI, AVX-512 VNNI, NEON, dotprod, i8mm, under any compiler or qemu CPU model)
// must print the same case lines: tests/kernels/test_kernel_paths_driver.py compares them with the scalar
// reference's, line for line.
//
// Inside one build it also checks batch invariance on its own path and prints "FAIL <name>: ..." (and
// exits 1) when it does not hold:
//   linears:   row i of an S-row call == the 1-row call of row i, with 1 and 2 threads;
//   attention: row i of an S-row call == the 1-row call of row i, and == a 1-row call that sees the row's
//              key sequence laid out contiguously (a tree row == its compacted path), 1 and 2 threads;
//   blocks:    a chain of S rows == S single-row decode steps; a tree row == the chain call over its
//              compacted path; no cache slot outside [l0, l0 + S) is touched.
// Attention and blocks run over an fp32 KV cache and over an fp16 one (cases named .../kvf16): the fp16
// cache's values come from sz_f32_to_f16, the library's own rounding, so that differs by path if anything.
//
// Inputs come from our own PRNG with integer and IEEE-exact arithmetic only (no libm), so every
// architecture generates the same bytes. Build (see the test for the path flags):
//   g++ -O2 -std=c++17 -fopenmp -ffp-contract=off <path flags> tests/kernel_driver/driver.cpp
//       src/speczoo/kernels/cpu_kernels.cpp src/speczoo/kernels/cpu_block.cpp -o driver   (one line)
// Usage: driver [--list] [--dump DIR] [GROUP...]
//   GROUP: q8, q8b, q8bm, q40, q50, q80, q6, q4, f32, f16, bf16, attn, block (default: all); --list: the case names only; --dump DIR: also write each
//   case's output (fp32, native byte order) to DIR/<name, '/' -> '_'>.bin, to see where two paths differ.

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <string>
#include <vector>

extern "C" {
int sz_q8_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const float* sw, int64_t N,
                 const float* bias, float* y, int nthreads);
int sz_q8b_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const float* sb, int64_t N,
                  const float* bias, float* y, int nthreads);
int sz_q8bm_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const float* sb,
                   const float* mb, int64_t N, const float* bias, float* y, int nthreads);
int sz_q40_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs, const uint16_t* sd, int64_t N,
                  const float* bias, float* y, int nthreads);
int sz_q50_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs, const uint8_t* qh,
                  const uint16_t* sd, int64_t N, const float* bias, float* y, int nthreads);
int sz_q80_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* w8, const uint16_t* sd, int64_t N,
                  const float* bias, float* y, int nthreads);
int sz_q6_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* ql, const uint8_t* qh,
                 const int8_t* sc, const float* dd, int64_t N, const float* bias, float* y, int nthreads);
int sz_q4_linear(const float* x, int64_t S, int64_t K, int64_t ldx, const uint8_t* qs, const uint8_t* sc,
                 const uint8_t* mn, const float* dd, int64_t N, const float* bias, float* y, int nthreads);
int sz_float_linear(int64_t fmt, const float* x, int64_t S, int64_t K, int64_t ldx, const void* w, int64_t N,
                    const float* bias, float* y, int nthreads);
int sz_attend(const float* q, int64_t S, int64_t H, int64_t Dh, const void* kc, const void* vc, int64_t kvfmt,
              int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi, const int64_t* off, const int64_t* idx, float softcap,
              float* out, int nthreads);
int sz_qwen_blocks(float* x, int64_t S, int64_t D, int64_t n, const int64_t* layers, float eps, const float* cos_k,
                   const float* sin_k, const float* cos_q, const float* sin_q, int64_t H, int64_t Hkv, int64_t Dh,
                   int64_t C, int64_t kvfmt, int64_t l0, const int64_t* dst, const int64_t* lo, const int64_t* hi,
                   const int64_t* off, const int64_t* idx, int nthreads);
void sz_f32_to_f16(const float* x, int64_t n, uint16_t* y);
int sz_abi_version(void);
void sz_set_one_row_prefetch(int on);
// Names the compiled path; weak so that a library without it still links (then the header says "?").
const char* sz_path(void) __attribute__((weak));
}

// ---------------------------------------------------------------- output, failures
static int g_failures = 0;
static bool g_list = false;

static uint64_t fnv1a(const void* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
    const uint8_t* b = (const uint8_t*)p;
    for (size_t i = 0; i < n; ++i) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void fail(const std::string& name, const char* fmt, ...) {
    ++g_failures;
    printf("FAIL %s: ", name.c_str());
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

static const char* g_dump = nullptr;  // --dump DIR: also write each case's output bytes to DIR/<name>.bin

static void emit(const std::string& name, uint64_t digest, const void* data, size_t n) {
    if (g_dump) {
        std::string fn = std::string(g_dump) + "/" + name;
        for (size_t i = strlen(g_dump) + 1; i < fn.size(); ++i)
            if (fn[i] == '/') fn[i] = '_';
        fn += ".bin";
        FILE* f = fopen(fn.c_str(), "wb");
        if (!f || fwrite(data, 1, n, f) != n) fail(name, "cannot write %s", fn.c_str());
        if (f) fclose(f);
    }
    printf("%s %016llx\n", name.c_str(), (unsigned long long)digest);
    fflush(stdout);
}

static uint32_t bits(float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    return u;
}

// Bitwise comparison of n floats; on a difference, one FAIL line naming what and where.
static bool same_bits(const std::string& name, const char* what, const float* got, const float* want, int64_t n) {
    if (memcmp(got, want, sizeof(float) * (size_t)n) == 0) return true;
    int64_t i = 0;
    while (bits(got[i]) == bits(want[i])) ++i;
    fail(name, "%s differs at element %lld: %.9g (0x%08x) vs %.9g (0x%08x)", what, (long long)i, got[i],
         bits(got[i]), want[i], bits(want[i]));
    return false;
}

static void check_rc(const std::string& name, const char* what, int rc) {
    if (rc != 0) fail(name, "%s returned %d", what, rc);
}

// ---------------------------------------------------------------- PRNG (integer and exact float ops only)
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull ^ 0x5DEECE66Dull) {}
    uint64_t next() {  // splitmix64
        uint64_t z = (s += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float unif() { return (float)(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1), exact
    int64_t below(int64_t n) { return (int64_t)(next() % (uint64_t)n); }
    uint8_t byte() { return (uint8_t)(next() >> 56); }
    // ~N(0, 1): Irwin-Hall of 4 uniforms, rescaled; every step is one IEEE-rounded operation.
    float normal() { return ((unif() + unif()) + (unif() + unif()) - 2.0f) * 1.7320508f; }
    // activations: ~N(0, 1) with an outlier (x 4 .. 16) one time in 32, as real hidden states have
    float act() {
        const float v = normal();
        return below(32) == 0 ? v * (4.0f + 12.0f * unif()) : v;
    }
};

static uint64_t seed_of(const std::string& name) { return fnv1a(name.data(), name.size()); }

static void fill_normal(Rng& r, float* p, int64_t n, float scale) {
    for (int64_t i = 0; i < n; ++i) p[i] = r.normal() * scale;
}

// Activation rows [S, ldx] (K used); special rows: row 2 all zeros (S >= 5), row 4 all exact ties of the
// rounding (S >= 9: every block of 32 inputs, so every activation block, holds -127 and nothing larger,
// its scale is 1.0, and x / scale lands on k + 0.5 and must round half to even).
static std::vector<float> make_acts(Rng& r, int64_t S, int64_t K, int64_t ldx) {
    std::vector<float> x((size_t)(S * ldx));
    for (int64_t s = 0; s < S; ++s)
        for (int64_t k = 0; k < ldx; ++k) x[s * ldx + k] = k < K ? r.act() : 1e30f;  // junk past K: never read
    if (S >= 5)
        for (int64_t k = 0; k < K; ++k) x[2 * ldx + k] = 0.0f;
    if (S >= 9)
        for (int64_t k = 0; k < K; ++k)
            x[4 * ldx + k] = k % 32 == 16 || k == K - 1 ? -127.0f : (float)(r.below(253) - 126) + (r.below(2) ? 0.5f : -0.5f);
    return x;
}

static inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------- packed linears (random codes)
enum { FMT_Q4 = 0, FMT_Q8 = 1, FMT_Q8B = 2, FMT_Q6 = 3, FMT_F32 = 4, FMT_F16 = 5, FMT_BF16 = 6, FMT_Q8BM = 7,
       FMT_Q40 = 8, FMT_Q50 = 9, FMT_Q80 = 10 };
static const int64_t FMT_LAST = FMT_Q80;

static bool is_float(int64_t fmt) { return fmt == FMT_F32 || fmt == FMT_F16 || fmt == FMT_BF16; }
static const char* fmt_name(int64_t fmt) {
    const char* names[] = {"q4", "q8", "q8b", "q6", "f32", "f16", "bf16", "q8bm", "q40", "q50", "q80"};
    return names[fmt];
}

// A random fp16 (bf16) bit pattern of a weight-sized value: sign, an exponent 2^-12 .. 2^-1 (fp16: biased 3 ..
// 14), any mantissa; one value in 16 subnormal, one in 64 zero: every conversion case the kernels meet.
static uint16_t rand_half(Rng& r, bool bf16) {
    const uint32_t sign = (uint32_t)(r.below(2)) << 15, kind = (uint32_t)r.below(64);
    const uint32_t mbits = bf16 ? 7 : 10, bias = bf16 ? 127 : 15;
    const uint32_t m = (uint32_t)(r.next() >> (64 - mbits));
    uint32_t e = bias - 12 + (uint32_t)r.below(12);
    if (kind == 0) return (uint16_t)sign;
    if (kind < 5) e = 0;
    return (uint16_t)(sign | (e << mbits) | (e == 0 && m == 0 ? 1u : m));
}

struct Lin {
    int64_t fmt, N, K;
    std::vector<uint8_t> a, b, c;  // q8, q8b, q80: a = w8; q4, q40, q50: a = qs; q4: b = sc, c = mn; q50: b = qh;
                                   // q6: a = ql, b = qh, c = sc;
                                   // f32, f16, bf16: a = w [NB, 4, KP/16, 4, 16] of the element type (KP: K up to 16)
    std::vector<float> d;          // q8: sw; q8b, q8bm: sb; q4, q6: dd; q40, q50, q80: sd (fp16 bits, two a float)
    std::vector<float> m;          // q8bm: mb [NB, KP/32, 16], an offset per 32 inputs
    std::vector<float> bias;       // empty: none
    int64_t desc[8];               // the descriptor sz_qwen_blocks reads (fmt, N, K, a, b, c, d, bias)
};

static void make_lin(Lin& L, Rng& r, int64_t fmt, int64_t N, int64_t K, bool bias) {
    L.m.clear();
    L.fmt = fmt;
    L.N = N;
    L.K = K;
    const int64_t NB = cdiv(N, 16);
    if (is_float(fmt)) {  // [NB, 4, KP/16, 4, 16], zero past N and past K, as pack_float lays it out
        const int64_t KP = cdiv(K, 16) * 16, el = fmt == FMT_F32 ? 4 : 2;
        L.a.assign((size_t)(NB * 16 * KP * el), 0);
        for (int64_t n = 0; n < N; ++n)
            for (int64_t k = 0; k < K; ++k) {
                const int64_t at_el = ((((n / 16) * 4 + (n % 16) / 4) * (KP / 16) + k / 16) * 4 + n % 4) * 16 + k % 16;
                uint8_t* at = L.a.data() + at_el * el;
                if (fmt == FMT_F32) {
                    const float v = r.normal() * 0.05f;
                    memcpy(at, &v, 4);
                } else {
                    const uint16_t h = rand_half(r, fmt == FMT_BF16);
                    memcpy(at, &h, 2);
                }
            }
    } else if (fmt == FMT_Q8 || fmt == FMT_Q8B || fmt == FMT_Q8BM) {
        const int64_t KP = cdiv(K, 32) * 32;
        L.a.resize((size_t)(NB * KP * 16));
        for (auto& v : L.a) v = r.byte();  // any byte is a valid code (q = byte - 128)
        L.d.resize((size_t)(fmt == FMT_Q8 ? NB * 16 : NB * KP));  // q8b: [NB, KP/16, 16], a scale per 16 inputs
        for (auto& v : L.d) v = (2.0f + r.unif()) * 1e-4f;  // weights of std ~0.02
        if (fmt == FMT_Q8BM) {  // offsets of either sign, as large as the weights (Q4_1's m ~ -8 d)
            L.m.resize((size_t)(NB * KP / 2));
            for (auto& v : L.m) v = (r.unif() - 0.5f) * 0.05f;
        }
    } else if (fmt == FMT_Q40 || fmt == FMT_Q50 || fmt == FMT_Q80) {  // any byte is valid codes (q40 and q50: two
        const int64_t KP = cdiv(K, 32) * 32;       // low nibbles; q50's qh any fifth bits; q80: one int8); fp16
        L.a.resize((size_t)(NB * KP * (fmt == FMT_Q80 ? 16 : 8)));   // scales of either sign, subnormal and 0 too
        for (auto& v : L.a) v = r.byte();
        L.b.resize(fmt == FMT_Q50 ? (size_t)(NB * KP * 2) : 0);     // [NB, KP/32, 16, 4]
        for (auto& v : L.b) v = r.byte();
        L.d.resize((size_t)(NB * KP / 4));  // [NB, KP/32, 16] fp16
        uint16_t* sd = (uint16_t*)L.d.data();
        for (int64_t i = 0; i < NB * KP / 2; ++i) sd[i] = rand_half(r, false);
    } else if (fmt == FMT_Q6) {  // any bytes are valid codes (6 bits from ql and qh) and int8 sub-scales
        const int64_t KP = cdiv(K, 32) * 32, KB = cdiv(KP, 256);
        L.a.resize((size_t)(NB * KP * 8));
        L.b.resize((size_t)(NB * KP * 4));
        L.c.resize((size_t)(NB * KP));
        for (auto* vec : {&L.a, &L.b, &L.c})
            for (auto& v : *vec) v = r.byte();
        L.d.resize((size_t)(NB * KB * 16));
        for (auto& v : L.d) v = (2.0f + r.unif()) * 1e-5f;  // D: weights of std ~0.02 with |sc| ~ 64, |u - 32| ~ 16
    } else {
        const int64_t G = 2 * cdiv(K, 64), KB = cdiv(G, 8);
        L.a.resize((size_t)(NB * G * 256));
        L.b.resize((size_t)(NB * G * 16));
        L.c.resize((size_t)(NB * (G / 2) * 32));
        for (auto* vec : {&L.a, &L.b, &L.c})
            for (auto& v : *vec) v = r.byte();
        L.d.resize((size_t)(NB * KB * 32));  // [NB, KB, 2, 16]: D, then Dm ~ 7.5 D (codes centred near 0)
        for (int64_t i = 0; i < NB * KB * 32; ++i) L.d[i] = (2.0f + r.unif()) * ((i / 16) % 2 ? 1.1e-4f : 1.5e-5f);
    }
    if (L.d.empty()) L.d.resize(1);  // the float formats have no scales; the descriptor's d is never read
    L.bias.clear();
    if (bias) {
        L.bias.resize((size_t)N);
        fill_normal(r, L.bias.data(), N, 0.1f);
    }
    const int64_t d[8] = {fmt,
                          N,
                          K,
                          (int64_t)(intptr_t)L.a.data(),
                          (int64_t)(intptr_t)(L.b.empty() ? nullptr : L.b.data()),
                          (int64_t)(intptr_t)(!L.m.empty() ? (const void*)L.m.data()
                                                            : L.c.empty() ? nullptr : (const void*)L.c.data()),
                          (int64_t)(intptr_t)L.d.data(),
                          (int64_t)(intptr_t)(L.bias.empty() ? nullptr : L.bias.data())};
    memcpy(L.desc, d, sizeof d);
}

static int call_lin(const Lin& L, const float* x, int64_t S, int64_t ldx, float* y, int threads) {
    const float* bias = L.bias.empty() ? nullptr : L.bias.data();
    if (is_float(L.fmt)) return sz_float_linear(L.fmt, x, S, L.K, ldx, L.a.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q8) return sz_q8_linear(x, S, L.K, ldx, L.a.data(), L.d.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q8B) return sz_q8b_linear(x, S, L.K, ldx, L.a.data(), L.d.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q8BM)
        return sz_q8bm_linear(x, S, L.K, ldx, L.a.data(), L.d.data(), L.m.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q40)
        return sz_q40_linear(x, S, L.K, ldx, L.a.data(), (const uint16_t*)L.d.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q50)
        return sz_q50_linear(x, S, L.K, ldx, L.a.data(), L.b.data(), (const uint16_t*)L.d.data(), L.N, bias, y,
                             threads);
    if (L.fmt == FMT_Q80)
        return sz_q80_linear(x, S, L.K, ldx, L.a.data(), (const uint16_t*)L.d.data(), L.N, bias, y, threads);
    if (L.fmt == FMT_Q6)
        return sz_q6_linear(x, S, L.K, ldx, L.a.data(), L.b.data(), (const int8_t*)L.c.data(), L.d.data(), L.N, bias, y,
                            threads);
    return sz_q4_linear(x, S, L.K, ldx, L.a.data(), L.b.data(), L.c.data(), L.d.data(), L.N, bias, y, threads);
}

static const float SENTINEL = -1.2345678e-29f;  // output buffers start with it: an unwritten element shows

static void linear_case(int64_t fmt, int64_t K, int64_t N, int64_t S, bool bias, int64_t ldx) {
    const char* f = fmt_name(fmt);
    char base[128];
    snprintf(base, sizeof base, "%s/K%lld/N%lld/S%lld/%s/ldx%lld", f, (long long)K, (long long)N, (long long)S,
             bias ? "bias" : "nobias", (long long)ldx);
    if (g_list) {
        for (int t = 1; t <= 2; ++t) printf("%s/t%d\n", base, t);
        return;
    }
    char wname[64];
    snprintf(wname, sizeof wname, "%s/K%lld/N%lld/%d", f, (long long)K, (long long)N, (int)bias);
    Rng rw(seed_of(wname));  // the same weights for every S of a shape
    Lin L;
    make_lin(L, rw, fmt, N, K, bias);
    Rng rx(seed_of(base));
    const std::vector<float> x = make_acts(rx, S, K, ldx);

    // the 1-row calls of every row: the batch-invariance reference
    std::vector<float> y1((size_t)(S * N), SENTINEL);
    for (int64_t s = 0; s < S; ++s) check_rc(base, "1-row call", call_lin(L, x.data() + s * ldx, 1, ldx, y1.data() + s * N, 1));
    // and again with the one-row software prefetch on (a per-CPU choice of the cost profile): no bit may change
    std::vector<float> yp((size_t)(S * N), SENTINEL);
    sz_set_one_row_prefetch(1);
    for (int64_t s = 0; s < S; ++s) check_rc(base, "1-row call, prefetch", call_lin(L, x.data() + s * ldx, 1, ldx, yp.data() + s * N, 1));
    sz_set_one_row_prefetch(0);
    for (int64_t s = 0; s < S; ++s)
        if (!same_bits(base, "1-row call with the one-row prefetch vs without", yp.data() + s * N, y1.data() + s * N, N)) break;
    for (int t = 1; t <= 2; ++t) {
        const std::string name = std::string(base) + "/t" + std::to_string(t);
        std::vector<float> y((size_t)(S * N), SENTINEL);
        check_rc(name, "call", call_lin(L, x.data(), S, ldx, y.data(), t));
        emit(name, fnv1a(y.data(), y.size() * sizeof(float)), y.data(), y.size() * sizeof(float));
        for (int64_t s = 0; s < S; ++s) {
            const std::string what = "row " + std::to_string(s) + " vs its 1-row call";
            if (!same_bits(name, what.c_str(), y.data() + s * N, y1.data() + s * N, N)) break;
        }
    }
}

static void linear_cases(int64_t fmt) {
    // K: 64 and 96 (one partial super-block), 97 and 333 (odd), 200, 1000, 1536 (whole super-blocks after
    // pair rounding: 8, 32, 48 groups), 896 (28 groups: a partial last super-block, Qwen2-0.5B's width).
    // N: one strip, partial last strips, and a wide one.
    struct Shape { int64_t K, N; };
    const Shape shapes[] = {{64, 16}, {96, 40}, {97, 24}, {200, 1000}, {333, 40}, {896, 40}, {1000, 56}, {1536, 40}};
    const int64_t Ss[] = {1, 2, 5, 9, 17};
    for (const Shape& sh : shapes)
        for (int64_t S : Ss)
            for (int b = 0; b < 2; ++b) {
                // a row stride past K on some cases (the kernels take ldx), odd where K is
                const int64_t ldx = (S == 5 || S == 17) ? sh.K + 3 : sh.K;
                linear_case(fmt, sh.K, sh.N, S, b == 1, ldx);
            }
}

// ---------------------------------------------------------------- attention
struct Plan {
    std::vector<int64_t> lo, hi, off, idx;
    void add(int64_t l, int64_t h, const std::vector<int64_t>& extra) {
        if (off.empty()) off.push_back(0);
        lo.push_back(l);
        hi.push_back(h);
        idx.insert(idx.end(), extra.begin(), extra.end());
        off.push_back((int64_t)idx.size());
    }
    int64_t rows() const { return (int64_t)lo.size(); }
    std::vector<int64_t> slots(int64_t i) const {  // row i's keys in order
        std::vector<int64_t> v;
        for (int64_t s = lo[i]; s < hi[i]; ++s) v.push_back(s);
        for (int64_t t = off[i]; t < off[i + 1]; ++t) v.push_back(idx[t]);
        return v;
    }
};

// Tree parents: parent[0] = -1 (the root), parent[i] < i. path(i): the root .. i.
static std::vector<int64_t> tree_parents(Rng& r, int64_t S) {
    std::vector<int64_t> p((size_t)S, -1);
    for (int64_t i = 1; i < S; ++i) p[i] = r.below(2) ? i - 1 : r.below(i);  // deep chains and wide fans
    return p;
}

static std::vector<int64_t> tree_path(const std::vector<int64_t>& parent, int64_t i) {
    std::vector<int64_t> path;
    for (int64_t j = i; j >= 0; j = parent[j]) path.insert(path.begin(), j);
    return path;
}

// kinds: chain (row i sees [0, L + i + 1)); tree (row i sees [0, L) then the new slots of its path);
// mixed (ranges with lo > 0, idx-only rows in random order, range plus idx, single-key rows).
static Plan make_plan(Rng& r, const char* kind, int64_t S, int64_t L, int64_t C) {
    Plan p;
    if (!strcmp(kind, "chain")) {
        for (int64_t i = 0; i < S; ++i) p.add(0, L + i + 1, {});
    } else if (!strcmp(kind, "tree")) {
        const std::vector<int64_t> parent = tree_parents(r, S);
        for (int64_t i = 0; i < S; ++i) {
            std::vector<int64_t> extra;
            for (int64_t j : tree_path(parent, i)) extra.push_back(L + j);
            p.add(0, L, extra);
        }
    } else {  // mixed
        for (int64_t i = 0; i < S; ++i) {
            const int64_t kind_i = r.below(4);
            int64_t lo = 0, hi = 0;
            std::vector<int64_t> extra;
            if (kind_i == 0 || kind_i == 2) {
                lo = r.below(C);
                hi = lo + 1 + r.below(C - lo);
            }
            if (kind_i == 1 || kind_i == 2) {
                const int64_t n = 1 + r.below(40);
                for (int64_t t = 0; t < n; ++t) extra.push_back(r.below(C));
            }
            if (kind_i == 3) {  // one key
                lo = r.below(C);
                hi = lo + 1;
            }
            p.add(lo, hi, extra);
        }
    }
    return p;
}

struct Heads { int64_t H, Hkv, Dh; };

// A KV cache of fp32 or fp16 elements (kvfmt FMT_F32 or FMT_F16), held as 16-bit units (an fp32 takes two):
// its fp32 values are written once, rounded by the library (sz_f32_to_f16) for fp16.
struct Kv {
    int64_t fmt, units;  // units: 16-bit words per element
    explicit Kv(int64_t f) : fmt(f), units(f == FMT_F16 ? 1 : 2) {}
    std::vector<uint16_t> make(const std::vector<float>& v) const {
        std::vector<uint16_t> o(v.size() * (size_t)units);
        if (fmt == FMT_F16)
            sz_f32_to_f16(v.data(), (int64_t)v.size(), o.data());
        else
            memcpy(o.data(), v.data(), sizeof(float) * v.size());
        return o;
    }
    // n elements from element `at` of src to element `to` of dst
    void copy(std::vector<uint16_t>& dst, int64_t to, const std::vector<uint16_t>& src, int64_t at, int64_t n) const {
        memcpy(&dst[(size_t)(to * units)], &src[(size_t)(at * units)], sizeof(uint16_t) * (size_t)(n * units));
    }
    const char* suffix() const { return fmt == FMT_F16 ? "/kvf16" : ""; }
};

// Bytewise comparison of two caches; on a difference, one FAIL line naming what and where (in 16-bit units).
static bool same_units(const std::string& name, const char* what, const std::vector<uint16_t>& got,
                       const std::vector<uint16_t>& want) {
    if (got == want) return true;
    size_t i = 0;
    while (got[i] == want[i]) ++i;
    fail(name, "%s differs at 16-bit unit %lld: 0x%04x vs 0x%04x", what, (long long)i, got[i], want[i]);
    return false;
}

// softcap > 0: the scores soft-capped (Gemma 2), named ".../capN"; kv: the cache's element type
static void attention_case(const Heads& hd, const char* kind, int64_t S, int64_t L, float softcap = 0.0f,
                           const Kv& kv = Kv(FMT_F32)) {
    char base[128];
    snprintf(base, sizeof base, "attn/H%lld/Hkv%lld/Dh%lld/%s/L%lld/S%lld", (long long)hd.H, (long long)hd.Hkv,
             (long long)hd.Dh, kind, (long long)L, (long long)S);
    if (softcap > 0.0f) snprintf(base + strlen(base), sizeof base - strlen(base), "/cap%g", (double)softcap);
    snprintf(base + strlen(base), sizeof base - strlen(base), "%s", kv.suffix());
    if (g_list) {
        for (int t = 1; t <= 2; ++t) printf("%s/t%d\n", base, t);
        return;
    }
    const int64_t H = hd.H, Hkv = hd.Hkv, Dh = hd.Dh, C = L + S, HD = H * Dh;
    Rng r(seed_of(base));
    std::vector<float> kc((size_t)(Hkv * C * Dh)), vc(kc.size()), q((size_t)(S * HD));
    fill_normal(r, kc.data(), (int64_t)kc.size(), 1.0f);
    fill_normal(r, vc.data(), (int64_t)vc.size(), 1.0f);
    for (int64_t g = 0; g < Hkv; ++g)  // slot 0 is an attention sink: scores far above the rest, so that
        for (int64_t d = 0; d < Dh; ++d)  // exp(score - max) underflows to 0 for some keys
            kc[(g * C) * Dh + d] *= 24.0f;
    const float qscale = 2.0f / sqrtf((float)Dh);  // q arrives scaled (sqrtf is correctly rounded)
    fill_normal(r, q.data(), (int64_t)q.size(), qscale);
    const Plan p = make_plan(r, kind, S, L, C);
    const std::vector<uint16_t> kq = kv.make(kc), vq = kv.make(vc);  // the cache as stored

    // references: each row alone, (a) as the 1-row call of the same plan row, (b) over a cache holding its
    // key sequence contiguously in slots [0, n) (a tree row's compacted path)
    std::vector<float> o1((size_t)(S * HD), SENTINEL), oc((size_t)(S * HD), SENTINEL);
    for (int64_t i = 0; i < S; ++i) {
        const int64_t lo = p.lo[i], hi = p.hi[i], off[2] = {0, p.off[i + 1] - p.off[i]};
        check_rc(base, "1-row call", sz_attend(q.data() + i * HD, 1, H, Dh, kq.data(), vq.data(), kv.fmt, Hkv, C, &lo,
                                               &hi, off, p.idx.data() + p.off[i], softcap, o1.data() + i * HD, 1));
        const std::vector<int64_t> sl = p.slots(i);
        const int64_t n = (int64_t)sl.size();
        std::vector<uint16_t> kg((size_t)(Hkv * n * Dh * kv.units)), vg(kg.size());
        for (int64_t g = 0; g < Hkv; ++g)
            for (int64_t j = 0; j < n; ++j) {
                kv.copy(kg, (g * n + j) * Dh, kq, (g * C + sl[j]) * Dh, Dh);
                kv.copy(vg, (g * n + j) * Dh, vq, (g * C + sl[j]) * Dh, Dh);
            }
        const int64_t zlo = 0, zhi = n, zoff[2] = {0, 0};
        check_rc(base, "contiguous call", sz_attend(q.data() + i * HD, 1, H, Dh, kg.data(), vg.data(), kv.fmt, Hkv, n,
                                                    &zlo, &zhi, zoff, nullptr, softcap, oc.data() + i * HD, 1));
    }
    for (int t = 1; t <= 2; ++t) {
        const std::string name = std::string(base) + "/t" + std::to_string(t);
        std::vector<float> out((size_t)(S * HD), SENTINEL);
        check_rc(name, "call", sz_attend(q.data(), S, H, Dh, kq.data(), vq.data(), kv.fmt, Hkv, C, p.lo.data(),
                                         p.hi.data(), p.off.data(), p.idx.data(), softcap, out.data(), t));
        emit(name, fnv1a(out.data(), out.size() * sizeof(float)), out.data(), out.size() * sizeof(float));
        for (int64_t i = 0; i < S; ++i) {
            const std::string w1 = "row " + std::to_string(i) + " vs its 1-row call";
            const std::string w2 = "row " + std::to_string(i) + " vs its keys laid out contiguously";
            if (!same_bits(name, w1.c_str(), out.data() + i * HD, o1.data() + i * HD, HD)) break;
            if (!same_bits(name, w2.c_str(), out.data() + i * HD, oc.data() + i * HD, HD)) break;
        }
    }
}

static void attention_cases() {
    const Heads heads[] = {{14, 2, 64}, {12, 2, 128}, {4, 4, 16}, {8, 2, 128}};  // the last: G = 4 (Llama 3)
    const int64_t Ss[] = {1, 2, 5, 9, 17};
    for (const Heads& hd : heads)
        for (int64_t S : Ss) {
            attention_case(hd, "chain", S, 203);
            attention_case(hd, "tree", S, 45);
            if (S >= 5) attention_case(hd, "mixed", S, 120);
        }
    for (int64_t S : Ss) {  // soft-capped: scores on both sides of the tanh's branch point, and the sink's
        attention_case(heads[0], "chain", S, 203, 30.0f);
        attention_case(heads[2], "tree", S, 45, 4.0f);
    }
    const Kv f16(FMT_F16);  // an fp16 cache: every shape and kind, and a soft-capped one
    for (const Heads& hd : heads)
        for (int64_t S : {(int64_t)1, (int64_t)5, (int64_t)17}) {
            attention_case(hd, "chain", S, 203, 0.0f, f16);
            attention_case(hd, "tree", S, 45, 0.0f, f16);
            if (S >= 5) attention_case(hd, "mixed", S, 120, 0.0f, f16);
        }
    attention_case(heads[0], "chain", 9, 203, 30.0f, f16);
}

// ---------------------------------------------------------------- whole blocks (sz_qwen_blocks)
struct BlockShape {
    const char* name;
    int64_t D, H, Hkv, Dh, F;
    bool qk_norm = false;  // per-head norms of q and k (Qwen3)
};

struct Layer {
    std::vector<float> norm1, norm2, qnorm, knorm;  // qnorm, knorm [Dh] with a qk_norm shape, else empty
    Lin lin[6];        // the linears as called: qkv runs, wo, gate_up runs, down (the "split" kind uses all 6)
    int64_t desc[64];  // sz_qwen_blocks' 8 descriptor slots: qkv runs 0-2, wo, gate_up runs 4-5, down, unused
};

// fmt: "q4", "q8", "q8b", "q6", "f32", "f16", "bf16", "q8bm", "q40", "q50", "q80"; "mix" (q8 for qkv, q8b for down, q4 for wo and
// gate_up: one call may mix formats); "split" (q|k in q4 and v in q6, gate in q4 and up in q8, down in q8b:
// q|k|v and gate|up as two calls each); "fsplit" (q|k in f16 and v in bf16, wo in f32, gate in q4 and up in
// f16, down in bf16: float formats beside integer ones in one block).
static void make_layer(Layer& ly, Rng& r, const BlockShape& b, const char* fmt) {
    const int64_t HD = b.H * b.Dh, KVD = b.Hkv * b.Dh;
    ly.norm1.resize((size_t)b.D);
    ly.norm2.resize((size_t)b.D);
    ly.qnorm.resize(b.qk_norm ? (size_t)b.Dh : 0);
    ly.knorm.resize(ly.qnorm.size());
    for (auto* v : {&ly.norm1, &ly.norm2, &ly.qnorm, &ly.knorm})
        for (auto& w : *v) w = 1.0f + 0.25f * r.normal();
    memset(ly.desc, 0, sizeof ly.desc);
    struct Part { int slot; int64_t N, K; bool bias; int64_t fmt; };
    int64_t one = FMT_Q4;
    for (int64_t f = FMT_Q4; f <= FMT_LAST; ++f)
        if (!strcmp(fmt, fmt_name(f))) one = f;
    const bool mix = !strcmp(fmt, "mix");
    std::vector<Part> parts;
    if (!strcmp(fmt, "fsplit"))
        parts = {{0, HD + KVD, b.D, true, FMT_F16}, {1, KVD, b.D, true, FMT_BF16}, {3, b.D, HD, false, FMT_F32},
                 {4, b.F, b.D, false, FMT_Q4},      {5, b.F, b.D, false, FMT_F16},  {6, b.D, b.F, false, FMT_BF16}};
    else if (!strcmp(fmt, "split"))
        parts = {{0, HD + KVD, b.D, true, FMT_Q4}, {1, KVD, b.D, true, FMT_Q6}, {3, b.D, HD, false, FMT_Q4},
                 {4, b.F, b.D, false, FMT_Q4},     {5, b.F, b.D, false, FMT_Q8},  {6, b.D, b.F, false, FMT_Q8B}};
    else
        parts = {{0, HD + 2 * KVD, b.D, true, mix ? FMT_Q8 : one}, {3, b.D, HD, false, mix ? FMT_Q4 : one},
                 {4, 2 * b.F, b.D, false, mix ? FMT_Q4 : one},   {6, b.D, b.F, false, mix ? FMT_Q8B : one}};
    for (size_t i = 0; i < parts.size(); ++i) {
        make_lin(ly.lin[i], r, parts[i].fmt, parts[i].N, parts[i].K, parts[i].bias);
        memcpy(ly.desc + 8 * parts[i].slot, ly.lin[i].desc, sizeof(int64_t) * 8);
    }
}

// RoPE tables [S, Dh] (NEOX halves: cos = (c, c), sin = (-s, s)), c^2 + s^2 = 1 by a rational map; the
// query pair has the query scale folded in.
static void make_rope(Rng& r, int64_t S, int64_t Dh, std::vector<float>* ck, std::vector<float>* sk,
                      std::vector<float>* cq, std::vector<float>* sq) {
    const int64_t half = Dh / 2;
    const float qs = 1.0f / sqrtf((float)Dh);
    for (auto* v : {ck, sk, cq, sq}) v->assign((size_t)(S * Dh), 0.0f);
    for (int64_t s = 0; s < S; ++s)
        for (int64_t d = 0; d < half; ++d) {
            const float t = 2.0f * r.unif() - 1.0f, den = 1.0f + t * t;
            const float c = (1.0f - t * t) / den, sn = (2.0f * t) / den;
            (*ck)[s * Dh + d] = (*ck)[s * Dh + d + half] = c;
            (*sk)[s * Dh + d] = -sn;
            (*sk)[s * Dh + d + half] = sn;
            (*cq)[s * Dh + d] = (*cq)[s * Dh + d + half] = c * qs;
            (*sq)[s * Dh + d] = -sn * qs;
            (*sq)[s * Dh + d + half] = sn * qs;
        }
}

struct BlockRun {  // inputs of one sz_qwen_blocks call (rows already selected)
    std::vector<float> x, ck, sk, cq, sq;
    Plan plan;
};

static std::vector<float> rows_of(const std::vector<float>& t, const std::vector<int64_t>& rows, int64_t w) {
    std::vector<float> o;
    for (int64_t i : rows) o.insert(o.end(), t.begin() + i * w, t.begin() + (i + 1) * w);
    return o;
}

typedef std::vector<std::vector<uint16_t>> Caches;  // per layer, a cache as Kv stores it

static int call_blocks(const BlockShape& b, std::vector<Layer>& layers, Caches& kcs, Caches& vcs, const Kv& kv,
                       int64_t C, int64_t l0, BlockRun& run, int threads) {
    const int64_t n = (int64_t)layers.size(), S = run.plan.rows();
    std::vector<int64_t> table((size_t)(7 * n));
    for (int64_t i = 0; i < n; ++i) {
        const bool qk = !layers[i].qnorm.empty();
        table[7 * i + 0] = (int64_t)(intptr_t)layers[i].norm1.data();
        table[7 * i + 1] = (int64_t)(intptr_t)layers[i].norm2.data();
        table[7 * i + 2] = (int64_t)(intptr_t)layers[i].desc;
        table[7 * i + 3] = (int64_t)(intptr_t)kcs[i].data();
        table[7 * i + 4] = (int64_t)(intptr_t)vcs[i].data();
        table[7 * i + 5] = qk ? (int64_t)(intptr_t)layers[i].qnorm.data() : 0;
        table[7 * i + 6] = qk ? (int64_t)(intptr_t)layers[i].knorm.data() : 0;
    }
    return sz_qwen_blocks(run.x.data(), S, b.D, n, table.data(), 1e-6f, run.ck.data(), run.sk.data(), run.cq.data(),
                          run.sq.data(), b.H, b.Hkv, b.Dh, C, kv.fmt, l0, nullptr, run.plan.lo.data(), run.plan.hi.data(),
                          run.plan.off.data(), run.plan.idx.data(), threads);
}

static void block_case(const BlockShape& b, const char* fmt, int64_t nlayers, const char* kind, int64_t S,
                       const Kv& kv = Kv(FMT_F32)) {
    char base[160];
    snprintf(base, sizeof base, "block/%s/%s/layers%lld/%s/S%lld%s", b.name, fmt, (long long)nlayers, kind, (long long)S,
             kv.suffix());
    if (g_list) {
        for (int t = 1; t <= 2; ++t) printf("%s/t%d\n", base, t);
        return;
    }
    const int64_t l0 = 23, C = l0 + S + 3, KVD = b.Hkv * b.Dh;  // 3 slots past the new ones: never touched
    char wname[96];
    snprintf(wname, sizeof wname, "block/%s/%s", b.name, fmt);
    Rng rw(seed_of(wname));
    std::vector<Layer> layers((size_t)nlayers);
    for (auto& ly : layers) make_layer(ly, rw, b, fmt);
    Rng r(seed_of(base));
    Caches kc0((size_t)nlayers), vc0((size_t)nlayers);  // the caches before the call
    for (int64_t i = 0; i < nlayers; ++i) {
        std::vector<float> k((size_t)(KVD * C), 0.0f), v(k.size(), 0.0f);
        for (int64_t g = 0; g < b.Hkv; ++g)
            for (int64_t s = 0; s < C; ++s)
                if (s < l0 || s >= l0 + S) {  // prefix (earlier tokens) and the slots past the new ones
                    fill_normal(r, &k[(g * C + s) * b.Dh], b.Dh, 1.0f);
                    fill_normal(r, &v[(g * C + s) * b.Dh], b.Dh, 1.0f);
                } else {  // the new slots hold stale values before the call: the block must overwrite them
                    for (int64_t d = 0; d < b.Dh; ++d) k[(g * C + s) * b.Dh + d] = v[(g * C + s) * b.Dh + d] = 7.0f;
                }
        kc0[i] = kv.make(k);
        vc0[i] = kv.make(v);
    }
    BlockRun full;
    full.x.resize((size_t)(S * b.D));
    for (auto& v : full.x) v = r.act();
    make_rope(r, S, b.Dh, &full.ck, &full.sk, &full.cq, &full.sq);
    std::vector<int64_t> parent((size_t)S, -1);
    const bool tree = !strcmp(kind, "tree");
    if (tree) parent = tree_parents(r, S);
    for (int64_t i = 0; i < S; ++i) {
        if (tree) {
            std::vector<int64_t> extra;
            for (int64_t j : tree_path(parent, i)) extra.push_back(l0 + j);
            full.plan.add(0, l0, extra);
        } else {
            full.plan.add(0, l0 + i + 1, {});
        }
    }

    // the reference of the S-row call, built from calls over fewer rows (1 thread):
    //   chain: S single-row decode steps, each at slot l0 + i over [0, l0 + i + 1);
    //   tree:  per row, a chain call over its path's rows (the compacted path), last row and its slots.
    std::vector<float> xref((size_t)(S * b.D));
    Caches kref = kc0, vref = vc0;
    if (!tree) {
        for (int64_t i = 0; i < S; ++i) {
            BlockRun one;
            one.x = rows_of(full.x, {i}, b.D);
            one.ck = rows_of(full.ck, {i}, b.Dh);
            one.sk = rows_of(full.sk, {i}, b.Dh);
            one.cq = rows_of(full.cq, {i}, b.Dh);
            one.sq = rows_of(full.sq, {i}, b.Dh);
            one.plan.add(0, l0 + i + 1, {});
            check_rc(base, "decode step", call_blocks(b, layers, kref, vref, kv, C, l0 + i, one, 1));
            memcpy(&xref[i * b.D], one.x.data(), sizeof(float) * b.D);
        }
    } else {
        for (int64_t i = 0; i < S; ++i) {
            const std::vector<int64_t> path = tree_path(parent, i);
            const int64_t d = (int64_t)path.size();
            BlockRun ch;
            ch.x = rows_of(full.x, path, b.D);
            ch.ck = rows_of(full.ck, path, b.Dh);
            ch.sk = rows_of(full.sk, path, b.Dh);
            ch.cq = rows_of(full.cq, path, b.Dh);
            ch.sq = rows_of(full.sq, path, b.Dh);
            for (int64_t j = 0; j < d; ++j) ch.plan.add(0, l0 + j + 1, {});
            Caches kc = kc0, vc = vc0;
            check_rc(base, "path chain call", call_blocks(b, layers, kc, vc, kv, C, l0, ch, 1));
            memcpy(&xref[i * b.D], &ch.x[(d - 1) * b.D], sizeof(float) * b.D);
            for (int64_t l = 0; l < nlayers; ++l)  // row i's own slot l0 + i holds what the path's last row wrote
                for (int64_t g = 0; g < b.Hkv; ++g) {
                    kv.copy(kref[l], (g * C + l0 + i) * b.Dh, kc[l], (g * C + l0 + d - 1) * b.Dh, b.Dh);
                    kv.copy(vref[l], (g * C + l0 + i) * b.Dh, vc[l], (g * C + l0 + d - 1) * b.Dh, b.Dh);
                }
        }
    }

    for (int t = 1; t <= 2; ++t) {
        const std::string name = std::string(base) + "/t" + std::to_string(t);
        Caches kc = kc0, vc = vc0;
        BlockRun run = full;
        check_rc(name, "call", call_blocks(b, layers, kc, vc, kv, C, l0, run, t));
        std::vector<uint16_t> all(run.x.size() * 2);  // x, then every layer's key and value cache
        memcpy(all.data(), run.x.data(), sizeof(float) * run.x.size());
        for (int64_t l = 0; l < nlayers; ++l) {
            all.insert(all.end(), kc[l].begin(), kc[l].end());
            all.insert(all.end(), vc[l].begin(), vc[l].end());
        }
        emit(name, fnv1a(all.data(), all.size() * sizeof(uint16_t)), all.data(), all.size() * sizeof(uint16_t));
        const char* how = tree ? "its compacted path's chain call" : "its single-row decode step";
        for (int64_t i = 0; i < S; ++i) {
            const std::string w = "x row " + std::to_string(i) + " vs " + how;
            if (!same_bits(name, w.c_str(), &run.x[i * b.D], &xref[i * b.D], b.D)) break;
        }
        for (int64_t l = 0; l < nlayers; ++l) {  // the whole caches: new slots as the reference, the rest untouched
            const std::string wk = "layer " + std::to_string(l) + " key cache vs the reference (new slots " + how +
                                   "; other slots untouched)";
            const std::string wv = "layer " + std::to_string(l) + " value cache vs the reference";
            same_units(name, wk.c_str(), kc[l], kref[l]);
            same_units(name, wv.c_str(), vc[l], vref[l]);
        }
    }
}

static void block_cases() {
    // tiny: q4 groups of K = 200 / 128 / 180 are 8 (whole), 4 and 6 (partial super-blocks); N = 200 and
    // 2F = 360 end in partial strips. qwen: Qwen2-0.5B's heads and width (K = 896: 28 groups), a short FFN.
    const BlockShape tiny{"tiny", 200, 4, 2, 32, 180};
    const BlockShape qwen{"qwen", 896, 14, 2, 64, 320};
    const BlockShape qwen3{"qwen3", 200, 4, 2, 48, 180, true};  // QK norm, heads wider than D / H
    const int64_t Ss[] = {1, 5, 9};
    for (const char* fmt : {"q4", "q8", "q8b", "q6", "f32", "f16", "bf16"})
        for (int64_t S : Ss) {
            block_case(tiny, fmt, 3, "chain", S);
            if (S > 1) block_case(tiny, fmt, 2, "tree", S);
            block_case(qwen, fmt, 1, "chain", S);
            if (S > 1) block_case(qwen, fmt, 1, "tree", S);
        }
    block_case(tiny, "q8bm", 2, "tree", 9);
    block_case(qwen, "q8bm", 1, "chain", 5);
    block_case(tiny, "q40", 2, "tree", 9);
    block_case(tiny, "q40", 3, "chain", 5);
    block_case(qwen, "q40", 1, "chain", 9);
    for (const char* fmt : {"q50", "q80"}) {
        block_case(tiny, fmt, 2, "tree", 9);
        block_case(tiny, fmt, 3, "chain", 5);
        block_case(qwen, fmt, 1, "chain", 9);
    }
    block_case(tiny, "mix", 2, "tree", 9);
    block_case(tiny, "mix", 1, "chain", 5);
    block_case(tiny, "split", 2, "tree", 9);
    block_case(qwen, "split", 1, "chain", 5);
    block_case(tiny, "fsplit", 2, "tree", 9);
    block_case(qwen, "fsplit", 1, "chain", 5);
    for (int64_t S : Ss) {
        block_case(qwen3, "q4", 2, "chain", S);
        if (S > 1) block_case(qwen3, "q8", 2, "tree", S);
    }
    const Kv f16(FMT_F16);  // an fp16 cache, written by the blocks themselves
    for (int64_t S : Ss) {
        block_case(tiny, "q4", 3, "chain", S, f16);
        if (S > 1) block_case(tiny, "f16", 2, "tree", S, f16);
        block_case(qwen, "q8b", 1, "chain", S, f16);
        if (S > 1) block_case(qwen3, "q4", 2, "tree", S, f16);
    }
}

// ---------------------------------------------------------------- main
int main(int argc, char** argv) {
    std::vector<std::string> groups;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--list"))
            g_list = true;
        else if (!strcmp(argv[i], "--dump") && i + 1 < argc)
            g_dump = argv[++i];
        else
            groups.push_back(argv[i]);
    }
    auto wanted = [&](const char* g) {
        if (groups.empty()) return true;
        for (auto& s : groups)
            if (s == g) return true;
        return false;
    };
    for (auto& g : groups)
        if (g != "q8" && g != "q8b" && g != "q8bm" && g != "q40" && g != "q50" && g != "q80" && g != "q6" && g != "q4" &&
            g != "f32" && g != "f16" && g != "bf16" && g != "attn" && g != "block") {
            fprintf(stderr,
                    "unknown group %s; usage: driver [--list] [--dump DIR] "
                    "[q8|q8b|q8bm|q40|q50|q80|q6|q4|f32|f16|bf16|attn|block ...]\n",
                    g.c_str());
            return 2;
        }
    printf("# path %s\n", sz_path ? sz_path() : "?");
    printf("# abi %d\n", sz_abi_version());
    fflush(stdout);
    struct Group { const char* name; void (*run)(); };
    const Group all[] = {{"q8", [] { linear_cases(FMT_Q8); }},
                         {"q8b", [] { linear_cases(FMT_Q8B); }},
                         {"q8bm", [] { linear_cases(FMT_Q8BM); }},
                         {"q40", [] { linear_cases(FMT_Q40); }},
                         {"q50", [] { linear_cases(FMT_Q50); }},
                         {"q80", [] { linear_cases(FMT_Q80); }},
                         {"q6", [] { linear_cases(FMT_Q6); }},
                         {"q4", [] { linear_cases(FMT_Q4); }},
                         {"f32", [] { linear_cases(FMT_F32); }},
                         {"f16", [] { linear_cases(FMT_F16); }},
                         {"bf16", [] { linear_cases(FMT_BF16); }},
                         {"attn", attention_cases},
                         {"block", block_cases}};
    for (const Group& g : all) {
        if (!wanted(g.name)) continue;
        const auto t0 = std::chrono::steady_clock::now();
        g.run();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!g_list) fprintf(stderr, "# %s: %.2f s\n", g.name, s);
    }
    if (g_failures) {
        fprintf(stderr, "%d FAIL line(s)\n", g_failures);
        return 1;
    }
    return 0;
}
