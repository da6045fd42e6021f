// V4's operand loader (v4::load_tile, a __host__ __device__ function) run on the host, every thread
// of a block in turn, against a model of what it must do. Built by tests/cpu/test_v4_loader.py with
// one tile config's defines; prints "checked N loads, F failures" and the first failures.
//
// For each tile shape (A and B, both layouts), tile origins and matrix extents at and around the
// tile's edges, leading dimensions with and without padding, and each path the kernel may take
// there (FULL: the tile inside the matrix and 16-byte aligned rows; EDGE: aligned rows; SCALAR):
//  * a cp.async (copy16) copies 0 or 16 bytes, never a count between: compute-sanitizer's
//    memcheck counts all 16 bytes as read whatever the count;
//  * a 16-byte copy reads 8 elements that are all in the matrix (not row padding, not past the
//    operand's last element) from a 16-byte aligned address (the operand's first element taken as
//    aligned: a misaligned operand always takes the scalar loads);
//  * the scalar loads read nothing outside the operand: it ends at the end of a readable page
//    with an inaccessible page after it (and before it), so such a read stops the harness;
//  * every shared-memory slot of the tile is written exactly once, with the element the tile
//    layout (tile_off) puts there, or zero outside the matrix.
// And the block raster (v4::block_coords): every tile of grids up to 40 x 40 (and a few wide and
// tall ones) gets exactly one block.
#include "v4_mma.cu"

#include <vector>

#include "host.h"

template <int OUTER, int INNER>
static void check(const char* tile, int o0, int i0, int o_ext, int i_ext, long long ld, int path) {
    const Operand op(o_ext, i_ext, ld);
    const long long span = op.span;
    static const char* names[] = {"FULL", "EDGE", "SCALAR"};
    char what[160];
    std::snprintf(what, sizeof what, "%s tile at (%d, %d), extents %d x %d, ld %lld, %s", tile, o0, i0, o_ext,
                  i_ext, ld, names[path]);
    std::vector<int> smem(OUTER * (INNER + v4::PAD), -1);   // -1: never written
    auto put = [&](int soff, int k, int v) {
        if (smem[soff + k] != -1) FAIL("%s: shared slot %d written twice", what, soff + k);
        smem[soff + k] = v;
    };
    const dg::in_t* g = reinterpret_cast<const dg::in_t*>(op.base);
    for (int tid = 0; tid < v4::THREADS; ++tid) {
        v4::load_tile<OUTER, INNER>(
            g, ld, o0, i0, o_ext, i_ext, path, tid,
            [&](int soff, const dg::in_t* src, int bytes) {
                ++checked;
                if (bytes != 0 && bytes != 16)
                    FAIL("%s: thread %d: cp.async of %d bytes (memcheck counts 16 as read)", what, tid, bytes);
                const long long e = reinterpret_cast<const unsigned short*>(src) - op.base;
                if (bytes > 0 && e % 8 != 0)   // the operand's base counts as 16-byte aligned
                    FAIL("%s: thread %d: cp.async source at element %lld is not 16-byte aligned", what, tid, e);
                for (int k = 0; k < 8; ++k) {
                    int v = 0;
                    if (2 * k < bytes) {
                        const long long at = e + k;
                        if (at < 0 || at >= span) {
                            FAIL("%s: thread %d: cp.async reads element %lld, outside the operand's %lld", what,
                                 tid, at, span);
                        } else {
                            if (at % ld >= i_ext)
                                FAIL("%s: thread %d: cp.async reads row padding (%lld, %lld)", what, tid, at / ld,
                                     at % ld);
                            v = op.base[at];
                        }
                    }
                    put(soff, k, v);
                }
            },
            [&](int soff, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
                ++checked;
                const unsigned w[4] = {w0, w1, w2, w3};
                for (int k = 0; k < 8; ++k) put(soff, k, (w[k / 2] >> (16 * (k % 2))) & 0xFFFF);
            });
    }
    for (int r = 0; r < OUTER; ++r)
        for (int c = 0; c < INNER; ++c) {
            const int at = v4::tile_off<INNER>(r, c / 8) + c % 8;
            const bool in = o0 + r < o_ext && i0 + c < i_ext;
            const int want = in ? value_at(o0 + r, i0 + c) : 0;
            if (smem[at] != want)
                FAIL("%s: tile (%d, %d) holds %d, expected %d", what, r, c, smem[at], want);
        }
}

template <int OUTER, int INNER>
static void sweep(const char* tile) {
    for (int o0 : {0, OUTER})
        for (int i0 : {0, INNER})
            for (int o_more : {1, OUTER - 1, OUTER, OUTER + 3})
                for (int i_more : {1, 3, 7, 8, 9, 12, INNER - 5, INNER, INNER + 2}) {
                    const int o_ext = o0 + o_more, i_ext = i0 + i_more;
                    const int up8 = (i_ext + 7) / 8 * 8;
                    for (long long ld : {(long long)i_ext, (long long)i_ext + 1, (long long)up8, (long long)up8 + 8}) {
                        if (ld < i_ext) continue;
                        const bool vec = ld % 8 == 0;   // and a 16-byte aligned base: the kernel's test
                        check<OUTER, INNER>(tile, o0, i0, o_ext, i_ext, ld, v4::SCALAR);
                        if (vec) check<OUTER, INNER>(tile, o0, i0, o_ext, i_ext, ld, v4::EDGE);
                        if (vec && o0 + OUTER <= o_ext && i0 + INNER <= i_ext)
                            check<OUTER, INNER>(tile, o0, i0, o_ext, i_ext, ld, v4::FULL);
                    }
                }
}

static void raster(int grid_m, int grid_n) {
    std::vector<int> hits((size_t)grid_m * grid_n, 0);
    for (int pid = 0; pid < grid_m * grid_n; ++pid) {
        int bm = -1, bn = -1;
        v4::block_coords(pid, grid_m, grid_n, bm, bn);
        ++checked;
        if (bm < 0 || bm >= grid_m || bn < 0 || bn >= grid_n) {
            FAIL("raster %d x %d: block %d -> tile (%d, %d), outside the grid", grid_m, grid_n, pid, bm, bn);
            continue;
        }
        ++hits[(size_t)bm * grid_n + bn];
    }
    for (size_t t = 0; t < hits.size(); ++t)
        if (hits[t] != 1) FAIL("raster %d x %d: tile (%zu, %zu) run by %d blocks", grid_m, grid_n, t / grid_n,
                               t % grid_n, hits[t]);
}

int main() {
    for (int gm = 1; gm <= 40; ++gm)
        for (int gn = 1; gn <= 40; ++gn) raster(gm, gn);
    raster(1, 1000), raster(1000, 1), raster(129, 257), raster(DG_GROUP_M * 7 + 3, 33);
    sweep<v4::BM, v4::BK>("A row-major");   // the four operand tiles: (outer, inner) = (m, k), (k, m),
    sweep<v4::BK, v4::BM>("A col-major");   // (k, n) and (n, k)
    sweep<v4::BK, v4::BN>("B row-major");
    sweep<v4::BN, v4::BK>("B col-major");
    std::printf("checked %lld loads, %lld failures\n", checked, failures);
    return failures ? 1 : 0;
}
