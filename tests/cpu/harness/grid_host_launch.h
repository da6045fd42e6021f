// The entry point of a host-built kernel (see grid_host.h), included after the kernel's source.
#pragma once
#include <cstring>
#include <type_traits>

// grid_host_runtime.cpp: runs `thread` as every thread of every block of the grid.
int dg_host_run_grid(void (*thread)(const void*), const void* params, unsigned gx, unsigned gy, unsigned gz,
                     unsigned bx, unsigned by, unsigned bz, unsigned smem_bytes);

// The entry takes its parameters in the type it declares (a grouped build's GroupedGemmParams,
// GemmParams otherwise): params points at one of that type.
template <class Params>
static void dg_host_call(void (*entry)(Params), const void* params) {
    entry(*static_cast<const std::remove_cv_t<std::remove_reference_t<Params>>*>(params));
}
// V5's entry also takes the tensor maps of A, B, D and C by value: they follow the parameters in the
// same buffer, each at the next multiple of 64 bytes (their alignment), as the host test lays them out.
template <class Params, class Map>
static void dg_host_call(void (*entry)(Params, Map, Map, Map, Map), const void* params) {
    using P = std::remove_cv_t<std::remove_reference_t<Params>>;
    using M = std::remove_cv_t<std::remove_reference_t<Map>>;
    const char* at = static_cast<const char*>(params);
    const size_t first = (sizeof(P) + 63) / 64 * 64;
    M maps[4];
    for (int i = 0; i < 4; ++i) std::memcpy(&maps[i], at + first + i * sizeof(M), sizeof(M));
    entry(*reinterpret_cast<const P*>(at), maps[0], maps[1], maps[2], maps[3]);
}
static void dg_host_thread(const void* params) { dg_host_call(deepgemm_kernel, params); }

// 0 when every block ran; 1 when a block's threads met different barriers (some returned while
// others still waited: __syncthreads() in divergent code, undefined on a GPU); 2 when a warp's lanes
// met different collectives or only part of a warp met one; 4 when a block's threads all wait for
// each other (mbarrier phases or named barriers that never complete: a hang on a GPU). smem_bytes: dynamic shared memory.
extern "C" __attribute__((visibility("default"))) int dg_host_launch(const void* p, unsigned gx, unsigned gy,
                                                                    unsigned gz, unsigned bx, unsigned by,
                                                                    unsigned bz, unsigned smem_bytes) {
    return dg_host_run_grid(dg_host_thread, p, gx, gy, gz, bx, by, bz, smem_bytes);
}
