// Runs a CUDA-core kernel's own source (V0-V3: no PTX, no warp intrinsics) on the host, compiled as
// C++ after this header. Every CUDA thread of a block is a coroutine (ucontext) on one host thread:
// each runs until its next __syncthreads(), then the next thread runs; once all are there, they go
// on together. Between two barriers the threads run one after the other, in thread order in one
// phase and in reverse order in the next: a thread that reads shared memory before a barrier that
// should have ordered it after other threads' writes reads the values of the previous phase (or of
// no write at all), deterministically, where a GPU shows such a race only sometimes.
// __shared__ arrays are statics (one block runs at a time); threadIdx/blockIdx are set for each
// thread as it resumes. dg_host_launch() (grid_host_launch.h) walks the grid block by block.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <vector_types.h>
#include <ucontext.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

struct DgHostIndex {
    unsigned x, y, z;
};
static DgHostIndex threadIdx, blockIdx, blockDim, gridDim;

namespace dg_host {
static ucontext_t scheduler;
static std::vector<ucontext_t> fibers;
static unsigned current = 0;
inline void syncthreads() { swapcontext(&fibers[current], &scheduler); }   // back to the scheduler
}  // namespace dg_host

// V3's 16-byte chunk loads (tile_load.cuh's host hook): a GPU traps on a misaligned one, so does this.
#include <csignal>
#include <cstdint>
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

#define __syncthreads() dg_host::syncthreads()
#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)
