// The entry point of a host-built kernel (see grid_host.h), included after the kernel's source.
#pragma once
#include <memory>

namespace dg_host {
static const GemmParams* params = nullptr;
static std::vector<char> finished;

static void thread_main() {
    const unsigned me = current;
    deepgemm_kernel(*params);
    finished[me] = 1;   // then uc_link returns to the scheduler
}
}  // namespace dg_host

// 0 when every block ran; 1 when a block's threads met different barriers (some returned while
// others still waited: __syncthreads() in divergent code, undefined on a GPU).
extern "C" int dg_host_launch(const GemmParams* p, unsigned gx, unsigned gy, unsigned gz,
                              unsigned bx, unsigned by, unsigned bz) {
    using namespace dg_host;
    constexpr size_t STACK = 128 * 1024;
    gridDim = {gx, gy, gz};
    blockDim = {bx, by, bz};
    params = p;
    const unsigned n = bx * by * bz;
    std::unique_ptr<char[]> stacks(new char[(size_t)n * STACK]);   // not zeroed: touched as used
    fibers.assign(n, ucontext_t{});
    finished.assign(n, 0);
    std::vector<DgHostIndex> index(n);
    for (unsigned i = 0; i < n; ++i) index[i] = {i % bx, (i / bx) % by, i / (bx * by)};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = {x, y, z};
                for (unsigned i = 0; i < n; ++i) {
                    getcontext(&fibers[i]);
                    fibers[i].uc_stack.ss_sp = stacks.get() + (size_t)i * STACK;
                    fibers[i].uc_stack.ss_size = STACK;
                    fibers[i].uc_link = &scheduler;
                    makecontext(&fibers[i], thread_main, 0);
                    finished[i] = 0;
                }
                for (unsigned phase = 0;; ++phase) {   // one phase: every live thread up to its next barrier
                    unsigned live = 0;
                    for (unsigned j = 0; j < n; ++j) {
                        const unsigned i = phase % 2 ? n - 1 - j : j;
                        if (finished[i]) continue;
                        current = i;
                        threadIdx = index[i];
                        swapcontext(&scheduler, &fibers[i]);
                        live += !finished[i];
                    }
                    if (live == 0) break;
                    if (live != n) return 1;
                }
            }
    return 0;
}
