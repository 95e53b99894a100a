// Internals shared by the translation units of the speczoo CPU kernel library (cpu_kernels.cpp: linears
// and attention; cpu_block.cpp: a whole decoder block in one call). Not a public API: Python reaches the
// library only through the extern "C" entry points. Everything here keeps the batch-invariance contract
// of cpu_kernels.cpp: a row's result never depends on S, on the other rows or on the thread count.
#pragma once
#include <math.h>
#include <stdint.h>
#include <mutex>
#include "cpu_simd.h"

// The library's entry points, the only symbols it exports: it is built with -fvisibility=hidden so that
// several builds (paths) loaded into one process never bind to each other's internals.
#define SZ_API extern "C" __attribute__((visibility("default")))

enum { SZ_FMT_Q4 = 0, SZ_FMT_Q8 = 1, SZ_FMT_Q8B = 2, SZ_FMT_Q6 = 3, SZ_FMT_F32 = 4, SZ_FMT_F16 = 5, SZ_FMT_BF16 = 6,
       SZ_FMT_Q8BM = 7, SZ_FMT_Q40 = 8, SZ_FMT_Q50 = 9, SZ_FMT_Q80 = 10 };
#define SZ_WS_WORDS 48  // per-thread linear workspace, in 32-bit words per activation row
#define SZ_ABLOCK 256   // inputs per activation scale (a q4 super-block; a q8 k-block)

// One packed linear layer (kernels/pack.py layouts). q4: a = qs, b = sc, c = mn, d = dd; q8: a = w8, d = sw;
// q8b: a = w8, d = sb; q8bm: a = w8, c = mb (f32, cast), d = sb;
// q40: a = qs, d = sd (fp16, cast); q50: a = qs, b = qh, d = sd; q80: a = w8, d = sd; q6: a = ql, b = qh,
// c = sc (int8), d = dd; f32, f16, bf16: a = w (cpu_float.h), the rest null.
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
void sz_attend_omp(const float* q, int64_t S, int64_t H, int64_t Dh, const void* kc, const void* vc, int64_t kvfmt,
                   int64_t Hkv, int64_t C, const int64_t* lo, const int64_t* hi, const int64_t* off, const int64_t* idx,
                   int64_t nmax, float softcap, float* out, int32_t* slots, float* scores);
uint16_t sz_f16_from_f32(float f);                // the fp16 KV cache's rounding (round half to even)
