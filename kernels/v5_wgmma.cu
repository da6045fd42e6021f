// V5: Hopper (sm_90a only). TMA copies 128-byte-swizzled tiles into a STAGES-deep shared-memory
// ring guarded by mbarriers; one producer warpgroup issues the copies (and, with a 16-bit residual,
// the residual's, into the epilogue's staging tiles: C_STAGED below), BM / 64 consumer warpgroups
// (two by default) run wgmma.mma_async (64 x BN each, so a block computes BM x BN of D) and the
// shared epilogue chain. BM = 64 (one consumer) is for few rows (decode batches, small groups): a
// 128-row tile there is half zero fill, which TMA writes and wgmma multiplies all the same. With
// DG_PINGPONG the two consumers instead take whole tiles in turn (see PINGPONG below).
// setmaxnreg moves registers from the producer (which needs few) to the consumers (BN/2 FP32
// accumulators each). The grid is persistent: one block per SM walks the tiles in grouped order
// (GROUP_M tile-rows at a time, so the B columns in flight stay in L2).
//
// Layouts go through the tensor maps, never through a copy: a row-major A is K-major in shared
// memory and a column-major A is M-major; B row-major (b[k*ldb+n]) is N-major, column-major
// (nn.Linear's w.T) K-major. wgmma reads either major-ness for 16-bit types (imm-trans-a/b).
// TMA fills out-of-bounds boxes with zeros, so M, N, K tails need no code in the main loop.
// Requirements TMA imposes (checked on the host, deepgemm/tma.py): 16-byte-aligned bases and
// leading dimensions that are multiples of 8 elements; operands that miss them are staged by the
// host into an aligned copy, and a D that misses them (or is FP32) is written with direct stores.
//
// Batched and grouped problems (DG_GROUPED = 1; the modes in deepgemm/grouped.cuh): one launch,
// one persistent walk over the tiles of every group in turn (group g: ceil(rows_g / BM) x
// ceil(N / BN) tiles, in GROUP_M order within the group), so the host neither launches per group
// nor reads the group sizes, and a group without rows has no tiles. A and B come through 3-D maps
// whose third coordinate is the group (a map of depth 1 for an operand every group shares, and for
// the contiguous modes' A, whose groups are row ranges of one matrix). In the batch and masked modes
// TMA's zero fill clips each group at M; in the contiguous modes a tile's rows past its group's end
// are the next group's: computed, never stored. The host stages nothing for a grouped problem: it
// refuses operands TMA cannot read (registry's V5 supports()).
#include "deepgemm/hopper.cuh"
#include "deepgemm/grouped.cuh"
#include "deepgemm/stress.cuh"

#ifndef DG_BM
#define DG_BM 128          // 128 (two consumer warpgroups), 64 (one) or 256 (two, 128 rows each)
#endif
#ifndef DG_BN
#define DG_BN 256          // 64, 96, 128, 192 or 256 (wgmma m64n{BN}k16); 96 needs a K-major B
#endif
#ifndef DG_STAGES
#define DG_STAGES 3
#endif
#ifndef DG_GROUP_M
#define DG_GROUP_M 8
#endif
#ifndef DG_EPI_TMA
#define DG_EPI_TMA 1       // 1: stage 16-bit D tiles in shared memory and write them with TMA stores
#endif
#ifndef DG_SPLIT_K
#define DG_SPLIT_K 1       // > 1: a cluster of DG_SPLIT_K blocks per tile, one K slice each (few tiles, long K)
#endif
#ifndef DG_PINGPONG
#define DG_PINGPONG 0      // 1: the consumer warpgroups take whole tiles in turn (below)
#endif
#ifndef DG_CLUSTER_M
#define DG_CLUSTER_M 1     // 2: a cluster of two blocks takes two tiles one above the other and shares B (below)
#endif

constexpr int BM = DG_BM;
constexpr int BN = DG_BN;
constexpr int BK = 64;                    // 64 16-bit values = one 128-byte swizzle row
constexpr int STAGES = DG_STAGES;
constexpr int CONSUMERS = BM < 128 ? 1 : 2;   // consumer warpgroups
// Ping-pong (DG_PINGPONG): each consumer computes every other tile of the block's walk whole, as
// HALVES 64-row halves, and the two main loops take turns, so one consumer's epilogue runs while
// the other's wgmmas keep the tensor cores busy; cooperative (the default), both consumers share
// each tile (64 rows each, or at BM = 256 two 64-row halves each: one tile per block where N is
// small, e.g. attention's P x V with 64 columns, so that each block reads B once per 256 rows) and
// the tensor cores wait while they run the epilogue.
constexpr bool PINGPONG = DG_PINGPONG;
constexpr int HALVES = BM / 64 / (PINGPONG ? 1 : CONSUMERS);
// The 64-row block of a tile that half h of consumer c computes: its rows of A in a stage, of C in
// the loader's boxes, of D in the stores (ping-pong: each consumer's whole tile).
__host__ __device__ constexpr int tile_block(int c, int h) { return PINGPONG ? h : c * HALVES + h; }
constexpr int THREADS = 128 * (CONSUMERS + 1);
constexpr int A_STAGE_BYTES = BM * BK * 2;
constexpr int B_STAGE_BYTES = BN * BK * 2;
constexpr int STAGE_BYTES = A_STAGE_BYTES + B_STAGE_BYTES;
constexpr int BOX_BYTES = 64 * 64 * 2;    // one 64 x 64 box (the M/N-major loads)
constexpr int ACC = BN / 2;               // FP32 accumulators per consumer thread (per half, ping-pong)
constexpr int SPLIT = DG_SPLIT_K;
// B shared by multicast (DG_CLUSTER_M = 2): the two blocks of a cluster walk tile pairs (tile rows
// 2i and 2i + 1 of one tile column, so the same B), and each block's producer loads half of B's
// stage into both blocks' rings with one TMA multicast, halving B's traffic from L2. A stage is
// then written by both producers, so each block's empty barrier counts both blocks' consumers, and
// a block's full barrier the bytes of its own A and of both halves of B. Where the tile rows are
// odd the last pair's second tile lies past M: that block runs the main loop on TMA's zero fill
// (its half of B is still needed) and stores nothing.
constexpr int CLUSTER_M = DG_CLUSTER_M;
constexpr int EPI_BATCH = 16;             // C values a consumer thread loads before using them
// A 16-bit C is loaded by TMA into the D staging tile that will hold the same rows of D, while the
// main loop runs: a loader thread of the producer warpgroup (warp 1) issues the loads, so the
// consumers spend nothing on C before their epilogue, which reads it from shared memory; D then
// takes each value's place. Not with split-K (only one rank finishes a tile) nor without the
// staging tile.
#if DG_C == DG_F16 || DG_C == DG_BF16
constexpr bool C_STAGED = DG_EPI_TMA && DG_OUT != DG_F32 && DG_SPLIT_K == 1;
using staged_c_t = typename dg::dtype<DG_C>::T;
#else
constexpr bool C_STAGED = false;
using staged_c_t = __half;   // unused
#endif
// The bias of each tile's BN columns is staged the same way, as FP32 (zero past N), by the whole
// loader warp, so the epilogue reads it from shared memory instead of waiting for global loads
// (Nsight Compute at 8192 x 8192 x 1024: the conversions after the bias loads were the epilogue's
// longest stalls). One slot per tile in flight: per consumer with ping-pong, else one. Not for a
// ping-pong chain without a staged C: the loader's hand-back before each main loop cost more
// (+11 us at 8192 x 8192 x 1024 with bias + GELU) than the staged bias saved.
constexpr bool BIAS_STAGED = DG_BIAS >= 0 && DG_EPI_TMA && DG_OUT != DG_F32 && DG_SPLIT_K == 1 &&
                             (C_STAGED || !PINGPONG);
