// Warp-level tensor-core helpers (sm_80+): ldmatrix and mma.sync m16n8k16 with FP32 accumulators.
// No system headers: this file must also compile under NVRTC.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16", 16-bit A/B, f32 C/D).
// lane = 0..31, g = lane >> 2 (row group), t = lane & 3 (thread in group). Each .b32 register
// holds two 16-bit values, the lower column/k index in the low half.
//   A (16x16, .row): a0 = A[g    ][2t, 2t+1]    a1 = A[g + 8][2t, 2t+1]
//                    a2 = A[g    ][2t+8, 2t+9]  a3 = A[g + 8][2t+8, 2t+9]
//   B (16x8,  .col): b0 = B[2t, 2t+1][g]        b1 = B[2t+8, 2t+9][g]        (B[k][n])
//   C/D (16x8, f32): c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
//
// ldmatrix.m8n8.x4.b16: lanes 8i..8i+7 give the addresses of rows 0..7 of matrix i (16 bytes each,
// 16-byte aligned); register ri of lane l receives, of matrix i,
//   without .trans: row l/4, elements 2(l%4), 2(l%4)+1        (M[l/4][2(l%4) + {0,1}])
//   with    .trans: element l/4 of rows 2(l%4) and 2(l%4)+1    (M[2(l%4) + {0,1}][l/4])
// So a matrix stored with rows = the fragment's row index (A: m, B: n) needs no .trans, and one
// stored with rows = the k index needs .trans: either way each lane ends up with the pair of
// k-consecutive values that the mma fragment wants.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#ifndef __CUDA_ARCH__
// A host build of a kernel (the CPU tier's: tests/cpu/harness/grid_host_runtime.cpp) defines these:
// each lane hands in its operands and waits until all 32 have, as the warp-collective instructions need.
void dg_host_ldmatrix_x4(unsigned (&r)[4], unsigned addr, bool trans);
void dg_host_mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2], bool bf16);
void dg_host_mma_16816_f16acc(unsigned (&d)[2], const unsigned (&a)[4], const unsigned (&b)[2]);
#endif

namespace dg {

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#else
    dg_host_ldmatrix_x4(r, addr, false);
#endif
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
#ifdef __CUDA_ARCH__
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#else
    dg_host_ldmatrix_x4(r, addr, true);
#endif
}

// Either form, chosen at compile time.
template <bool TRANS>
__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], unsigned addr) {
    if constexpr (TRANS) ldsm_x4_trans(r, addr); else ldsm_x4(r, addr);
}

// d += A(16x16) * B(16x8), FP32 accumulate in place. T: __half or __nv_bfloat16.
template <typename T> struct Mma16816;

template <> struct Mma16816<__half> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#ifdef __CUDA_ARCH__
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
        dg_host_mma_16816(d, a, b, false);
#endif
    }
};

template <> struct Mma16816<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
#ifdef __CUDA_ARCH__
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
        dg_host_mma_16816(d, a, b, true);
#endif
    }
};

template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    Mma16816<T>::run(d, a, b);
}

}  // namespace dg
