// V4: tensor cores through warp-level mma.sync (sm_80+, runs on Hopper), fed by a cp.async
// multi-stage pipeline and ldmatrix.
//
// DG_ACC_F16=1 builds the accuracy report's FP16-accumulating variant (registry "fp16acc_mma",
// never chosen by kernel="auto"): mma.sync ... .f16.f16.f16.f16 (HMMA.16816.F16), each m16n8
// accumulator tile two .f16x2 registers instead of four floats, so the running sum is rounded to
// fp16 at least once per k16 step; fp16 inputs only (PTX has no bf16 mma with f16 accumulators).
//
// What V4 adds over V3 (smem tiles + register tiles + FFMA on CUDA cores) and why it is faster:
//  * The math moves from FFMA (FP32 CUDA cores, ~67 TFLOP/s on H200) to HMMA
//    (mma.sync.m16n8k16, fp16/bf16 in, FP32 accumulate): one instruction does 16x8x16 MACs.
//    Legacy mma.sync reaches roughly 60-65% of Hopper's dense tensor peak (wgmma, V5, the rest).
//  * ldmatrix.x4 fetches a whole 16x16 operand fragment for the warp in one instruction, in exactly
//    the register layout mma wants; ldmatrix.trans serves the operands whose shared tile is stored
//    k-major-by-rows (A column-major, B row-major), so no layout transposes through registers.
//  * cp.async (LDGSTS) copies global -> shared without passing through registers, asynchronously:
//    DG_STAGES-1 k-tiles are in flight while the tensor cores work on the current one, so global
//    latency hides behind math without a register prefetch buffer (V3) and with one barrier per
//    k-tile.
//  * Register double-buffering of the fragments: while the mma of k16 step ks run, the ldmatrix
//    for step ks+1 (or step 0 of the next k-tile, right after the barrier) is already issued.
//  * Warp tile 64x64 (by default): per k16 step a warp issues 4 (A) + 4 (B) ldmatrix.x4 for 32 mma,
//    4 mma per ldmatrix; shared-memory bandwidth, the limit of mma.sync kernels, is then below the
//    tensor throughput. A 64x32 warp tile would need 6 ldmatrix per 16 mma (2.7 per): too close.
//
// Block tile DG_BM x DG_BN x DG_BK, warps (DG_BM/DG_WM) x (DG_BN/DG_WN), each a DG_WM x DG_WN tile
// of (DG_WM/16) x (DG_WN/8) m16n8 accumulator fragments. Default 128x128x32, 4 warps of 64x64,
// 4 stages, 80 KB dynamic shared memory: 2 blocks (8 warps) per SM.
//
// Shared-memory layout. Each operand tile is stored in the global operand's own orientation (its
// contiguous dimension contiguous in shared memory too), so a 16-byte cp.async copies 8 contiguous
// global elements to 8 contiguous shared elements: OUTER rows of INNER elements, in 16-byte chunks:
//   A row-major: As[BM][BK] (k contiguous)      A col-major: As[BK][BM] (m contiguous)
//   B col-major: Bs[BN][BK] (k contiguous)      B row-major: Bs[BK][BN] (n contiguous)
// An ldmatrix phase reads 8 rows x 16 bytes at consecutive row indices (same chunk column); a
// cp.async phase writes 8 consecutive chunks of a row. Two ways to make both conflict-free:
//  * DG_SWIZZLE=0, PADDING: row pitch INNER+8 elements. The pitch in 16-byte units, INNER/8 + 1, is
//    odd, so 8 consecutive rows fall on 8 distinct 16-byte bank groups. Costs 8/INNER extra smem
//    (20 % at BK=32) and cp.async stores with INNER = 32 are 2-way conflicted in 1 of 8 lanes.
//  * DG_SWIZZLE=1, XOR SWIZZLE: no padding; chunk c of row r is stored at chunk c ^ s(r), with
//    s(r) = (r / RPL) % SW, SW = min(CPR, 8) chunks, RPL = 8 / SW rows per 128-byte line (CPR =
//    INNER/8 chunks per row). Any 8 consecutive rows at one chunk column hit the 8 bank groups of a
//    128-byte line once each; a row's chunks are permuted within their 128-byte line. One rule for
//    every layout and tile width (s has period 8 rows for every CPR).
// ldmatrix stepping under the swizzle: a fragment's chunk column is the lane's own chunk (one bit:
// +0/+1, plus the warp's offset, a multiple of W/8) plus a compile-time step (2 per 16 elements);
// with WM, WN powers of two these bit ranges are disjoint, so chunk (c + step) ^ s == (c ^ s) ^ step:
// each fragment address is (lane address ^ 32*step bytes) + row offset, one LOP3, no table.
//
// Operand loads. Per launch and per operand, one uniform decision: the 16-byte cp.async path needs
// base % 16 bytes == 0 and ld % 8 == 0 (then every 8-element chunk that starts at an 8-aligned
// inner index is 16-byte aligned). On that path a chunk wholly outside the matrix (outer edge,
// K tail, past the inner edge) copies 0 bytes = 16 zero bytes (cp.async src-size), and a chunk that
// lies partly outside (inner edge) is loaded element by element. Otherwise the scalar path loads
// each element with bounds checks (zero outside) and writes the same shared layout with ordinary
// stores; the pipeline's barriers order those as well.
//
// Pipeline (S = DG_STAGES, KS = DG_BK/16 >= 2), tile t lives in stage t % S:
//   prologue: issue tiles 0..S-2 (one commit group each, empty groups past the end); wait until
//             <= S-2 groups pending (tile 0 landed); barrier; ldmatrix step 0 of tile 0.
//   iteration kt, step ks:
//     ks == KS-1: wait <= S-2 pending (tile kt+1 landed: S-1+kt+1 groups committed so far);
//                 barrier (tile kt+1 visible to all; and every warp has done its last ldmatrix of
//                 tile kt, whose step KS-1 was fetched at ks = KS-2, so tile kt's stage may be
//                 refilled from the next iteration on); the read stage moves to tile kt+1.
//     ldmatrix step ks+1 of tile kt (or step 0 of tile kt+1) into the other fragment buffer.
//     mma of step ks.
//     ks == 0:    issue tile kt+S-1 into stage (kt+S-1)%S == (kt-1)%S, commit (empty past the end).
//                 All reads of that stage (tile kt-1) were issued before the previous iteration's
//                 barrier; all these writes come after it.
// KS >= 2 is required: the wait at ks == KS-1 counts on this iteration's commit at ks == 0.
#include "deepgemm/common.cuh"
#include "deepgemm/cp_async.cuh"
#include "deepgemm/stress.cuh"
#include "deepgemm/mma.cuh"
#include "deepgemm/grouped.cuh"