constexpr bool LOADER = C_STAGED || BIAS_STAGED;   // warp 1 of the producer warpgroup loads them
constexpr int LOADER_ARRIVALS = BIAS_STAGED ? 32 : 1;   // per tile on each c_full: every lane that stores bias
// D staging for the epilogue: per unit (one consumer's 64 rows of a tile, or with ping-pong one of
// its two halves) 64 rows x BN, as ceil(BN/64) boxes of 64 x 64 16-bit values (8 KB, 128-byte
// swizzled like the operand tiles). Reserved whenever DG_EPI_TMA is on; used for 16-bit D (TMA
// stores where D allows them, else row-by-row stores) and a staged C; FP32 D is stored directly.
constexpr int D_BOXES = (BN + 63) / 64;
constexpr int UNITS = CONSUMERS * HALVES;
constexpr int D_STAGE_BYTES = DG_EPI_TMA ? UNITS * D_BOXES * 8192 : 0;
constexpr int BIAS_SLOTS = PINGPONG ? 2 : 1;
constexpr int BIAS_STAGE_BYTES = DG_EPI_TMA ? BIAS_SLOTS * BN * 4 : 0;
// Shared memory: up to 1 KB to reach the swizzle atom's 1024-byte alignment, the ring, the D
// staging, then the full/empty mbarriers of the ring and, with the staging, each unit's c_full /
// d_free pair (its C and bias have landed / its last D store has read it), c_start (the loader
// may begin) and the bias slots. Mirrored by registry._wgmma_smem.
constexpr int SMEM_BYTES = 1024 + STAGES * STAGE_BYTES + D_STAGE_BYTES + 2 * STAGES * 8 +
                           (DG_EPI_TMA ? 2 * UNITS * 8 + 8 : 0) + BIAS_STAGE_BYTES;

constexpr int A_TRANS = DG_A_ROW ? 0 : 1;   // 0: K-major
constexpr int B_TRANS = DG_B_ROW ? 1 : 0;
static_assert(BM == 64 || BM == 128 || BM == 256, "DG_BM must be 64, 128 or 256");
// A consumer holds HALVES x BN / 2 accumulators per thread: at most 128 (232 registers each).
static_assert(BM != 256 || (BN <= 128 && !PINGPONG && DG_SPLIT_K == 1 && DG_CLUSTER_M == 1),
              "DG_BM = 256: at most 128 wide, cooperative, no split-K, no multicast");
static_assert(BN == 64 || BN == 96 || BN == 128 || BN == 192 || BN == 256, "DG_BN must be 64, 96, 128, 192 or 256");
// An N-major B is loaded and read by wgmma in 64-column swizzle blocks; a 96-wide tile would end
// mid-block (deepgemm/registry.py refuses that config for row-major B before compiling it).
static_assert(BN % 64 == 0 || B_TRANS == 0, "DG_BN = 96 needs a K-major (column-major) B");
static_assert(SMEM_BYTES <= 232448, "shared memory ring too large for sm_90");
#ifdef DG_HOST_SMEM_BYTES   // what the host launches with (deepgemm/registry.py): the same bytes
static_assert(SMEM_BYTES == DG_HOST_SMEM_BYTES, "the host's dynamic shared memory size differs from SMEM_BYTES");
#endif
static_assert(SPLIT >= 1 && SPLIT <= 8, "DG_SPLIT_K: 1..8 (a portable cluster size)");
// A ping-pong consumer holds a whole tile's accumulators (HALVES x BN / 2 per thread).
static_assert(!PINGPONG || (BM == 128 && BN <= 128 && SPLIT == 1), "DG_PINGPONG: 128 x BN tiles, BN <= 128, no split-K");
// Split-K parks and sums one half's accumulators per consumer.
static_assert(HALVES == 1 || SPLIT == 1, "DG_SPLIT_K > 1 takes one 64-row half per consumer");
// Split-K parks a block's partial sums (every consumer thread's ACC floats) in its idle ring.
static_assert(SPLIT == 1 || STAGES * STAGE_BYTES >= CONSUMERS * 128 * ACC * 4, "ring too small for split-K partials");
// A split-K launch is one cluster per tile, which needs the tile count on the host: a grouped
// launch's depends on group sizes the host never reads.
static_assert(SPLIT == 1 || !DG_GROUPED, "DG_SPLIT_K > 1 has no grouped build");
static_assert(CLUSTER_M == 1 || CLUSTER_M == 2, "DG_CLUSTER_M must be 1 or 2");
static_assert(CLUSTER_M == 1 || (SPLIT == 1 && !DG_GROUPED), "DG_CLUSTER_M = 2: no split-K (its own clusters), no grouped build");
// Each block loads whole 64-column boxes of an N-major B.
static_assert(CLUSTER_M == 1 || B_TRANS == 0 || (BN / 64) % CLUSTER_M == 0, "DG_CLUSTER_M = 2 with a row-major B: BN / 64 even");

#if DG_SPLIT_K > 1
#define DG_CLUSTER_DIMS __cluster_dims__(DG_SPLIT_K, 1, 1)
#elif DG_CLUSTER_M > 1
#define DG_CLUSTER_DIMS __cluster_dims__(DG_CLUSTER_M, 1, 1)
#else
#define DG_CLUSTER_DIMS
#endif

// An M/N-major operand whose 64-wide blocks lie `block_bytes` apart: LBO = that stride, SBO = 1024 B
// between 8-row k groups (CUTLASS's canonical GMMA layout; the exchanged assignment is wrong, and
// the GPU sweep's M/N-major layouts would catch it).
__device__ __forceinline__ unsigned long long mn_major_desc(unsigned addr, unsigned block_bytes) {
    return dg::smem_desc(addr, block_bytes, 1024);
}

// Whether D goes out through TMA stores: 16-bit output, whole 64-column boxes per tile, 16-byte-
// aligned base, row pitch and row length. The row length matters because a TMA store writes the
// last partial 16 bytes of a row whole (seen on the H200: N = 517, ld = 520 overwrote columns
// 517-519). The host builds tma_d under the same condition (deepgemm/tma.py, _d_plan); grouped, the
// groups' D must lie a whole number of 16 bytes apart as well (the map's third stride).
__device__ __forceinline__ bool d_by_tma(const dg::KernelParams& p) {
    return DG_EPI_TMA && DG_OUT != DG_F32 && BN % 64 == 0 && reinterpret_cast<unsigned long long>(p.d) % 16 == 0 &&
           (p.ldd * (long long)sizeof(dg::out_t)) % 16 == 0 && (p.n * (long long)sizeof(dg::out_t)) % 16 == 0
#if DG_GROUPED
           && p.stride_d >= 0 && (p.stride_d * (long long)sizeof(dg::out_t)) % 16 == 0
#endif
        ;
}

