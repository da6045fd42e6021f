// V5's staging copy (kernels/stage_copy.cu) run on the host, every thread of every block in turn,
// against a model. Built by tests/cpu/test_stage_copy.py with the kernel's folder on the include
// path; reads cases from stdin, one per line: inner outer ld_src ld_dst grid_x grid_y threads (the
// block's), and prints "checked N elements, F failures" last.
//
// The source operand ends at the end of a readable page with inaccessible pages around it
// (host.h), so a read past its last element stops the harness; its padding holds 0xFFFF. The kernel
// has no barriers and no warp collectives, so running its threads one after another is exact.
// Checked per case:
//  * every 16-byte load (__ldg of a uint4) is 16-byte aligned, as a GPU requires;
//  * the copy: dst[row][i] is the source element for i < inner, zero for inner <= i < the next
//    multiple of 8 (the pad a 16-byte chunk covers), and untouched past that, in every row.
#include <vector_functions.h>
#include <vector_types.h>

#include <cstdint>
#include <cstring>
#include <iostream>
#include <vector>

#include "host.h"

struct DgHostIndex {
    unsigned x, y, z;
};
static DgHostIndex threadIdx, blockIdx, blockDim, gridDim;

// The device intrinsics the kernel uses, in host form.
static uint4 dg_host_ldg(const uint4* p) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) FAIL("a 16-byte load at %p is not 16-byte aligned", (const void*)p);
    uint4 v;
    std::memcpy(&v, p, 16);   // a read outside the source operand's pages stops the harness here
    return v;
}
static unsigned dg_host_funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    return (unsigned)((((unsigned long long)hi << 32) | lo) >> (shift & 31));
}
#define __ldg dg_host_ldg
#define __funnelshift_r dg_host_funnelshift_r
#undef __global__
#define __global__
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __restrict__
#define __restrict__

#include "stage_copy.cu"

static const unsigned short UNTOUCHED = 0xABCD;

int main() {
    long long cases = 0;
    int inner, outer, gx, gy, threads;
    long long ld_src, ld_dst;
    while (std::cin >> inner >> outer >> ld_src >> ld_dst >> gx >> gy >> threads) {
        ++cases;
        Operand src(outer, inner, ld_src);
        std::vector<unsigned short> dst((size_t)outer * ld_dst + 8, UNTOUCHED);
        // 16-byte aligned, as the staging buffer is (CuPy's pool blocks are 256-byte aligned)
        unsigned short* out = dst.data() + (8 - reinterpret_cast<uintptr_t>(dst.data()) % 16 / 2) % 8;
        gridDim = {(unsigned)gx, (unsigned)gy, 1};
        blockDim = {(unsigned)threads, 1, 1};
        for (unsigned by = 0; by < gridDim.y; ++by)
            for (unsigned bx = 0; bx < gridDim.x; ++bx)
                for (unsigned tx = 0; tx < blockDim.x; ++tx) {
                    blockIdx = {bx, by, 0};
                    threadIdx = {tx, 0, 0};
                    deepgemm_kernel(src.base, ld_src, out, ld_dst, inner, outer);
                }
        const long long pad_end = (inner + 7) / 8 * 8;
        for (int r = 0; r < outer; ++r)
            for (long long i = 0; i < ld_dst; ++i) {
                ++checked;
                const unsigned short got = out[(long long)r * ld_dst + i];
                const unsigned short want = i < inner ? value_at(r, i) : i < pad_end ? 0 : UNTOUCHED;
                if (got != want)
                    FAIL("inner %d outer %d ld_src %lld ld_dst %lld grid %dx%d: row %d element %lld is 0x%04x, "
                         "expected 0x%04x (%s)", inner, outer, ld_src, ld_dst, gx, gy, r, i, got, want,
                         i < inner ? "the source" : i < pad_end ? "the zero pad" : "untouched");
            }
    }
    std::printf("checked %lld elements, %lld failures\n", checked, failures);
    return cases == 0 || failures ? 1 : 0;
}
