// Hopper (sm_90a) building blocks for V5: mbarriers, TMA loads, wgmma and its shared-memory
// descriptors, setmaxnreg. Thin wrappers over PTX (ISA 8.0+), one instruction each, so the kernel
// reads as the algorithm. Every wrapper is __forceinline__: nothing here costs a call.
#pragma once
#include "deepgemm/common.cuh"
#include "deepgemm/cp_async.cuh"

#if DG_IN == DG_BF16
#define DG_WGMMA_AB ".bf16.bf16"
#else
#define DG_WGMMA_AB ".f16.f16"
#endif

#ifndef __CUDA_ARCH__
// A host build of V5 (the CPU tier's: tests/cpu/harness/grid_host_runtime.cpp) defines these: the
// mbarriers, TMA copies, bulk groups, named barriers, shared-memory accesses and wgmma of a block,
// run by the scheduler that runs the other kernels' host builds. The cluster instructions have no
// host form: a host build stops at the first one it executes.
void dg_host_mbar_init(unsigned bar, unsigned count);
void dg_host_mbar_arrive(unsigned bar, unsigned tx_bytes);
void dg_host_mbar_wait(unsigned bar, unsigned parity);
void dg_host_tma_load(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar);
void dg_host_tma_store(const void* map, unsigned src, int c0, int c1, int c2);
void dg_host_bulk_commit();
void dg_host_bulk_wait_read(int n);
void dg_host_named_barrier(int id, int count, bool wait);
void dg_host_wgmma(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int trans_a, int trans_b,
                   bool bf16);
void dg_host_wgmma_commit();
void dg_host_wgmma_wait(int n);
void dg_host_shared_load(unsigned addr, void* value, unsigned bytes);
void dg_host_shared_store(unsigned addr, const void* value, unsigned bytes);
void dg_host_fence_async_shared();
[[noreturn]] void dg_host_unmodelled(const char* what);
#endif

namespace dg {

// A CUtensorMap (cuda.h) as the kernel sees it: 128 opaque bytes, 64-byte aligned, passed by value
// as a __grid_constant__ parameter so TMA can read it from parameter space. Built on the host by
// deepgemm/tma.py with cuTensorMapEncodeTiled.
struct alignas(64) TmaDesc { unsigned long long opaque[16]; };

// ---- mbarrier -------------------------------------------------------------------------------
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count));
#else
    dg_host_mbar_init(bar, count);
#endif
}
// Make the inits visible to the async proxy (TMA) and the other threads before first use.
__device__ __forceinline__ void mbar_fence_init() {
#ifdef __CUDA_ARCH__
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
#else
    dg_host_mbar_arrive(bar, 0);
#endif
}
// Arrive and announce `bytes` of TMA traffic that will complete this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(unsigned bar, unsigned bytes) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
#else
    dg_host_mbar_arrive(bar, bytes);
#endif
}
// Wait until the phase with this parity has completed. A fresh barrier counts as having completed
// the phase of parity 1, so a producer's first wait on an "empty" barrier passes at once.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_%=;\n"
        "}\n" :: "r"(bar), "r"(parity) : "memory");
#else
    dg_host_mbar_wait(bar, parity);
#endif
}

// ---- TMA ------------------------------------------------------------------------------------
// Copy the 2-D box at (c0 = inner coordinate, c1) of `map` into shared memory at `dst`; the bytes
// count toward `bar`'s transaction. Out-of-bounds elements arrive as zeros (and still count).
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc* map, int c0, int c1, unsigned bar) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar) : "memory");
#else
    dg_host_tma_load(dst, map, c0, c1, 0, bar);
#endif
}
// Store the 2-D box at (c0, c1) of `map` from shared memory at `src` (bulk-group completion;
// out-of-bounds parts of the box are not written).
__device__ __forceinline__ void tma_store_2d(const TmaDesc* map, unsigned src, int c0, int c1) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];"
                 :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(src) : "memory");
#else
    dg_host_tma_store(map, src, c0, c1, 0);
#endif
}
// The 3-D forms, for batched and grouped problems: c2 is the group (a map's outermost dimension,
// one matrix per group at a fixed stride). Out-of-bounds parts act as in 2-D, per group.
__device__ __forceinline__ void tma_load_3d(unsigned dst, const TmaDesc* map, int c0, int c1, int c2, unsigned bar) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar) : "memory");
#else
    dg_host_tma_load(dst, map, c0, c1, c2, bar);
