// small_m: skinny GEMM for decode-sized M (M <= 64; best at M <= 16), bound by streaming B once.
//
// At M <= 16 the FLOPs are negligible: the kernel is a weight stream, and its speed is how many
// bytes of B are in flight per SM and how evenly the SMs share them. So:
//  * Mapping: a block owns CW = 8 * DG_SMALL_M_NT output columns (and 16 * DG_SMALL_M_MT rows:
//    gridDim.y covers M in row blocks; each row block re-streams B, so pick MT >= ceil(M / 16)).
//    Its DG_SMALL_M_WARPS warps split K among themselves in groups of DG_SMALL_M_UNROLL 32-k steps
//    (group G goes to warp G % WARPS), so N / CW blocks x WARPS warps keep every SM busy (N = 4096,
//    NT = 2: 256 blocks, 2048 warps) without any cross-block reduction: one launch, no workspace, no
//    atomics, and the result is bitwise deterministic (partials are summed in warp order).
//  * Loads: each lane issues NT 16-byte B loads per 32-k step, all UNROLL steps of a group before
//    any math (NT * UNROLL * 16 bytes in flight per lane). B bypasses L1 (read once); A (tiny) is
//    re-read by every block and stays in L1/L2.
//  * Math: mma.sync m16n8k16 (FP32 accumulate), A as the 16-row operand (rows >= M are zero
//    registers, never loaded). The k order inside a 32-k step is permuted so that both operands
//    come from 16-byte loads: lane (g = lane/4, t = lane%4) holds k = 8t .. 8t+7 of its A rows and
//    B column; mma step s in {0, 1} uses k = 8t + 4s + {0..3} as the fragment's k pairs
//    {2t, 2t+1} and {2t+8, 2t+9}. A sum is a sum in any k order, as long as A and B agree.
//  * B column-major (b[n * ldb + k], K-contiguous: nn.Linear's weight w.T): the 16-byte load of
//    column n = n0 + 8j + g at k0 + 8t is directly the B fragment of both mma steps.
//    B row-major (b[k * ldb + n]): 16-byte loads run along n, so each warp stages its 32 x CW
//    chunk in a private shared buffer (rows stored in the permuted k order above, XOR-swizzled so
//    both the stores and ldmatrix are conflict-free) and ldmatrix.trans turns it into fragments.
//  * Tails and misalignment: a step that is not wholly inside K, a column past N, or an operand
//    whose base/leading dimension is not 16-byte aligned takes the scalar path (per-element loads,
//    zero outside the matrix); A column-major always does (A is tiny).
//  * Epilogue: the warps' partial tiles meet in shared memory; each element is summed over warps
//    in index order and written with dg::store_d (the whole fused chain, bounds-checked).
#include "deepgemm/common.cuh"
#include "deepgemm/cp_async.cuh"
#include "deepgemm/mma.cuh"

#ifndef DG_SMALL_M_NT
#define DG_SMALL_M_NT 2        // n8 tiles per block (block = 8 * NT columns)
#endif
#ifndef DG_SMALL_M_MT
#define DG_SMALL_M_MT 1        // m16 tiles per block (block = 16 * MT rows)
#endif
#ifndef DG_SMALL_M_WARPS
#define DG_SMALL_M_WARPS 8     // warps per block, splitting K
#endif
#ifndef DG_SMALL_M_UNROLL
#define DG_SMALL_M_UNROLL 4    // 32-k steps whose loads are issued together
#endif
#ifndef DG_SMALL_M_STAGES
#define DG_SMALL_M_STAGES 1    // 1: B's loads of a group go to registers; S >= 2: a cp.async ring (below)
#endif

#define DG_SMALL_M_THREADS (DG_SMALL_M_WARPS * 32)

