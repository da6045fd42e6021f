// Probes of the host forms of V4's instructions (grid_host.h, grid_host_runtime.cpp), one per
// p.flags, run by tests/cpu/test_host_kernels.py as a "kernel" through the same launch: each writes
// what its threads saw to p.d, which the test compares with the layouts and semantics stated in
// kernels/include/deepgemm/mma.cuh and cp_async.cuh, or must end in the error it names.
#include "deepgemm/cp_async.cuh"
#include "deepgemm/mma.cuh"
#include "deepgemm/params.cuh"

enum Probe {
    LDMATRIX,            // 32 rows of 8 halves in shared memory, lane l pointing at row ROW(l): both forms
    MMA_F16,             // D = A B + C from fragments built by the documented layouts, fp16
    MMA_BF16,            // ... bf16
    MMA_F16_ACC,         // ... fp16 with fp16 accumulators (V4's DG_ACC_F16 build)
    CP_ASYNC,            // when copies land, and their zero fill
    CP_ASYNC_NO_READ,    // src_bytes 0 at the first byte past an operand: nothing read
    CP_ASYNC_PAST_END,   // 2 bytes from there: the guard page
    CP_ASYNC_PARTIAL_PAST_END,   // the 8 bytes before the end of an operand of 120 bytes (16 would pass it)
    CP_ASYNC_MISALIGNED, // a source 2 bytes off 16
    CP_ASYNC_OUTSIDE,    // a destination past the block's shared memory
    PART_OF_A_WARP,      // half a warp at an ldmatrix, the other half at a barrier
    DIFFERENT_KINDS,     // even lanes at an ldmatrix, odd lanes at an mma
    DIFFERENT_SITES,     // every lane at an ldmatrix, but two different ones
};

#define ROW(l) (((l) * 7 + 3) % 32)   // a permutation: row addresses unlike the lane numbers