// Whether some 64-row halves of D go out row by row beside others stored by TMA: a grouped
// build's halves at a group's end, in every mode but batches (whose groups all end at M, where the
// map ends too).
__device__ __forceinline__ bool some_rows_stored(const dg::KernelParams& p) {
#if DG_GROUPED
    return p.group_mode != DG_GROUP_BATCH;
#else
    (void)p;
    return false;
#endif
}

// Byte address of (row r < 64, column col < BN) in a consumer's D staging tile: BN/64 boxes of
// 64 rows x 128 bytes, 16-byte chunks XOR-swizzled by row (the TMA 128-byte swizzle).
__device__ __forceinline__ unsigned d_stage_addr(unsigned tile, int r, int col) {
    return tile + (col / 64) * 8192 + r * 128 + ((((col % 64) / 8) ^ (r % 8)) * 16) + (col % 8) * 2;
}

// Write a consumer's staged 64 x BN tile to D at (row0, col0) without TMA: warp w takes rows
// w, w + 4, ...; lane l the columns 2l, 2l + 1 (+ 64 j) as one 4-byte store where D's base and
// pitch allow pairs, else column l (+ 32 j) as 2-byte stores. Either way a warp's store covers
// consecutive bytes of one row. Bounds-checked per element (edge tiles).
__device__ __forceinline__ void store_rows_coalesced(const GemmParams& p, unsigned tile, int row0, int col0,
                                                     int warp, int lane, bool pairs) {
    dg::out_t* d = static_cast<dg::out_t*>(p.d);
    for (int r = warp; r < 64; r += 4) {
        const int row = row0 + r;
        if (row >= p.m) break;
        dg::out_t* d_row = d + (long long)row * p.ldd + col0;
        if (pairs) {
#pragma unroll
            for (int j = 0; j < D_BOXES; ++j) {
                const int col = 64 * j + 2 * lane;
                if (col >= BN) break;
                unsigned v = dg::ld_shared_b32(d_stage_addr(tile, r, col));
                if (col0 + col + 1 < p.n) {
#ifndef __CUDA_ARCH__
                    DG_HOST_ALIGNED(d_row + col, 4);   // a host build traps on a misaligned pair, as a GPU does
#endif
                    *reinterpret_cast<unsigned*>(d_row + col) = v;
                } else if (col0 + col < p.n) {
                    d_row[col] = *reinterpret_cast<dg::out_t*>(&v);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < BN / 32; ++j) {
                const int col = 32 * j + lane;
                unsigned short v = dg::ld_shared_u16(d_stage_addr(tile, r, col));
                if (col0 + col < p.n) *reinterpret_cast<unsigned short*>(d_row + col) = v;
            }
        }
    }
}

// Whether the epilogue reads the chain's operands in pairs at this tile (chain_paired): aligned
// pairs, and pairs that end inside the row (N even) wherever the tile reaches past N or M.
__device__ __forceinline__ bool paired_ok(const GemmParams& q, int m0, int n0) {
    const bool interior = m0 + BM <= q.m && n0 + BN <= q.n;
    return dg::HAS_EPILOGUE && dg::chain_pairs_ok(q) && (interior || q.n % 2 == 0);
}

// Whether the host built C's tensor map (deepgemm/tma.py, _c_plan, under the same condition):
// a 16-bit C (C_STAGED) with a 16-byte-aligned base and row pitch, and grouped, a group stride of
// whole 16 bytes (the map's third stride).
__device__ __forceinline__ bool c_by_tma(const dg::KernelParams& p) {
    return C_STAGED && reinterpret_cast<unsigned long long>(p.c) % 16 == 0 && p.ldc % 8 == 0
#if DG_GROUPED
           && p.stride_c >= 0 && p.stride_c % 8 == 0
#endif
        ;
}

// Whether C is staged at the tile (m0, n0) of the group view q: C's map exists and the chain reads
// its operands in pairs there. The loader and the consumers decide alike, tile by tile.
__device__ __forceinline__ bool c_staged_ok(const dg::KernelParams& p, const GemmParams& q, int m0, int n0) {
    return c_by_tma(p) && paired_ok(q, m0, n0);
}

// C(r, col), C(r, col + 1) of a staged tile (r < 64, col < BN even) as FP32.
__device__ __forceinline__ float2 staged_c_pair(unsigned tile, int r, int col) {
    using c2_t = typename dg::pair_of<staged_c_t>::T;
    unsigned bits = dg::ld_shared_b32(d_stage_addr(tile, r, col));
    const c2_t v = *reinterpret_cast<const c2_t*>(&bits);
    return make_float2(dg::to_f32(v.x), dg::to_f32(v.y));
}

// The chain over a consumer thread's accumulators, in place, when its operands come in pairs
// (paired_ok): acc[4j + 2h + e] is D(row0 + 8h, col0 + 8j + e). c_pair(h, j) gives C at
// (row0 + 8h, col0 + 8j + {0, 1}) as FP32; column_pair(col, inside, c0, c1) the bias and scale of
// columns col, col + 1 (dg::load_column_pair's contract). They are read EPI_BATCH values at a time
// before they are used (all at once spills), and a load of a column past N is predicated off, not
// branched around.
template <class CPair, class ColumnPair>
__device__ __forceinline__ void chain_paired(float (&acc)[ACC], const GemmParams& q, int col0, CPair c_pair,
                                             ColumnPair column_pair) {
#pragma unroll
    for (int i0 = 0; i0 < ACC; i0 += EPI_BATCH) {
        dg::Column cols[EPI_BATCH / 2];
        float2 c_val[EPI_BATCH / 2];
#pragma unroll
        for (int j = 0; j < EPI_BATCH / 4; ++j) {   // 8 columns apart; N is even past an edge
            const int col = col0 + 8 * (i0 / 4 + j);
            column_pair(col, col < q.n, cols[2 * j], cols[2 * j + 1]);
            c_val[2 * j] = c_pair(0, i0 / 4 + j);
            c_val[2 * j + 1] = c_pair(1, i0 / 4 + j);
        }
#pragma unroll
        for (int j = 0; j < EPI_BATCH / 2; ++j) {   // acc[i0 + 2j], acc[i0 + 2j + 1]: one row's pair
            const int i = i0 + 2 * j;
            const dg::Column& c0 = cols[2 * (j / 2)];
            const dg::Column& c1 = cols[2 * (j / 2) + 1];
            acc[i] = dg::add_residual(dg::chain_columnwise(acc[i], c0, q), c_val[j].x, q);
            acc[i + 1] = dg::add_residual(dg::chain_columnwise(acc[i + 1], c1, q), c_val[j].y, q);
        }
    }
}

// The ring position `kblocks` k-blocks on: stage s of phase parity `phase`.
__host__ __device__ __forceinline__ void skip_stages(int& stage, unsigned& phase, int kblocks) {
    stage += kblocks;
    phase ^= (stage / STAGES) & 1;
    stage %= STAGES;
}

// Tile t of the persistent walk -> (tile row, tile column), GROUP_M tile-rows per group.
__host__ __device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
    const int per_group = DG_GROUP_M * tiles_n;
    const int first_m = (t / per_group) * DG_GROUP_M;
    const int rows = min(tiles_m - first_m, DG_GROUP_M);
    const int r = t % per_group;
    tm = first_m + r % rows;
    tn = r / rows;
}