namespace small_m {

constexpr int NT = DG_SMALL_M_NT, MT = DG_SMALL_M_MT, WARPS = DG_SMALL_M_WARPS, U = DG_SMALL_M_UNROLL;
constexpr int CW = 8 * NT, RB = 16 * MT;
constexpr bool B_KCONTIG = DG_B_ROW == 0;
static_assert(NT == 1 || NT == 2 || NT == 4, "DG_SMALL_M_NT: 1, 2 or 4 (the shared swizzle is proven for these)");
static_assert(MT >= 1 && MT <= 4, "DG_SMALL_M_MT: 1..4");
static_assert(WARPS >= 1 && WARPS <= 32 && U >= 1, "DG_SMALL_M_WARPS, DG_SMALL_M_UNROLL");

// Shared bytes: the reduction buffer (WARPS x RB x CW floats) is the larger user; the B row-major
// staging (per warp 2 steps-halves x NT tiles x 16 rows x 16 bytes) reuses the same memory.
constexpr int RED_BYTES = WARPS * RB * CW * 4;
constexpr int STAGE_BYTES_PER_WARP = 2 * NT * 16 * 16;
static_assert(RED_BYTES >= WARPS * STAGE_BYTES_PER_WARP, "staging fits in the reduction buffer");
// DG_SMALL_M_STAGES = S >= 2 with a K-contiguous B: each warp streams B through a private ring of S
// groups in shared memory (U x NT 16-byte chunks per lane; a lane reads back only its own), filled
// by cp.async S - 1 groups ahead, so a warp's loads stay in flight while it multiplies. On the
// register path a warp issues a group, waits for all of it, then multiplies. On the H200, 14336 x
// 4096 weights, L2 evicted with clean lines: 3.1 TB/s on the register path, 3.5 with the ring (NT 4,
// UNROLL 1, 2 stages), a copy 4.2; with the L2 full of dirty lines (after a memset) the ring
// is 1-3 % behind instead (docs/performance.md). The ring reuses the reduction buffer's memory (the
// reduction starts after the last wait).
constexpr int S = DG_SMALL_M_STAGES;
constexpr bool RING = B_KCONTIG && S >= 2;
constexpr int GROUP_BYTES = U * NT * 32 * 16;
constexpr int SMEM_BYTES = (S >= 2 && WARPS * S * GROUP_BYTES > RED_BYTES) ? WARPS * S * GROUP_BYTES : RED_BYTES;
static_assert(S >= 1 && S <= 8, "DG_SMALL_M_STAGES: 1..8");
#ifdef DG_HOST_SMEM_BYTES   // what the host launches with (deepgemm/registry.py): the same bytes
static_assert(SMEM_BYTES == DG_HOST_SMEM_BYTES, "the host's dynamic shared memory size differs from SMEM_BYTES");
#endif

// 16-byte read-only load that does not allocate in L1 (B is read exactly once) and asks L2 for
// the whole 256-byte neighbourhood (the warp's next steps read it).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
#ifdef __CUDA_ARCH__
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
#else
    return DG_HOST_LOAD16(p);   // a host build (the CPU tier's): traps when misaligned, as a GPU does
#endif
}
// The ring's 16-byte copy of B into shared memory, with ldg_stream's L2 hint (cp_async_16's is 128B).
__device__ __forceinline__ void cp_async_stream(unsigned dst, const void* src) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16;\n" :: "r"(dst), "l"(src) : "memory");
#else
    dg_host_cp_async_16(dst, src, 16);
#endif
}
// 16-byte read-only load through L1 (A: re-read by every block on the SM).
__device__ __forceinline__ uint4 ldg_cached(const void* p) {
#ifdef __CUDA_ARCH__
    uint4 r;
    asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
    return r;
#else
    return DG_HOST_LOAD16(p);
#endif
}

