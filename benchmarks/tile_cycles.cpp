// The integer tiles of the compiled kernels (src/speczoo/kernels/cpu_tiles.h) timed on their own, their
// codes and activations in L1: nanoseconds per 512 weight-rows (one group of 32 inputs of a 16-column
// strip, times one activation row) for q4, q6 and q50 at every tile height R the path has. This is the
// cost of a verify's rows once the weights are streamed: what no memory system can take off. Each figure
// is the fastest of many short windows, so a machine whose other tenants steal time in bursts still
// shows its quiet speed. Built and run by benchmarks/tile_cycles.py with the path's own flags.
//
//     tile_cycles WINDOWS CALLS     prints one line per (format, R): "fmt R ns_per_512 invariant"
//
// `invariant` is 1 when the R-row tile gives, bit for bit, what R one-row tiles give (the kernels' batch
// invariance); the harness never touches the kernels' state and writes nothing but stdout.
#define SZ_PF 12  // prefetch distance in super-blocks, as cpu_kernels.cpp builds it (addresses only)
static bool sz_one_row_prefetch = false;  // cpu_kernels.cpp's default (the codes sit in L1 here either way)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include "cpu_tiles.h"

namespace {

constexpr int NG = 8;                 // groups of 32 inputs per call: one super-block of 256
constexpr int PAD = (SZ_PF + 2) * 2048;  // room for the tiles' prefetches past the super-block

struct Data {
    std::vector<uint8_t> qs, qh, scb, mnb;
    std::vector<int8_t> sc;
    std::vector<uint16_t> d16;
    std::vector<float> dd, sab;
    std::vector<int32_t> xk, xp, xh;
    explicit Data(int rows) : qs(2048 + PAD), qh(1024 + PAD), scb(128 + PAD), mnb(128 + PAD), sc(512 + PAD),
                              d16(16 * NG + PAD), dd(32 + PAD), sab(NG * rows), xk(NG * 8 * rows),
                              xp(NG * rows), xh(2 * NG * rows) {
        srand(7);
        for (auto& b : qs) b = rand();
        for (auto& b : qh) b = rand();
        for (auto& b : scb) b = rand() % 64;
        for (auto& b : mnb) b = rand() % 64;
        for (auto& b : sc) b = rand() % 256 - 128;
        for (auto& b : d16) b = 0x1400 + rand() % 512;  // small positive fp16 scales
        for (auto& v : dd) v = (rand() % 1000 + 1) * 1e-6f;
        for (auto& v : sab) v = (rand() % 1000 + 1) * 1e-3f;
        for (auto& v : xk) v = rand() & 0x7f7f7f7f;      // four int8 activations a word, within +-127
        for (auto& v : xp) v = rand() & 0x00ff00ff;      // q4's int16 pair sums of a super-block's halves
        for (auto& v : xh) v = rand() % 4000 - 2000;    // the halves' activation sums
    }
};

// One call of format `fmt` on rows [r0, r0 + R) of an S-row activation block, adding into facc [R][16].
void call(const Data& d, int fmt, int R, int S, int r0, float* facc) {
    const int i = R - 1;
    if (fmt == 0)
        TL::q4[i](d.qs.data(), d.scb.data(), d.mnb.data(), d.dd.data(), d.xk.data() + r0, d.xp.data() + r0,
                  d.sab.data() + r0, S, NG, facc);
    else if (fmt == 1)
        TL::q6[i](d.qs.data(), d.qh.data(), d.sc.data(), d.dd.data(), 8 * NG, d.xk.data() + r0, d.xh.data() + r0,
                  d.sab.data() + r0, S, facc);
    else
        TL::q50[i](d.qs.data(), d.qh.data(), d.d16.data(), 8 * NG, d.xk.data() + r0, d.xh.data() + r0,
                   d.sab.data() + r0, S, facc);
}

double ns_per_group_row(const Data& d, int fmt, int R, int windows, int calls) {
    alignas(64) float facc[SZ_TILE * 16] = {};
    double best = 1e30;
    for (int w = 0; w < windows; ++w) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) call(d, fmt, R, R, 0, facc);
        const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
        if (ns < best) best = ns;
    }
    volatile float sink = facc[0];
    (void)sink;
    return best / calls / (NG * R);
}

bool invariant(const Data& d, int fmt, int R) {
    alignas(64) float whole[SZ_TILE * 16] = {}, alone[SZ_TILE * 16] = {};
    call(d, fmt, R, R, 0, whole);
    for (int r = 0; r < R; ++r) call(d, fmt, 1, R, r, alone + 16 * r);
    return std::memcmp(whole, alone, sizeof(float) * 16 * R) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::fprintf(stderr, "usage: %s WINDOWS CALLS\n", argv[0]);
        return 2;
    }
    const int windows = std::atoi(argv[1]), calls = std::atoi(argv[2]);
    if (windows < 1 || calls < 1) {
        std::fprintf(stderr, "WINDOWS and CALLS must be positive\n");
        return 2;
    }
    const Data d(SZ_TILE);
    const char* names[] = {"q4", "q6", "q50"};
    for (int fmt = 0; fmt < 3; ++fmt)
        for (int R = 1; R <= SZ_TILE; ++R)
            std::printf("%s %d %.3f %d\n", names[fmt], R, ns_per_group_row(d, fmt, R, windows, calls),
                        invariant(d, fmt, R) ? 1 : 0);
    return 0;
}