#ifndef DG_ACC_F16
#define DG_ACC_F16 0
#endif
#if DG_ACC_F16 && DG_IN != DG_F16
#error "DG_ACC_F16: fp16 inputs only (there is no bf16 mma.sync with an f16 accumulator)"
#endif
// The tile is always given by the host (deepgemm/registry.py states V4's default and config space,
// and the report's fp16acc_mma variant its own): no fallback here that could disagree with it.
#if !defined(DG_BM) || !defined(DG_BN) || !defined(DG_BK) || !defined(DG_WM) || !defined(DG_WN) || \
    !defined(DG_STAGES) || !defined(DG_GROUP_M) || !defined(DG_SWIZZLE)
#error "v4_mma.cu: define DG_BM, DG_BN, DG_BK, DG_WM, DG_WN, DG_STAGES, DG_GROUP_M and DG_SWIZZLE (registry.py)"
#endif
// DG_GROUP_M: block raster, groups of GROUP_M block rows walk N together (L2 reuse); 1 = plain.
// DG_SWIZZLE: shared tiles, 0 = rows padded by 8 elements, 1 = XOR swizzle (see above).

#define DG_THREADS ((DG_BM / DG_WM) * (DG_BN / DG_WN) * 32)
// Dynamic shared memory, bytes, the same for all four layouts (padded: an upper bound for the
// column-major A / row-major B tiles, exact for the k-contiguous ones; needs DG_BK <= DG_BM, DG_BN):
#define DG_SMEM_BYTES (DG_STAGES * (DG_BM + DG_BN) * (DG_BK + (DG_SWIZZLE ? 0 : 8)) * 2)