// This block's tile row within a pair of DG_CLUSTER_M = 2 (its cluster rank; 0 without multicast).
// A host build of the walk (tests/cpu/harness/v5_cluster_walk.cu) names the rank it plays.
__host__ __device__ __forceinline__ int cluster_row() {
#if defined(__CUDA_ARCH__) && DG_CLUSTER_M > 1
    return (int)dg::cluster_rank();
#elif !defined(__CUDA_ARCH__) && defined(DG_HOST_CLUSTER_ROW)
    return DG_HOST_CLUSTER_ROW;
#else
    return 0;
#endif
}

// The persistent walk over tiles t = blockIdx.x, + gridDim.x, ...: after seek(p, t), tile t exists
// if t < end, and tile(t, ...) gives its corner (m0 counted from its group's first row, n0). t only
// grows, so the grouped walk scans the groups once per block; the producer and the consumers walk
// alike and so agree on every tile and k-block without talking.
struct TileWalk {
    int tiles_m, tiles_n;   // plain: D's; grouped: the current group's tile rows, every group's columns
    int end;                // the first t past the current group's tiles (plain: past every tile)
#if DG_GROUPED
    dg::GroupCursor group;  // the current group; its tiles are t in [first, end)
    int first = 0;

    __host__ __device__ __forceinline__ explicit TileWalk(const dg::KernelParams& p)
        : tiles_m(0), tiles_n((p.n + BN - 1) / BN), end(0) {}

    // On to tile t's group, passing groups without rows (they have no tiles); past the last group
    // end stays at or below t, which ends the walk. Returns t.
    __host__ __device__ __forceinline__ int seek(const dg::KernelParams& p, int t) {
        if (p.group_mode == DG_GROUP_BATCH) {
            // Every batch has p.m rows, so t's group is one division away. Walking there group by
            // group passed gridDim.x / (tiles per group) groups per tile, in every consumer warp:
            // Nsight Compute found that loop holding about 30 % of the warps' stall samples in
            // batches of K = 64 (docs/performance.md, batched and grouped GEMM).
            if (t >= end) {
                tiles_m = (p.m + BM - 1) / BM;
                const int per = tiles_m * tiles_n;
                const int g = per > 0 ? t / per : p.groups;
                group.g = min(g, p.groups);
                if (g < p.groups) {
                    group.base = 0;
                    group.rows = p.m;
                    first = g * per;
                    end = first + per;
                }
            }
            return t;
        }
        while (t >= end && group.next(p)) {
            first = end;
            tiles_m = (group.rows + BM - 1) / BM;
            end = first + tiles_m * tiles_n;
        }
        return t;
    }
    __host__ __device__ __forceinline__ void tile(int t, int& m0, int& n0) const {
        int tm, tn;
        tile_coords(t - first, tiles_m, tiles_n, tm, tn);
        m0 = tm * BM;
        n0 = tn * BN;
    }
    // Row r of the current group as a row of an operand's map: contiguous groups are row ranges of
    // one A and D; a batched or masked group's rows count from 0 in its own matrix (base = 0).
    __host__ __device__ __forceinline__ int row(int r) const { return group.base + r; }
    // The maps' third coordinate for A, B, D and C: the group, or 0 where every group shares the
    // operand (stride 0: a map of depth 1).
    __host__ __device__ __forceinline__ int z_a(const dg::KernelParams& p) const { return p.stride_a ? group.g : 0; }
    __host__ __device__ __forceinline__ int z_b(const dg::KernelParams& p) const { return p.stride_b ? group.g : 0; }
    __host__ __device__ __forceinline__ int z_d(const dg::KernelParams& p) const { return p.stride_d ? group.g : 0; }
    __host__ __device__ __forceinline__ int z_c(const dg::KernelParams& p) const { return p.stride_c ? group.g : 0; }
    // The tile's group as one GEMM (its D, C and bias; rows counted from m0's origin).
    __host__ __device__ __forceinline__ GemmParams view(const dg::KernelParams& p) const {
        return dg::group_params(p, group.g, group.base, group.rows);
    }
#else
    // One "group": D. seek, row and z are static, the identity or 0, so the plain build compiles
    // to the SASS it had before groups existed, byte for byte (inline members reading the walk in
    // their place changed the compiled schedule of some configs).
    // With DG_CLUSTER_M = 2 a "tile" of the walk is a pair of tile rows, the block of cluster rank r
    // taking row 2i + r.
    __host__ __device__ __forceinline__ explicit TileWalk(const dg::KernelParams& p)
        : tiles_m(((p.m + BM - 1) / BM + CLUSTER_M - 1) / CLUSTER_M), tiles_n((p.n + BN - 1) / BN), end(tiles_m * tiles_n) {}

    static __host__ __device__ __forceinline__ int seek(const dg::KernelParams&, int t) { return t; }
    __host__ __device__ __forceinline__ void tile(int t, int& m0, int& n0) const {
        int tm, tn;
        tile_coords(t, tiles_m, tiles_n, tm, tn);
        m0 = (tm * CLUSTER_M + cluster_row()) * BM;
        n0 = tn * BN;
    }
    static __host__ __device__ __forceinline__ int row(int r) { return r; }
    static __host__ __device__ __forceinline__ int z_a(const dg::KernelParams&) { return 0; }
    static __host__ __device__ __forceinline__ int z_b(const dg::KernelParams&) { return 0; }
    static __host__ __device__ __forceinline__ int z_d(const dg::KernelParams&) { return 0; }
    static __host__ __device__ __forceinline__ int z_c(const dg::KernelParams&) { return 0; }
    static __device__ __forceinline__ const GemmParams& view(const dg::KernelParams& p) { return p; }
#endif
};

// An operand box / a D box at (c0, c1) of group z: 3-D maps in the grouped build, the plain
// build's 2-D ones (z = 0) otherwise.
__device__ __forceinline__ void load_box(unsigned dst, const dg::TmaDesc* map, int c0, int c1, int z, unsigned bar) {
#if DG_GROUPED
    dg::tma_load_3d(dst, map, c0, c1, z, bar);
#else
    (void)z;
    dg::tma_load_2d(dst, map, c0, c1, bar);
#endif
}
// A box of C, read once: evicted from L2 first (l2_evict_first_policy).
__device__ __forceinline__ void load_c_box(unsigned dst, const dg::TmaDesc* map, int c0, int c1, int z, unsigned bar,
                                           unsigned long long policy) {
#if DG_GROUPED
    dg::tma_load_3d_hinted(dst, map, c0, c1, z, bar, policy);
#else
    (void)z;
    dg::tma_load_2d_hinted(dst, map, c0, c1, bar, policy);
#endif
}
__device__ __forceinline__ void store_box(const dg::TmaDesc* map, unsigned src, int c0, int c1, int z) {
#if DG_GROUPED
    dg::tma_store_3d(map, src, c0, c1, z);
#else
    (void)z;
    dg::tma_store_2d(map, src, c0, c1);
#endif
}

