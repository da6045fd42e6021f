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
__host__ __device__ __forceinline__ long long a_index(int m, int k, long long lda) {
    return DG_A_ROW ? (long long)m * lda + k : (long long)k * lda + m;
}
__host__ __device__ __forceinline__ long long b_index(int k, int n, long long ldb) {
    return DG_B_ROW ? (long long)k * ldb + n : (long long)n * ldb + k;
}

// Scalar loads with zero fill outside the matrix: the tail path of every tiled kernel.
__device__ __forceinline__ in_t load_a(const GemmParams& p, int m, int k) {
    return (m < p.m && k < p.k) ? static_cast<const in_t*>(p.a)[a_index(m, k, p.lda)] : in_t(0.0f);
}
__device__ __forceinline__ in_t load_b(const GemmParams& p, int k, int n) {
    return (k < p.k && n < p.n) ? static_cast<const in_t*>(p.b)[b_index(k, n, p.ldb)] : in_t(0.0f);
}

// x / (1 + 2^t): the sigmoid form GELU and SiLU share, in four instructions: ex2.approx.ftz and
// rcp.approx.ftz are one MUFU each, without the range fix-ups __expf and __fdividef add for
// subnormal results (Nsight Compute showed those compares and rescales in the fused epilogue's
// hottest code). Flushing costs nothing here: a 2^t below 2^-126 leaves 1 + 2^t = 1, and a
// reciprocal below 2^-126 (1 + 2^t past 2^126) makes the result 0, within 2^-126 |x| of the
// exact value. The error bound's allowance for both (deepgemm/testing/bounds.py) is checked on
// every finite bfloat16 input by tests/gpu/test_activation_accuracy.py.
// A host build of the kernel (tests/cpu's, from this source) computes the same function in libm.
__device__ __forceinline__ float x_over_one_plus_exp2(float x, float t) {
    float e, r;
#ifdef __CUDA_ARCH__
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + e));
#else
    e = exp2f(t);
    r = 1.0f / (1.0f + e);
#endif
    return x * r;
}

__device__ __forceinline__ float activate(float x) {
#if DG_ACT == DG_ACT_RELU
    return fmaxf(x, 0.0f);
#elif DG_ACT == DG_ACT_GELU
    // 0.5 x (1 + tanh(u)) = x sigmoid(2u) = x / (1 + e^(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3): no
    // tanhf branches, no cancellation of 1 + tanh(u) for negative x. e^(-2u) = 2^(x (k + k 0.044715 x^2)):
    // 3 FP32 instructions, not 4 (the chain's cost follows that count: docs/performance.md, fused epilogue).
    const float k = -2.0f * 0.7978845608028654f * 1.4426950408889634f;  // -2 sqrt(2/pi) log2(e)
    return x_over_one_plus_exp2(x, x * fmaf(x, x * (k * 0.044715f), k));
#elif DG_ACT == DG_ACT_GELU_ERF
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
#elif DG_ACT == DG_ACT_SILU
    return x_over_one_plus_exp2(x, -1.4426950408889634f * x);   // x sigmoid(x) = x / (1 + e^(-x))
#else
    return x;
#endif
}

// Whether the chain does anything: without it the kernels store the accumulators as they are.
constexpr bool HAS_EPILOGUE = DG_ALPHA || DG_BIAS >= 0 || DG_ACT != DG_ACT_NONE || DG_SCALE_MODE != 0 || DG_C >= 0;

// Hooks of a host build of the kernels (the CPU tier's, tests/cpu/harness/grid_host.h, which makes
// them trap where a GPU would): a paired access checked for its alignment, the chain's loads checked
// to lie inside their operand, a 16-byte load (V3's chunks, small_m's vectors). Elsewhere on the
// host the checks are nothing and the load a plain one.
#if !defined(__CUDA_ARCH__) && !defined(DG_HOST_ALIGNED)
#define DG_HOST_ALIGNED(ptr, bytes) ((void)0)
#endif
#if !defined(__CUDA_ARCH__) && !defined(DG_HOST_READ)
#define DG_HOST_READ(ptr, bytes) ((void)0)
#endif
#if !defined(__CUDA_ARCH__) && !defined(DG_HOST_LOAD16)
#define DG_HOST_LOAD16(ptr) (*reinterpret_cast<const uint4*>(ptr))
#endif

// The chain's operands that depend only on the column: bias[col] and the vector scale[col] as FP32
// (0 and 1 where the chain has none).
struct Column {
    float bias = 0.0f, scale = 1.0f;
};

