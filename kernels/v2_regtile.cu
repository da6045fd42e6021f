// V2: register tiling. A block computes a BM x BN tile of D with (BM/TM) x (BN/TN) threads; each
// thread owns TM x TN accumulators in registers.
//
// What it adds over V1 and why it is faster: V1 issues 2 shared-memory loads per FFMA, so the
// shared-memory pipe, not the FP32 units, sets its speed. Here, at every k of the staged tile, a
// thread loads TM values of A and TN values of B into registers once and forms their outer
// product: TM*TN FFMAs for TM+TN loads (64 FFMA per 16 LDS at 8x8), and each staged global
// element is reused by a whole BM- or BN-wide tile (1/BM + 1/BN global loads per FMA: 1/64 at
// 128x128, against 1/16 in V1).
//
// Defaults BM = BN = 128, BK = 16, TM = TN = 8 -> 256 threads (8 warps):
//  * 8x8 = 64 accumulators + 16 fragment registers stay well under the 255-register limit and
//    leave room for 2 blocks/SM if ptxas lands <= 128 registers (16 warps/SM to hide latency);
//  * 128x128 gives the reuse above while a 4096^2 output still has 1024 blocks for 132 SMs;
//  * BK = 16: 1024 FFMA per thread between two barrier pairs; A and B tiles are
//    2 x 16 x 128 floats = 16 KB of static shared memory.
//
// Shared memory holds floats (converted once on the way in; the inner loop is pure FFMA), both
// tiles k-major: As[k][m] (A transposed) and Bs[k][n], so at one k a warp reads a contiguous
// row of each. Thread (ty, tx) owns rows ty + (BM/TM)*i and columns tx + (BN/TN)*j (interleaved,
// not blocked): the 16 lanes with consecutive tx read 16 consecutive words of Bs[k] (conflict-
// free), the two ty values of a warp read 2 words of As[k] (broadcast), and the epilogue's
// stores of one (i, j) are coalesced along N.
// The global loads are coalesced for all layouts (dg::load_tile_scalar); the transposing smem
// store of a k-contiguous operand (row-major A, column-major B) has bank conflicts, and all
// loads are 16-bit: V3 fixes both (padding + 128-bit loads).
//
// Register arrays are indexed only with compile-time constants (fully unrolled loops).
#include "deepgemm/common.cuh"
#include "deepgemm/tile_load.cuh"

#ifndef DG_BM
#define DG_BM 128
#endif
#ifndef DG_BN
#define DG_BN 128
#endif
#ifndef DG_BK
#define DG_BK 16
#endif
#ifndef DG_TM
#define DG_TM 8
#endif
#ifndef DG_TN
#define DG_TN 8
#endif
#define DG_THREADS ((DG_BM / DG_TM) * (DG_BN / DG_TN))

static_assert(DG_TM >= 1 && DG_TN >= 1 && DG_BK >= 1, "tile sizes must be positive");
static_assert(DG_BM % DG_TM == 0 && DG_BN % DG_TN == 0, "BM % TM == 0 and BN % TN == 0");
static_assert(DG_THREADS % 32 == 0 && DG_THREADS <= 1024, "threads: whole warps, at most 1024");
static_assert((DG_BM + DG_BN) * DG_BK * 4 <= 48 * 1024, "static shared memory <= 48 KB");

extern "C" __global__ void __launch_bounds__(DG_THREADS) deepgemm_kernel(const GemmParams p) {
    constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, TM = DG_TM, TN = DG_TN, THREADS = DG_THREADS;
    constexpr int TX = BN / TN;   // threads along N
    constexpr int TY = BM / TM;   // threads along M
    __shared__ float As[BK * BM];  // As[k * BM + m]
    __shared__ float Bs[BK * BN];  // Bs[k * BN + n]

    const int tid = threadIdx.x;
    const int tx = tid % TX, ty = tid / TX;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const dg::in_t* a = static_cast<const dg::in_t*>(p.a);
    const dg::in_t* b = static_cast<const dg::in_t*>(p.b);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    const int ktiles = p.k / BK + (p.k % BK != 0);   // 0 when K == 0; no overflow near INT_MAX
    for (int t = 0; t < ktiles; ++t) {
        const int k0 = t * BK;
        dg::load_tile_scalar<BM, BK, BM, THREADS, dg::kAKContig>(As, a, p.lda, m0, k0, p.m, p.k, tid);
        dg::load_tile_scalar<BN, BK, BN, THREADS, dg::kBKContig>(Bs, b, p.ldb, n0, k0, p.n, p.k, tid);
        __syncthreads();   // tiles complete before anyone reads them

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float af[TM], bf[TN];
#pragma unroll
            for (int i = 0; i < TM; ++i) af[i] = As[kk * BM + ty + TY * i];
#pragma unroll
            for (int j = 0; j < TN; ++j) bf[j] = Bs[kk * BN + tx + TX * j];
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(af[i], bf[j], acc[i][j]);
        }
        __syncthreads();   // everyone done reading before the next iteration overwrites the tiles
    }

#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j)
            dg::store_d(p, m0 + ty + TY * i, n0 + tx + TX * j, acc[i][j]);
}