extern "C" __global__ void DG_CLUSTER_DIMS __launch_bounds__(THREADS, 1)
deepgemm_kernel(const __grid_constant__ dg::KernelParams p, const __grid_constant__ dg::TmaDesc tma_a,
                const __grid_constant__ dg::TmaDesc tma_b, const __grid_constant__ dg::TmaDesc tma_d,
                const __grid_constant__ dg::TmaDesc tma_c) {
#ifdef __CUDA_ARCH__
    extern __shared__ unsigned char smem_raw[];
#else
    unsigned char* const smem_raw = dg_host_dynamic_smem();   // a host build: the block's, from its launch
#endif
    const unsigned raw = dg::smem_u32(smem_raw);
    const unsigned ring = (raw + 1023u) & ~1023u;              // stage s: A at ring + s*STAGE_BYTES, B after it
    const unsigned d_stage = ring + STAGES * STAGE_BYTES;       // unit u's staging tile at d_stage + u * D_BOXES * 8192
    const unsigned bars = d_stage + D_STAGE_BYTES;              // full[s] at bars + 8s, empty[s] at bars + 8(STAGES+s)
    auto full = [&](int s) { return bars + 8u * s; };
    auto empty = [&](int s) { return bars + 8u * (STAGES + s); };
    auto c_full = [&](int u) { return bars + 8u * (2 * STAGES + u); };           // unit u's C has landed
    auto d_free = [&](int u) { return bars + 8u * (2 * STAGES + UNITS + u); };   // unit u may take C again
    auto unit_d = [&](int u) { return d_stage + u * D_BOXES * 8192; };           // unit u's staging tile
    const unsigned c_start = bars + 8u * (2 * STAGES + 2 * UNITS);                // the first stages are issued
    auto bias_slot = [&](int i) { return c_start + 8u + i * BN * 4u; };          // after the mbarriers: BN floats

    const int wg = threadIdx.x / 128;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            dg::mbar_init(full(s), 1);              // the producer's arrive + the TMA bytes
            dg::mbar_init(empty(s), (PINGPONG ? 1 : CONSUMERS) * CLUSTER_M);   // one arrive per consumer reading the stage (in every block it lands in)
        }
        if (LOADER) {
            for (int u = 0; u < UNITS; ++u) {
                dg::mbar_init(c_full(u), LOADER_ARRIVALS);   // the loader's arrives (+ the TMA bytes where C is loaded)
                dg::mbar_init(d_free(u), 128);   // every thread of the unit's consumer
            }
            dg::mbar_init(c_start, 1);
        }
        dg::mbar_fence_init();
    }
    __syncthreads();
    if (CLUSTER_M > 1) dg::cluster_sync();   // the other block's barriers exist before anything reaches them
    // Launched as a programmatic dependent: what is above overlapped the previous kernel; from here
    // on its output may be read (the walk reads grouped sizes from global memory).
    dg::grid_dependency_wait();

    TileWalk walk(p);
    const int ktiles = (p.k + BK - 1) / BK;
    // Split-K (plain build only): the host launches one cluster per tile; the block of rank r takes
    // k-blocks [r * ktiles / SPLIT, (r + 1) * ktiles / SPLIT). Without it, one block per SM walks the tiles.
    const int rank = SPLIT > 1 ? (int)dg::cluster_rank() : 0;
    const int t_first = blockIdx.x / (SPLIT * CLUSTER_M), t_step = SPLIT > 1 ? walk.end : gridDim.x / CLUSTER_M;
    const int kb_begin = rank * ktiles / SPLIT, kb_end = (rank + 1) * ktiles / SPLIT;

    if (wg == 0) {
        // ---- producer: one thread issues every operand copy, another one C's --------------------
        dg::regs_dealloc<40>();
        if (dg::warp_id_uniform() == 0) { if (threadIdx.x == 0) {   // by warp, then lane: dg::warp_id_uniform
            dg::tma_prefetch_desc(&tma_a);
            dg::tma_prefetch_desc(&tma_b);
            int stage = 0;
            unsigned phase = 0;
            // A K-major A shorter than a tile (decode) comes in a box of M rounded up to 8 rows
            // (deepgemm/tma.py: a_box_rows), so a stage expects only those rows' bytes. The rows
            // under them keep what an earlier stage left there: they feed only output rows past M,
            // which nothing stores.
            const int a_rows = (A_TRANS == 0 && !DG_GROUPED) ? min(BM, max(8, (p.m + 7) & ~7)) : BM;
            const unsigned stage_tx = STAGE_BYTES - (BM - a_rows) * BK * 2;
            // The C loader waits for the block's first STAGES k-blocks to be issued (c_start): its
            // boxes, not needed before the first main loop ends, would otherwise queue ahead of them.
            bool start_c = LOADER;
            const int c_start_after = kb_begin + min(STAGES, kb_end - kb_begin);
            for (int t = walk.seek(p, t_first); t < walk.end; t = walk.seek(p, t + t_step)) {
                int m0, n0;
                walk.tile(t, m0, n0);
                const int row0 = walk.row(m0), za = walk.z_a(p), zb = walk.z_b(p);
                if (start_c && kb_end == kb_begin) {   // K = 0: no stages to go first
                    dg::mbar_arrive(c_start);
                    start_c = false;
                }
                for (int kb = kb_begin; kb < kb_end; ++kb) {
                    const int k0 = kb * BK;
                    dg::stress_pause(0, 0, kb);
                    dg::mbar_wait(empty(stage), phase ^ 1);
                    dg::stress_pause(0, 1, kb);
                    dg::mbar_arrive_expect_tx(full(stage), stage_tx);
                    const unsigned a_dst = ring + stage * STAGE_BYTES, b_dst = a_dst + A_STAGE_BYTES;
                    if (A_TRANS == 0) {
                        load_box(a_dst, &tma_a, k0, row0, za, full(stage));                   // box 64(k) x a_rows(m)
                    } else {
#pragma unroll
                        for (int i = 0; i < BM / 64; ++i)                                      // boxes 64(m) x 64(k)
                            load_box(a_dst + i * BOX_BYTES, &tma_a, row0 + 64 * i, k0, za, full(stage));
                    }
                    if (CLUSTER_M > 1) {   // this block's half of B, into both blocks' stage
                        constexpr unsigned short both = (1u << CLUSTER_M) - 1;
                        const int r = cluster_row();
                        if (B_TRANS == 0) {                                                    // box 64(k) x BN/2(n)
                            dg::tma_load_2d_multicast(b_dst + r * (BN / CLUSTER_M) * 128, &tma_b, k0,
                                                      n0 + r * (BN / CLUSTER_M), full(stage), both);
                        } else {
#pragma unroll
                            for (int i = 0; i < BN / 64 / CLUSTER_M; ++i) {                    // boxes 64(n) x 64(k)
                                const int box = r * (BN / 64 / CLUSTER_M) + i;
                                dg::tma_load_2d_multicast(b_dst + box * BOX_BYTES, &tma_b, n0 + 64 * box, k0, full(stage), both);
                            }
                        }
                    } else if (B_TRANS == 0) {
                        load_box(b_dst, &tma_b, k0, n0, zb, full(stage));                     // box 64(k) x BN(n)
                    } else {
#pragma unroll
                        for (int i = 0; i < BN / 64; ++i)                                      // boxes 64(n) x 64(k)
                            load_box(b_dst + i * BOX_BYTES, &tma_b, n0 + 64 * i, k0, zb, full(stage));
                    }
                    if (++stage == STAGES) { stage = 0; phase ^= 1; }
                    if (start_c && kb + 1 == c_start_after) {
                        dg::mbar_arrive(c_start);
                        start_c = false;
                    }
                }
            }
        } } else if (LOADER && dg::warp_id_uniform() == 1) {
            // The loader warp: the tiles in the consumers' order; once each of a tile's units has
            // been handed back (d_free: its previous D has left it and the bias slot was read),
            // the tile's bias into its slot (all lanes, each then arriving on the units' c_full),
            // then per unit (lane 0) C's boxes for its rows, or a bare arrive where C is not staged
            // at the tile, so that c_full completes once per tile either way. Use j of a unit waits
            // for the consumer's release of use j - 1 (a fresh barrier passes use 0).
            const int lane = threadIdx.x % 32;
            if (C_STAGED && lane == 0) dg::tma_prefetch_desc(&tma_c);
            const unsigned long long read_once = C_STAGED ? dg::l2_evict_first_policy() : 0;
            int j = 0;
            for (int t = walk.seek(p, t_first); t < walk.end; t = walk.seek(p, t + t_step), ++j) {
                int m0, n0;
                walk.tile(t, m0, n0);
                const int c_first = PINGPONG ? j % 2 : 0, c_last = PINGPONG ? j % 2 : CONSUMERS - 1;
                const unsigned parity = ((PINGPONG ? j / 2 : j) & 1) ^ 1;
                if (j == 0) dg::mbar_wait(c_start, 0);   // used once: no phase to mistake
                dg::stress_pause(0, 6, j);
                for (int cw = c_first; cw <= c_last; ++cw)
#pragma unroll
                    for (int h = 0; h < HALVES; ++h) dg::mbar_wait(d_free(cw * HALVES + h), parity);
                const GemmParams& q = walk.view(p);
                if constexpr (BIAS_STAGED) {
                    using bias_t = typename dg::dtype<(DG_BIAS >= 0 ? DG_BIAS : DG_F32)>::T;
                    const bias_t* bias = static_cast<const bias_t*>(q.bias);
                    const unsigned slot = bias_slot(PINGPONG ? j % 2 : 0);
                    for (int col = lane; col < BN; col += 32) {
                        const float v = n0 + col < q.n ? dg::to_f32(bias[n0 + col]) : 0.0f;
                        dg::st_shared_f32(slot + 4 * col, v);
                    }
                }
                // Each lane's own arrive releases its slot stores: ordering them by __syncwarp before
                // lane 0's arrive is enough for the memory model, but not for compute-sanitizer's
                // racecheck, which then reports every stored bias value as a race.
                if (lane != 0) {
                    if constexpr (BIAS_STAGED) {
                        for (int cw = c_first; cw <= c_last; ++cw)
#pragma unroll
                            for (int h = 0; h < HALVES; ++h) dg::mbar_arrive(c_full(cw * HALVES + h));
                    }
                    continue;
                }
                const bool load = c_staged_ok(p, q, m0, n0);
                for (int cw = c_first; cw <= c_last; ++cw) {
#pragma unroll
                    for (int h = 0; h < HALVES; ++h) {
                        const int u = cw * HALVES + h;
                        if (!load) {
                            dg::mbar_arrive(c_full(u));
                            continue;
                        }
                        dg::mbar_arrive_expect_tx(c_full(u), D_BOXES * 8192);
                        const int row = walk.row(m0 + 64 * tile_block(cw, h));
#pragma unroll
                        for (int box = 0; box < D_BOXES; ++box)
                            load_c_box(unit_d(u) + box * 8192, &tma_c, n0 + 64 * box, row, walk.z_c(p), c_full(u), read_once);
                    }
                }
            }
        }
        // The producer warpgroup leaves without the consumers' cluster barriers (split-K's two, the
        // block's end with multicast): a thread that has exited counts as arrived at barrier.cluster
        // (PTX ISA, exit), and nothing it issued needs it alive; the consumers' waits on the full
        // barriers cover its copies. Waiting there instead kept warp 0's other lanes alive behind
        // the producer's thread, and ptxas then compiled the producer's k-loop for divergence
        // (vector registers, an R2UR before every TMA load).
        return;
    }

    // ---- consumers: warpgroup c computes rows [64 HALVES c, 64 HALVES (c + 1)) of each BM x BN tile
    dg::regs_alloc<232>();
    const int c = wg - 1;
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#if DG_GROUPED
    // Group g's D and C lie g * stride plus (contiguous modes) base * ld elements past p's, its bias
    // g * stride_bias, and ld is even wherever pairs are used: even strides keep every group's pairs
    // as aligned as p's.
    const bool pairs_ok = dg::epilogue_pairs_ok(p) && p.stride_d % 2 == 0 && (DG_C < 0 || p.stride_c % 2 == 0) &&
                          (DG_BIAS < 0 || p.stride_bias % 2 == 0);
    const bool tma_store = d_by_tma(p);
    const bool d_pairs_ok = dg::pairs_aligned<dg::out_t>(p.d, p.ldd) && p.stride_d % 2 == 0;