#endif
}
__device__ __forceinline__ void tma_store_3d(const TmaDesc* map, unsigned src, int c0, int c1, int c2) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%1, %2, %3}], [%4];"
                 :: "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(src) : "memory");
#else
    dg_host_tma_store(map, src, c0, c1, c2);
#endif
}
// An L2 cache policy for data read once (V5's residual C): its lines are evicted first, so
// streaming it through L2 does not push out the operand tiles that other blocks read again.
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
    unsigned long long policy;
#ifdef __CUDA_ARCH__
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
#else
    policy = 0;
#endif
    return policy;
}
// tma_load_2d / tma_load_3d with an L2 cache policy (l2_evict_first_policy).
__device__ __forceinline__ void tma_load_2d_hinted(unsigned dst, const TmaDesc* map, int c0, int c1, unsigned bar,
                                                   unsigned long long policy) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3}], [%4], %5;"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "l"(policy) : "memory");
#else
    (void)policy, dg_host_tma_load(dst, map, c0, c1, 0, bar);
#endif
}
__device__ __forceinline__ void tma_load_3d_hinted(unsigned dst, const TmaDesc* map, int c0, int c1, int c2,
                                                   unsigned bar, unsigned long long policy) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
#else
    (void)policy, dg_host_tma_load(dst, map, c0, c1, c2, bar);
#endif
}
__device__ __forceinline__ void bulk_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#else
    dg_host_bulk_commit();
#endif
}
// Wait until at most N bulk groups have not finished reading their shared memory (their global
// writes may still be in flight: enough where nothing reads D back before the kernel ends), and
// note the same N in the issuing thread's ledger (dg::StagingLedger, DG_PIPE_CHECK builds): the
// ledger checks the wait this instruction really does, with no second place that states N.
template <int N, class Ledger> __device__ __forceinline__ void bulk_wait_read(Ledger& ledger) {
#ifdef __CUDA_ARCH__
    asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
#else
    dg_host_bulk_wait_read(N);
#endif
    ledger.template reads_waited<N>();
}
// Order this thread's ordinary shared-memory writes before later async-proxy (TMA) reads of them.
__device__ __forceinline__ void fence_async_shared() {
#ifdef __CUDA_ARCH__
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#else
    dg_host_fence_async_shared();
#endif
}
// Barrier over `count` threads with id `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int count) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
#else
    dg_host_named_barrier(id, count, true);
#endif
}
// Arrive at named barrier `id` without waiting: a signal to the threads that bar.sync on it.
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
#ifdef __CUDA_ARCH__
    asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
#else
    dg_host_named_barrier(id, count, false);
#endif
}

__device__ __forceinline__ void tma_prefetch_desc(const TmaDesc* map) {
#ifdef __CUDA_ARCH__
    asm volatile("prefetch.tensormap [%0];" :: "l"(reinterpret_cast<unsigned long long>(map)) : "memory");
#else
    (void)map;
#endif
}

// ---- wgmma ----------------------------------------------------------------------------------
__device__ __forceinline__ void wgmma_fence() {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#else
    dg_host_wgmma_commit();
#endif
}
// wgmma.wait_group N, noted in the consumer's ledger (dg::WgmmaLedger) as bulk_wait_read's wait is.
template <int N, class Ledger> __device__ __forceinline__ void wgmma_wait(Ledger& ledger) {
#ifdef __CUDA_ARCH__
    asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory");
#else
    dg_host_wgmma_wait(N);
#endif
    ledger.template waited<N>();
}

// Keep the accumulators in registers across the async wgmma pipeline: tells the compiler each one
// may have changed (cheap: no instruction), so it does not move or reuse them mid-flight.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
#ifdef __CUDA_ARCH__
        asm volatile("" : "+f"(d[i]) :: "memory");
#endif
    }
}

// Shared-memory matrix descriptor for a tile written by TMA with 128-byte swizzle.
// Fields (PTX ISA, "matrix descriptor"): start address >> 4 in bits 0-13, leading byte offset >> 4
// in 16-29, stride byte offset >> 4 in 32-45, swizzle mode in 62-63 (1 = 128 B). Tiles start on a
// 1024-byte boundary (one swizzle atom = 8 rows of 128 B), so the base-offset field stays 0.
//   K-major (rows of 64 k-values): LBO unused (the k16 slice never crosses a 128-B row), SBO =
//   1024 B between groups of 8 rows. MN-major (rows of 64 m/n-values, one row per k): LBO = bytes
//   between 64-wide m/n blocks, SBO = 1024 B between groups of 8 k-rows.
__device__ __forceinline__ unsigned long long smem_desc(unsigned addr, unsigned lbo_bytes, unsigned sbo_bytes) {
    return (unsigned long long)((addr & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo_bytes >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo_bytes >> 4) & 0x3FFF) << 32)
         | (1ull << 62);
}

