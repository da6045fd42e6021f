// V3's chunk loader (dg::ChunkTile: load, then store into the padded k-major float tile) run on the
// host, every thread of a block in turn, against a model. Built by tests/cpu/test_v3_chunks.py with
// one V3 variant's defines; prints "checked N chunks, F failures" and the first failures.
//
// For both operand tiles (BM and BN wide) in both layouts (k or x contiguous), tile origins and
// extents at and around the tile's edges, leading dimensions with and without padding, aligned or
// not (the kernel's `vec`):
//  * a 16-byte load reads 8 elements that are all in the matrix, from a 16-byte aligned address
//    (the operand's first element taken as aligned), and only when the operand may be read so;
//  * a 2-byte load reads an element of the matrix (not padding, not outside the operand);
//  * the tile holds, at S[k * LDS + x], the element (x0 + x, k0 + k) or zero outside the matrix,
//    for every x < BX and k < BK, each written exactly once.
#include <cstring>
#include <vector>

#include "host.h"

// The operand the loads below are checked against.
static struct {
    const unsigned short* base;
    long long span, ld;
    int inner;       // extent along the contiguous dimension (elements of a row that are matrix)
    bool vec;
    const char* what;
} cur;

[[maybe_unused]] static uint4 checked_load16(const unsigned short* p);
[[maybe_unused]] static unsigned short checked_load2(const unsigned short* p);
#define DG_HOST_LOAD16(ptr) checked_load16(ptr)
#define DG_HOST_LOAD2(ptr) checked_load2(ptr)
#include "deepgemm/tile_load.cuh"

[[maybe_unused]] static uint4 checked_load16(const unsigned short* p) {
    ++checked;
    const long long e = p - cur.base;
    if (!cur.vec) FAIL("%s: a 16-byte load from an operand that must be read element by element", cur.what);
    if (e % 8) FAIL("%s: a 16-byte load at element %lld is not 16-byte aligned", cur.what, e);
    if (e < 0 || e + 8 > cur.span) {
        FAIL("%s: a 16-byte load at element %lld leaves the operand's %lld", cur.what, e, cur.span);
        return make_uint4(0, 0, 0, 0);
    }
    if (e % cur.ld + 8 > cur.inner) FAIL("%s: a 16-byte load at element %lld reads row padding", cur.what, e);
    uint4 v;
    std::memcpy(&v, p, 16);
    return v;
}

[[maybe_unused]] static unsigned short checked_load2(const unsigned short* p) {
    const long long e = p - cur.base;
    if (e < 0 || e >= cur.span) {
        FAIL("%s: a 2-byte load at element %lld, outside the operand's %lld", cur.what, e, cur.span);
        return 0;
    }
    if (e % cur.ld >= cur.inner) FAIL("%s: a 2-byte load at element %lld reads row padding", cur.what, e);
    return *p;
}

constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, THREADS = (DG_BM / DG_TM) * (DG_BN / DG_TN), PAD = 4;

static float expected(int x, int k, bool kcontig) {   // the element's value as the tile holds it
    const unsigned short bits = kcontig ? value_at(x, k) : value_at(k, x);
    return dg::ChunkTile<32, 8, 36, 32, true>::bits_to_f32(bits);
}

template <int BX, bool KCONTIG>
static void check(const char* tile, int x0, int k0, int X, int K, long long ld, bool vec) {
    constexpr int LDS = BX + PAD;
    ++checked;
    // The operand: rows along the non-contiguous dimension, `inner` elements of each in the matrix.
    const int outer = KCONTIG ? X : K, inner = KCONTIG ? K : X;
    const Operand op(outer, inner, ld);
    char what[160];
    std::snprintf(what, sizeof what, "%s tile at (x %d, k %d), extents X %d K %d, ld %lld, %s", tile, x0, k0, X,
                  K, ld, vec ? "vector" : "scalar");
    cur = {op.base, op.span, ld, inner, vec, what};
    std::vector<float> s(BK * LDS, -1.0f);   // -1: never written (every value here is >= 0)
    std::vector<int> writes(BK * LDS, 0);
    for (int tid = 0; tid < THREADS; ++tid) {
        dg::ChunkTile<BX, BK, LDS, THREADS, KCONTIG> t;
        t.load(op.base, ld, vec, x0, k0, X, K, tid);
        std::vector<float> mine(BK * LDS, -2.0f);
        t.store(mine.data(), tid);
        for (int i = 0; i < BK * LDS; ++i)
            if (mine[i] != -2.0f) {
                ++writes[i];
                s[i] = mine[i];
            }
    }
    for (int k = 0; k < BK; ++k)
        for (int x = 0; x < BX; ++x) {
            const int at = k * LDS + x;
            const bool in = x0 + x < X && k0 + k < K;
            const float want = in ? expected(x0 + x, k0 + k, KCONTIG) : 0.0f;
            if (writes[at] != 1) FAIL("%s: S[%d][%d] written %d times", what, k, x, writes[at]);
            else if (s[at] != want) FAIL("%s: S[%d][%d] holds %g, expected %g", what, k, x, s[at], want);
        }
    for (int k = 0; k < BK; ++k)
        for (int x = BX; x < LDS; ++x)
            if (writes[k * LDS + x]) FAIL("%s: the row pad S[%d][%d] was written", what, k, x);
}

template <int BX, bool KCONTIG>
static void sweep(const char* tile) {
    for (int x0 : {0, BX})
        for (int k0 : {0, BK})
            for (int x_more : {1, 9, BX - 1, BX, BX + 5})
                for (int k_more : {1, 9, BK - 1, BK, BK + 2}) {
                    const int X = x0 + x_more, K = k0 + k_more;
                    const int inner = KCONTIG ? K : X;
                    const int up8 = (inner + 7) / 8 * 8;
                    for (long long ld : {(long long)inner, (long long)inner + 1, (long long)up8, (long long)up8 + 8}) {
                        if (ld < inner) continue;
                        check<BX, KCONTIG>(tile, x0, k0, X, K, ld, false);
                        if (ld % 8 == 0) check<BX, KCONTIG>(tile, x0, k0, X, K, ld, true);
                    }
                }
}

int main() {
    sweep<BM, true>("A row-major (k contiguous)");
    sweep<BM, false>("A col-major (m contiguous)");
    sweep<BN, false>("B row-major (n contiguous)");
    sweep<BN, true>("B col-major (k contiguous)");
    std::printf("checked %lld chunks, %lld failures\n", checked, failures);
    return failures ? 1 : 0;
}
