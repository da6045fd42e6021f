// Runs a kernel's own source on the host, compiled as C++ after this header: the CUDA-core ladder
// (V0-V3), V4 and small_m (mma.sync, ldmatrix, cp.async), V5 (mbarriers, named barriers, TMA, wgmma;
// hopper.cuh declares their host forms). Every CUDA thread of a block is a coroutine on one host
// thread, and a thread runs until it must wait for others:
//  * __syncthreads(): until every live thread of the block is there;
//  * an mbarrier wait: until the phase completes; a named barrier: until its count has arrived; a
//    wgmma commit: until the whole warpgroup is there (its .sync.aligned form);
//  * a warp-collective instruction (ldmatrix, mma.sync, __syncwarp): it needs every lane's operands
//    before any lane has its result. A lane leaves its operands in its slot and yields; once all 32
//    lanes of the warp wait at the same instruction, the scheduler computes the instruction for the
//    warp and each lane resumes with its part. Lanes that meet different instructions, or an
//    instruction met by part of a warp, are an error (the .sync.aligned forms are undefined then).
// Between two barriers the warps run one after the other, each to the next barrier (its lanes in
// turn up to each collective), in thread order in one phase and in reverse order in the next: a
// thread that reads shared memory before a barrier that should have ordered it after other threads'
// writes reads the values of the previous phase (or of no write at all), deterministically, where a
// GPU shows such a race only sometimes.
// cp.async is made as late as the PTX allows: a copy is read from global memory when issued (a read
// outside an operand hits its guard page there) but lands in shared memory only when
// cp.async.wait_group N of its thread leaves at most N newer groups in flight, or when the thread
// exits. So a wait one group too shallow, or a wait or a barrier missing, reads stale shared
// memory every time. V5's asynchronous units likewise (grid_host_runtime.cpp's Hopper section): TMA
// loads land when issued, wgmma groups and TMA stores read shared memory only at the wait that
// covers them, and a thread that completes an mbarrier phase others wait for lets them run first;
// so a stage or staging tile handed back before its reader is known done is overwritten before it is
// read, every time. A block whose threads all wait for each other is reported as a hang.
// Dynamic shared memory is filled with 0xFF bytes (NaN in fp16 and bf16) before each block, and
// ends against an inaccessible page.
// __shared__ arrays are statics (one block runs at a time); threadIdx/blockIdx are set for each
// thread as it resumes.
//
// The scheduler and the instructions' host forms are grid_host_runtime.cpp, compiled once and linked
// into every kernel's build (tests/cpu/host_harness.py): this header only declares them, so that a
// kernel variant's build compiles little besides the kernel. grid_host_launch.h, included after the
// kernel's source, gives the library its entry point, dg_host_launch().
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>

#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>

struct DgHostIndex {
    unsigned x, y, z;
};
extern DgHostIndex threadIdx, blockIdx, blockDim, gridDim;

// The integer min/max that device code has (grouped.cuh's group walk).
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// The hooks the kernel headers call in a host build (declared again there, in cp_async.cuh and
// mma.cuh, and defined in grid_host_runtime.cpp).
void dg_host_syncthreads();
void dg_host_syncwarp(unsigned mask = 0xffffffffu);

// V3's 16-byte chunk loads (tile_load.cuh's host hook): a GPU traps on a misaligned one, so does this.
static inline uint4 dg_host_load16(const void* ptr) {
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) {
        std::fprintf(stderr, "misaligned 16-byte load at %p\n", ptr);
        std::raise(SIGBUS);
    }
    uint4 v;
    std::memcpy(&v, ptr, 16);
    return v;
}
#define DG_HOST_LOAD16(ptr) dg_host_load16(ptr)

// V4's paired epilogue accesses (common.cuh's host hook): a misaligned one traps on a GPU.
static inline void dg_host_aligned(const void* ptr, unsigned bytes) {
    if (reinterpret_cast<uintptr_t>(ptr) % bytes != 0) {
        std::fprintf(stderr, "misaligned %u-byte access at %p\n", bytes, ptr);
        std::raise(SIGBUS);
    }
}
#define DG_HOST_ALIGNED(ptr, bytes) dg_host_aligned(ptr, bytes)

// The epilogue's loads of C, bias and scale (common.cuh's host hook): every byte inside one
// operand's view (dg_host_operands), as memcheck demands where an allocation ends at the view. The
// guard pages cannot show a read one element past a view whose end is not also a page's end.
void dg_host_read(const void* ptr, unsigned bytes);
#define DG_HOST_READ(ptr, bytes) dg_host_read(ptr, bytes)

#define __syncthreads() dg_host_syncthreads()
#define __syncwarp dg_host_syncwarp
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__
// Device built-ins V5 uses, as the host's.
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