// ---- thread-block clusters (split-K partial sums through distributed shared memory; B shared by multicast) --
__device__ __forceinline__ unsigned cluster_rank() {
    unsigned r;
#ifdef __CUDA_ARCH__
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#else
    dg_host_unmodelled("%cluster_ctarank");
#endif
    return r;
}
// Every thread of every block in the cluster: this thread's earlier memory accesses (shared
// included) happen before the accesses of any thread after the matching wait.
__device__ __forceinline__ void cluster_sync() {
#ifdef __CUDA_ARCH__
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
#else
    dg_host_unmodelled("barrier.cluster");
#endif
}
// The same shared-memory offset in the block of rank `rank` of this cluster.
__device__ __forceinline__ unsigned cluster_map(unsigned addr, unsigned rank) {
    unsigned out;
#ifdef __CUDA_ARCH__
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
#else
    dg_host_unmodelled("mapa.shared::cluster");
#endif
    return out;
}
// Arrive on another block's mbarrier (an address from cluster_map). The default .release.cta
// semantics, as for a local arrive: a .release.cluster arrive (and an .acquire.cluster wait on the
// other side) compile to MEMBAR.ALL.GPU and an L1 invalidation per k-block, which made V5 with
// multicast 1.6-2.8x slower on the H200; the reads this arrive releases are wgmma's, already retired
// by wgmma.wait_group, and the TMA writes that follow are ordered by the mbarrier itself.
__device__ __forceinline__ void mbar_arrive_cluster(unsigned bar) {
#ifdef __CUDA_ARCH__
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" :: "r"(bar) : "memory");
#else
    dg_host_unmodelled("mbarrier.arrive.shared::cluster");
#endif
}
// tma_load_2d into every block of the cluster whose bit is set in `mask` (bit r = rank r): the box
// lands at `dst` in each of them, and counts toward each one's mbarrier at `bar` (TMA multicast).
__device__ __forceinline__ void tma_load_2d_multicast(unsigned dst, const TmaDesc* map, int c0, int c1, unsigned bar,
                                                      unsigned short mask) {
#ifdef __CUDA_ARCH__
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;"
        :: "r"(dst), "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
#else
    dg_host_unmodelled("TMA multicast");
#endif
}
// 32-bit and 16-bit shared-memory loads and stores at a .shared address (V5's staging tiles and bias
// slots). The loads carry no "memory" clobber, the stores do: the compiler may move a load past
// other memory accesses, never a store.
__device__ __forceinline__ unsigned ld_shared_b32(unsigned addr) {
    unsigned v;
#ifdef __CUDA_ARCH__
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
#else
    dg_host_shared_load(addr, &v, 4);
#endif
    return v;
}
__device__ __forceinline__ unsigned short ld_shared_u16(unsigned addr) {
    unsigned short v;
#ifdef __CUDA_ARCH__
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(addr));
#else
    dg_host_shared_load(addr, &v, 2);
#endif
    return v;
}
__device__ __forceinline__ float2 ld_shared_f32x2(unsigned addr) {
    float2 v;
#ifdef __CUDA_ARCH__
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
#else
    dg_host_shared_load(addr, &v, 8);
#endif
    return v;
}
__device__ __forceinline__ void st_shared_b32(unsigned addr, unsigned v) {
#ifdef __CUDA_ARCH__
    asm volatile("st.shared.b32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
#else
    dg_host_shared_store(addr, &v, 4);
#endif
}
__device__ __forceinline__ void st_shared_f32(unsigned addr, float v) {
#ifdef __CUDA_ARCH__
    asm volatile("st.shared.f32 [%0], %1;" :: "r"(addr), "f"(v) : "memory");
#else
    dg_host_shared_store(addr, &v, 4);
#endif
}
__device__ __forceinline__ float4 ld_cluster_f4(unsigned addr) {
    float4 v;
#ifdef __CUDA_ARCH__
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
#else
    dg_host_unmodelled("ld.shared::cluster");
#endif
    return v;
}
__device__ __forceinline__ void st_shared_f4(unsigned addr, float4 v) {
#ifdef __CUDA_ARCH__
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" :: "r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
#else
    dg_host_shared_store(addr, &v, 16);
#endif
}

// ---- register reallocation between warpgroups (needs __launch_bounds__(threads, 1)) ----------
template <int REGS> __device__ __forceinline__ void regs_dealloc() {
#ifdef __CUDA_ARCH__
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}
template <int REGS> __device__ __forceinline__ void regs_alloc() {
#ifdef __CUDA_ARCH__
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(REGS));
#endif
}