#else
    const bool pairs_ok = dg::epilogue_pairs_ok(p);
    const bool tma_store = d_by_tma(p);
    const bool d_pairs_ok = dg::pairs_aligned<dg::out_t>(p.d, p.ldd);
#endif
    // Half h of this consumer's rows of a tile: its first row, and its staging unit.
    auto half_row = [=](int h) { return 64 * tile_block(c, h); };
    auto half_unit = [=](int h) { return c * HALVES + h; };
    int stage = 0;
    unsigned phase = 0;
    // Ping-pong: the ring holds the tiles in walk order, so each consumer skips the other's
    // k-blocks; consumer 1 starts at the block's second tile.
    if constexpr (PINGPONG) {
        if (c == 1) skip_stages(stage, phase, kb_end - kb_begin);
    }
    dg::Accumulators<HALVES, ACC> acc;   // acc[h][i]; DG_PIPE_CHECK builds trap on an h past HALVES
    // A stage read is handed back to its producer, and with multicast to the other block's producer
    // too, which writes its half of B into this block's stage.
    auto release = [&](int s) {
        if constexpr (CLUSTER_M > 1) {
#pragma unroll
            for (int r = 0; r < CLUSTER_M; ++r) dg::mbar_arrive_cluster(dg::cluster_map(empty(s), r));
        } else {
            dg::mbar_arrive(empty(s));
        }
    };
    dg::WgmmaLedger ledger;   // checks every stage release (DG_PIPE_CHECK builds only; else empty)
    dg::StagingLedger staging;   // checks every staging hand-over to the C loader (likewise)

    const int t_begin = PINGPONG ? t_first + c * t_step : t_first, t_stride = PINGPONG ? 2 * t_step : t_step;
    bool first_tile = true;
    unsigned c_phase = 0;   // the parity of this tile's c_full phase (the units' use count)
    for (int t = walk.seek(p, t_begin); t < walk.end; t = walk.seek(p, t + t_stride)) {
        int m0, n0;
        walk.tile(t, m0, n0);
#pragma unroll
        for (int h = 0; h < HALVES; ++h)
#pragma unroll
            for (int i = 0; i < ACC; ++i) acc[h][i] = 0.0f;
        // C's and the bias's loads overlap the main loop instead of stalling the epilogue.
        const bool c_staged = C_STAGED && c_staged_ok(p, walk.view(p), m0, n0);
        if (LOADER && !first_tile) c_phase ^= 1;
        // Hand the staging units (and the bias slot) to the loader: every thread is past its reads
        // of them (the previous tile's chain and row-by-row stores), and the previous tile's TMA
        // stores have read them. Cooperative consumers do it once the tile's first k-block is
        // issued, so that waiting for those stores overlaps its wgmmas (measured: 3-6 % off the
        // fused chains on 128 x 256 tiles at 8192 x 8192 x 1024). A consumer of two halves (ping-pong,
        // 256-row tiles) does it before its main loop: there, a hand-back inside the loop makes ptxas
        // serialize the wgmmas (ping-pong builds, and 256-row grouped builds with a staged C or bias).
        constexpr bool HAND_BACK_IN_LOOP = HALVES == 1;
        bool hand_back = LOADER && !first_tile;
        auto give_units = [&]() {
            if (threadIdx.x % 128 == 0) dg::bulk_wait_read<0>(staging);
            staging.freed();
#pragma unroll
            for (int h = 0; h < HALVES; ++h) dg::mbar_arrive(d_free(half_unit(h)));
            hand_back = false;
        };
        if (!HAND_BACK_IN_LOOP && hand_back) give_units();
        // Ping-pong: a main loop starts once the other consumer's has waited on all its stages, so
        // no full barrier this one waits on is two phases ahead (a parity wait would take that for
        // a completed phase).
        if constexpr (PINGPONG) {
            dg::stress_pause(wg, 5, t);
            if (!(c == 0 && first_tile)) dg::named_barrier(c == 0 ? 5 : 4, 256);
        }
        first_tile = false;

        int prev_stage = 0, prev_group = 0;
        for (int kb = kb_begin; kb < kb_end; ++kb) {
            dg::mbar_wait(full(stage), phase);
            dg::stress_pause(wg, 2, kb);
            const unsigned a_s = ring + stage * STAGE_BYTES, b_s = a_s + A_STAGE_BYTES;
            dg::wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < BK / 16; ++ks) {
#pragma unroll
                for (int h = 0; h < HALVES; ++h) {
                    const int r = tile_block(c, h);   // the stage's 64-row block of A
                    const unsigned long long da = A_TRANS == 0
                        ? dg::smem_desc(a_s + r * 64 * 128 + ks * 32, 16, 1024)     // 64 rows of 128 B, k16 = 32 B
                        : mn_major_desc(a_s + r * BOX_BYTES + ks * 16 * 128, BOX_BYTES);  // k16 = 16 rows
                    const unsigned long long db = B_TRANS == 0
                        ? dg::smem_desc(b_s + ks * 32, 16, 1024)
                        : mn_major_desc(b_s + ks * 16 * 128, BOX_BYTES);
                    dg::Wgmma<BN>::mma<A_TRANS, B_TRANS>(acc[h], da, db, 1);
                }
            }
            dg::wgmma_commit();
            const int group = ledger.commit();
            if (HAND_BACK_IN_LOOP && hand_back) give_units();
            dg::stress_pause(wg, 3, kb);
            // Keep this k-block's wgmmas in flight while waiting for the previous block's, then
            // hand that block's stage back (measured: the same speed as draining every block). The
            // ledger notes the depth this wait really has (DG_PIPE_CHECK builds check each release).
            dg::wgmma_wait<1>(ledger);
            if (kb > kb_begin && threadIdx.x % 128 == 0) {
                ledger.release(prev_group);
                release(prev_stage);
            }
            prev_stage = stage;
            prev_group = group;
            if (++stage == STAGES) { stage = 0; phase ^= 1; }
        }
        if constexpr (PINGPONG) {   // the other consumer's turn (if it has a next tile), past its k-blocks
            TileWalk ahead = walk;
            dg::stress_pause(wg, 4, t);
            if (ahead.seek(p, t + t_step) < ahead.end) dg::named_barrier_arrive(c == 0 ? 4 : 5, 256);
            skip_stages(stage, phase, kb_end - kb_begin);
        }
        if (hand_back) give_units();   // no k-blocks (K = 0)
        // Every wgmma of the tile retired: its last stage can go back, the accumulators are final.
        dg::wgmma_wait<0>(ledger);   dg::parked_ring_hold(SPLIT != 1 && rank == c % SPLIT);   // DG_PIPE_CHECK: see parked_ring_idle
        if (kb_end > kb_begin && threadIdx.x % 128 == 0) {
            ledger.release(prev_group);
            release(prev_stage);
        }
