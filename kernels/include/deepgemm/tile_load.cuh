// Global -> shared tile loading shared by V2 (scalar) and V3 (128-bit vectors + scalar tail).
//
// Both kernels see an operand tile as BX x BK, where x is m for A and n for B, and keep it in
// shared memory k-major, as float:  S[k * LDS + x]   (LDS = row stride in floats, >= BX).
// That way the FFMA inner loop reads a row of A values and a row of B values at one k, both
// contiguous in x.
//
// "KCONTIG" says which dimension is contiguous in global memory:
//   A row-major (DG_A_ROW=1): A(m, k) at m*lda + k -> k contiguous  (KCONTIG = true)
//   A col-major             : A(m, k) at k*lda + m -> m contiguous  (KCONTIG = false)
//   B row-major (DG_B_ROW=1): B(k, n) at k*ldb + n -> n contiguous  (KCONTIG = false)
//   B col-major             : B(k, n) at n*ldb + k -> k contiguous  (KCONTIG = true)
// op_index<KCONTIG>(x, k, ld) reproduces dg::a_index / dg::b_index for that layout (64-bit).
#pragma once
#include "deepgemm/common.cuh"

namespace dg {

constexpr bool kAKContig = DG_A_ROW != 0;
constexpr bool kBKContig = DG_B_ROW == 0;

// Host builds of V3's chunk loader (tests/cpu's model of it) read through these hooks; on the
// device they are plain loads.
#ifdef __CUDA_ARCH__
#define DG_CHUNK_LOAD16(ptr) (*reinterpret_cast<const uint4*>(ptr))
#define DG_CHUNK_LOAD2(ptr) (*(ptr))
#else
#ifndef DG_HOST_LOAD2
#define DG_HOST_LOAD2(ptr) (*(ptr))
#endif
#define DG_CHUNK_LOAD16(ptr) DG_HOST_LOAD16(ptr)
#define DG_CHUNK_LOAD2(ptr) DG_HOST_LOAD2(ptr)
#endif

template <bool KCONTIG>
__host__ __device__ __forceinline__ long long op_index(int x, int k, long long ld) {
    return KCONTIG ? (long long)x * ld + k : (long long)k * ld + x;
}

// ---------------------------------------------------------------------------------------------
// V2: one element per step, zero fill outside the matrix (x >= X or k >= K).
// Consecutive threads take consecutive elements along the operand's contiguous global dimension,
// so every warp's loads are coalesced for all four layouts. The shared-memory stores are not
// conflict-free when the contiguous dimension is k (the transposing store goes down a column of
// S); that is what V3's padding fixes.
//
// Element e = it*THREADS + tid of the tile has fast index e % L and slow index e / L, where L is
// the tile's extent along the contiguous dimension (BK when KCONTIG, else BX). Because
// THREADS % L == 0 or L % THREADS == 0, both move by compile-time constants from one `it` to the
// next, so a thread needs one 64-bit base offset per tile, not one per element (keeps V2 free
// of register spills).
template <int BX, int BK, int LDS, int THREADS, bool KCONTIG>
__device__ __forceinline__ void load_tile_scalar(float* s, const in_t* g, long long ld,
                                                 int x0, int k0, int X, int K, int tid) {
    constexpr int N = BX * BK;
    constexpr int ITERS = (N + THREADS - 1) / THREADS;
    constexpr int L = KCONTIG ? BK : BX;            // tile extent along the contiguous dimension
    static_assert(THREADS % L == 0 || L % THREADS == 0, "THREADS and the tile's contiguous extent "
                  "(BK for a k-contiguous operand, BM/BN otherwise) must divide one another");
    // Opaque copy of ld: stops the compiler from hoisting the ITERS 64-bit products ds*ld out of
    // the caller's K loop and keeping them live (2 registers each) across the FFMA loop. They are
    // recomputed per tile instead (a few IMADs per 1024+ FFMAs).
    asm volatile("" : "+l"(ld));
    const int f0 = tid % L, s0 = tid / L;           // this thread's first element (fast, slow)
    // global (x, k) of the first element and its element offset
    const int gx0 = x0 + (KCONTIG ? s0 : f0), gk0 = k0 + (KCONTIG ? f0 : s0);
    const in_t* base = g + op_index<KCONTIG>(gx0, gk0, ld);
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
        const int e = it * THREADS;                 // offset of this step's elements from tid's
        if (N % THREADS == 0 || e + tid < N) {
            // (e + tid) % L == f0 + e % L and (e + tid) / L == s0 + e / L by the divisibility
            // above (e % L == 0 when THREADS % L == 0; tid == f0 < THREADS <= L otherwise).
            const int df = e % L, ds = e / L;                 // compile-time after unrolling
            const int x = KCONTIG ? s0 + ds : f0 + df;        // tile coordinates
            const int k = KCONTIG ? f0 + df : s0 + ds;
            float v = 0.0f;
            if (x0 + x < X && k0 + k < K)
                v = to_f32(base[(long long)ds * ld + df]);    // = g[op_index(x0 + x, k0 + k, ld)]
            s[k * LDS + x] = v;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// V3: the tile is cut into 8-element chunks along the contiguous global dimension (16 bytes of
// fp16/bf16). A chunk is fetched with one 128-bit load (LDG.E.128) when
//   vec (uniform: base pointer 16-byte aligned and ld % 8 == 0)  AND  the chunk lies fully inside
//   the matrix;
// otherwise with 8 guarded scalar loads (zero fill). Chunk starts are multiples of 8 elements
// (tile origins and k0 are multiples of 8 because BX % 32 == 0 and BK % 8 == 0), so with vec the
// chunk address x*ld + k (or k*ld + x) is a multiple of 8 elements = 16 bytes.
// Chunks are kept raw (uint4 = 8 x 16 bit) in registers between load() and store(), so the
// caller can issue the next tile's loads before computing on the current one.
//
// Chunk -> tile position, chosen so the global loads are fully coalesced AND the stores into the
// padded shared tile (LDS % 32 == 4, see v3_padded_vec.cu) are bank-conflict-free:
//  * KCONTIG (chunk = 8 consecutive k at one x; NKC = BK/8 chunks per x-row):
//      x = c / NKC, kc = c % NKC. Lanes of a warp read whole 16*NKC-byte row segments.
//      The chunk is stored transposed: 8 scalar STS to S[(8*kc + j) * LDS + x]. With LDS = 4
//      (mod 32), word bank = x + 4j (mod 32), independent of kc: the NKC lanes that share an
//      x-range would hit the same banks (an NKC-way conflict; no 16-byte-aligned pad can
//      separate rows 8 apart). So each lane writes its 8 values in a rotated order
//      j = (t + r) & 7, r = kc * (8 / NKC);
//      at store step t the bank is x + 4t + 32*kc/NKC (mod 32), a permutation of 0..31 over the
//      warp (32/NKC consecutive x times NKC values of kc). The rotation is done on registers with
//      compile-time-indexed selects (no local memory).
//  * !KCONTIG (chunk = 8 consecutive x at one k): stored as two float4 (STS.128) at
//      S[k * LDS + x .. x+7]. Within each group of 8 chunks (one quarter-warp): 4 consecutive
//      chunks along x at k, and the same 4 at k+1. Rows k and k+1 are 4 banks apart
//      (LDS = 4 mod 32) and the 4 chunks are 8 banks apart, so the 8 float4 of a quarter-warp
//      cover all 32 banks exactly once: each STS.128 takes the minimum 4 wavefronts whether the
//      hardware splits 128-bit accesses by quarter-warp (the classic description) or not (the
//      plain order, 8 consecutive chunks per quarter-warp, would be 2-way in the former model).
//      Globally every 4 lanes read 64 contiguous bytes (two full sectors).
template <int BX, int BK, int LDS, int THREADS, bool KCONTIG>
struct ChunkTile {
    static_assert(BK % 8 == 0 && (BK / 8 == 1 || BK / 8 == 2 || BK / 8 == 4 || BK / 8 == 8),
                  "V3 needs BK in {8, 16, 32, 64}");
    static_assert(BX % 32 == 0, "V3 needs BM, BN multiples of 32");
    static_assert(LDS % 32 == 4, "padded row stride must be 4 (mod 32) words");
    static_assert(THREADS % 32 == 0, "whole warps");
    static constexpr int NCH = BX * BK / 8;                 // chunks per tile
    static constexpr int ITERS = (NCH + THREADS - 1) / THREADS;
    static constexpr int NKC = BK / 8;                      // chunks per x-row (KCONTIG)
    static_assert(NCH % 32 == 0, "chunk count must be whole warps (keeps the guard warp-uniform)");

    uint4 r[ITERS];

    // Tile position of chunk c: x (first x for !KCONTIG) and k (first k for KCONTIG).
    __host__ __device__ __forceinline__ static void coords(int c, int& x, int& k) {
        if (KCONTIG) {
            x = c / NKC;
            k = (c % NKC) * 8;
        } else {
            constexpr int XG = BX / 32;                     // groups of 4 chunks (32 x) per k-row
            const int s = c & 7, g = c >> 3;
            k = 2 * (g / XG) + (s >> 2);
            x = 8 * (4 * (g % XG) + (s & 3));
        }
    }

    __host__ __device__ __forceinline__ void load(const unsigned short* g, long long ld, bool vec,
                                                  int x0, int k0, int X, int K, int tid) {
#ifdef __CUDA_ARCH__
        asm volatile("" : "+l"(ld));   // opaque: recompute x*ld / k*ld per tile, do not hoist (see above)
#endif
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int c = it * THREADS + tid;
            if (NCH % THREADS == 0 || c < NCH) {
                int x, k;
                coords(c, x, k);
                const int gx = x0 + x, gk = k0 + k;
                const bool full = KCONTIG ? (gx < X && gk + 8 <= K) : (gk < K && gx + 8 <= X);
                if (vec && full) {
                    r[it] = DG_CHUNK_LOAD16(g + op_index<KCONTIG>(gx, gk, ld));
                } else {
                    unsigned int w[4];
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        unsigned int h[2];
#pragma unroll
                        for (int e = 0; e < 2; ++e) {
                            const int j = 2 * q + e;
                            const int ex = KCONTIG ? gx : gx + j;
                            const int ek = KCONTIG ? gk + j : gk;
                            h[e] = (ex < X && ek < K) ? (unsigned int)DG_CHUNK_LOAD2(g + op_index<KCONTIG>(ex, ek, ld)) : 0u;
                        }
                        w[q] = h[0] | (h[1] << 16);
                    }
                    r[it] = make_uint4(w[0], w[1], w[2], w[3]);
                }
            }
        }
    }

    __host__ __device__ __forceinline__ static float bits_to_f32(unsigned int u16) {
#if DG_IN == DG_BF16
#ifdef __CUDA_ARCH__
        return __uint_as_float(u16 << 16);                  // exact bf16 -> f32
#else
        const unsigned int bits = u16 << 16;
        float f;
        memcpy(&f, &bits, 4);
        return f;
#endif
#else
        return __half2float(__ushort_as_half((unsigned short)u16));
#endif
    }

    __host__ __device__ __forceinline__ static void unpack(const uint4& v, float (&f)[8]) {
        const unsigned int w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            f[2 * q] = bits_to_f32(w[q] & 0xffffu);
            f[2 * q + 1] = bits_to_f32(w[q] >> 16);
        }
    }

