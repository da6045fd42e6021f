// The entry point of a host-built kernel (see grid_host.h), included after the kernel's source.
#pragma once
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
static void dg_host_thread(const void* params) { dg_host_call(deepgemm_kernel, params); }

// 0 when every block ran; 1 when a block's threads met different barriers (some returned while
// others still waited: __syncthreads() in divergent code, undefined on a GPU); 2 when a warp's lanes
// met different collectives or only part of a warp met one. smem_bytes: dynamic shared memory.
extern "C" __attribute__((visibility("default"))) int dg_host_launch(const void* p, unsigned gx, unsigned gy,
                                                                    unsigned gz, unsigned bx, unsigned by,
                                                                    unsigned bz, unsigned smem_bytes) {
    return dg_host_run_grid(dg_host_thread, p, gx, gy, gz, bx, by, bz, smem_bytes);
}
