// fp16acc_simt: CUDA-core GEMM that ACCUMULATES IN HALF PRECISION, for the accuracy report only
// (registry purpose "report": never chosen by kernel="auto", not in the verification sweep).
//
// Each thread owns TM rows x one pair of adjacent columns of D, as TM __half2 (bf16 inputs:
// __nv_bfloat162) accumulators, updated with __hfma2: acc = round16(a * b + acc), one rounding
// per k (an FMA: the product is exact, only the sum is rounded). Every thread visits k strictly
// in order 0, 1, ..., K-1 (K tiles in order, kk in order inside a tile), so each output equals
// deepgemm.report.emulate.emulate_gemm(a, b, "fp16" | "bf16", block_k=1) bit for bit. Any other
// order (split-K, a tree) would still be fp16 accumulation but would no longer match the model.
//
// Structure: V1's shared-memory tiling with a small register tile. A block of
// (BN/2) x (BM/TM) threads stages a BM x BK tile of A and a BK x BN tile of B in shared memory,
// in the input dtype (no conversion: __hfma2 takes the 16-bit values as they are). Per kk a
// thread reads one pair B(kk, 2tx..2tx+1) (consecutive 4-byte words across a warp) and TM values
// of A (one address per warp row group: a broadcast) and issues TM HFMA2. Correctness and clarity
// over speed: this kernel exists to measure accumulation error, not to be fast.
//
// Edges: tiles are loaded through dg::load_a / dg::load_b (zero fill outside M, N, K), so the
// K tail adds fma(0, 0, acc) = acc exactly; K = 0 leaves acc = 0 and the epilogue still runs.
// Rows/columns outside M x N are computed and dropped by dg::store_d's bounds check.
#include "deepgemm/common.cuh"

#ifndef DG_BM
#define DG_BM 32
#endif
#ifndef DG_BN
#define DG_BN 64
#endif
#ifndef DG_BK
#define DG_BK 32
#endif
#ifndef DG_TM
#define DG_TM 4    // rows per thread
#endif
#define DG_THREADS ((DG_BN / 2) * (DG_BM / DG_TM))

static_assert(DG_BN % 2 == 0, "BN: whole column pairs");
static_assert(DG_BM % DG_TM == 0, "BM must be a multiple of TM");
static_assert(DG_THREADS % 32 == 0 && DG_THREADS <= 1024, "(BN/2)*(BM/TM) threads: whole warps, at most 1024");
#if DG_IN != DG_F16 && DG_IN != DG_BF16
#error "fp16acc_simt: fp16 or bf16 inputs"
#endif

namespace fp16acc {
using pair_t = typename dg::pair_of<dg::in_t>::T;   // __half2 | __nv_bfloat162: the accumulator pair
}

extern "C" __global__ void __launch_bounds__(DG_THREADS) deepgemm_kernel(const GemmParams p) {
    using fp16acc::pair_t;
    constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, TM = DG_TM, THREADS = DG_THREADS, NP = BN / 2;
    __shared__ dg::in_t As[BM][BK];
    __shared__ __align__(16) dg::in_t Bs[BK][BN];   // each row read as NP aligned pairs

    const int tid = threadIdx.x;
    const int tx = tid % NP;            // column pair: columns 2tx, 2tx + 1 of the tile
    const int ty = tid / NP;            // rows ty*TM .. ty*TM + TM-1 of the tile
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;

    const dg::in_t zero = dg::from_f32<dg::in_t>(0.0f);
    pair_t acc[TM];
#pragma unroll
    for (int i = 0; i < TM; ++i) acc[i] = pair_t(zero, zero);

    const int ktiles = p.k / BK + (p.k % BK != 0);   // no overflow near INT_MAX; 0 when K == 0
    for (int t = 0; t < ktiles; ++t) {
        const int k0 = t * BK;
        // Coalesced for every layout: consecutive threads take consecutive elements along the
        // operand's contiguous global dimension (as in V1).
        constexpr int NA = BM * BK, ITA = (NA + THREADS - 1) / THREADS;
#pragma unroll
        for (int i = 0; i < ITA; ++i) {
            const int e = i * THREADS + tid;
            if (NA % THREADS == 0 || e < NA) {
                const int m = DG_A_ROW ? e / BK : e % BM;
                const int k = DG_A_ROW ? e % BK : e / BM;
                As[m][k] = dg::load_a(p, m0 + m, k0 + k);
            }
        }
        constexpr int NB = BK * BN, ITB = (NB + THREADS - 1) / THREADS;
#pragma unroll
        for (int i = 0; i < ITB; ++i) {
            const int e = i * THREADS + tid;
            if (NB % THREADS == 0 || e < NB) {
                const int n = DG_B_ROW ? e % BN : e / BK;
                const int k = DG_B_ROW ? e / BN : e % BK;
                Bs[k][n] = dg::load_b(p, k0 + k, n0 + n);
            }
        }
        __syncthreads();   // tiles complete before anyone reads them

        // k strictly in order: the one-rounding-per-k model depends on it.
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const pair_t b2 = reinterpret_cast<const pair_t*>(Bs[kk])[tx];
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const dg::in_t a = As[ty * TM + i][kk];
                acc[i] = __hfma2(pair_t(a, a), b2, acc[i]);   // both columns: round16(a*b + acc)
            }
        }
        __syncthreads();   // everyone done reading before the next tile overwrites them
    }

    // The half-precision accumulator, widened exactly to float, then the usual epilogue and cast.
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int row = m0 + ty * TM + i, col = n0 + 2 * tx;
        dg::store_d(p, row, col, dg::to_f32(acc[i].x));
        dg::store_d(p, row, col + 1, dg::to_f32(acc[i].y));
    }
}