    // f'[t] = f[(t + S) & 7] when cond (compile-time indices only)
    template <int S>
    __host__ __device__ __forceinline__ static void rotate_if(float (&f)[8], bool cond) {
        float t[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) t[j] = f[(j + S) & 7];
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] = cond ? t[j] : f[j];
    }

    __host__ __device__ __forceinline__ void store(float* s, int tid) const {
#pragma unroll
        for (int it = 0; it < ITERS; ++it) {
            const int c = it * THREADS + tid;
            if (NCH % THREADS == 0 || c < NCH) {
                int x, k;
                coords(c, x, k);
                float f[8];
                unpack(r[it], f);
                if (KCONTIG) {
                    const int rot = (c % NKC) * (8 / NKC);  // 0..7
                    rotate_if<1>(f, rot & 1);
                    rotate_if<2>(f, rot & 2);
                    rotate_if<4>(f, rot & 4);
#pragma unroll
                    for (int t = 0; t < 8; ++t)
                        s[(k + ((t + rot) & 7)) * LDS + x] = f[t];
                } else {
                    float4* d = reinterpret_cast<float4*>(s + k * LDS + x);
                    d[0] = make_float4(f[0], f[1], f[2], f[3]);
                    d[1] = make_float4(f[4], f[5], f[6], f[7]);
                }
            }
        }
    }
};

__device__ __forceinline__ bool aligned16(const void* ptr) {
    return (reinterpret_cast<unsigned long long>(ptr) & 15ull) == 0;
}

}  // namespace dg
