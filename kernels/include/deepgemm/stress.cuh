// Support for the stress tier (tests/gpu/test_stress.py, `pytest --stress`). Both switches are
// compile-time defines that default to 0, and at 0 they compile to nothing: a normal build's SASS
// is the same with or without this header.
//
// DG_STRESS = a nonzero seed: pseudo-random pauses (__nanosleep) at the hand-over points of the
// asynchronous pipelines (V4's cp.async ring, V5's TMA -> mbarrier -> wgmma ring). A missing wait
// or barrier that today's timing happens to hide gets other interleavings to show itself in; a
// different seed gives different pauses. The pause is uniform across a warp group (hashed on the
// block, the warp group and the step), so no warp-synchronous instruction sees divergent lanes.
//
// DG_PIPE_CHECK = 1: a ledger of V5's wgmma commit groups in each consumer (and one of its staging
// units' TMA stores, StagingLedger below). A stage may only be
// handed back to the producer once the group that reads it is known to have retired (a
// wgmma.wait_group has covered it); a release before that is recorded, and the consumer then writes
// NaN for its outputs, so any oracle fails on it. This catches a premature release
// deterministically, where a timing test needs luck: the wgmma usually finishes before the next
// TMA copy lands even when nothing waits for it.
#pragma once

#ifndef DG_STRESS
#define DG_STRESS 0
#endif
#ifndef DG_PIPE_CHECK
#define DG_PIPE_CHECK 0
#endif

namespace dg {

// A pause of 64..1087 ns one time in four, different per (seed, block, group, site, step).
__device__ __forceinline__ void stress_pause(unsigned group, unsigned site, unsigned step) {
#if DG_STRESS
    unsigned h = (unsigned)DG_STRESS * 0x9E3779B9u;
    h ^= blockIdx.x * 0x85EBCA6Bu + blockIdx.y * 0x7FEB352Du;
    h ^= group * 0xC2B2AE35u + site * 0x27D4EB2Fu + step * 0x165667B1u;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    if ((h & 3u) == 0) __nanosleep(64u + (h >> 22));
#else
    (void)group; (void)site; (void)step;
#endif
}

// wgmma commit groups of one consumer thread: commit() numbers them in order, waited<N>() records
// that all but the newest N have retired (called by dg::wgmma_wait<N>(ledger) itself, so the
// depth noted is the depth waited), release(g) checks that group g has.
struct WgmmaLedger {
#if DG_PIPE_CHECK
    int committed = 0, retired = 0;
    bool bad = false;
    __device__ __forceinline__ int commit() { return committed++; }
    template <int N> __device__ __forceinline__ void waited() { retired = committed - N > retired ? committed - N : retired; }
    __device__ __forceinline__ void release(int group) { bad |= group >= retired; }
    __device__ __forceinline__ bool violated() const { return bad; }
#else
    __device__ __forceinline__ int commit() { return 0; }
    template <int N> __device__ __forceinline__ void waited() {}
    __device__ __forceinline__ void release(int) {}
    __device__ __forceinline__ bool violated() const { return false; }
#endif
};

// TMA stores out of one consumer's staging units (its first thread issues and waits for them):
// stored(unit) after a unit's store group is committed; reads_waited<N>() from
// dg::bulk_wait_read<N>(ledger), after which the newest N groups may still be reading their units;
// freed() when the units go back to V5's C loader, whose next loads overwrite them, so every store
// must have read its unit by then; rewriting(unit, values) before the consumer writes a unit again,
// when no group still reading may be that unit's; exiting() as the block ends, when none may. A
// hand-over or rewrite before that is recorded like a premature stage release (violated(): the
// consumer writes NaN), where a timing test would need the store's read to be slower than the next
// write. The ledger keeps which unit each pending group reads, not only how many groups are
// pending: a unit written row by row commits no group, so a count alone does not say whose are.
struct StagingLedger {
#if DG_PIPE_CHECK
    unsigned units = 0;   // the pending groups' units, oldest in the low 4 bits
    int unread = 0;       // store groups committed that no wait has seen finish reading (at most 8)
    bool bad = false;
    __device__ __forceinline__ void stored(int unit) {
        if (unread == 8) { bad = true; return; }
        units |= (unsigned)unit << (4 * unread);
        ++unread;
    }
    template <int N> __device__ __forceinline__ void reads_waited() {
        while (unread > N) { units >>= 4; --unread; }
    }
    __device__ __forceinline__ void freed() { bad |= unread > 0; }
    template <int K> __device__ __forceinline__ void rewriting(int unit, float (&values)[K]) {
        for (int i = 0; i < unread; ++i) bad |= ((units >> (4 * i)) & 15u) == (unsigned)unit;
        if (bad) {
#pragma unroll
            for (int i = 0; i < K; ++i) values[i] = __int_as_float(0x7fc00000);
        }
    }
    __device__ __forceinline__ bool violated() const { return bad; }
    // At the block's exit no output is left to turn into NaN: a store still reading the block's
    // shared memory, which the SM may then hand to another block, fails the launch instead.
    __device__ __forceinline__ void exiting() const {
        if (unread > 0) __trap();
    }
#else
    __device__ __forceinline__ void stored(int) {}
    template <int N> __device__ __forceinline__ void reads_waited() {}
    __device__ __forceinline__ void freed() {}
    template <int K> __device__ __forceinline__ void rewriting(int, float (&)[K]) {}
    __device__ __forceinline__ bool violated() const { return false; }
    __device__ __forceinline__ void exiting() const {}
#endif
};

// V5's split-K (DG_SPLIT_K > 1): a rank that does not finish a consumer's rows parks its partial
// sums in its own shared memory, the owner of those rows reads them from there (ld.shared::cluster),
// and a cluster barrier holds the rank until the owner is done: past it the rank moves on and, its
// one tile done, exits, which frees shared memory the owner may still be reading. In DG_PIPE_CHECK
// builds a rank that moves on first overwrites the first of each thread's parked words with a mark,
// then lingers a while (so that its shared memory outlives any read the owner still makes), and the
// owner, having read a rank's sums, looks for the mark there: found, or read as one of the sums, it
// makes the owner's outputs NaN. With the barrier the mark comes after every read; without it, a
// few cycles after the previous barrier, where the owner's remote reads take far longer.
constexpr unsigned PARKED_LEFT = 0x7fc0beefu;   // a NaN: a sum of finite products never has these bits

// The owner, after loading parked word group j of the rank at `remote` (its thread's first word)
// and adding it to acc: after the last group, a mark there means the rank had already moved on.
template <int H, int K> __device__ __forceinline__ void parked_sums_read(float (&acc)[H][K], unsigned remote, bool last) {
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
    if (last) {
        unsigned word;
        asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(word) : "r"(remote) : "memory");
        if (word == PARKED_LEFT) {
#pragma unroll
            for (int h = 0; h < H; ++h)
#pragma unroll
                for (int i = 0; i < K; ++i) acc[h][i] = __int_as_float(0x7fc00000);
        }
    }
#else
    (void)acc; (void)remote; (void)last;
#endif
}

