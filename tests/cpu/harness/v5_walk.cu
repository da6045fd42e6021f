// V5's persistent tile walk (TileWalk over dg::GroupCursor, tile_coords) and its stage ring
// arithmetic (skip_stages), run on the host against a model. Built by tests/cpu/test_v5_walk.py
// with the grouped build's defines (DG_GROUPED = 1); prints "checked N tiles, F failures".
//
// For every group mode and group-size pattern (empty groups, one huge, many of one row, sizes
// either side of a tile edge, counts past the capacity, offsets out of range, negative sizes) and
// several grid sizes, every block walks t = blockIdx, + gridDim, ... as the kernel's warps do:
//  * each tile of each group with rows is visited exactly once, by one block, and no other tile;
//  * a group's rows (base, count) are what the mode says, clamped as the kernel documents: a
//    negative count is 0 rows and no group reaches past row M;
//  * the group's one-GEMM view (dg::group_params) starts A, D and C at the group's first row of its
//    own matrix (g * stride + that row in the operand's layout) and B and the bias at its own, with
//    the group's row count, and every leading dimension and stride distinct, so a swap shows.
// And skip_stages(stage, phase, k) lands where k single steps around the ring of STAGES land.
#include "v5_wgmma.cu"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <tuple>
#include <vector>

#include "host.h"

static const char* MODE_NAMES[] = {"batch", "masked", "sizes", "offsets"};

// The rows (base, count) the mode gives group g, restated from grouped.cuh's contract.
static std::vector<std::pair<int, int>> model_rows(int mode, const std::vector<int>& v, int groups, int m) {
    std::vector<std::pair<int, int>> out;
    int base = 0;
    for (int g = 0; g < groups; ++g) {
        if (mode == DG_GROUP_BATCH) {
            out.push_back({0, m});
        } else if (mode == DG_GROUP_MASKED) {
            out.push_back({0, std::min(std::max(v[g], 0), m)});
        } else if (mode == DG_GROUP_SIZES) {
            const int rows = std::min(std::max(v[g], 0), m - base);
            out.push_back({base, rows});
            base += rows;
        } else {
            const int lo = std::min(std::max(v[g], 0), m);
            const int hi = std::min(std::max(v[g + 1], lo), m);
            out.push_back({lo, hi - lo});
        }
    }
    return out;
}

// Byte distance from `from` to `to` (stand-in addresses: nothing is read through them).
static long long bytes(const void* from, const void* to) {
    return (long long)(reinterpret_cast<uintptr_t>(to) - reinterpret_cast<uintptr_t>(from));
}

// The view of group g (rows [base, base + rows)) against where the contract puts each operand.
static void check_view(const dg::KernelParams& p, const GemmParams& q, int mode, int g, int base, int rows) {
    const long long a_row = DG_A_ROW ? (long long)base * p.lda : base;   // element (base, 0) of A
    struct {
        const char* what;
        long long got, want;
    } fields[] = {
        {"A", bytes(p.a, q.a), (long long)sizeof(dg::in_t) * (g * p.stride_a + a_row)},
        {"B", bytes(p.b, q.b), (long long)sizeof(dg::in_t) * (g * p.stride_b)},
        {"D", bytes(p.d, q.d), (long long)sizeof(dg::out_t) * (g * p.stride_d + (long long)base * p.ldd)},
#if DG_C >= 0
        {"C", bytes(p.c, q.c), (long long)sizeof(typename dg::dtype<DG_C>::T) * (g * p.stride_c + (long long)base * p.ldc)},
#endif
#if DG_BIAS >= 0
        {"bias", bytes(p.bias, q.bias), (long long)sizeof(typename dg::dtype<DG_BIAS>::T) * (g * p.stride_bias)},
#endif
        {"rows", q.m, rows},
        {"lda", q.lda, p.lda}, {"ldb", q.ldb, p.ldb}, {"ldc", q.ldc, p.ldc}, {"ldd", q.ldd, p.ldd},
    };
    for (const auto& f : fields) {
        if (f.got != f.want)
            FAIL("%s group %d (rows [%d, +%d)): the view's %s is %lld, expected %lld", MODE_NAMES[mode], g, base, rows,
                 f.what, f.got, f.want);
    }
}

