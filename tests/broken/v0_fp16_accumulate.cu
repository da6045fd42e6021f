// BROKEN ON PURPOSE (test suite only): V0 with the accumulator rounded to FP16 after every k,
// as a kernel written with hfma2 would. Products are exact; the running sum loses bits from K ~ 64.
// The quick sweep must fail this kernel (error-bound oracle).
#include "deepgemm/common.cuh"
#define DG_BX 32
#define DG_BY 8

extern "C" __global__ void __launch_bounds__(DG_BX * DG_BY) deepgemm_kernel(const GemmParams p) {
    const int col = blockIdx.x * DG_BX + threadIdx.x;
    const int row = blockIdx.y * DG_BY + threadIdx.y;
    if (row >= p.m || col >= p.n) return;
    const dg::in_t* a = static_cast<const dg::in_t*>(p.a);
    const dg::in_t* b = static_cast<const dg::in_t*>(p.b);
    __half acc = __float2half(0.0f);
    for (int k = 0; k < p.k; ++k)
        acc = __float2half(__half2float(acc) +
                           dg::to_f32(a[dg::a_index(row, k, p.lda)]) * dg::to_f32(b[dg::b_index(k, col, p.ldb)]));
    dg::store_d(p, row, col, __half2float(acc));
}