#pragma unroll
        for (int h = 0; h < HALVES; ++h) dg::fence_regs(acc[h]);
        if (ledger.violated() || staging.violated()) {   // DG_PIPE_CHECK: a stage or unit went back too early
#pragma unroll
            for (int h = 0; h < HALVES; ++h)
#pragma unroll
                for (int i = 0; i < ACC; ++i) acc[h][i] = __int_as_float(0x7fc00000);
        }

        if (SPLIT > 1) {
            // Each consumer's 64 rows are finished by one rank (owner = c % SPLIT, so with two or
            // more slices the two halves of the tile finish on different SMs). The other ranks park
            // that consumer's partial sums in their idle ring (every stage consumed, by both
            // consumers once the named barrier passes), thread-major so the float4 stores and the
            // remote loads are contiguous; the owner adds them in rank order (the same sum on every
            // run) and runs the epilogue. The second barrier keeps the parked sums alive until read.
            const int owner = c % SPLIT;
            const unsigned part = ring + (c * (ACC / 4) * 128 + threadIdx.x % 128) * 16;   // + 2048 j
            dg::named_barrier(3, 128 * CONSUMERS);   if (rank != owner) dg::parked_ring_idle<STAGES>(acc.v, empty(0), stage, phase);   // DG_PIPE_CHECK: NaN if the ring is still read
            if (rank != owner) {
#pragma unroll
                for (int j = 0; j < ACC / 4; ++j)
                    dg::st_shared_f4(part + 2048 * j, make_float4(acc[0][4 * j], acc[0][4 * j + 1], acc[0][4 * j + 2], acc[0][4 * j + 3]));
            }
            dg::cluster_sync();
            if (rank == owner) {
                for (int r = 0; r < SPLIT; ++r) {
                    if (r == owner) continue;
                    const unsigned remote = dg::cluster_map(part, r);
#pragma unroll
                    for (int j = 0; j < ACC / 4; ++j) {
                        const float4 v = dg::ld_cluster_f4(remote + 2048 * j);
                        acc[0][4 * j] += v.x; acc[0][4 * j + 1] += v.y; acc[0][4 * j + 2] += v.z; acc[0][4 * j + 3] += v.w;   dg::parked_sums_read(acc.v, remote, j == ACC / 4 - 1);
                    }
                }
            }
            dg::cluster_sync();
            if (rank != owner) { dg::parked_sums_left(part); continue; }   // DG_PIPE_CHECK: marks its sums left
        }

        // ---- epilogue: acc[i] -> D(row, col) through the shared chain and the one final cast ----
        // On q, the tile's group as one GEMM (its D, C and bias; q.m = its rows, from which m0
        // counts): the bounds below keep every store, and every C read, inside the group.
        const GemmParams& q = walk.view(p);
        // Per 64-row half of this consumer's rows (one half unless ping-pong), with its own staging tile.