namespace v4 {

constexpr int BM = DG_BM, BN = DG_BN, BK = DG_BK, WM = DG_WM, WN = DG_WN, STAGES = DG_STAGES;
constexpr int THREADS = DG_THREADS;
constexpr bool SWZ = DG_SWIZZLE != 0;
constexpr int PAD = SWZ ? 0 : 8;       // elements of padding per shared row
constexpr int WARPS_N = BN / WN;
constexpr int MT = WM / 16;            // m16 fragments per warp
constexpr int NT = WN / 8;             // n8 fragments per warp
constexpr int KS = BK / 16;            // k16 steps per k-tile

// Operand tiles in shared memory: OUTER rows of INNER contiguous elements, row pitch LD = INNER + PAD.
// Global element (outer o, inner i) is at ptr[o * ld + i] for all four layouts:
//   A row-major: o = m, i = k    A col-major: o = k, i = m
//   B row-major: o = k, i = n    B col-major: o = n, i = k
constexpr bool A_KMAJ = DG_A_ROW != 0;   // A tile rows are m (k contiguous)
constexpr bool B_KMAJ = DG_B_ROW == 0;   // B tile rows are n (k contiguous)
constexpr int A_OUTER = A_KMAJ ? BM : BK, A_INNER = A_KMAJ ? BK : BM, A_LD = A_INNER + PAD;
constexpr int B_OUTER = B_KMAJ ? BN : BK, B_INNER = B_KMAJ ? BK : BN, B_LD = B_INNER + PAD;
constexpr int A_TILE = A_OUTER * A_LD;   // elements
constexpr int B_TILE = B_OUTER * B_LD;
constexpr int STAGE_ELEMS = A_TILE + B_TILE;

// Element offset of chunk c (8 elements) of row r in a tile with INNER elements per row.
template <int INNER>
__host__ __device__ constexpr int tile_off(int r, int c) {
    constexpr int CPR = INNER / 8, SW = CPR < 8 ? CPR : 8, RPL = 8 / SW;
    return SWZ ? r * INNER + 8 * (c ^ ((r / RPL) % SW)) : r * (INNER + PAD) + 8 * c;
}
// Byte offset of an ldmatrix fragment from the lane's fragment (0, 0) at byte offset `lane` (stage and
// tile included; those are multiples of 128 bytes): `inner16` steps of 16 elements along the row,
// `rows` rows down. Swizzled: XOR the column step in (disjoint bits, see the layout notes).
template <int LD>
__host__ __device__ constexpr unsigned frag_off(unsigned lane, int inner16, int rows) {
    return (SWZ ? lane ^ (32u * inner16) : lane + 32u * inner16) + 2u * (unsigned)(rows * LD);
}

static_assert(BM % WM == 0 && BN % WN == 0, "block tile must be a whole number of warp tiles");
static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile: WM, WN multiples of 16 (B is loaded in n16 pairs)");
static_assert(BK % 32 == 0, "BK must be a multiple of 32 (KS >= 2 k16 steps: see the pipeline notes)");
static_assert(BK <= BM && BK <= BN, "DG_SMEM_BYTES assumes the k-contiguous tiles are the larger ones");
static_assert(STAGES >= 2, "at least double buffering");
__host__ __device__ constexpr bool pow2(int x) { return (x & (x - 1)) == 0; }
static_assert(!SWZ || (pow2(BM) && pow2(BN) && pow2(BK) && pow2(WM) && pow2(WN)),
              "swizzle: power-of-two tiles (XOR column steps must not carry into the lane's or the row's bits)");
static_assert(THREADS >= 32 && THREADS <= 1024, "block size");
static_assert((A_OUTER * A_INNER / 8) % THREADS == 0, "A tile chunks must divide evenly among threads");
static_assert((B_OUTER * B_INNER / 8) % THREADS == 0, "B tile chunks must divide evenly among threads");
static_assert(STAGES * STAGE_ELEMS * 2 <= DG_SMEM_BYTES, "shared memory budget");
static_assert(DG_SMEM_BYTES <= 232448, "over the 227 KB per-block opt-in limit of sm_80/sm_90");
#ifdef DG_HOST_SMEM_BYTES   // what the host launches with (deepgemm/registry.py): the same bytes
static_assert(DG_SMEM_BYTES == DG_HOST_SMEM_BYTES, "the host's dynamic shared memory size differs from DG_SMEM_BYTES");
#endif

// ---- ldmatrix lane addresses (element offsets inside one operand tile) -----------------------
// A fragment of m16 x k16 at tile position (m, k): ldmatrix.x4 matrix q = lane / 8 must deliver
// register a_q, i.e. rows m + 8*(q & 1), k-columns k + 8*(q >> 1); lane row r = lane % 8.
//   k-major tile (As[m][k], no .trans): lane points at row m + 8*(q&1) + r, column k + 8*(q>>1).
//     Lane l then receives A[m + 8*(q&1) + l/4][k + 8*(q>>1) + 2(l%4) + {0,1}] = a_q.
//   m-major tile (As[k][m], .trans):    lane points at row k + 8*(q>>1) + r, column m + 8*(q&1).
//     Lane l then receives (transposed) As[k + 8*(q>>1) + 2(l%4) + {0,1}][m + 8*(q&1) + l/4] = a_q.
// (m, k: multiples of 8; the tile_off form applies the swizzle when on.)
__host__ __device__ constexpr int a_lane_offset(int lane, int m, int k) {
    return A_KMAJ ? tile_off<A_INNER>(m + (lane & 7) + 8 * ((lane >> 3) & 1), k / 8 + (lane >> 4))
                  : tile_off<A_INNER>(k + (lane & 7) + 8 * (lane >> 4), m / 8 + ((lane >> 3) & 1));
}
// B fragments for two adjacent n8 tiles (n .. n+15) at k16 position k: matrix q delivers
//   q = 0: b0 of tile n (k .. k+7)   q = 1: b1 of tile n (k+8 .. k+15)
//   q = 2: b0 of tile n+8            q = 3: b1 of tile n+8
// i.e. k-offset 8*(q & 1), n-offset 8*(q >> 1).
//   k-major tile (Bs[n][k], no .trans): lane points at row n + 8*(q>>1) + r, column k + 8*(q&1).
//     Lane l receives Bs[n + 8*(q>>1) + l/4][k + 8*(q&1) + 2(l%4) + {0,1}] = B[k..][n = .. + g] = b.
//   n-major tile (Bs[k][n], .trans):    lane points at row k + 8*(q&1) + r, column n + 8*(q>>1).
//     Lane l receives Bs[k + 8*(q&1) + 2(l%4) + {0,1}][n + 8*(q>>1) + l/4] = b.
__host__ __device__ constexpr int b_lane_offset(int lane, int k, int n) {
    return B_KMAJ ? tile_off<B_INNER>(n + (lane & 7) + 8 * (lane >> 4), k / 8 + ((lane >> 3) & 1))
                  : tile_off<B_INNER>(k + (lane & 7) + 8 * ((lane >> 3) & 1), n / 8 + (lane >> 4));
}

// ---- accumulator -> output element (m16n8 fragment, f32 C layout) ---------------------------
// acc[mt][nt][j]: row wm0 + 16 mt + lane/4 + 8 (j >> 1), column wn0 + 8 nt + 2 (lane % 4) + (j & 1).
__host__ __device__ constexpr int acc_row(int lane, int mt, int j) { return 16 * mt + (lane >> 2) + 8 * (j >> 1); }
__host__ __device__ constexpr int acc_col(int lane, int nt, int j) { return 8 * nt + 2 * (lane & 3) + (j & 1); }

// ---- block raster ----------------------------------------------------------------------------
// Linear block id -> (block row, block column), grouped: GROUP_M block rows at a time sweep all
// block columns, so the A rows of a group and the B columns stay in L2 together. A bijection on
// [0, grid_m) x [0, grid_n): each group of pids [g*GROUP_M*grid_n, ...) holds gsize*grid_n ids,
// q -> (q % gsize, q / gsize). (Int math: the tile count is far below 2^31 for any M x N that fits
// in memory.)
__host__ __device__ inline void block_coords(int pid, int grid_m, int grid_n, int& bm, int& bn) {
    const int in_group = DG_GROUP_M * grid_n;
    const int group = pid / in_group;
    const int first_m = group * DG_GROUP_M;
    const int gsize = (grid_m - first_m) < DG_GROUP_M ? (grid_m - first_m) : DG_GROUP_M;
    const int q = pid - group * in_group;
    bm = first_m + q % gsize;
    bn = q / gsize;
}

// ---- global -> shared, one operand tile --------------------------------------------------------
// Chunk c = tid + j*THREADS (j = 0 .. PER-1) covers tile row c / CPR, chunk column c % CPR.
// THREADS % CPR == 0, so a thread's chunks share one column and step RSTEP = THREADS / CPR rows:
// one base pointer plus j * RSTEP * ld per chunk (64-bit), one inner-edge count for all of them, and
// one shared offset plus j * RSTEP rows (RSTEP is a multiple of the swizzle's period of 8 rows).
// (o0, i0): global (outer, inner) of the tile's first element; o_ext, i_ext: the matrix extents.
// One uniform path per tile and operand: FULL = 16-byte copies of a tile wholly inside the matrix
// (every interior tile of an aligned operand: no bounds math in the main loop); EDGE = 16-byte
// copies of whole chunks, zero fills outside, scalar loads for a chunk across the inner edge;
// SCALAR = the misaligned fallback.
// The shared-memory side goes through two callables (element offset inside the tile):
//   copy16(soff, src, bytes): 16-byte cp.async of 16 (bytes = 16) or 16 zero bytes (bytes = 0);
//   store16(soff, w0, w1, w2, w3): ordinary 16-byte store (scalar path).
enum Path { FULL, EDGE, SCALAR };

#pragma nv_exec_check_disable
template <int OUTER, int INNER, class Copy16, class Store16>
__host__ __device__ __forceinline__ void load_tile(const dg::in_t* g, long long ld, int o0, int i0,
                                                   int o_ext, int i_ext, int path, int tid,
                                                   Copy16&& copy16, Store16&& store16) {
    constexpr int CPR = INNER / 8;           // 16-byte chunks per tile row
    constexpr int RSTEP = THREADS / CPR;     // tile rows between a thread's chunks
    constexpr int PER = OUTER / RSTEP;       // chunks per thread
    constexpr int SSTEP = RSTEP * (INNER + PAD);
    static_assert(THREADS % CPR == 0 && OUTER % RSTEP == 0, "chunk mapping");
    static_assert(!SWZ || RSTEP % 8 == 0, "swizzle: a thread's chunks must share one XOR pattern");
    const int r0 = tid / CPR;
    const int s0 = tile_off<INNER>(r0, tid % CPR);   // shared offset of chunk 0
    const int o = o0 + r0;                   // global outer index of chunk 0
    const int i = i0 + (tid % CPR) * 8;      // global inner index of every chunk's first element
    const long long step = (long long)RSTEP * ld;
    const long long off0 = (long long)o * ld + i;
    if (path == FULL) {
        // Walk one pointer down the rows, opaque after each step: otherwise the compiler hoists
        // j * step for every j out of the k loop (2*PER live registers per operand, spills at
        // 128x128x64) or rebuilds each with a 64-bit multiply.
        const dg::in_t* src = g + off0;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            copy16(s0 + j * SSTEP, src, 16);
            src += step;
#ifdef __CUDA_ARCH__
            asm volatile("" : "+l"(src));
#endif
        }
        return;
    }
    const int rest = i_ext - i;              // elements from the chunk's first to the inner edge
    const int n_in = rest < 0 ? 0 : (rest > 8 ? 8 : rest);   // in range, on an in-range row
    // A chunk that straddles the inner edge (0 < rest < 8) takes the scalar loads even on the EDGE
    // path: compute-sanitizer's memcheck counts a cp.async's whole 16 bytes as read whatever its
    // src-size (measured on the H200), and on the last row of an operand that ends at its last
    // element those bytes leave the allocation. Only the threads of the edge chunk column diverge.
    // The test is on `rest`, not on the clamped n_in: nvcc 13.0 (sm_90a) compiled
    // `n_in == 8 || n_in == 0` into a VIMNMX.RELU predicate that is true for every rest up to 8 and
    // false past 8 (measured on the H200), sending exactly the straddling chunks to cp.async.
    const bool straddles = rest > 0 && rest < 8;
    if (path == EDGE && !straddles) {
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            const int n = (o + j * RSTEP < o_ext) ? n_in : 0;
            const dg::in_t* src = n > 0 ? g + (off0 + j * step) : g;   // never read when n == 0
            copy16(s0 + j * SSTEP, src, 2 * n);
        }
    } else {
        // Scalar fallback: raw 16-bit words (0 == +0.0 in fp16 and bf16), one 16-byte shared store
        // per chunk. Not unrolled: this path keeps the register pressure of the main loop low.
        const unsigned short* gs = reinterpret_cast<const unsigned short*>(g);
#pragma unroll 1
        for (int j = 0; j < PER; ++j) {
            const bool row_ok = o + j * RSTEP < o_ext;
            const long long base = off0 + j * step;
            unsigned w[4];
#pragma unroll
            for (int e = 0; e < 8; e += 2) {
                const unsigned lo = (row_ok && e < n_in) ? gs[base + e] : 0u;
                const unsigned hi = (row_ok && e + 1 < n_in) ? gs[base + e + 1] : 0u;
                w[e / 2] = lo | (hi << 16);
            }
            store16(s0 + j * SSTEP, w[0], w[1], w[2], w[3]);
        }
    }
}