// Eight 16-bit elements src[off(0)], ..., src[off(7)] where valid(e), zero elsewhere: the scalar path.
template <class Off, class Valid>
__device__ __forceinline__ uint4 gather8(const unsigned short* src, Off&& off, Valid&& valid) {
    unsigned w[4];
#pragma unroll
    for (int e = 0; e < 8; e += 2) {
        const unsigned lo = valid(e) ? src[off(e)] : 0u;
        const unsigned hi = valid(e + 1) ? src[off(e + 1)] : 0u;
        w[e / 2] = lo | (hi << 16);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// B row-major staging: the chunk of physical k-row p (0..31 within the step) and n8 tile j goes to
// mma step s = (p >> 2) & 1 as fragment k index kappa = 2t + 8hi + lo (t = p >> 3, hi = (p >> 1) & 1,
// lo = p & 1): the same permuted k order as the A fragments. Row slot inside the 16-row matrix
// block (s, j): 8hi + ((2t + lo) ^ key), key = (2hi + 4s + 5j) & 7, which makes every 8-lane phase
// of the 16-byte stores hit 8 distinct bank groups for NT = 1, 2, 4 (checked exhaustively), while
// ldmatrix (8 rows of one (s, j, hi)) sees a permutation of 8 consecutive slots.
__device__ __forceinline__ int stage_slot(int s, int j, int hi, int low3) {
    return (s * NT + j) * 16 + 8 * hi + (low3 ^ ((2 * hi + 4 * s + 5 * j) & 7));
}

}  // namespace small_m

extern "C" __global__ void __launch_bounds__(DG_SMALL_M_THREADS) deepgemm_kernel(const GemmParams p) {
    using namespace small_m;
#ifdef __CUDA_ARCH__
    extern __shared__ __align__(128) unsigned char dg_smem[];
#else
    unsigned char* const dg_smem = dg_host_dynamic_smem();   // a host build: the block's, from its launch
#endif

    // Launched as a programmatic dependent: nothing before this reads or writes global memory.
    dg::grid_dependency_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * CW;
    const int m0 = blockIdx.y * RB;
    const unsigned short* ga = static_cast<const unsigned short*>(p.a);
    const unsigned short* gb = static_cast<const unsigned short*>(p.b);
    // Uniform per launch: may this operand use 16-byte loads?
    const bool vec_a = DG_A_ROW && ((reinterpret_cast<unsigned long long>(p.a) & 15ull) == 0) && (p.lda % 8 == 0);
    const bool vec_b = ((reinterpret_cast<unsigned long long>(p.b) & 15ull) == 0) && (p.ldb % 8 == 0);

    float acc[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.0f;

    // Rows of A this lane feeds (g and g + 8 of each m16 tile), and whether they exist.
    bool row_ok[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) row_ok[mt][h] = m0 + 16 * mt + g + 8 * h < p.m;

    const unsigned stage_base = dg::smem_u32(dg_smem) + warp * STAGE_BYTES_PER_WARP;
    const int steps = (p.k + 31) / 32;
    const int groups = (steps + U - 1) / U;

    // The ring (RING builds): this warp's groups are warp + i * WARPS, i = 0, 1, ..., group i in
    // stage i % S. A chunk cp.async cannot copy whole (past N or K, or B misaligned) the lane
    // writes itself: zeros, or the scalar gather.
    unsigned char* const ring = dg_smem + warp * S * GROUP_BYTES;
    auto ring_stage = [&](int grp) { return ring + ((grp - warp) / WARPS % S) * GROUP_BYTES; };
    auto ring_issue = [&](int grp) {
        unsigned char* const stage = ring_stage(grp);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (grp * U + u) * 32;
            const bool full = k0 + 32 <= p.k;
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int n = n0 + 8 * j + g, kk = k0 + 8 * t;
                uint4* const dst = reinterpret_cast<uint4*>(stage + ((u * NT + j) * 32 + lane) * 16);
                if (n >= p.n || k0 >= p.k) {
                    *dst = make_uint4(0, 0, 0, 0);
                } else if (vec_b && full) {
                    cp_async_stream(dg::smem_u32(dst), gb + (long long)n * p.ldb + kk);
                } else {
                    *dst = gather8(gb, [&](int e) { return dg::b_index(kk + e, n, p.ldb); },
                                   [&](int e) { return kk + e < p.k; });
                }
            }
        }
    };
    if constexpr (RING) {   // the first S - 1 groups; one commit each, even when empty
#pragma unroll
        for (int i = 0; i < S - 1; ++i) {
            if (warp + i * WARPS < groups) ring_issue(warp + i * WARPS);
            dg::cp_async_commit();
        }
    }

    for (int grp = warp; grp < groups; grp += WARPS) {
        if constexpr (RING) {   // the group S - 1 ahead, into the stage this warp read last time round
            if (grp + (S - 1) * WARPS < groups) ring_issue(grp + (S - 1) * WARPS);
            dg::cp_async_commit();
        }
        uint4 ra[U][MT][2];   // A: k = k0 + 8t .. +7 of rows g, g + 8
        uint4 rb[U][NT];      // B: col-major: column n0 + 8j + g, k0 + 8t .. +7; row-major: chunk lane + 32j
        // ---- issue every load of the group ---------------------------------------------------
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k0 = (grp * U + u) * 32;
            const bool full = k0 + 32 <= p.k;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = m0 + 16 * mt + g + 8 * h, kk = k0 + 8 * t;
                    if (!row_ok[mt][h] || k0 >= p.k) {
                        ra[u][mt][h] = make_uint4(0, 0, 0, 0);
                    } else if (vec_a && full) {
                        ra[u][mt][h] = ldg_cached(ga + (long long)row * p.lda + kk);
                    } else {
                        ra[u][mt][h] = gather8(ga, [&](int e) { return dg::a_index(row, kk + e, p.lda); },
                                               [&](int e) { return kk + e < p.k; });
                    }
                }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if constexpr (RING) {   // B comes from the ring, below
                } else if constexpr (B_KCONTIG) {
                    const int n = n0 + 8 * j + g, kk = k0 + 8 * t;
                    if (n >= p.n || k0 >= p.k) {
                        rb[u][j] = make_uint4(0, 0, 0, 0);
                    } else if (vec_b && full) {
                        rb[u][j] = ldg_stream(gb + (long long)n * p.ldb + kk);
                    } else {
                        rb[u][j] = gather8(gb, [&](int e) { return dg::b_index(kk + e, n, p.ldb); },
                                           [&](int e) { return kk + e < p.k; });
                    }
                } else {
                    const int c = lane + 32 * j;          // chunk: k-row c / NT, n8 tile c % NT
                    const int kk = k0 + c / NT, n = n0 + 8 * (c % NT);
                    if (kk >= p.k || n >= p.n) {
                        rb[u][j] = make_uint4(0, 0, 0, 0);
                    } else if (vec_b && n + 8 <= p.n) {
                        rb[u][j] = ldg_stream(gb + (long long)kk * p.ldb + n);
                    } else {
                        rb[u][j] = gather8(gb, [&](int e) { return dg::b_index(kk, n + e, p.ldb); },
                                           [&](int e) { return n + e < p.n; });
                    }
                }
            }
        }
        if constexpr (RING) {   // this group's stage, once this lane's copies of it have landed
            dg::cp_async_wait<S - 1>();
            const uint4* const stage = reinterpret_cast<const uint4*>(ring_stage(grp));
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int j = 0; j < NT; ++j) rb[u][j] = stage[(u * NT + j) * 32 + lane];
        }
        // ---- math ------------------------------------------------------------------------------
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if ((grp * U + u) * 32 >= p.k) continue;   // warp-uniform: past the end of K
            unsigned bf[2][NT][2];                  // [mma step s][tile j]
            if constexpr (B_KCONTIG) {
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    bf[0][j][0] = rb[u][j].x; bf[0][j][1] = rb[u][j].y;
                    bf[1][j][0] = rb[u][j].z; bf[1][j][1] = rb[u][j].w;
                }
            } else {
                __syncwarp();   // the previous step's ldmatrix reads are done
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int c = lane + 32 * j, pr = c / NT, tile = c % NT;
                    const int s = (pr >> 2) & 1, hi = (pr >> 1) & 1, low3 = 2 * (pr >> 3) + (pr & 1);
                    const unsigned addr = stage_base + 16u * (unsigned)stage_slot(s, tile, hi, low3);
#ifdef __CUDA_ARCH__
                    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                                 :: "r"(addr), "r"(rb[u][j].x), "r"(rb[u][j].y), "r"(rb[u][j].z), "r"(rb[u][j].w)
                                 : "memory");
