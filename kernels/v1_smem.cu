// V1: shared-memory block tiling. One output element per thread, as V0, but a block of
// BM x BN threads first stages a BM x BK tile of A and a BK x BN tile of B in shared memory and
// then every thread reads its BK products from there.
//
// What it adds over V0 and why it is faster: in V0 each of the BM*BN threads fetches its own
// row of A and column of B through L1/L2 (2 global loads per FMA). Here each element of the A
// tile is fetched from global memory once per block and reused by BN threads, each element of
// B by BM threads: global traffic drops from 2 to 1/BM + 1/BN loads per FMA (1/16 at 32x32).
// The inner loop is still bound by shared memory (2 LDS per FFMA); V2 fixes that with
// register tiling.
//
// Loads are coalesced for every layout: consecutive threads take consecutive elements along the
// operand's contiguous global dimension (k for row-major A, m for column-major A, n for
// row-major B, k for column-major B). The tiles are stored in their natural orientation,
// As[m][k] and Bs[k][n], so the stores are conflict-free for the row-major cases; a column-major
// operand's store walks down a column of its tile (a BK- resp. BN-way bank conflict at the
// 32-wide default) -- V3's padding removes that.
//
// Compute: thread (ty, tx) reads As[ty][kk] (the same word for the whole warp when BN >= 32:
// broadcast) and Bs[kk][tx] (32 consecutive words: conflict-free).
//
// Occupancy trade-off of the tile size: 32x32 = 1024 threads per block. An SM holds at most 2048
// threads, so 2 blocks/SM only if a thread needs <= 32 registers (65536 / 2048); with more it
// is 1 block = 32 warps, and every __syncthreads() stalls a whole SM-half of warps at once.
// 16x16 = 256 threads gives up to 8 blocks/SM and finer-grained barriers, but halves the reuse
// of every staged element (1/8 instead of 1/16 global loads per FMA). Both are in the config
// space; 32x32 is the default because global/L2 traffic is what V1 is about.
#include "deepgemm/common.cuh"

#ifndef DG_BM
#define DG_BM 32
#endif
#ifndef DG_BN
#define DG_BN 32
#endif
#ifndef DG_BK
#define DG_BK 32
#endif
#define DG_THREADS (DG_BM * DG_BN)

static_assert(DG_BM >= 1 && DG_BN >= 1 && DG_BK >= 1, "tile sizes must be positive");
static_assert(DG_THREADS % 32 == 0 && DG_THREADS <= 1024, "BM*BN threads: whole warps, at most 1024");
static_assert((DG_BM * DG_BK + DG_BK * DG_BN) * 4 <= 48 * 1024, "static shared memory <= 48 KB");

extern "C" __global__ void __launch_bounds__(DG_THREADS) deepgemm_kernel(const GemmParams p) {
    constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, THREADS = DG_THREADS;
    __shared__ float As[BM][BK];
    __shared__ float Bs[BK][BN];

    const int tid = threadIdx.x;
    const int tx = tid % BN, ty = tid / BN;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    // K tiles; written so that p.k close to INT_MAX cannot overflow; 0 when K == 0.
    const int ktiles = p.k / BK + (p.k % BK != 0);
    float acc = 0.0f;

    for (int t = 0; t < ktiles; ++t) {
        const int k0 = t * BK;
        // A tile BM x BK (zero fill outside M, K via dg::load_a).
        constexpr int NA = BM * BK, ITA = (NA + THREADS - 1) / THREADS;
#pragma unroll
        for (int i = 0; i < ITA; ++i) {
            const int e = i * THREADS + tid;
            if (NA % THREADS == 0 || e < NA) {
                const int m = DG_A_ROW ? e / BK : e % BM;   // row-major: k fastest; col-major: m fastest
                const int k = DG_A_ROW ? e % BK : e / BM;
                As[m][k] = dg::to_f32(dg::load_a(p, m0 + m, k0 + k));
            }
        }
        // B tile BK x BN.
        constexpr int NB = BK * BN, ITB = (NB + THREADS - 1) / THREADS;
#pragma unroll
        for (int i = 0; i < ITB; ++i) {
            const int e = i * THREADS + tid;
            if (NB % THREADS == 0 || e < NB) {
                const int n = DG_B_ROW ? e % BN : e / BK;   // row-major: n fastest; col-major: k fastest
                const int k = DG_B_ROW ? e / BN : e % BK;
                Bs[k][n] = dg::to_f32(dg::load_b(p, k0 + k, n0 + n));
            }
        }
        __syncthreads();   // tiles complete before anyone reads them

#pragma unroll
        for (int kk = 0; kk < BK; ++kk)
            acc = fmaf(As[ty][kk], Bs[kk][tx], acc);   // zero-filled tails add exact zeros

        __syncthreads();   // everyone done reading before the next iteration overwrites the tiles
    }
    // Threads outside M x N took part in loads and barriers; store_d bounds-checks them away.
    dg::store_d(p, m0 + ty, n0 + tx, acc);
}