static void walk(int mode, std::vector<int> values, int groups, int m, int n, int grid) {
    dg::KernelParams p{};   // the grouped build: GroupedGemmParams
    p.groups = groups;
    p.group_mode = mode;
    p.group_rows = values.data();
    p.m = m;
    p.n = n;
    static char stand_in[6];   // distinct stand-in addresses for the operands
    p.a = stand_in, p.b = stand_in + 1, p.d = stand_in + 2, p.c = stand_in + 3, p.bias = stand_in + 4;
    p.lda = 1001, p.ldb = 1003, p.ldc = 1007, p.ldd = 1009;
    const bool contiguous = mode == DG_GROUP_SIZES || mode == DG_GROUP_OFFSETS;   // one A, D and C
    p.stride_a = contiguous ? 0 : 100003, p.stride_d = contiguous ? 0 : 400009, p.stride_c = contiguous ? 0 : 300007;
    p.stride_b = 200003, p.stride_bias = 5003;
    const int tiles_n = (n + BN - 1) / BN;
    const auto rows = model_rows(mode, values, groups, m);
    std::map<std::tuple<int, int, int>, int> seen;   // (group, m0, n0) -> blocks that ran it
    for (int block = 0; block < grid; ++block) {
        TileWalk w(p);
        for (int t = w.seek(p, block); t < w.end; t = w.seek(p, t + grid)) {
            int m0 = -1, n0 = -1;
            w.tile(t, m0, n0);
            const int g = w.group.g;
            ++checked;
            if (g < 0 || g >= groups) {
                FAIL("%s, %d groups, grid %d: block %d walked into group %d", MODE_NAMES[mode], groups, grid, block, g);
                break;
            }
            if (w.group.base != rows[g].first || w.group.rows != rows[g].second)
                FAIL("%s group %d: rows [%d, +%d), expected [%d, +%d)", MODE_NAMES[mode], g, w.group.base,
                     w.group.rows, rows[g].first, rows[g].second);
            check_view(p, w.view(p), mode, g, rows[g].first, rows[g].second);
            if (m0 < 0 || m0 >= w.group.rows || m0 % BM || n0 < 0 || n0 >= n || n0 % BN)
                FAIL("%s group %d (%d rows, N %d): tile at (%d, %d) is not one of its tiles", MODE_NAMES[mode], g,
                     w.group.rows, n, m0, n0);
            ++seen[{g, m0, n0}];
        }
    }
    long long expected = 0;
    for (int g = 0; g < groups; ++g)
        for (int m0 = 0; m0 < rows[g].second; m0 += BM)
            for (int tn = 0; tn < tiles_n; ++tn) {
                ++expected;
                const auto it = seen.find({g, m0, tn * BN});
                const int count = it == seen.end() ? 0 : it->second;
                if (count != 1)
                    FAIL("%s, %d groups, grid %d: group %d's tile (%d, %d) run %d times", MODE_NAMES[mode], groups,
                         grid, g, m0, tn * BN, count);
            }
    if ((long long)seen.size() != expected)
        FAIL("%s, %d groups, grid %d: %zu distinct tiles run, %lld exist", MODE_NAMES[mode], groups, grid,
             seen.size(), expected);
}

static void ring() {
    for (int stage = 0; stage < STAGES; ++stage)
        for (unsigned phase = 0; phase < 2; ++phase)
            for (int k = 0; k <= 5 * STAGES + 3; ++k) {
                int s = stage, want_s = stage;
                unsigned ph = phase, want_ph = phase;
                skip_stages(s, ph, k);
                for (int i = 0; i < k; ++i)
                    if (++want_s == STAGES) want_s = 0, want_ph ^= 1;
                ++checked;
                if (s != want_s || ph != want_ph)
                    FAIL("skip_stages from stage %d phase %u by %d: stage %d phase %u, expected %d %u", stage, phase, k,
                         s, ph, want_s, want_ph);
            }
}

int main() {
    const int T = BM;   // the tile's rows: patterns straddle it
    const std::vector<std::vector<int>> patterns = {
        {0, 0, 0}, {5 * T + 3}, {1, 1, 1, 1, 1, 1, 1}, {T - 1, T, T + 1, 0, 2 * T}, {0, 3 * T, 0, 1},
        {7, 900, 0, 33, 250, 1, 64}, {-5, T, 2}, {T, T, T, T}};
    for (int grid : {1, 3, 7, 132})
        for (int n : {1, BN, BN + 1, 3 * BN - 5}) {
            for (const auto& sizes : patterns) {
                const int groups = (int)sizes.size();
                int total = 0;
                for (int s : sizes) total += std::max(s, 0);
                walk(DG_GROUP_SIZES, sizes, groups, total, n, grid);
                walk(DG_GROUP_SIZES, sizes, groups, std::max(total - T / 2, 0), n, grid);   // sizes past M
                std::vector<int> offsets = {0};
                for (int s : sizes) offsets.push_back(offsets.back() + std::max(s, 0));
                walk(DG_GROUP_OFFSETS, offsets, groups, total, n, grid);
                std::vector<int> wild = offsets;                                             // out of range
                wild.front() = -3, wild.back() = total + 9;
                walk(DG_GROUP_OFFSETS, wild, groups, total, n, grid);
                walk(DG_GROUP_MASKED, sizes, groups, 2 * T + 5, n, grid);                    // counts past capacity
            }
            for (int groups : {1, 5, 64})
                for (int m : {0, 1, T, T + 3, 3 * T - 1}) walk(DG_GROUP_BATCH, std::vector<int>(1, 0), groups, m, n, grid);
        }
    ring();
    std::printf("checked %lld tiles, %lld failures\n", checked, failures);
    return failures ? 1 : 0;
}