#if DG_ACC_F16
// d += A(16x16) * B(16x8) with fp16 accumulators in place: d[0] = {C[g][2t], C[g][2t+1]},
// d[1] = {C[g+8][2t], C[g+8][2t+1]} (low half = lower column; PTX ISA, mma.m16n8k16 .f16 C/D).
__device__ __forceinline__ void mma_16816_f16acc(unsigned (&d)[2], const unsigned (&a)[4], const unsigned (&b)[2]) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 "
        "{%0, %1}, {%2, %3, %4, %5}, {%6, %7}, {%0, %1};\n"
        : "+r"(d[0]), "+r"(d[1])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    dg_host_mma_16816_f16acc(d, a, b);   // a host build (mma.cuh declares it)
#endif
}
#endif

// ---- one block tile --------------------------------------------------------------------------
// The whole work of a block: tile (bm_idx, bn_idx) of the one GEMM p describes. The entry point
// below only chooses p and the tile (a grouped launch passes group g's view of its problem), so the
// pipeline is the same code for plain, batched and grouped problems. Every thread of the block must
// call it with the same arguments: it has barriers.
__device__ __forceinline__ void block_tile(const GemmParams& p, int bm_idx, int bn_idx) {
#ifdef __CUDA_ARCH__
    extern __shared__ __align__(128) unsigned char dg_smem[];
#else
    unsigned char* const dg_smem = dg_host_dynamic_smem();   // a host build: the block's, from its launch
#endif
    dg::in_t* smem = reinterpret_cast<dg::in_t*>(dg_smem);
    const unsigned smem_base = dg::smem_u32(dg_smem);

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm0 = (warp / WARPS_N) * WM;   // warp tile origin inside the block tile
    const int wn0 = (warp % WARPS_N) * WN;

    const int bm0 = bm_idx * BM;
    const int bn0 = bn_idx * BN;

    const dg::in_t* ga = static_cast<const dg::in_t*>(p.a);
    const dg::in_t* gb = static_cast<const dg::in_t*>(p.b);
    // Uniform per block (per launch for one GEMM): may this operand use 16-byte cp.async?
    const bool vec_a = ((reinterpret_cast<unsigned long long>(p.a) & 15ull) == 0) && (p.lda % 8 == 0);
    const bool vec_b = ((reinterpret_cast<unsigned long long>(p.b) & 15ull) == 0) && (p.ldb % 8 == 0);
    // ... and are this block's rows of A (columns of B) all inside the matrix? (FULL needs k too.)
    const bool in_a = vec_a && bm0 + BM <= p.m, in_b = vec_b && bn0 + BN <= p.n;

    const int ktiles = (p.k + BK - 1) / BK;

    // Issue the copies of k-tile kt into stage st (no commit).
    auto load_stage = [&](int kt, int st) {
        const int k0 = kt * BK;
        const int a_base = st * STAGE_ELEMS;       // element offsets of the stage's tiles
        const int b_base = a_base + A_TILE;
        auto cpa = [&](int soff, const dg::in_t* src, int bytes) {
            dg::cp_async_16(smem_base + 2u * (unsigned)(a_base + soff), src, bytes);
        };
        auto sta = [&](int soff, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
            *reinterpret_cast<uint4*>(smem + a_base + soff) = make_uint4(w0, w1, w2, w3);
        };
        auto cpb = [&](int soff, const dg::in_t* src, int bytes) {
            dg::cp_async_16(smem_base + 2u * (unsigned)(b_base + soff), src, bytes);
        };
        auto stb = [&](int soff, unsigned w0, unsigned w1, unsigned w2, unsigned w3) {
            *reinterpret_cast<uint4*>(smem + b_base + soff) = make_uint4(w0, w1, w2, w3);
        };
        const bool kin = k0 + BK <= p.k;
        const int pa = in_a && kin ? FULL : vec_a ? EDGE : SCALAR;
        const int pb = in_b && kin ? FULL : vec_b ? EDGE : SCALAR;
        if constexpr (A_KMAJ) load_tile<A_OUTER, A_INNER>(ga, p.lda, bm0, k0, p.m, p.k, pa, tid, cpa, sta);
        else                  load_tile<A_OUTER, A_INNER>(ga, p.lda, k0, bm0, p.k, p.m, pa, tid, cpa, sta);
        if constexpr (B_KMAJ) load_tile<B_OUTER, B_INNER>(gb, p.ldb, bn0, k0, p.n, p.k, pb, tid, cpb, stb);
        else                  load_tile<B_OUTER, B_INNER>(gb, p.ldb, k0, bn0, p.k, p.n, pb, tid, cpb, stb);
    };

    // This lane's ldmatrix byte offsets from smem_base for fragment (0, 0) at k-step 0 of stage 0.
    const unsigned a_lane = 2u * (unsigned)a_lane_offset(lane, wm0, 0);
    const unsigned b_lane = 2u * (unsigned)(A_TILE + b_lane_offset(lane, 0, wn0));

#if DG_ACC_F16
    unsigned acc[MT][NT][2];   // .f16x2 pairs: 0 = (+0, +0)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
            acc[mt][nt][0] = acc[mt][nt][1] = 0u;
#else
    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[mt][nt][j] = 0.0f;
#endif

    unsigned af[2][MT][4];   // A fragments, double-buffered over k16 steps
    unsigned bf[2][NT][2];   // B fragments

    // ldmatrix all fragments of k16 step ks of the tile in stage st into buffer buf.
    auto load_frags = [&](int buf, int st, int ks) {
        const unsigned stage_off = 2u * (unsigned)(st * STAGE_ELEMS);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
            dg::ldsm_x4_t<!A_KMAJ>(af[buf][mt], smem_base + (A_KMAJ ? frag_off<A_LD>(a_lane + stage_off, ks, 16 * mt)
                                                                     : frag_off<A_LD>(a_lane + stage_off, mt, 16 * ks)));
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            unsigned r[4];
            dg::ldsm_x4_t<!B_KMAJ>(r, smem_base + (B_KMAJ ? frag_off<B_LD>(b_lane + stage_off, ks, 16 * np)
                                                          : frag_off<B_LD>(b_lane + stage_off, np, 16 * ks)));
            bf[buf][2 * np][0] = r[0];
            bf[buf][2 * np][1] = r[1];
            bf[buf][2 * np + 1][0] = r[2];
            bf[buf][2 * np + 1][1] = r[3];
        }
    };

    // ---- prologue: tiles 0 .. S-2 in flight --------------------------------------------------
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < ktiles) load_stage(s, s);
        dg::cp_async_commit();
    }
    dg::cp_async_wait<STAGES - 2>();
    __syncthreads();

    int read_stage = 0;            // stage of tile kt
    int write_stage = STAGES - 1;  // stage of tile kt + S - 1
    int kt_load = STAGES - 1;      // next tile to issue
    load_frags(0, 0, 0);

    // ---- main loop -------------------------------------------------------------------------------
    for (int kt = 0; kt < ktiles; ++kt) {
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
            if (ks == KS - 1) {
                dg::stress_pause(threadIdx.x / 32, 0, kt);
                dg::cp_async_wait<STAGES - 2>();   // tile kt+1 has landed (this thread's copies)
                __syncthreads();                   // ... everyone's; and all warps are done reading tile kt
                read_stage = (read_stage + 1 == STAGES) ? 0 : read_stage + 1;
            }
            // Fragments of the next k16 step: step ks+1 of tile kt, or step 0 of tile kt+1. On the last
            // iteration this reads a stage with no live tile (no copy in flight to it); never used.
            load_frags((ks + 1) & 1, read_stage, (ks + 1) % KS);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
#if DG_ACC_F16
                    mma_16816_f16acc(acc[mt][nt], af[ks & 1][mt], bf[ks & 1][nt]);
#else
                    dg::mma_16816<dg::in_t>(acc[mt][nt], af[ks & 1][mt], bf[ks & 1][nt]);
#endif
            // After the mma, not before: the copy issue is branchy (FULL/EDGE/SCALAR), and the
            // scheduler does not move the mma across branches, so this keeps the tensor core fed.
            if (ks == 0) {
                dg::stress_pause(threadIdx.x / 32, 1, kt);
                if (kt_load < ktiles) load_stage(kt_load, write_stage);
                dg::cp_async_commit();
                ++kt_load;
                write_stage = (write_stage + 1 == STAGES) ? 0 : write_stage + 1;
            }
        }
    }
    dg::cp_async_wait<0>();   // nothing real is in flight (only empty groups); leave no copy behind