#else
                    dg_host_st_shared_16(addr, &rb[u][j]);   // a host build (cp_async.cuh declares it)
#endif
                }
                __syncwarp();
                // Matrices (s, j, hi) in order ((s * NT + j) * 2 + hi); one ldmatrix.x4 per 4 of them.
#pragma unroll
                for (int q = 0; q < NT; ++q) {
                    const int mat = 4 * q + (lane >> 3), r = lane & 7;
                    const int hi = mat & 1, sj = mat >> 1, s = sj / NT, j = sj % NT;
                    unsigned regs[4];
                    dg::ldsm_x4_trans(regs, stage_base + 16u * (unsigned)stage_slot(s, j, hi, r));
#pragma unroll
                    for (int i = 0; i < 4; i += 2) {
                        const int msj = (4 * q + i) >> 1;
                        bf[msj / NT][msj % NT][0] = regs[i];
                        bf[msj / NT][msj % NT][1] = regs[i + 1];
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    const uint4& a0 = ra[u][mt][0];
                    const uint4& a1 = ra[u][mt][1];
                    const unsigned af[4] = {s ? a0.z : a0.x, s ? a1.z : a1.x, s ? a0.w : a0.y, s ? a1.w : a1.y};
#pragma unroll
                    for (int j = 0; j < NT; ++j) dg::mma_16816<dg::in_t>(acc[mt][j], af, bf[s][j]);
                }
        }
    }

    // ---- deterministic reduction over warps, then the epilogue ----------------------------------
    if constexpr (RING) dg::cp_async_wait<0>();   // no copy may land in the reduction buffer
    __syncthreads();   // every warp is done with its staging buffer
    float* red = reinterpret_cast<float*>(dg_smem);   // [WARPS][RB][CW]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * mt + g + 8 * (e >> 1), c = 8 * j + 2 * t + (e & 1);
                red[(warp * RB + r) * CW + c] = acc[mt][j][e];
            }
    __syncthreads();
    for (int idx = threadIdx.x; idx < RB * CW; idx += DG_SMALL_M_THREADS) {
        float v = 0.0f;
#pragma unroll 4
        for (int w = 0; w < WARPS; ++w) v += red[w * RB * CW + idx];
        dg::store_d(p, m0 + idx / CW, n0 + idx % CW, v);
    }
}
