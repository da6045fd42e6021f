// Batched and grouped GEMM (DG_GROUPED = 1): which rows of A, D and C and which B and bias
// group g uses. One launch covers every group; the group sizes may live on the device (written
// by an earlier kernel, e.g. an MoE router), so the host never reads them and a CUDA graph can
// replay the launch with new sizes.
//
// Modes (GroupedGemmParams.group_mode):
//   DG_GROUP_BATCH    strided batch: every group has p.m rows.
//   DG_GROUP_MASKED   group g has group_rows[g] valid rows of its p.m (a fixed-capacity buffer per
//                     group); rows past the count are neither read into D nor written.
//   DG_GROUP_SIZES    contiguous: the groups' rows follow each other in A, D and C; group g has
//                     group_rows[g] of them (p.m = the rows of all groups).
//   DG_GROUP_OFFSETS  contiguous: group g is rows [group_rows[g], group_rows[g + 1]).
// Values the host could not check are clamped, never trusted: a negative count is 0 rows and a
// group never reaches past row p.m (deepgemm.grouped_gemm validates sizes it is given on the host).
#pragma once
#include "deepgemm/common.cuh"

#ifndef DG_GROUPED
#define DG_GROUPED 0
#endif


// keep in sync with deepgemm/registry.py GROUP_MODES
#define DG_GROUP_BATCH 0
#define DG_GROUP_MASKED 1
#define DG_GROUP_SIZES 2
#define DG_GROUP_OFFSETS 3

namespace dg {

// What a kernel's entry takes: the grouped builds' argument carries the group fields.
#if DG_GROUPED
using KernelParams = GroupedGemmParams;
#else
using KernelParams = GemmParams;
#endif

// A group's row count or offset: through the read-only cache on the device; a plain read in host
// models of the group walk (tests/cpu).
#ifdef __CUDA_ARCH__
#define DG_GROUP_ROWS_AT(ptr) __ldg(ptr)
#else
#define DG_GROUP_ROWS_AT(ptr) (*(ptr))
#endif

// Walks the groups in order (the sizes mode needs the rows of every earlier group). After next()
// returns true: group g covers rows [base, base + rows) of the whole A, D and C of its mode.
struct GroupCursor {
    int g = -1, base = 0, rows = 0;

    __host__ __device__ __forceinline__ bool next(const GroupedGemmParams& p) {
        if (++g >= p.groups) return false;
        switch (p.group_mode) {
        case DG_GROUP_MASKED:
            base = 0;
            rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m);
            break;
        case DG_GROUP_SIZES:
            base = g == 0 ? 0 : base + rows;
            rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m - base);
            break;
        case DG_GROUP_OFFSETS: {
            const int lo = min(max(DG_GROUP_ROWS_AT(p.group_rows + g), 0), p.m);
            base = lo;
            rows = min(max(DG_GROUP_ROWS_AT(p.group_rows + g + 1), lo), p.m) - lo;
            break;
        }
        default:   // DG_GROUP_BATCH
            base = 0;
            rows = p.m;
        }
        return true;
    }
};

// The one-GEMM view of group g: its operands' first elements and its row count, every other field
// as in p, so a kernel body written for one GEMM runs a group unchanged. Host-callable too: the
// CPU tier's walk harness (tests/cpu/harness/v5_walk.cu) checks every group's view.
__host__ __device__ __forceinline__ GemmParams group_params(const GroupedGemmParams& p, int g, int base, int rows) {
    GemmParams q = p;   // the GemmParams part
    q.a = static_cast<const in_t*>(p.a) + g * p.stride_a + a_index(base, 0, p.lda);
    q.b = static_cast<const in_t*>(p.b) + g * p.stride_b;
    q.d = static_cast<out_t*>(p.d) + g * p.stride_d + (long long)base * p.ldd;
#if DG_C >= 0
    q.c = static_cast<const typename dtype<DG_C>::T*>(p.c) + g * p.stride_c + (long long)base * p.ldc;
#endif
#if DG_BIAS >= 0
    q.bias = static_cast<const typename dtype<DG_BIAS>::T*>(p.bias) + g * p.stride_bias;
#endif
    q.m = rows;
    return q;
}

}  // namespace dg