#pragma unroll
        for (int half = 0; half < HALVES; ++half) {
            float (&acc_h)[ACC] = acc[half];
            const int rb = half_row(half);
            const unsigned tile_d = unit_d(half_unit(half));
            const int row0 = m0 + rb + 16 * warp + lane / 4;
            const int col0 = n0 + 2 * (lane % 4);
            const bool interior = m0 + BM <= q.m && n0 + BN <= q.n;
            if (DG_EPI_TMA && DG_OUT != DG_F32) {
                // The whole chain first, in place, before any store: a staging store with a "memory"
                // clobber after each pair, or a branch per pair, kept each C load next to its use, one
                // C latency per pair (measured at 153e376: bias + GELU + C at 512 x 3072 x 768 took 58 us
                // against 15 plain). One code path for interior and edge tiles where the chain's
                // operands come in pairs (chain_paired), C from the staging tile where it was staged.
                // Nsight Compute (docs/performance.md, fused epilogue) found the epilogue's code size,
                // fetched once per tile, to be its first cost at small shapes, so the checked
                // per-element path below is only for operands that cannot be paired (an odd N at an
                // edge tile, a misaligned C or bias).
                // The bias of columns col, col + 1: from this tile's slot where it is staged.
                const unsigned slot = bias_slot(PINGPONG ? c : 0);
                auto column_pair = [&](int col, bool inside, dg::Column& c0, dg::Column& c1) {
                    if constexpr (BIAS_STAGED) {
                        const float2 b = dg::ld_shared_f32x2(slot + 4 * (col - n0));
                        c0.bias = b.x;
                        c1.bias = b.y;
                        dg::load_scale_pair(q, col, inside, c0, c1);
                    } else {
                        dg::load_column_pair(q, col, inside, c0, c1);
                    }
                };
                // This tile's C and bias have landed. Waited on every path, where C or the bias are
                // read from shared memory or not: a phase left unwaited (a tile that falls to the
                // per-element path) would let the next tile's parity wait pass before its own phase.
                if (LOADER) dg::mbar_wait(c_full(half_unit(half)), c_phase);
                if (C_STAGED && c_staged) {
                    const int r0 = 16 * warp + lane / 4, c0 = 2 * (lane % 4);   // within the staging tile
                    chain_paired(acc_h, q, col0, [&](int h, int j) { return staged_c_pair(tile_d, r0 + 8 * h, c0 + 8 * j); },
                                 column_pair);
                } else if (!C_STAGED && paired_ok(q, m0, n0)) {   // (with C staged, one path fewer: fewer registers)
                    const bool row_in[2] = {row0 < q.m, row0 + 8 < q.m};
                    chain_paired(acc_h, q, col0, [&](int h, int j) {
                        const int col = col0 + 8 * j;
                        return dg::load_c_pair(q, row0 + 8 * h, col, row_in[h] && col < q.n);
                    }, column_pair);
                } else if (dg::HAS_EPILOGUE || !interior) {   // outside D the values are never stored, but must not read C/bias
#pragma unroll
                    for (int i = 0; i < ACC; i += 2) {
                        const int row_g = row0 + 8 * ((i / 2) % 2), col_g = col0 + 8 * (i / 4);
                        acc_h[i] = row_g < q.m && col_g < q.n ? dg::epilogue(acc_h[i], row_g, col_g, q) : 0.0f;
                        acc_h[i + 1] = row_g < q.m && col_g + 1 < q.n ? dg::epilogue(acc_h[i + 1], row_g, col_g + 1, q) : 0.0f;
                    }
                }
                // Then into this consumer's staging tile (swizzled: the 8 rows of a store instruction
                // hit different banks), and either one thread issues TMA stores and the warpgroup moves
                // on while they drain, or (D TMA cannot store: e.g. ld = 4097) each warp writes whole
                // rows with consecutive lanes on consecutive columns, so every store instruction fills
                // its sectors (the fragment order would write 8 rows x 8 bytes per instruction).
                // The staging tile's previous contents must have been read first (TMA or the warps).
                // This half's previous store has read the staging tile. With every half stored by TMA,
                // one group per half, the newest HALVES - 1 groups are the other halves'; a grouped
                // build stores the halves at a group's end row by row (by_tma below), which commit no
                // group, so past such a half the count would let this half's own store still be
                // reading: there it waits for every group.
                if (tma_store && threadIdx.x % 128 == 0) {
                    if (HALVES > 1 && some_rows_stored(p)) dg::bulk_wait_read<0>(staging);
                    else dg::bulk_wait_read<HALVES - 1>(staging);
                }
                staging.rewriting(half_unit(half), acc_h);   // DG_PIPE_CHECK: else the values written are NaN
                dg::named_barrier(1 + c, 128);
#pragma unroll
                for (int i = 0; i < ACC; i += 2) {
                    const int r = 16 * warp + lane / 4 + 8 * ((i / 2) % 2);        // row within the 64
                    const int col = 8 * (i / 4) + 2 * (lane % 4);                  // column within BN
                    typename dg::pair_of<dg::out_t>::T d2;
                    d2.x = dg::from_f32<dg::out_t>(acc_h[i]);
                    d2.y = dg::from_f32<dg::out_t>(acc_h[i + 1]);
                    dg::st_shared_b32(d_stage_addr(tile_d, r, col), *reinterpret_cast<unsigned*>(&d2));
                }
                // Grouped, TMA stores only where the map's bounds are the group's: every batch group has
                // M rows, as the map; a masked or contiguous group's rows end inside it (past a masked
                // group's count lies its unused capacity, past a contiguous group's end the next group).
                bool by_tma = tma_store && (CLUSTER_M == 1 || m0 < q.m);   // a pair's tile past M stores nothing
    #if DG_GROUPED
                by_tma = by_tma && (p.group_mode == DG_GROUP_BATCH || m0 + rb + 64 <= q.m);
    #endif
                if (by_tma) {
                    dg::fence_async_shared();
                    dg::named_barrier(1 + c, 128);
                    if (threadIdx.x % 128 == 0) {
#pragma unroll
                        for (int box = 0; box < BN / 64; ++box)
                            store_box(&tma_d, tile_d + box * 8192, n0 + 64 * box, walk.row(m0 + rb), walk.z_d(p));
                        dg::bulk_commit();
                        staging.stored(half_unit(half));
                    }
                } else {
                    dg::named_barrier(1 + c, 128);
                    store_rows_coalesced(q, tile_d, m0 + rb, n0, warp, lane, d_pairs_ok);
                }
            } else if (interior && pairs_ok) {
                // Pair by pair (FP32 D, or DG_EPI_TMA = 0): loading all of C first, as above, spills at BN = 256.
#pragma unroll
                for (int i = 0; i < ACC; i += 2) {
                    dg::epilogue_pair_interior(q, row0 + 8 * ((i / 2) % 2), col0 + 8 * (i / 4), acc_h[i], acc_h[i + 1]);
                    dg::store_pair_interior(q, row0 + 8 * ((i / 2) % 2), col0 + 8 * (i / 4), acc_h[i], acc_h[i + 1]);
                }
            } else {
#pragma unroll
                for (int i = 0; i < ACC; ++i)
                    dg::store_d(q, row0 + 8 * ((i / 2) % 2), col0 + 8 * (i / 4) + i % 2, acc_h[i]);
            }
        }
    }
    // Before the block exits, the last TMA stores must have read their shared memory; nothing here
    // reads D back, so not their global writes (Nsight Compute at 85a33b7: the full wait, with its L1
    // invalidation, held 9.5 % of the stall samples at 512 x 3072 x 768).
    if (DG_EPI_TMA && threadIdx.x % 128 == 0) dg::bulk_wait_read<0>(staging);
    staging.exiting();   // DG_PIPE_CHECK: else the launch fails
    // With multicast, neither block of a cluster exits while the other may still write its half of
    // B into this block's ring or arrive on its barriers.
    if (CLUSTER_M > 1) dg::cluster_sync();
}