__device__ __forceinline__ Column load_column(const GemmParams& p, int col) {
    Column cv;
#if DG_BIAS >= 0
#ifndef __CUDA_ARCH__
    DG_HOST_READ(static_cast<const typename dtype<DG_BIAS>::T*>(p.bias) + col, sizeof(typename dtype<DG_BIAS>::T));
#endif
    cv.bias = to_f32(static_cast<const typename dtype<DG_BIAS>::T*>(p.bias)[col]);
#endif
#if DG_SCALE_MODE == 2
#ifndef __CUDA_ARCH__
    DG_HOST_READ(static_cast<const typename dtype<DG_SCALE>::T*>(p.scale) + col, sizeof(typename dtype<DG_SCALE>::T));
#endif
    cv.scale = to_f32(static_cast<const typename dtype<DG_SCALE>::T*>(p.scale)[col]);
#endif
    return cv;
}

// act(alpha * acc + bias) * scale with the column's operands already loaded: the chain up to the
// residual, written once for every kernel and every load pattern.
__device__ __forceinline__ float chain_columnwise(float acc, const Column& cv, const GemmParams& p) {
    float v = acc;
#if DG_ALPHA
    v *= p.alpha;
#endif
#if DG_BIAS >= 0
    v += cv.bias;
#endif
    v = activate(v);
#if DG_SCALE_MODE == 1
    v *= p.scale_scalar;
#elif DG_SCALE_MODE == 2
    v *= cv.scale;
#endif
    (void)cv;
    return v;
}

// act(alpha * acc + bias) * scale: the part of the epilogue that needs only the column.
__device__ __forceinline__ float epilogue_columnwise(float acc, int col, const GemmParams& p) {
    return chain_columnwise(acc, load_column(p, col), p);
}

