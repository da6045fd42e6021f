// Staging copy for V5: an operand TMA cannot read (base not 16-byte aligned, or a leading
// dimension or contiguous extent that is not a multiple of 8 elements) is copied, keeping its
// layout, into a buffer whose leading dimension is rounded up to 8 elements, the pad zero-filled.
// Each thread writes 8 consecutive 16-bit elements with one 16-byte store. The source is only
// 2-byte aligned, so it loads the two aligned 16-byte chunks around its 8 elements and shifts them
// into place (funnel shifts on 32-bit words); the last chunks of a row, where the second load could
// pass the row's end, are copied element by element.
// Grid: x over the contiguous dimension in chunks of 8 * blockDim.x, y (strided) over the other.
extern "C" __global__ void __launch_bounds__(256)
deepgemm_kernel(const unsigned short* __restrict__ src, long long ld_src,
                unsigned short* __restrict__ dst, long long ld_dst, int inner, int outer) {
    const int i0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (i0 >= inner) return;
    for (int row = blockIdx.y; row < outer; row += gridDim.y) {
        const unsigned short* s = src + (long long)row * ld_src + i0;
        uint4 out;
        if (i0 + 16 <= inner) {
            const unsigned long long addr = reinterpret_cast<unsigned long long>(s);
            const uint4* base = reinterpret_cast<const uint4*>(addr & ~15ull);   // within [s - 14 B, s + 32 B)
            const uint4 lo = __ldg(base), hi = __ldg(base + 1);   // __ldg: a global load (the cast from an integer lost the space)
            const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            const int q = (addr & 15) / 4, odd = (addr & 2) != 0;   // word offset, half-word offset
            unsigned sel[5];
#pragma unroll
            for (int j = 0; j < 5; ++j)   // constant indices only: selects, no local memory
                sel[j] = q == 0 ? w[j] : q == 1 ? w[j + 1] : q == 2 ? w[j + 2] : w[j + 3];
            unsigned o[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) o[j] = odd ? __funnelshift_r(sel[j], sel[j + 1], 16) : sel[j];
            out = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            unsigned short v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = (i0 + j < inner) ? s[j] : (unsigned short)0;
            out = make_uint4(v[0] | ((unsigned)v[1] << 16), v[2] | ((unsigned)v[3] << 16),
                             v[4] | ((unsigned)v[5] << 16), v[6] | ((unsigned)v[7] << 16));
        }
        *reinterpret_cast<uint4*>(dst + (long long)row * ld_dst + i0) = out;   // ld_dst % 8 == 0
    }
}