#if DG_ACC_F16
    // ---- epilogue: each fp16 accumulator -> float (exact) -> the fused chain and the cast ------
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const unsigned short bits = (unsigned short)(acc[mt][nt][j >> 1] >> (16 * (j & 1)));
                dg::store_d(p, bm0 + wm0 + acc_row(lane, mt, j), bn0 + wn0 + acc_col(lane, nt, j),
                            __half2float(__ushort_as_half(bits)));
            }
#else
    // ---- epilogue: acc[mt][nt][j] -> D(row, col), the fused chain and the cast -----------------
    // Interior tiles with pair-aligned D (and C): j = 0, 1 (and 2, 3) are the adjacent columns
    // col, col + 1 of one row, col even: one paired access each. Edge tiles: checked per element.
    if (bm0 + BM <= p.m && bn0 + BN <= p.n && dg::epilogue_pairs_ok(p)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 4; j += 2)   // every load of the chain first, then every store
                    dg::epilogue_pair_interior(p, bm0 + wm0 + acc_row(lane, mt, j), bn0 + wn0 + acc_col(lane, nt, j),
                                               acc[mt][nt][j], acc[mt][nt][j + 1]);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 4; j += 2)
                    dg::store_pair_interior(p, bm0 + wm0 + acc_row(lane, mt, j), bn0 + wn0 + acc_col(lane, nt, j),
                                            acc[mt][nt][j], acc[mt][nt][j + 1]);
    } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    dg::store_d(p, bm0 + wm0 + acc_row(lane, mt, j), bn0 + wn0 + acc_col(lane, nt, j), acc[mt][nt][j]);
    }
