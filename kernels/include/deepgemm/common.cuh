// Shared device code for every deepgemm kernel: dtypes, operand addressing, the epilogue chain.
//
// A kernel file is compiled once per configuration. The JIT (deepgemm/jit.py) prepends #defines:
//   DG_IN                 input dtype code (DG_F16 | DG_BF16)
//   DG_OUT                output dtype code (DG_F16 | DG_BF16 | DG_F32)
//   DG_A_ROW, DG_B_ROW    1: row-major operand (A: k contiguous, B: n contiguous), 0: column-major
//   DG_ALPHA              1 when alpha != 1
//   DG_BIAS, DG_C         dtype code of the bias vector / residual matrix, or -1 for none
//   DG_ACT                activation (DG_ACT_NONE ...)
//   DG_SCALE_MODE         0 none, 1 scalar, 2 per-column vector of dtype DG_SCALE
//   plus the kernel's own tile parameters (DG_BM, DG_BN, ...), listed in deepgemm/registry.py.
// Everything unused is a compile-time 0 and costs nothing.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include "deepgemm/params.cuh"

// dtype codes: keep in sync with deepgemm/registry.py DTYPE_CODES
#define DG_F16 0
#define DG_BF16 1
#define DG_F32 2

#define DG_ACT_NONE 0
#define DG_ACT_RELU 1
#define DG_ACT_GELU 2        // tanh approximation, as cuBLASLt's GELU epilogue
#define DG_ACT_GELU_ERF 3
#define DG_ACT_SILU 4

#ifndef DG_IN
#define DG_IN DG_F16
#endif
#ifndef DG_OUT
#define DG_OUT DG_IN
#endif
#ifndef DG_A_ROW
#define DG_A_ROW 1
#endif
#ifndef DG_B_ROW
#define DG_B_ROW 1
#endif
#ifndef DG_ALPHA
#define DG_ALPHA 0
#endif
#ifndef DG_BIAS
#define DG_BIAS -1
#endif
#ifndef DG_ACT
#define DG_ACT DG_ACT_NONE
#endif
#ifndef DG_SCALE_MODE
#define DG_SCALE_MODE 0
#endif
#ifndef DG_SCALE
#define DG_SCALE DG_F32
#endif
#ifndef DG_C
#define DG_C -1
#endif

namespace dg {

template <int CODE> struct dtype;
template <> struct dtype<DG_F16>  { using T = __half; };
template <> struct dtype<DG_BF16> { using T = __nv_bfloat16; };
template <> struct dtype<DG_F32>  { using T = float; };

using in_t = typename dtype<DG_IN>::T;
using out_t = typename dtype<DG_OUT>::T;

__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(float x) { return x; }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }

// Element offsets of A(m, k) and B(k, n) for the compiled layout. 64-bit: M*lda may pass 2^31.
__device__ __forceinline__ long long a_index(int m, int k, long long lda) {
    return DG_A_ROW ? (long long)m * lda + k : (long long)k * lda + m;
}
__device__ __forceinline__ long long b_index(int k, int n, long long ldb) {
    return DG_B_ROW ? (long long)k * ldb + n : (long long)n * ldb + k;
}

// Scalar loads with zero fill outside the matrix: the tail path of every tiled kernel.
__device__ __forceinline__ in_t load_a(const GemmParams& p, int m, int k) {
    return (m < p.m && k < p.k) ? static_cast<const in_t*>(p.a)[a_index(m, k, p.lda)] : in_t(0.0f);
}
__device__ __forceinline__ in_t load_b(const GemmParams& p, int k, int n) {
    return (k < p.k && n < p.n) ? static_cast<const in_t*>(p.b)[b_index(k, n, p.ldb)] : in_t(0.0f);
}

__device__ __forceinline__ float activate(float x) {
#if DG_ACT == DG_ACT_RELU
    return fmaxf(x, 0.0f);
#elif DG_ACT == DG_ACT_GELU
    const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(k0 * (x + 0.044715f * x * x * x)));
#elif DG_ACT == DG_ACT_GELU_ERF
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
#elif DG_ACT == DG_ACT_SILU
    return x / (1.0f + expf(-x));
#else
    return x;
#endif
}

// act(alpha * acc + bias) * scale: the part of the epilogue that needs only the column.
__device__ __forceinline__ float epilogue_columnwise(float acc, int col, const GemmParams& p) {
    float v = acc;
#if DG_ALPHA
    v *= p.alpha;
#endif
#if DG_BIAS >= 0
    v += to_f32(static_cast<const typename dtype<DG_BIAS>::T*>(p.bias)[col]);
#endif
    v = activate(v);
#if DG_SCALE_MODE == 1
    v *= p.scale_scalar;
#elif DG_SCALE_MODE == 2
    v *= to_f32(static_cast<const typename dtype<DG_SCALE>::T*>(p.scale)[col]);
#endif
    return v;
}

