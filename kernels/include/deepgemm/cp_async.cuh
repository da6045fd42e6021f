// cp.async (sm_80+): asynchronous 16-byte global -> shared copies, tracked per thread in commit
// groups. A thread's copies become visible to itself after cp.async.wait_group; to the rest of the
// block only after a barrier that follows the wait (the usual wait + __syncthreads pair).
// No system headers: this file must also compile under NVRTC.
#pragma once

namespace dg {

// 32-bit shared-window address of a generic pointer into shared memory (what cp.async, ldmatrix
// and the other .shared instructions take).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Copy 16 bytes global -> shared, bypassing L1 (.cg). Only the first src_bytes (0..16) come from
// global memory; the rest of the 16 destination bytes are written as zeros (PTX src-size).
// src_bytes == 0 reads nothing at all, so src need only be some valid pointer. A count between 0
// and 16 is still checked by compute-sanitizer's memcheck as a read of all 16 bytes (measured on the
// H200): give one only where the 16 bytes lie inside the operand.
// dst and src must be 16-byte aligned. .L2::128B asks L2 to fetch the whole 128-byte line.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n"
                 :: "r"(dst), "l"(src), "r"(src_bytes) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

}  // namespace dg