// ---- wgmma.mma_async m64nNk16, FP32 accumulators, A and B from shared memory ------------------
// TRANS_A / TRANS_B: 0 = K-major, 1 = M-/N-major (PTX imm-trans-a / imm-trans-b; 16-bit types only).
// Accumulator d[i] holds D(row, col) with, for the warp w = (thread % 128) / 32 and lane l:
// row = 16 w + l / 4 + 8 ((i / 2) % 2), col = 8 (i / 4) + 2 (l % 4) + i % 2.
#ifdef __CUDA_ARCH__
template <int N> struct Wgmma;

template <> struct Wgmma<64> {
    // D[64x64] = A(smem desc) * B(smem desc) + (scale_d ? D : 0); 32 FP32 accumulators per thread.
    template <int TRANS_A, int TRANS_B>
    static __device__ __forceinline__ void mma(float (&d)[32], unsigned long long desc_a, unsigned long long desc_b,
                                                       int scale_d) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %36, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k16.f32" DG_WGMMA_AB " "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
            "%32, %33, p, 1, 1, %34, %35;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
            : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B), "r"(scale_d));
    }
};

template <> struct Wgmma<96> {
    // D[64x96] = A(smem desc) * B(smem desc) + (scale_d ? D : 0); 48 FP32 accumulators per thread.
    template <int TRANS_A, int TRANS_B>
    static __device__ __forceinline__ void mma(float (&d)[48], unsigned long long desc_a, unsigned long long desc_b,
                                                       int scale_d) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %52, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n96k16.f32" DG_WGMMA_AB " "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47}, "
            "%48, %49, p, 1, 1, %50, %51;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
            : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B), "r"(scale_d));
    }
};

template <> struct Wgmma<128> {
    // D[64x128] = A(smem desc) * B(smem desc) + (scale_d ? D : 0); 64 FP32 accumulators per thread.
    template <int TRANS_A, int TRANS_B>
    static __device__ __forceinline__ void mma(float (&d)[64], unsigned long long desc_a, unsigned long long desc_b,
                                                       int scale_d) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %68, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k16.f32" DG_WGMMA_AB " "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
            "%64, %65, p, 1, 1, %66, %67;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
            : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B), "r"(scale_d));
    }
};

template <> struct Wgmma<192> {
    // D[64x192] = A(smem desc) * B(smem desc) + (scale_d ? D : 0); 96 FP32 accumulators per thread.
    template <int TRANS_A, int TRANS_B>
    static __device__ __forceinline__ void mma(float (&d)[96], unsigned long long desc_a, unsigned long long desc_b,
                                                       int scale_d) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %100, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n192k16.f32" DG_WGMMA_AB " "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
            "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
            "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
            "%96, %97, p, 1, 1, %98, %99;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
            : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B), "r"(scale_d));
    }
};

template <> struct Wgmma<256> {
    // D[64x256] = A(smem desc) * B(smem desc) + (scale_d ? D : 0); 128 FP32 accumulators per thread.
    template <int TRANS_A, int TRANS_B>
    static __device__ __forceinline__ void mma(float (&d)[128], unsigned long long desc_a, unsigned long long desc_b,
                                                       int scale_d) {
        asm volatile(
            "{\n"
            ".reg .pred p;\n"
            "setp.ne.b32 p, %132, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n256k16.f32" DG_WGMMA_AB " "
            "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
            "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
            "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
            "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
            "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
            "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
            "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
            "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
            "%128, %129, p, 1, 1, %130, %131;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
              "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
              "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
              "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
              "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
              "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
              "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
              "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
              "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
              "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
              "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
              "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
              "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
              "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
              "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
            : "l"(desc_a), "l"(desc_b), "n"(TRANS_A), "n"(TRANS_B), "r"(scale_d));
    }
};

#else
// A host build: every width through the runtime's wgmma, whose operands and layouts are the above.
template <int N> struct Wgmma {
    template <int TRANS_A, int TRANS_B>
    static void mma(float (&d)[N / 2], unsigned long long desc_a, unsigned long long desc_b, int scale_d) {
        if (!scale_d) dg_host_unmodelled("wgmma with scale-d = 0");
        dg_host_wgmma(d, N, desc_a, desc_b, TRANS_A, TRANS_B, DG_IN == DG_BF16);
    }
};
#endif

}  // namespace dg
