// V5's persistent walk with B shared by multicast (DG_CLUSTER_M = 2, the plain build), run on the
// host against a model. Built by tests/cpu/test_v5_walk.py; prints "checked N tiles, F failures".
//
// Block b is rank b % 2 of cluster b / 2 and walks t = b / 2, + grid / 2, ... as the kernel's warps
// do (the rank it plays is cluster_row()'s, through DG_HOST_CLUSTER_ROW). For several M, N and grid
// sizes:
//  * the two blocks of a cluster walk the same number of tiles, and at each step the same tile
//    column (they share B's stage) with rank 1 one tile row below rank 0;
//  * every tile of D is run exactly once;
//  * a tile past M (whose block runs the main loop on zero fill and stores nothing) is only ever
//    rank 1's, the partner of D's last tile row when the tile rows are odd.
static int host_rank = 0;
#define DG_HOST_CLUSTER_ROW host_rank
#include "v5_wgmma.cu"

#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "host.h"

static_assert(CLUSTER_M == 2, "build with DG_CLUSTER_M=2");

static void walk(int m, int n, int grid) {
    dg::KernelParams p{};
    p.m = m;
    p.n = n;
    const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    std::map<std::pair<int, int>, int> seen;   // (m0, n0) -> blocks that ran it
    for (int cluster = 0; cluster < grid / CLUSTER_M; ++cluster) {
        std::vector<std::pair<int, int>> steps[CLUSTER_M];
        for (int r = 0; r < CLUSTER_M; ++r) {
            host_rank = r;
            const int block = cluster * CLUSTER_M + r;
            TileWalk w(p);
            for (int t = w.seek(p, block / CLUSTER_M); t < w.end; t = w.seek(p, t + grid / CLUSTER_M)) {
                int m0 = -1, n0 = -1;
                w.tile(t, m0, n0);
                ++checked;
                steps[r].push_back({m0, n0});
                if (m0 < 0 || m0 % BM || n0 < 0 || n0 >= n || n0 % BN) {
                    FAIL("M %d N %d grid %d: block %d's tile (%d, %d) is not a tile of D", m, n, grid, block, m0, n0);
                } else if (m0 >= m) {   // past M: only the partner of an odd last tile row
                    if (r == 0 || m0 != tiles_m * BM || tiles_m % 2 == 0)
                        FAIL("M %d N %d grid %d: block %d (rank %d) runs (%d, %d), past M and not the last pair's "
                             "second tile", m, n, grid, block, r, m0, n0);
                } else {
                    ++seen[{m0, n0}];
                }
            }
        }
        if (steps[0].size() != steps[1].size()) {
            FAIL("M %d N %d grid %d: cluster %d's blocks walk %zu and %zu tiles", m, n, grid, cluster,
                 steps[0].size(), steps[1].size());
            continue;
        }
        for (size_t i = 0; i < steps[0].size(); ++i)
            if (steps[1][i].second != steps[0][i].second || steps[1][i].first != steps[0][i].first + BM)
                FAIL("M %d N %d grid %d: cluster %d step %zu: rank 0 at (%d, %d), rank 1 at (%d, %d), not the "
                     "tile below in the same column", m, n, grid, cluster, i, steps[0][i].first, steps[0][i].second,
                     steps[1][i].first, steps[1][i].second);
    }
    for (int tm = 0; tm < tiles_m; ++tm)
        for (int tn = 0; tn < tiles_n; ++tn) {
            const auto it = seen.find({tm * BM, tn * BN});
            const int count = it == seen.end() ? 0 : it->second;
            if (count != 1) FAIL("M %d N %d grid %d: tile (%d, %d) run %d times", m, n, grid, tm * BM, tn * BN, count);
        }
}

int main() {
    for (int grid : {2, 6, 14, 132})
        for (int m : {1, BM, BM + 1, 2 * BM, 3 * BM - 5, 17 * BM + 3, 40 * BM})
            for (int n : {1, BN, BN + 1, 3 * BN - 5, 19 * BN})
                walk(m, n, grid);
    std::printf("checked %lld tiles, %lld failures\n", checked, failures);
    return failures ? 1 : 0;
}