// C(row, col) as FP32 (0 when the epilogue has no residual): the per-element chain's load.
__device__ __forceinline__ float load_c(const GemmParams& p, int row, int col) {
#if DG_C >= 0
#ifndef __CUDA_ARCH__
    DG_HOST_READ(static_cast<const typename dtype<DG_C>::T*>(p.c) + (long long)row * p.ldc + col, sizeof(typename dtype<DG_C>::T));
#endif
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

// A vector of the chain (bias, scale) read as pairs (col, col + 1), col even: its base aligned to a pair.
template <typename T>
__device__ __forceinline__ bool vector_pairs_aligned(const void* base) {
    return reinterpret_cast<unsigned long long>(base) % (2 * sizeof(T)) == 0;
}

// Whether the chain's operands (C, bias, vector scale) can be read in aligned pairs.
__device__ __forceinline__ bool chain_pairs_ok(const GemmParams& p) {
#if DG_C >= 0
    if (!pairs_aligned<typename dtype<DG_C>::T>(p.c, p.ldc)) return false;
#endif
#if DG_BIAS >= 0
    if (!vector_pairs_aligned<typename dtype<DG_BIAS>::T>(p.bias)) return false;
#endif
#if DG_SCALE_MODE == 2
    if (!vector_pairs_aligned<typename dtype<DG_SCALE>::T>(p.scale)) return false;
#endif
    (void)p;
    return true;
}

// Whether D and the chain's operands can be accessed in aligned pairs: decided once per block.
__device__ __forceinline__ bool epilogue_pairs_ok(const GemmParams& p) {
    return chain_pairs_ok(p) && pairs_aligned<out_t>(p.d, p.ldd);
}

template <typename T>
__device__ __forceinline__ float2 load_pair(const void* base, long long offset) {
#ifndef __CUDA_ARCH__
    DG_HOST_ALIGNED(static_cast<const T*>(base) + offset, 2 * sizeof(T));
    DG_HOST_READ(static_cast<const T*>(base) + offset, 2 * sizeof(T));
#endif
    const typename pair_of<T>::T v = *reinterpret_cast<const typename pair_of<T>::T*>(static_cast<const T*>(base) + offset);
    return make_float2(to_f32(v.x), to_f32(v.y));
}

// The vector scale of columns col and col + 1 (col even, chain_pairs_ok(p)): one 2-element load;
// none where `inside` is false. load_column_pair's second half, for kernels that have the bias
// from elsewhere (V5 stages it in shared memory).
__device__ __forceinline__ void load_scale_pair(const GemmParams& p, int col, bool inside, Column& c0, Column& c1) {
#if DG_SCALE_MODE == 2
    if (inside) {
        const float2 s = load_pair<typename dtype<DG_SCALE>::T>(p.scale, col);
        c0.scale = s.x;
        c1.scale = s.y;
    }
#endif
    (void)p, (void)col, (void)inside, (void)c0, (void)c1;
}

// The column operands of columns col and col + 1 (col even, chain_pairs_ok(p)): one 2-element load
// per vector. `inside` false (columns past N: computed, never stored) reads nothing.
__device__ __forceinline__ void load_column_pair(const GemmParams& p, int col, bool inside, Column& c0, Column& c1) {
#if DG_BIAS >= 0
    if (inside) {
        const float2 b = load_pair<typename dtype<DG_BIAS>::T>(p.bias, col);
        c0.bias = b.x;
        c1.bias = b.y;
    }
#endif
    load_scale_pair(p, col, inside, c0, c1);
}

// C(row, col), C(row, col + 1) as FP32 with one 2-element load (col even, chain_pairs_ok(p));
// zeros when `inside` is false or the chain has no residual.
__device__ __forceinline__ float2 load_c_pair(const GemmParams& p, int row, int col, bool inside) {
#if DG_C >= 0
    if (inside) return load_pair<typename dtype<DG_C>::T>(p.c, (long long)row * p.ldc + col);
#endif
    (void)p, (void)row, (void)col, (void)inside;
    return make_float2(0.0f, 0.0f);
}

// The chain for the pair D(row, col), D(row, col + 1) with col even, both inside the matrix and
// epilogue_pairs_ok(p): one 2-element load of C and of each vector, the values replaced in place;
// store_pair_interior then casts and stores them with one 2-element store. Kernels call these only
// for whole interior tiles and keep store_d for edge tiles, so the unrolled epilogue has one code
// path per tile (a checked fallback per pair bloated the code and slowed the fused epilogue by 14 %
// on the H200). They run the chain over all of a thread's pairs before storing any: a store to D
// may alias C, so a load of C after it waits for it, and every pair's C latency added up (H200,
// 153e376; docs/performance.md, fused epilogue).
__device__ __forceinline__ void epilogue_pair_interior(const GemmParams& p, int row, int col, float& v0, float& v1) {
    Column c0, c1;
    load_column_pair(p, col, true, c0, c1);
    const float2 c = load_c_pair(p, row, col, true);
    v0 = add_residual(chain_columnwise(v0, c0, p), c.x, p);
    v1 = add_residual(chain_columnwise(v1, c1, p), c.y, p);
}

__device__ __forceinline__ void store_pair_interior(const GemmParams& p, int row, int col, float v0, float v1) {
    typename pair_of<out_t>::T d2;
    d2.x = from_f32<out_t>(v0);
    d2.y = from_f32<out_t>(v1);
    out_t* const dst = static_cast<out_t*>(p.d) + (long long)row * p.ldd + col;
#ifndef __CUDA_ARCH__
    DG_HOST_ALIGNED(dst, 2 * sizeof(out_t));
#endif
    *reinterpret_cast<typename pair_of<out_t>::T*>(dst) = d2;
}

// Programmatic dependent launch (sm_90 on): a kernel launched with the attribute (deepgemm/launch.py)
// may start while the previous kernel on its stream is finishing, so its set-up (barriers, tensor
// maps) overlaps that kernel's exit. grid_dependency_wait() returns once the previous kernel has
// completed and its writes are visible: every global read and write of a kernel launched this way
// comes after it (registry.py: KernelSpec.pdl). No kernel here signals griddepcontrol.launch_dependents:
// measured on the H200 (docs/performance.md, programmatic dependent launch), letting the next kernel
// in early, at the start or after the last load, made chains of GEMMs 3-18 % slower; without it
// the next kernel starts as this one's blocks exit. Without the attribute the wait is a no-op;
// before sm_90, and in a host build, it compiles to nothing.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The warp's index in the block as a value the compiler knows every lane of the warp shares
// (threadIdx.x / 32 it does not: the block size could be anything to it). Branching on it first keeps
// a warp's roles apart for ptxas: a single-thread region that lanes of the same warp may leave for
// another role's branch is compiled for divergence, its loop state in vector registers, where a
// region the rest of its warp exits from keeps it in uniform registers. Measured on V5 (H200, 64 x 64
// tiles at 512 x 768 x 3072): with the C/bias loader's branch for warp 1 beside the producer's for
// thread 0, the producer's k-loop took 45 instructions instead of 29 and fell behind the wgmmas,
// 12.4 us with a bias against 10.7 without; branching on this first: 10.8 us with the bias.
__device__ __forceinline__ int warp_id_uniform() {
#ifdef __CUDA_ARCH__
    return __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
#else
    return static_cast<int>(threadIdx.x / 32);   // a host build runs one lane at a time: nothing to tell
#endif
}

}  // namespace dg
