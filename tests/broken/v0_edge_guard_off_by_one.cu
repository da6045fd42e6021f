// BROKEN ON PURPOSE (test suite only): V0 whose edge guard lets one extra column through
// (col > n instead of col >= n) and stores without the shared bounds-checked store_d.
// Column n lands in the output's row padding or the next row: the poisoned output's guard
// check must catch it, and the stray operand reads past the edge as well.
#include "deepgemm/common.cuh"
#define DG_BX 32
#define DG_BY 8

extern "C" __global__ void __launch_bounds__(DG_BX * DG_BY) deepgemm_kernel(const GemmParams p) {
    const int col = blockIdx.x * DG_BX + threadIdx.x;
    const int row = blockIdx.y * DG_BY + threadIdx.y;
    if (row >= p.m || col > p.n) return;   // the bug: should be col >= p.n
    const dg::in_t* a = static_cast<const dg::in_t*>(p.a);
    const dg::in_t* b = static_cast<const dg::in_t*>(p.b);
    float acc = 0.0f;
    for (int k = 0; k < p.k; ++k)
        acc += dg::to_f32(a[dg::a_index(row, k, p.lda)]) * dg::to_f32(b[dg::b_index(k, col, p.ldb)]);
    static_cast<dg::out_t*>(p.d)[(long long)row * p.ldd + col] = dg::from_f32<dg::out_t>(dg::epilogue(acc, row, col, p));
}
