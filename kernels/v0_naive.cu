// V0: one thread per output element, operands straight from global memory.
// The baseline of the ladder: every load of A and B goes to L1/L2, nothing is reused on chip.
#include "deepgemm/common.cuh"

#ifndef DG_BX
#define DG_BX 32   // threads along N: consecutive threads write consecutive columns of D
#endif
#ifndef DG_BY
#define DG_BY 8
#endif

extern "C" __global__ void __launch_bounds__(DG_BX * DG_BY)
deepgemm_kernel(const GemmParams p) {
    const int col = blockIdx.x * DG_BX + threadIdx.x;
    const int row = blockIdx.y * DG_BY + threadIdx.y;
    if (row >= p.m || col >= p.n) return;
    const dg::in_t* a = static_cast<const dg::in_t*>(p.a);
    const dg::in_t* b = static_cast<const dg::in_t*>(p.b);
    float acc = 0.0f;
    for (int k = 0; k < p.k; ++k)
        acc += dg::to_f32(a[dg::a_index(row, k, p.lda)]) * dg::to_f32(b[dg::b_index(k, col, p.ldb)]);
    dg::store_d(p, row, col, acc);
}
