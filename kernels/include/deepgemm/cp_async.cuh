// cp.async (sm_80+): asynchronous 16-byte global -> shared copies, tracked per thread in commit
// groups. A thread's copies become visible to itself after cp.async.wait_group; to the rest of the
// block only after a barrier that follows the wait (the usual wait + __syncthreads pair).
// No system headers: this file must also compile under NVRTC.
#pragma once

#ifndef __CUDA_ARCH__
// A host build of a kernel (the CPU tier's: tests/cpu/harness/grid_host_runtime.cpp) defines these:
// shared memory is host memory there, and each copy lands when a wait_group forces it, never earlier.
unsigned char* dg_host_dynamic_smem();
unsigned dg_host_smem_u32(const void* p);
void dg_host_cp_async_16(unsigned dst, const void* src, int src_bytes);
void dg_host_cp_async_commit();
void dg_host_cp_async_wait(int n);
void dg_host_st_shared_16(unsigned addr, const void* v);   // st.shared.v4 (small_m's staging)
#endif

namespace dg {

// 32-bit shared-window address of a generic pointer into shared memory (what cp.async, ldmatrix
// and the other .shared instructions take).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
#ifdef __CUDA_ARCH__
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
#else
    return dg_host_smem_u32(p);
#endif
}

// Copy 16 bytes global -> shared, bypassing L1 (.cg). Only the first src_bytes (0..16) come from
// global memory; the rest of the 16 destination bytes are written as zeros (PTX src-size).
// src_bytes == 0 reads nothing at all, so src need only be some valid pointer. A count between 0
// and 16 is still checked by compute-sanitizer's memcheck as a read of all 16 bytes (measured on the
// H200): give one only where the 16 bytes lie inside the operand.
// dst and src must be 16-byte aligned. .L2::128B asks L2 to fetch the whole 128-byte line.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
#else
    dg_host_cp_async_16(dst, src, src_bytes);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#else
    dg_host_cp_async_commit();
#endif
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#else
    dg_host_cp_async_wait(N);
#endif
}

}  // namespace dg