// C(row, col) as FP32 (0 when the epilogue has no residual), for kernels that load a batch of C
// values before using them.
__device__ __forceinline__ float load_c(const GemmParams& p, int row, int col) {
#if DG_C >= 0
    return to_f32(static_cast<const typename dtype<DG_C>::T*>(p.c)[(long long)row * p.ldc + col]);
#else
    return 0.0f;
#endif
}

// v + beta * C for an already loaded C value (the identity without a residual): the last link of
// the chain, for kernels that load C in batches or pairs.
__device__ __forceinline__ float add_residual(float v, float c, const GemmParams& p) {
#if DG_C >= 0
    v += p.beta * c;
#endif
    return v;
}

// D = act(alpha * acc + bias) * scale + beta * C, in FP32. C may alias D: each thread reads
// C(row, col) before it writes D(row, col), and no other thread touches that element.
__device__ __forceinline__ float epilogue(float acc, int row, int col, const GemmParams& p) {
    const float v = epilogue_columnwise(acc, col, p);
    return add_residual(v, load_c(p, row, col), p);
}

// Epilogue + the one final cast + store of one output element (bounds-checked).
__device__ __forceinline__ void store_d(const GemmParams& p, int row, int col, float acc) {
    if (row < p.m && col < p.n)
        static_cast<out_t*>(p.d)[(long long)row * p.ldd + col] = from_f32<out_t>(epilogue(acc, row, col, p));
}

template <typename T> struct pair_of;
template <> struct pair_of<__half> { using T = __half2; };
template <> struct pair_of<__nv_bfloat16> { using T = __nv_bfloat162; };
template <> struct pair_of<float> { using T = float2; };

// Two adjacent elements (row, col), (row, col + 1) form one aligned pair in memory when the base
// and the leading dimension are even in elements (col is even wherever pairs are used).
template <typename T>
__device__ __forceinline__ bool pairs_aligned(const void* base, long long ld) {
    return reinterpret_cast<unsigned long long>(base) % (2 * sizeof(T)) == 0 && ld % 2 == 0;
}

// Whether D (and C, when read) can be accessed in aligned pairs: decided once per block.
__device__ __forceinline__ bool epilogue_pairs_ok(const GemmParams& p) {
#if DG_C >= 0
    if (!pairs_aligned<typename dtype<DG_C>::T>(p.c, p.ldc)) return false;
#endif
    return pairs_aligned<out_t>(p.d, p.ldd);
}

// The chain for the pair D(row, col), D(row, col + 1) with col even, both inside the matrix and
// epilogue_pairs_ok(p): one 2-element load of C, the values replaced in place; store_pair_interior
// then casts and stores them with one 2-element store. Kernels call these only for whole interior
// tiles and keep store_d for edge tiles, so the unrolled epilogue has one code path per tile (a
// checked fallback per pair bloated the code and slowed the fused epilogue by 14 % on the H200).
// They run the chain over all of a thread's pairs before storing any: a store to D may alias C,
// so a load of C after it waits for it, and every pair's C latency added up (H200, 153e376; docs/performance.md, fused epilogue).
__device__ __forceinline__ void epilogue_pair_interior(const GemmParams& p, int row, int col, float& v0, float& v1) {
    v0 = epilogue_columnwise(v0, col, p);
    v1 = epilogue_columnwise(v1, col + 1, p);
#if DG_C >= 0
    using c2_t = typename pair_of<typename dtype<DG_C>::T>::T;
    const c2_t c2 = *reinterpret_cast<const c2_t*>(static_cast<const typename dtype<DG_C>::T*>(p.c) +
                                                  (long long)row * p.ldc + col);
    v0 = add_residual(v0, to_f32(c2.x), p);
    v1 = add_residual(v1, to_f32(c2.y), p);
#endif
}

__device__ __forceinline__ void store_pair_interior(const GemmParams& p, int row, int col, float v0, float v1) {
    typename pair_of<out_t>::T d2;
    d2.x = from_f32<out_t>(v0);
    d2.y = from_f32<out_t>(v1);
    *reinterpret_cast<typename pair_of<out_t>::T*>(static_cast<out_t*>(p.d) + (long long)row * p.ldd + col) = d2;
}

}  // namespace dg