#endif
}

}  // namespace v4

// The one entry point (DG_GROUPED picks its body). One GEMM: one block per tile, grid (tiles along
// N, tiles along M), in the GROUP_M raster.
//
// Batched and grouped GEMM (DG_GROUPED = 1, deepgemm/grouped.cuh): one block per tile of one
// group. The grid is sized on the host without the group sizes (they may exist only on the device,
// and a CUDA graph replays the launch with new ones), so it may hold blocks with no tile: each finds
// out from blockIdx and p alone, the same answer for every thread, and returns before block_tile's
// first cp.async or barrier.
//   batch, masked:   grid (tiles along N, tiles along p.m, G); blockIdx.z is the group, the
//                    GROUP_M raster runs inside it, and the tile rows past a masked group's rows exit.
//   sizes, offsets:  grid (tiles along N, ceil(p.m / BM) + G, 1); grid.y counts virtual tile rows,
//                    group 0's ceil(rows_0 / BM) first, then group 1's, and so on. Their sum is at most
//                    ceil(p.m / BM) + G - 1 (the groups' rows add up to at most p.m, and each group
//                    rounds up by less than one tile), so the grid covers every group; the rows past
//                    the sum exit. (Offsets that decrease make groups overlap and may add up past the
//                    grid: the tiles past it are not computed, and nothing is read or written outside
//                    the groups' clamped rows.) The GROUP_M raster runs over the virtual rows: a
//                    bijection of the grid, whatever the groups.
extern "C" __global__ void __launch_bounds__(DG_THREADS, 1) deepgemm_kernel(const dg::KernelParams p) {
    int bm_idx, bn_idx;
    v4::block_coords(blockIdx.y * gridDim.x + blockIdx.x, gridDim.y, gridDim.x, bm_idx, bn_idx);
#if !DG_GROUPED
    v4::block_tile(p, bm_idx, bn_idx);
#else
    dg::GroupCursor group;
    if (p.group_mode == DG_GROUP_SIZES || p.group_mode == DG_GROUP_OFFSETS) {
        // The walk the cursor needs anyway (sizes: each group starts where the previous ends):
        // take whole groups' tile rows off the virtual row until it falls inside one.
        for (;;) {
            if (!group.next(p)) return;   // past every group's tiles
            const int tiles = (group.rows + v4::BM - 1) / v4::BM;
            if (bm_idx < tiles) break;
            bm_idx -= tiles;
        }
    } else {
        // A batch or masked group's rows do not depend on the groups before it: start the cursor
        // just before group blockIdx.z instead of walking to it.
        group.g = (int)blockIdx.z - 1;
        if (!group.next(p) || bm_idx * v4::BM >= group.rows) return;
    }
    v4::block_tile(dg::group_params(p, group.g, group.base, group.rows), bm_idx, bn_idx);
#endif
}