// A rank moving on from a tile whose sums it parked at `part` (this thread's first word).
__device__ __forceinline__ void parked_sums_left(unsigned part) {
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
    asm volatile("st.shared.u32 [%0], %1;" :: "r"(part), "r"(PARKED_LEFT) : "memory");
    const long long t0 = clock64();
    while (clock64() - t0 < 40000) __nanosleep(256);   // ~20 us at the H200's clocks
#else
    (void)part;
#endif
}

// Before a split-K rank parks a consumer's sums in its ring, both consumers must be done reading
// the ring: the named barrier before the parking waits for the other consumer, whose last stage
// release comes after its last wgmma has retired. In DG_PIPE_CHECK builds the consumer that keeps
// its rows on this rank holds that release back a while (parked_ring_hold), and the parking consumer,
// past the barrier, tests each stage's `empty` barrier for the phase of its last use
// (parked_ring_idle): one still open means the other consumer may still read the ring, and the
// sums it parks turn NaN, which the owner adds into its outputs. With the barrier every phase has
// completed; without it, the held release is still to come on every run, so no luck with timing
// is needed. `empty0` is stage 0's barrier (stage s's at + 8 s); (stage, phase) is the consumer's
// ring position past its last k-block.
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
template <int STAGES> __device__ __forceinline__ bool parked_ring_busy(unsigned empty0, int stage, unsigned phase) {
    bool busy = false;
#pragma unroll
    for (int s = 0; s < STAGES; ++s) {   // last used in this lap (parity `phase`) or the one before
        unsigned done;
        asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done) : "r"(empty0 + 8u * s), "r"(s < stage ? phase : phase ^ 1u) : "memory");
        busy |= done == 0;
    }
    return busy;
}
#endif

template <int STAGES, int H, int K>
__device__ __forceinline__ void parked_ring_idle(float (&acc)[H][K], unsigned empty0, int stage, unsigned phase) {
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
    if (parked_ring_busy<STAGES>(empty0, stage, phase)) {
#pragma unroll
        for (int h = 0; h < H; ++h)
#pragma unroll
            for (int i = 0; i < K; ++i) acc[h][i] = __int_as_float(0x7fc00000);
    }
#else
    (void)acc; (void)empty0; (void)stage; (void)phase;
#endif
}

// The consumer that keeps its rows on this rank (`holds`), between its last wait and release.
__device__ __forceinline__ void parked_ring_hold(bool holds) {
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
    if (holds) {
        const long long t0 = clock64();
        while (clock64() - t0 < 10000) __nanosleep(64);   // ~5 us at the H200's clocks
    }
#else
    (void)holds;
#endif
}

// A consumer's FP32 accumulators, H rows of K (V5: one per 64-row half of its rows). Each row is
// indexed by a constant once the loops unroll, so an index past the last row is undefined behaviour
// that no output need show (the compiler may read any register): DG_PIPE_CHECK builds trap on it,
// and since the index is known at compile time the test costs nothing where it is in range.
template <int H, int K> struct Accumulators {
    float v[H][K];
    __device__ __forceinline__ float (&operator[](int h))[K] {
#if DG_PIPE_CHECK && defined(__CUDA_ARCH__)
        if (static_cast<unsigned>(h) / H) __trap();   // h outside [0, H)
#endif
        return v[h];
    }
};

}  // namespace dg
