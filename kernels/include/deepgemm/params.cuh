// The one argument every deepgemm kernel takes, passed by value.
// Its layout is mirrored by deepgemm/params.py (PARAMS_DTYPE); tests/cpu/test_abi.py compiles
// this header on the host and checks every field offset against that mirror.
#pragma once

struct GemmParams {
    const void* a;        // M x K, dtype DG_IN; (m, k) at a[m * lda + k] (row-major) or a[k * lda + m]
    const void* b;        // K x N, dtype DG_IN; (k, n) at b[k * ldb + n] (row-major) or b[n * ldb + k]
    void* d;              // M x N output, dtype DG_OUT, row-major: (m, n) at d[m * ldd + n]
    const void* bias;     // length N, dtype DG_BIAS (epilogue; unused when DG_BIAS == 0)
    const void* scale;    // length N, dtype DG_SCALE (when DG_SCALE_MODE == 2)
    const void* c;        // M x N residual, dtype DG_C, row-major with leading dim ldc
    long long lda, ldb, ldd, ldc;   // leading dimensions in elements
    int m, n, k;
    float alpha, beta;
    float scale_scalar;   // when DG_SCALE_MODE == 1
    void* workspace;      // kernel-specific scratch (split-K partials); may be null
    long long workspace_elems;
    int split_k;          // number of K slices (kernels that support split-K), else 1
    int flags;            // reserved for kernels; 0
};

// Batched and grouped builds (DG_GROUPED = 1, deepgemm/grouped.cuh) take this instead: `groups`
// GEMMs in one launch. Group g reads A, B and C and writes D at GemmParams' pointers plus
// g * stride_x elements (0: one operand shared by every group), plus, in the contiguous modes,
// the group's first row. group_mode (DG_GROUP_*) says how many rows each group has. A separate
// type, so the single-GEMM kernels' argument stays as it was: one more 56 bytes of GemmParams cost
// V4's fullest epilogue 10 registers and a spill.
struct GroupedGemmParams : GemmParams {
    int groups;           // G >= 1
    int group_mode;       // DG_GROUP_BATCH, DG_GROUP_MASKED, DG_GROUP_SIZES or DG_GROUP_OFFSETS
    const int* group_rows;   // on the device: G row counts (MASKED, SIZES) or G + 1 row offsets (OFFSETS)
    long long stride_a, stride_b, stride_d, stride_c, stride_bias;   // elements between groups
};
