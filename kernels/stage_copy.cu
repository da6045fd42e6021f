// Staging copy for V5: an operand TMA cannot read (base not 16-byte aligned, or a leading
// dimension that is not a multiple of 8 elements) is copied, keeping its layout, into a buffer
// whose leading dimension is rounded up to 8 elements. Each thread moves 8 consecutive 16-bit
// elements along the contiguous dimension: 8 scalar loads (the source is only 2-byte aligned; the
// warp's loads still cover contiguous bytes, served by L1) and one 16-byte store.
// Grid: x over the contiguous dimension in chunks of 8 * blockDim.x, y over the other one.
extern "C" __global__ void __launch_bounds__(256)
deepgemm_kernel(const unsigned short* __restrict__ src, long long ld_src,
                unsigned short* __restrict__ dst, long long ld_dst, int inner, int outer) {
    const int i0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
    for (int row = blockIdx.y; row < outer; row += gridDim.y) {
        if (i0 >= inner) return;
        const unsigned short* s = src + (long long)row * ld_src + i0;
        unsigned short v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = (i0 + j < inner) ? s[j] : (unsigned short)0;
        uint4 packed;
        packed.x = v[0] | ((unsigned)v[1] << 16);
        packed.y = v[2] | ((unsigned)v[3] << 16);
        packed.z = v[4] | ((unsigned)v[5] << 16);
        packed.w = v[6] | ((unsigned)v[7] << 16);
        *reinterpret_cast<uint4*>(dst + (long long)row * ld_dst + i0) = packed;   // ld_dst % 8 == 0
    }
}