extern "C" void deepgemm_kernel(const GemmParams& p) {
    unsigned char* smem = dg_host_dynamic_smem();
    const unsigned base = dg::smem_u32(smem);
    const int tid = threadIdx.x, lane = tid % 32;
    unsigned* out = static_cast<unsigned*>(p.d);
    const unsigned short* a = static_cast<const unsigned short*>(p.a);
    const unsigned short* b = static_cast<const unsigned short*>(p.b);
    auto half_pair = [](const unsigned short* m, int ld, int r0, int c0, int r1, int c1) {
        return (unsigned)m[r0 * ld + c0] | (unsigned)m[r1 * ld + c1] << 16;
    };
    switch (p.flags) {
    case LDMATRIX: {
        for (int c = 0; c < 8; ++c) reinterpret_cast<unsigned short*>(smem)[8 * tid + c] = (unsigned short)(1 + 8 * tid + c);
        __syncthreads();
        unsigned r[4], t[4];
        dg::ldsm_x4(r, base + 16 * ROW(lane));
        dg::ldsm_x4_trans(t, base + 16 * ROW(lane));
        for (int i = 0; i < 4; ++i) out[8 * lane + i] = r[i], out[8 * lane + 4 + i] = t[i];
        break;
    }
    case MMA_F16: case MMA_BF16: case MMA_F16_ACC: {   // A 16 x 16 and B 16 x 8 ([k][n]), row-major
        const int g = lane >> 2, q = lane & 3;
        const unsigned af[4] = {half_pair(a, 16, g, 2 * q, g, 2 * q + 1), half_pair(a, 16, g + 8, 2 * q, g + 8, 2 * q + 1),
                                half_pair(a, 16, g, 2 * q + 8, g, 2 * q + 9),
                                half_pair(a, 16, g + 8, 2 * q + 8, g + 8, 2 * q + 9)};
        const unsigned bf[2] = {half_pair(b, 8, 2 * q, g, 2 * q + 1, g), half_pair(b, 8, 2 * q + 8, g, 2 * q + 9, g)};
        if (p.flags == MMA_F16_ACC) {   // C as fp16 pairs: {C[g][2q], C[g][2q+1]}, {C[g+8][2q], C[g+8][2q+1]}
            const unsigned short* c = static_cast<const unsigned short*>(p.c);
            unsigned d[2] = {half_pair(c, 8, g, 2 * q, g, 2 * q + 1), half_pair(c, 8, g + 8, 2 * q, g + 8, 2 * q + 1)};
            dg_host_mma_16816_f16acc(d, af, bf);
            unsigned short* o = reinterpret_cast<unsigned short*>(out);
            o[g * 8 + 2 * q] = (unsigned short)d[0], o[g * 8 + 2 * q + 1] = (unsigned short)(d[0] >> 16);
            o[(g + 8) * 8 + 2 * q] = (unsigned short)d[1], o[(g + 8) * 8 + 2 * q + 1] = (unsigned short)(d[1] >> 16);
            break;
        }
        const float* c = static_cast<const float*>(p.c);
        float d[4] = {c[g * 8 + 2 * q], c[g * 8 + 2 * q + 1], c[(g + 8) * 8 + 2 * q], c[(g + 8) * 8 + 2 * q + 1]};
        if (p.flags == MMA_F16) dg::mma_16816<__half>(d, af, bf);
        else dg::mma_16816<__nv_bfloat16>(d, af, bf);
        float* o = reinterpret_cast<float*>(out);
        o[g * 8 + 2 * q] = d[0], o[g * 8 + 2 * q + 1] = d[1], o[(g + 8) * 8 + 2 * q] = d[2], o[(g + 8) * 8 + 2 * q + 1] = d[3];
        break;
    }
    case CP_ASYNC: {   // out row r, thread t: words 4t .. 4t+3 of row r (128 words per row)
        auto chunk = [&](int c, int row) {
            for (int w = 0; w < 4; ++w) out[128 * row + 4 * tid + w] = reinterpret_cast<const unsigned*>(smem + 16 * c)[w];
        };
        // thread t copies min(t, 16) bytes of its chunk: the rest is zero-filled
        dg::cp_async_16(base + 16 * tid, a + 8 * tid, tid < 16 ? tid : 16);
        dg::cp_async_commit();
        chunk(tid, 0);                 // not landed before its wait
        dg::cp_async_wait<0>();
        chunk(tid, 1);                 // landed
        dg::cp_async_16(base + 16 * (32 + tid), a + 8 * tid, 16);
        dg::cp_async_commit();
        dg::cp_async_16(base + 16 * (64 + tid), a + 8 * tid, 16);
        dg::cp_async_commit();
        dg::cp_async_16(base + 16 * (96 + tid), a + 8 * tid, 16);   // never committed
        dg::cp_async_wait<1>();        // the older group only
        chunk(32 + tid, 2);
        chunk(64 + tid, 3);
        chunk(96 + tid, 4);
        __syncthreads();               // every thread's older group, and no more
        chunk(32 + (tid + 1) % 32, 5);
        chunk(64 + (tid + 1) % 32, 6);
        __syncthreads();               // none exits (landing the rest) while others still read
        break;
    }
    case CP_ASYNC_NO_READ: case CP_ASYNC_PAST_END:   // p.a holds p.k elements; its end is a page's end
        dg::cp_async_16(base + 16 * tid, a + p.k, p.flags == CP_ASYNC_NO_READ ? 0 : 2);
        dg::cp_async_wait<0>();
        break;
    case CP_ASYNC_PARTIAL_PAST_END:
        dg::cp_async_16(base + 16 * tid, a + 56, 8);
        dg::cp_async_wait<0>();
        break;
    case CP_ASYNC_MISALIGNED:
        dg::cp_async_16(base + 16 * tid, a + 1, 16);
        break;
    case CP_ASYNC_OUTSIDE:
        dg::cp_async_16(base + 16 * (64 + tid), a, 16);   // launched with 64 chunks of shared memory
        break;
    case PART_OF_A_WARP: {
        unsigned r[4];
        if (lane < 16) dg::ldsm_x4(r, base);
        __syncthreads();
        break;
    }
    case DIFFERENT_KINDS: {
        unsigned r[4] = {0, 0, 0, 0};
        float d[4] = {0, 0, 0, 0};
        const unsigned bb[2] = {0, 0};
        if (lane % 2) dg::mma_16816<__half>(d, r, bb);
        else dg::ldsm_x4(r, base);
        break;
    }
    case DIFFERENT_SITES: {
        unsigned r[4];
        if (lane % 2) {
            dg::ldsm_x4(r, base);
            out[lane] = r[0];
        } else {
            out[lane] = 7;
            dg::ldsm_x4(r, base + 16);
            out[lane] += r[1];
        }
        break;
    }
    }
}
