// V3: V2 + padded shared memory + 128-bit global loads + 128-bit shared loads + a register-staged
// prefetch of the next K tile.
//
// What it adds over V2 and why it is faster:
//  1. 128-bit global loads. V2 moves every fp16/bf16 element with its own 16-bit LDG; here a
//     thread fetches 8 consecutive elements (16 bytes, LDG.E.128) along the operand's contiguous
//     dimension (k for row-major A, m for column-major A, n for row-major B, k for column-major
//     B): 8x fewer load instructions and address computations. The vector path is taken when the
//     operand's base pointer is 16-byte aligned and its leading dimension is a multiple of 8
//     (decided once per block, uniform) and the chunk lies fully inside the matrix; everything
//     else (misaligned views such as x[:, 1:], odd leading dims, the edges of M, N, K) takes a
//     guarded scalar path with zero fill. See dg::ChunkTile (tile_load.cuh).
//  2. Padded shared memory. Rows of the k-major float tiles are BM+4 / BN+4 floats long. The pad
//     is 4 floats = 16 bytes, so every row start and every 8-element chunk offset stays
//     16-byte aligned (float4 stores/loads remain legal), and a row stride of 4 (mod 32) banks
//     makes the stores conflict-free: a transposing store of a k-contiguous chunk (row-major A,
//     column-major B) no longer walks down one bank as in V2 (with the rotated store order in
//     ChunkTile), and the two float4 stores of an m/n-contiguous chunk from a quarter-warp cover
//     32 distinct banks (rows k and k+1 are 4 banks apart).
//  3. 128-bit shared loads in the inner loop. Each thread's TM (TN) values are TM/4 (TN/4)
//     groups of 4 consecutive floats, group g at offset g*4*(BM/TM) + 4*ty: one LDS.128 per
//     group, 4 per k at 8x8 instead of 16 LDS.32. Lanes are arranged 4 (m) x 8 (n) per warp, so
//     at one k a warp reads 8 consecutive float4 of Bs (128 bytes, one wavefront) and 4
//     consecutive float4 of As (broadcast to 8 lanes each): conflict-free, and the FFMA pipe
//     (64 FFMA per 4 LDS) is the bottleneck, as it should be.
//  4. Prefetch: the next K tile's global loads are issued (into 8 registers at the default
//     config) before the current tile's FFMA loop, so their latency overlaps the compute; one
//     shared buffer, the same two barriers per tile as V1/V2.
//
// Defaults BM = BN = 128, BK = 16, TM = TN = 8 -> 256 threads, as V2 (same reasoning); static
// shared memory 2 * 16 * 132 * 4 = 16896 bytes. FP32 FFMA is the roof for this kernel
// (~67 TFLOP/s on an H200).
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
#define DG_PAD 4   // floats: keeps 16-byte alignment, row stride = 4 (mod 32) banks

static_assert(DG_BM % 32 == 0 && DG_BN % 32 == 0, "BM, BN multiples of 32 (chunk mapping, padding)");
static_assert(DG_BK % 8 == 0, "BK multiple of 8 (one 128-bit chunk = 8 elements)");
static_assert(DG_TM % 4 == 0 && DG_TN % 4 == 0, "TM, TN multiples of 4 (float4 fragments)");
static_assert(DG_BM % DG_TM == 0 && DG_BN % DG_TN == 0, "BM % TM == 0 and BN % TN == 0");
static_assert((DG_BM / DG_TM) % 4 == 0 && (DG_BN / DG_TN) % 8 == 0,
              "threads per block must tile into 4 (m) x 8 (n) warps");
static_assert(DG_THREADS % 32 == 0 && DG_THREADS <= 1024, "threads: whole warps, at most 1024");
static_assert((DG_BM + DG_BN + 2 * DG_PAD) * DG_BK * 4 <= 48 * 1024, "static shared memory <= 48 KB");

extern "C" __global__ void __launch_bounds__(DG_THREADS) deepgemm_kernel(const GemmParams p) {
    constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, TM = DG_TM, TN = DG_TN, THREADS = DG_THREADS;
    constexpr int LDA = BM + DG_PAD, LDB = BN + DG_PAD;   // smem row strides (floats)
    constexpr int TX = BN / TN, TY = BM / TM;             // threads along N, M
    constexpr int GA = TM / 4, GB = TN / 4;               // float4 groups per thread
    constexpr int SA = BM / GA, SB = BN / GB;             // distance between groups
    static_assert(SA == 4 * TY && SB == 4 * TX, "groups of 4 rows/cols per thread tile the block");
    __shared__ __align__(16) float As[BK * LDA];           // As[k * LDA + m]
    __shared__ __align__(16) float Bs[BK * LDB];           // Bs[k * LDB + n]

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    constexpr int WN = TX / 8;                            // warps along N
    const int tx = (warp % WN) * 8 + (lane & 7);          // 0 .. TX-1
    const int ty = (warp / WN) * 4 + (lane >> 3);         // 0 .. TY-1
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    const unsigned short* a = static_cast<const unsigned short*>(p.a);
    const unsigned short* b = static_cast<const unsigned short*>(p.b);
    // Uniform per block: may 8-element chunks be read with one 16-byte load?
    const bool a_vec = dg::aligned16(p.a) && (p.lda % 8 == 0);
    const bool b_vec = dg::aligned16(p.b) && (p.ldb % 8 == 0);

    dg::ChunkTile<BM, BK, LDA, THREADS, dg::kAKContig> ta;
    dg::ChunkTile<BN, BK, LDB, THREADS, dg::kBKContig> tb;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    const int ktiles = p.k / BK + (p.k % BK != 0);   // 0 when K == 0; no overflow near INT_MAX
    if (ktiles > 0) {
        ta.load(a, p.lda, a_vec, m0, 0, p.m, p.k, tid);
        tb.load(b, p.ldb, b_vec, n0, 0, p.n, p.k, tid);
    }
    for (int t = 0; t < ktiles; ++t) {
        // Registers (tile t) -> shared. The barrier at the end of the previous iteration
        // guarantees nobody still reads the previous tile.
        ta.store(As, tid);
        tb.store(Bs, tid);
        __syncthreads();   // tile t complete before anyone reads it

        if (t + 1 < ktiles) {   // uniform; loads of tile t+1 fly while we compute on tile t
            const int k1 = (t + 1) * BK;
            ta.load(a, p.lda, a_vec, m0, k1, p.m, p.k, tid);
            tb.load(b, p.ldb, b_vec, n0, k1, p.n, p.k, tid);
        }

#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float af[TM], bf[TN];
#pragma unroll
            for (int g = 0; g < GA; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&As[kk * LDA + g * SA + 4 * ty]);
                af[4 * g] = v.x; af[4 * g + 1] = v.y; af[4 * g + 2] = v.z; af[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[kk * LDB + g * SB + 4 * tx]);
                bf[4 * g] = v.x; bf[4 * g + 1] = v.y; bf[4 * g + 2] = v.z; bf[4 * g + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(af[i], bf[j], acc[i][j]);
        }
        __syncthreads();   // everyone done reading tile t before the next iteration overwrites it
    }

    // acc[4g + i][4h + j] is D(m0 + g*SA + 4*ty + i, n0 + h*SB + 4*tx + j); store_d bounds-checks.
#pragma unroll
    for (int g = 0; g < GA; ++g)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int h = 0; h < GB; ++h)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    dg::store_d(p, m0 + g * SA + 4 * ty + i, n0 + h * SB + 4 * tx + j,
                                acc[4 * g + i][4 * h + j]);
}
