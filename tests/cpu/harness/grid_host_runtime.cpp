// The scheduler of host-built kernels and the host forms of the instructions they use (grid_host.h
// says what they model). Compiled once per test session and linked into every kernel's build.
//
// A thread starts on its own stack through makecontext/setcontext; after that, the switches go
// through _setjmp/_longjmp, which do not save and restore the signal mask: swapcontext's system
// calls (two per switch) made V4's run, one switch per lane per mma, several times slower. glibc's
// _FORTIFY_SOURCE check of longjmp refuses a jump to another stack, so it is off in this unit.
#undef _FORTIFY_SOURCE
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <vector>

struct DgHostIndex {
    unsigned x, y, z;
};
DgHostIndex threadIdx, blockIdx, blockDim, gridDim;

namespace dg_host {
// AT_MBARRIER: waiting for an mbarrier phase (V5); AT_NAMED: at a named barrier (bar.sync id, count).
// HANDING_OFF: it completed an mbarrier phase that others wait for, and they run before it goes on.
enum State : unsigned char { READY, AT_BARRIER, AT_COLLECTIVE, AT_MBARRIER, AT_NAMED, HANDING_OFF, FINISHED };
struct Fiber {
    ucontext_t start;   // the thread's entry on its stack, entered once
    jmp_buf at;         // where it yielded
    bool started;
};
static jmp_buf scheduler;
static std::vector<Fiber> fibers;
static std::vector<unsigned char> state;   // State, per thread of the running block
static unsigned current = 0;
static unsigned long long resumes = 0;   // thread resumptions so far: a phase without any is a hang
static void (*thread_body)(const void*) = nullptr;
static const void* params = nullptr;

static void yield(State s) {   // back to the scheduler, which resumes this thread once s is over
    state[current] = s;
    if (!_setjmp(fibers[current].at)) _longjmp(scheduler, 1);
}

// What a GPU would trap on (an address outside shared memory, a misaligned one): the message, then
// the signal that the test reports.
[[noreturn]] static void fault(int sig, const char* format, ...) {
    va_list args;
    va_start(args, format);
    std::fprintf(stderr, "thread (%u, %u, %u) of block (%u, %u, %u): ", threadIdx.x, threadIdx.y, threadIdx.z,
                 blockIdx.x, blockIdx.y, blockIdx.z);
    std::vfprintf(stderr, format, args);
    std::fprintf(stderr, "\n");
    va_end(args);
    std::raise(sig);
    _Exit(128 + sig);
}

// ---- shared memory ---------------------------------------------------------------------------
// The block's dynamic shared memory, and its 32-bit .shared window: the window starts at SMEM_BASE,
// not 0 (as on sm_80+, where the first kilobyte is the system's), so an address that forgot the
// window's base is outside it.
constexpr unsigned SMEM_BASE = 1024;
static unsigned char* smem = nullptr;
static unsigned smem_bytes = 0;

static unsigned char* shared_at(unsigned addr, unsigned bytes, const char* what, unsigned align = 16) {
    if (addr < SMEM_BASE || addr - SMEM_BASE > smem_bytes || smem_bytes - (addr - SMEM_BASE) < bytes)
        fault(SIGSEGV, "%s at shared address %#x, outside the block's %u bytes of dynamic shared memory", what, addr,
              smem_bytes);
    if (addr % align != 0) fault(SIGBUS, "%s at shared address %#x, not %u-byte aligned", what, addr, align);
    return smem + (addr - SMEM_BASE);
}

// ---- cp.async: per thread, the copies issued since the last commit and the committed groups ----
// The operands' byte ranges (dg_host_operands): a copy that reads must have all its 16 bytes inside
// one, whatever its src_bytes, as compute-sanitizer's memcheck counts them (measured on the H200;
// cp_async.cuh). A guard page cannot show it: the 16 bytes of an aligned copy never cross one.
static std::vector<std::pair<uintptr_t, uintptr_t>> operands;

static bool inside_an_operand(uintptr_t lo, size_t bytes) {
    for (const auto& r : operands)
        if (r.first <= lo && lo + bytes <= r.second) return true;
    return false;
}

struct Copy {
    unsigned dst;
    unsigned char bytes[16];
};
struct AsyncCopies {
    std::vector<Copy> open;
    std::deque<std::vector<Copy>> groups;   // oldest first
    // A thread's st.shared.v4 stores (small_m's staging), made visible to the other threads at its
    // next __syncwarp or __syncthreads (or its exit), not before: a collective ldmatrix reached
    // without the __syncwarp after the stores reads what was there before them, every time.
    std::vector<Copy> stores;
};
static std::vector<AsyncCopies> async;

static void land(const std::vector<Copy>& group) {
    for (const Copy& c : group) std::memcpy(smem + (c.dst - SMEM_BASE), c.bytes, 16);
}

static void publish_stores(unsigned thread) {
    land(async[thread].stores);
    async[thread].stores.clear();
}

// ---- warp collectives ---------------------------------------------------------------------------
enum Kind : int { LDSM, LDSM_TRANS, MMA_F16, MMA_BF16, MMA_F16_ACC, SYNCWARP };
static const char* const KIND_NAMES[] = {"ldmatrix.x4", "ldmatrix.x4.trans", "mma.sync f16", "mma.sync bf16",
                                         "mma.sync f16 (f16 accumulators)", "__syncwarp"};
struct Lane {   // one thread's operands at its current collective, and its result
    int kind;
    const void* site;   // the instruction (return address of the hook): lanes must meet the same one
    unsigned addr, mask;
    unsigned a[4], b[2], c[2];
    float fc[4];
    unsigned r[4];
    float fd[4];
};
static std::vector<Lane> lanes;

static void collective(Lane& me, int kind, const void* site) {
    me.kind = kind;
    me.site = site;
    yield(AT_COLLECTIVE);
}

// fp16 -> float through a table: the host's __half2float is a software conversion, and the mma
// emulation converts 2 x 256 inputs per instruction.
struct F16Table {
    float value[65536];
    F16Table() {
        for (unsigned h = 0; h < 65536; ++h) value[h] = __half2float(__ushort_as_half((unsigned short)h));
    }
};
static const F16Table f16_table;
static float f16_to_f32(unsigned short h) { return f16_table.value[h]; }
static float bf16_to_f32(unsigned short h) {
    const unsigned bits = (unsigned)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// ldmatrix.m8n8.x4(.trans).b16 for the warp whose lanes are L[0..31] (mma.cuh states the layout).
static void run_ldmatrix(Lane* L, bool trans) {
    const unsigned char* row[32];
    for (int l = 0; l < 32; ++l) row[l] = shared_at(L[l].addr, 16, trans ? "ldmatrix.trans row" : "ldmatrix row");
    for (int l = 0; l < 32; ++l)
        for (int i = 0; i < 4; ++i) {
            unsigned v;
            if (!trans) {
                std::memcpy(&v, row[8 * i + l / 4] + 4 * (l % 4), 4);
            } else {
                unsigned short lo, hi;
                std::memcpy(&lo, row[8 * i + 2 * (l % 4)] + 2 * (l / 4), 2);
                std::memcpy(&hi, row[8 * i + 2 * (l % 4) + 1] + 2 * (l / 4), 2);
                v = lo | (unsigned)hi << 16;
            }
            L[l].r[i] = v;
        }
}

// mma.sync.m16n8k16.row.col: D = A B + C for the warp (mma.cuh states the fragments). The products of
// fp16 or bf16 values are exact in float; each output's 16 of them and C are summed in double and
// rounded once, to float (FP32 accumulation at least as exact as the tensor cores') or, for f16
// accumulators, straight to fp16 (deepgemm.report.emulate's model of them, block_k = 16).
static void run_mma(Lane* L, int kind) {
    float A[16][16], B[16][8], C[16][8];
    auto in = [kind](unsigned w, int half) {
        const unsigned short h = (unsigned short)(w >> (16 * half));
        return kind == MMA_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
    };
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        const Lane& x = L[l];
        for (int h = 0; h < 2; ++h) {
            A[g][2 * t + h] = in(x.a[0], h);
            A[g + 8][2 * t + h] = in(x.a[1], h);
            A[g][2 * t + 8 + h] = in(x.a[2], h);
            A[g + 8][2 * t + 8 + h] = in(x.a[3], h);
            B[2 * t + h][g] = in(x.b[0], h);
            B[2 * t + 8 + h][g] = in(x.b[1], h);
            if (kind == MMA_F16_ACC) {
                C[g][2 * t + h] = f16_to_f32((unsigned short)(x.c[0] >> (16 * h)));
                C[g + 8][2 * t + h] = f16_to_f32((unsigned short)(x.c[1] >> (16 * h)));
            } else {
                C[g][2 * t + h] = x.fc[h];
                C[g + 8][2 * t + h] = x.fc[2 + h];
            }
        }
    }
    double D[16][8];
    for (int i = 0; i < 16; ++i)
        for (int j = 0; j < 8; ++j) {
            double s = 0;
            for (int k = 0; k < 16; ++k) s += (double)(A[i][k] * B[k][j]);
            D[i][j] = s + C[i][j];
        }
    for (int l = 0; l < 32; ++l) {
        const int g = l >> 2, t = l & 3;
        Lane& x = L[l];
        if (kind == MMA_F16_ACC) {
            for (int r = 0; r < 2; ++r) {
                const unsigned lo = __half_as_ushort(__double2half(D[g + 8 * r][2 * t]));
                const unsigned hi = __half_as_ushort(__double2half(D[g + 8 * r][2 * t + 1]));
                x.r[r] = lo | hi << 16;
            }
        } else {
            x.fd[0] = (float)D[g][2 * t];
            x.fd[1] = (float)D[g][2 * t + 1];
            x.fd[2] = (float)D[g + 8][2 * t];
            x.fd[3] = (float)D[g + 8][2 * t + 1];
        }
    }
}

// ---- Hopper (V5): mbarriers, named barriers, TMA copies, bulk groups and wgmma -------------------
// An mbarrier phase completes when its pending arrivals reach zero and every byte announced by
// expect_tx has landed; try_wait.parity(P) passes once the phase of parity P has completed (a fresh
// barrier counts the phase of parity 1 as completed); a thread other than the one that initialized
// it may use it only after a __syncthreads that follows the init. TMA loads land when issued, so a stage or
// staging tile handed back early is overwritten at once; TMA stores read shared memory as late as the
// PTX allows: at the cp.async.bulk.wait_group.read that covers their group, else when the block
// ends. wgmma is the warpgroup's: its 128 threads meet at each commit (one that does not, or a
// warpgroup that commits a different number of times, hangs), and a group's operations, every
// thread's, read their shared-memory operands when the first wgmma.wait_group that covers the group
// runs, not when issued: a stage handed back before that wait is read after the producer refilled it.
struct Mbarrier {
    unsigned count = 0, pending = 0, phase = 0;
    long long tx = 0;
    unsigned init_thread = 0;          // the thread that ran its mbarrier.init,
    unsigned long long init_syncs = 0;  // at this count of the block's __syncthreads
};
// The block's __syncthreads so far: an mbarrier's init is visible to the other threads only once
// one has completed after it (a GPU thread that uses it sooner may find it not yet initialized).
static unsigned long long block_syncs = 0;
static std::map<unsigned, Mbarrier> mbarriers;   // by .shared address, the running block's
struct WaitFor {
    unsigned bar, parity;
};
static std::vector<WaitFor> waits;   // per thread: what an AT_MBARRIER thread waits for
static std::vector<unsigned> handed_to;   // per thread: the mbarrier a HANDING_OFF thread completed
struct NamedBarrier {
    int count = 0, arrived = 0;
    std::vector<unsigned> waiting;
};
static NamedBarrier named[16];

// One arrival at barrier b of `count` threads (`what` names it in an error): the last one in
// releases the others and returns true; any other waits there if `wait` (bar.sync, not bar.arrive)
// and returns false once released.
static bool meet(NamedBarrier& b, int count, bool wait, const char* what) {
    if (b.arrived == 0) b.count = count;
    else if (b.count != count) fault(SIGILL, "%s met with counts %d and %d", what, b.count, count);
    if (++b.arrived == b.count) {
        for (unsigned t : b.waiting) state[t] = READY;
        b.waiting.clear();
        b.arrived = 0;
        return true;
    }
    if (wait) {
        b.waiting.push_back(current);
        yield(AT_NAMED);
    }
    return false;
}

static Mbarrier& mbarrier_at(unsigned bar, const char* what) {
    shared_at(bar, 8, what, 8);
    auto it = mbarriers.find(bar);
    if (it == mbarriers.end()) fault(SIGSEGV, "%s at shared address %#x: no mbarrier was initialized there", what, bar);
    if (it->second.init_thread != current && it->second.init_syncs == block_syncs)
        fault(SIGILL, "%s at shared address %#x: thread %u's mbarrier.init of it is not visible to this thread yet "
              "(no __syncthreads since)", what, bar, it->second.init_thread);
    return it->second;
}

static void mbarrier_settle(Mbarrier& b) {
    if (b.pending == 0 && b.tx == 0) {
        ++b.phase;
        b.pending = b.count;
    }
}

static bool mbarrier_passed(const WaitFor& w) {
    return (mbarriers[w.bar].phase & 1u) != w.parity;
}

// The 128 bytes of a CUtensorMap as the host test encodes them instead of the driver (the map's
// fields, nothing opaque): see tests/cpu/test_host_kernels.py.
struct HostTensorMap {
    unsigned magic, rank;
    unsigned long long base, dims[3], strides[2];   // strides in bytes, of dims 1 and 2
    unsigned box[3], elem_bytes, swizzle_bytes;
};
constexpr unsigned HOST_MAP_MAGIC = 0x4D544744u;   // "DGTM"

static HostTensorMap tensor_map(const void* map, const char* what) {
    HostTensorMap m;
    std::memcpy(&m, map, sizeof m);
    if (m.magic != HOST_MAP_MAGIC) fault(SIGSEGV, "%s through a tensor map the host did not encode (an unused map?)", what);
    return m;
}

// Byte address in shared memory of byte `offset` of a box landed at `dst` with 128-byte swizzle:
// within each 1024-byte atom the 16-byte chunks of row r (128 bytes) are XOR-ed with r % 8, a
// function of the address bits as on the GPU.
static unsigned swizzled(unsigned addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

// Every element of the box at (c0, c1, c2): fn(shared address, global pointer or null outside the map).
template <class Fn>
static void for_box(const HostTensorMap& m, unsigned smem_addr, int c0, int c1, int c2, Fn fn) {
    const long long c[3] = {c0, c1, m.rank > 2 ? c2 : 0};
    const unsigned nz = m.rank > 2 ? m.box[2] : 1;
    for (unsigned z = 0; z < nz; ++z)
        for (unsigned y = 0; y < m.box[1]; ++y)
            for (unsigned x = 0; x < m.box[0]; ++x) {
                const long long g[3] = {c[0] + x, c[1] + y, c[2] + z};
                bool inside = true;
                for (unsigned d = 0; d < (m.rank > 2 ? 3u : 2u); ++d) inside &= g[d] >= 0 && g[d] < (long long)m.dims[d];
                const unsigned offset = ((z * m.box[1] + y) * m.box[0] + x) * m.elem_bytes;
                const unsigned addr = m.swizzle_bytes ? swizzled(smem_addr + offset) : smem_addr + offset;
                unsigned char* src = inside ? reinterpret_cast<unsigned char*>(m.base) + g[0] * m.elem_bytes +
                                                  g[1] * m.strides[0] + (m.rank > 2 ? g[2] * m.strides[1] : 0)
                                            : nullptr;
                fn(addr, src);
            }
}

static unsigned box_bytes(const HostTensorMap& m) {
    return m.box[0] * m.box[1] * (m.rank > 2 ? m.box[2] : 1) * m.elem_bytes;
}

static void check_box(const HostTensorMap& m, unsigned smem_addr, const char* what) {
    if (m.swizzle_bytes && m.box[0] * m.elem_bytes != m.swizzle_bytes)
        fault(SIGILL, "%s: a box row of %u bytes with %u-byte swizzle", what, m.box[0] * m.elem_bytes, m.swizzle_bytes);
    shared_at(smem_addr, box_bytes(m), what, 128);   // the whole box inside shared memory, 128-byte aligned
}

// Shared-memory bytes a thread wrote with ordinary stores since its last fence.proxy.async (by
// 4-byte word, with the writing thread): a TMA store issued over one reads through the async proxy
// what that proxy may not see yet, a race no GPU run is sure to show, so the host stops there.
static std::map<unsigned, unsigned> unfenced;
static std::vector<std::vector<unsigned>> written;   // per thread: its words in unfenced

struct BulkStore {
    HostTensorMap map;
    unsigned src;
    int c0, c1, c2;
};
static void run_store(const BulkStore& s) {
    for_box(s.map, s.src, s.c0, s.c1, s.c2, [&](unsigned addr, unsigned char* dst) {
        if (dst) std::memcpy(dst, shared_at(addr, s.map.elem_bytes, "TMA store source", s.map.elem_bytes),
                             s.map.elem_bytes);   // outside the map: not written
    });
}

// One thread's share of a wgmma: its accumulators d[0 .. n/2) (hopper.cuh states which D element
// each holds) += A (64 x 16) B (16 x n), read through the shared-memory descriptors when it runs.
struct WgmmaOp {
    unsigned thread;
    float* d;
    int n;
    unsigned long long da, db;
    int trans_a, trans_b;
    bool bf16;
};
struct ThreadAsync {   // per thread: TMA store groups, oldest first
    std::vector<BulkStore> open_stores;
    std::deque<std::vector<BulkStore>> store_groups;
};
static std::vector<ThreadAsync> hopper;
struct WarpgroupMma {   // per warpgroup: its wgmma operations since the last commit, and its groups
    std::vector<WgmmaOp> open;
    std::deque<std::vector<WgmmaOp>> groups;
    NamedBarrier commit;              // where its 128 threads meet at each commit
};
static std::vector<WarpgroupMma> warpgroups;
static std::vector<BulkStore> block_stores;   // groups no wait covered: run when the block ends

// Element (i, k) of a 16-bit operand tile behind descriptor `desc` (128-byte swizzle): K-major (i:
// the row, 128 bytes of k per row, 8-row groups SBO apart) or M/N-major (k: the row, 64 i-values
// per 128-byte row, 8-row k groups SBO apart, 64-wide i blocks LBO apart).
static float operand(unsigned long long desc, bool mn_major, int i, int k, bool bf16) {
    if ((desc >> 62) != 1) fault(SIGILL, "wgmma descriptor %#llx without 128-byte swizzle", desc);
    const unsigned start = (unsigned)(desc & 0x3FFF) << 4, lbo = (unsigned)((desc >> 16) & 0x3FFF) << 4,
                   sbo = (unsigned)((desc >> 32) & 0x3FFF) << 4;
    const unsigned addr = mn_major ? start + (i / 64) * lbo + (k / 8) * sbo + (k % 8) * 128 + (i % 64) * 2
                                   : start + (i / 8) * sbo + (i % 8) * 128 + k * 2;
    unsigned short h;
    std::memcpy(&h, shared_at(swizzled(addr), 2, "wgmma operand", 2), 2);
    return bf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

static void run_wgmma(const WgmmaOp& op, unsigned thread) {
    const unsigned t = thread % 128, w = t / 32, l = t % 32;
    float a[2][16];
    for (int h = 0; h < 2; ++h)
        for (int k = 0; k < 16; ++k) a[h][k] = operand(op.da, op.trans_a, 16 * w + l / 4 + 8 * h, k, op.bf16);
    for (int i = 0; i < op.n / 2; ++i) {
        const int h = (i / 2) % 2, col = 8 * (i / 4) + 2 * (l % 4) + i % 2;
        double s = op.d[i];
        for (int k = 0; k < 16; ++k) s += (double)(a[h][k] * operand(op.db, op.trans_b, col, k, op.bf16));
        op.d[i] = (float)s;
    }
}

// After the block: the TMA stores that no wait covered read shared memory now.
static void finish_block_stores() {
    for (const BulkStore& s : block_stores) run_store(s);
    block_stores.clear();
    for (const WarpgroupMma& g : warpgroups)
        if (!g.open.empty() || !g.groups.empty())
            fault(SIGILL, "the block ends with wgmma operations no wgmma.wait_group covered");
}

// ---- the scheduler --------------------------------------------------------------------------------
enum { OK = 0, BARRIER_MISMATCH = 1, WARP_MISMATCH = 2, HANG = 4 };

static void thread_main() {
    const unsigned me = current;
    thread_body(params);
    AsyncCopies& q = async[me];   // copies still in flight land at the latest when their thread exits
    for (; !q.groups.empty(); q.groups.pop_front()) land(q.groups.front());
    land(q.open);
    publish_stores(me);
    ThreadAsync& h = hopper[me];   // TMA stores no wait covered read shared memory when the block ends
    for (auto& group : h.store_groups) block_stores.insert(block_stores.end(), group.begin(), group.end());
    block_stores.insert(block_stores.end(), h.open_stores.begin(), h.open_stores.end());
    state[me] = FINISHED;
    _longjmp(scheduler, 1);   // never returns: its stack is left as it is
}

// Resumes thread i until it waits (barrier, collective) or returns.
static void resume(unsigned i, const DgHostIndex& index) {
    current = i;
    threadIdx = index;
    state[i] = READY;
    ++resumes;
    if (_setjmp(scheduler)) return;   // it yielded or returned
    if (fibers[i].started) _longjmp(fibers[i].at, 1);
    fibers[i].started = true;
    setcontext(&fibers[i].start);
}

// Resumes thread i, and each time it hands off (an mbarrier phase others wait for), those first.
static void resume_with_handoffs(unsigned i, const std::vector<DgHostIndex>& index) {
    resume(i, index[i]);
    while (state[i] == HANDING_OFF) {
        for (unsigned t = 0; t < state.size(); ++t)
            if (state[t] == AT_MBARRIER && waits[t].bar == handed_to[i] && mbarrier_passed(waits[t]))
                resume_with_handoffs(t, index);
        resume(i, index[i]);
    }
}

// Runs warp w's ready lanes (in thread order, or reversed) up to their next barrier, meeting their
// collectives on the way: when every lane waits at the same one, it is computed and they go on.
static int run_warp(unsigned w, unsigned n, bool reverse, const std::vector<DgHostIndex>& index) {
    const unsigned first = 32 * w, count = n - first < 32 ? n - first : 32;
    for (;;) {
        for (unsigned j = 0; j < count; ++j) {
            const unsigned i = first + (reverse ? count - 1 - j : j);
            if (state[i] == AT_MBARRIER && mbarrier_passed(waits[i])) state[i] = READY;
            if (state[i] == READY) resume_with_handoffs(i, index);
        }
        unsigned waiting = 0;
        for (unsigned j = 0; j < count; ++j) waiting += state[first + j] == AT_COLLECTIVE;
        if (waiting == 0) return OK;   // every lane at the barrier or done
        Lane* L = &lanes[first];
        bool same = waiting == 32;
        for (unsigned j = 1; same && j < 32; ++j)
            same = L[j].kind == L[0].kind && L[j].site == L[0].site && (L[j].kind != SYNCWARP || L[j].mask == L[0].mask);
        if (!same) {
            std::fprintf(stderr, "block (%u, %u, %u), warp %u: %u of its %u lanes at a warp-collective instruction:",
                         blockIdx.x, blockIdx.y, blockIdx.z, w, waiting, count);
            for (unsigned j = 0; j < count; ++j)
                std::fprintf(stderr, " %s%s", state[first + j] == AT_COLLECTIVE ? KIND_NAMES[L[j].kind]
                                              : state[first + j] == AT_BARRIER ? "__syncthreads" : "exited",
                             state[first + j] == AT_COLLECTIVE && L[j].site != L[0].site ? " (elsewhere)" : "");
            std::fprintf(stderr, " (lanes meeting different instructions, or part of a warp)\n");
            return WARP_MISMATCH;
        }
        switch (L[0].kind) {
        case LDSM: run_ldmatrix(L, false); break;
        case LDSM_TRANS: run_ldmatrix(L, true); break;
        case MMA_F16: case MMA_BF16: case MMA_F16_ACC: run_mma(L, L[0].kind); break;
        case SYNCWARP:
            if (L[0].mask != 0xffffffffu) {
                std::fprintf(stderr, "__syncwarp(%#x): only the whole warp is modelled\n", L[0].mask);
                return WARP_MISMATCH;
            }
            break;
        }
        for (unsigned j = 0; j < 32; ++j) state[first + j] = READY;
    }
}

// Dynamic shared memory of `bytes`, 128-byte aligned, ending as close to an inaccessible page as
// that allows.
struct SharedArena {
    char* map = nullptr;
    size_t len = 0;
    explicit SharedArena(unsigned bytes) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        const size_t data = (bytes + page - 1) / page * page;
        len = data + 2 * page;
        map = (char*)mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED || (data && mprotect(map + page, data, PROT_READ | PROT_WRITE) != 0)) {
            std::perror("mmap");
            std::exit(3);
        }
        char* start = map + page + data - bytes;
        smem = (unsigned char*)(start - (uintptr_t)start % 128);
        smem_bytes = bytes;
    }
    ~SharedArena() { munmap(map, len); }
};
}  // namespace dg_host

// ---- the hooks the kernel headers call in a host build (declared in grid_host.h, cp_async.cuh and
// mma.cuh). Each collective's return address names the instruction its lanes are at: not inlined.

void dg_host_syncthreads() {
    dg_host::publish_stores(dg_host::current);
    dg_host::yield(dg_host::AT_BARRIER);
}

unsigned char* dg_host_dynamic_smem() { return dg_host::smem; }

unsigned dg_host_smem_u32(const void* p) {
    using namespace dg_host;
    const unsigned char* q = static_cast<const unsigned char*>(p);
    if (smem == nullptr || q < smem || q > smem + smem_bytes)
        fault(SIGSEGV, "__cvta_generic_to_shared of %p, outside the block's shared memory", p);
    return SMEM_BASE + (unsigned)(q - smem);
}

void dg_host_read(const void* ptr, unsigned bytes) {
    using namespace dg_host;
    if (!operands.empty() && !inside_an_operand(reinterpret_cast<uintptr_t>(ptr), bytes))   // none given: a harness of its own
        fault(SIGSEGV, "a %u-byte read at %p, outside every operand's view", bytes, ptr);
}

void dg_host_cp_async_16(unsigned dst, const void* src, int src_bytes) {
    using namespace dg_host;
    shared_at(dst, 16, "cp.async destination");
    if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fault(SIGBUS, "misaligned 16-byte cp.async source %p", src);
    if (src_bytes < 0 || src_bytes > 16) fault(SIGILL, "cp.async of 16 bytes with a source size of %d", src_bytes);
    if (src_bytes > 0 && !operands.empty()) {
        if (!inside_an_operand(reinterpret_cast<uintptr_t>(src), 16))
            fault(SIGSEGV, "cp.async of %d bytes from %p: its 16 bytes are not all inside an operand (memcheck "
                  "counts all 16 as read)", src_bytes, src);
    }
    Copy c;
    c.dst = dst;
    std::memcpy(c.bytes, src, (size_t)src_bytes);   // read now: a read outside an operand faults here
    std::memset(c.bytes + src_bytes, 0, (size_t)(16 - src_bytes));
    async[current].open.push_back(c);
}

void dg_host_st_shared_16(unsigned addr, const void* v) {
    dg_host::shared_at(addr, 16, "st.shared.v4 address");   // an address outside the block's faults now
    dg_host::Copy c;
    c.dst = addr;
    std::memcpy(c.bytes, v, 16);
    dg_host::async[dg_host::current].stores.push_back(c);
}

void dg_host_cp_async_commit() {
    dg_host::AsyncCopies& q = dg_host::async[dg_host::current];
    q.groups.push_back(std::move(q.open));
    q.open.clear();
}

void dg_host_cp_async_wait(int n) {
    dg_host::AsyncCopies& q = dg_host::async[dg_host::current];
    for (; (int)q.groups.size() > n; q.groups.pop_front()) dg_host::land(q.groups.front());
}

__attribute__((noinline)) void dg_host_ldmatrix_x4(unsigned (&r)[4], unsigned addr, bool trans) {
    dg_host::Lane& me = dg_host::lanes[dg_host::current];
    me.addr = addr;
    dg_host::collective(me, trans ? dg_host::LDSM_TRANS : dg_host::LDSM, __builtin_return_address(0));
    for (int i = 0; i < 4; ++i) r[i] = me.r[i];
}

__attribute__((noinline)) void dg_host_mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2],
                                                 bool bf16) {
    dg_host::Lane& me = dg_host::lanes[dg_host::current];
    for (int i = 0; i < 4; ++i) me.a[i] = a[i], me.fc[i] = d[i];
    me.b[0] = b[0], me.b[1] = b[1];
    dg_host::collective(me, bf16 ? dg_host::MMA_BF16 : dg_host::MMA_F16, __builtin_return_address(0));
    for (int i = 0; i < 4; ++i) d[i] = me.fd[i];
}

__attribute__((noinline)) void dg_host_mma_16816_f16acc(unsigned (&d)[2], const unsigned (&a)[4],
                                                        const unsigned (&b)[2]) {
    dg_host::Lane& me = dg_host::lanes[dg_host::current];
    for (int i = 0; i < 4; ++i) me.a[i] = a[i];
    me.b[0] = b[0], me.b[1] = b[1];
    me.c[0] = d[0], me.c[1] = d[1];
    dg_host::collective(me, dg_host::MMA_F16_ACC, __builtin_return_address(0));
    d[0] = me.r[0], d[1] = me.r[1];
}

__attribute__((noinline)) void dg_host_syncwarp(unsigned mask) {
    dg_host::publish_stores(dg_host::current);
    dg_host::Lane& me = dg_host::lanes[dg_host::current];
    me.mask = mask;
    dg_host::collective(me, dg_host::SYNCWARP, __builtin_return_address(0));
}

// V5's instructions (hopper.cuh's host forms; what they model: the Hopper section above).
void dg_host_mbar_init(unsigned bar, unsigned count) {
    dg_host::shared_at(bar, 8, "mbarrier.init", 8);
    dg_host::Mbarrier b;
    b.count = b.pending = count;
    b.init_thread = dg_host::current;
    b.init_syncs = dg_host::block_syncs;
    dg_host::mbarriers[bar] = b;
}

// An arrive that completes a phase hands off to the threads waiting for it: they run at once, before
// the arriving thread's next instruction, as early as a GPU could run them. So whatever a release
// hands back (a stage, a staging unit) is refilled before the releasing thread touches it again.
void dg_host_mbar_arrive(unsigned bar, unsigned tx_bytes) {
    using namespace dg_host;
    publish_stores(current);   // an arrive releases the thread's earlier writes
    Mbarrier& b = mbarrier_at(bar, "mbarrier.arrive");
    const unsigned phase = b.phase;
    b.tx += tx_bytes;
    --b.pending;
    mbarrier_settle(b);
    if (b.phase == phase) return;
    for (unsigned i = 0; i < state.size(); ++i)
        if (state[i] == AT_MBARRIER && waits[i].bar == bar) {
            handed_to[current] = bar;
            yield(HANDING_OFF);
            return;
        }
}

void dg_host_mbar_wait(unsigned bar, unsigned parity) {
    using namespace dg_host;
    mbarrier_at(bar, "mbarrier.try_wait");
    const WaitFor w{bar, parity & 1u};
    if (mbarrier_passed(w)) return;
    waits[current] = w;
    yield(AT_MBARRIER);   // resumed once the phase has completed
}

void dg_host_tma_load(unsigned dst, const void* map, int c0, int c1, int c2, unsigned bar) {
    using namespace dg_host;
    const HostTensorMap m = tensor_map(map, "TMA load");
    check_box(m, dst, "TMA load destination");
    Mbarrier& b = mbarrier_at(bar, "TMA load's mbarrier");
    for_box(m, dst, c0, c1, c2, [&](unsigned addr, unsigned char* src) {
        unsigned char* to = shared_at(addr, m.elem_bytes, "TMA load", m.elem_bytes);
        if (src) std::memcpy(to, src, m.elem_bytes);   // a read outside an operand faults here
        else std::memset(to, 0, m.elem_bytes);         // outside the map: zero fill
    });
    b.tx -= box_bytes(m);
    mbarrier_settle(b);
}

void dg_host_tma_store(const void* map, unsigned src, int c0, int c1, int c2) {
    using namespace dg_host;
    const HostTensorMap m = tensor_map(map, "TMA store");
    check_box(m, src, "TMA store source");
    for_box(m, src, c0, c1, c2, [&](unsigned addr, unsigned char*) {
        const auto it = unfenced.find(addr & ~3u);
        if (it != unfenced.end())
            fault(SIGILL, "a TMA store reads shared address %#x, which thread %u wrote with no fence.proxy.async since",
                  addr, it->second);
    });
    hopper[current].open_stores.push_back(BulkStore{m, src, c0, c1, c2});
}

void dg_host_bulk_commit() {
    dg_host::ThreadAsync& h = dg_host::hopper[dg_host::current];
    h.store_groups.push_back(std::move(h.open_stores));
    h.open_stores.clear();
}

void dg_host_bulk_wait_read(int n) {
    dg_host::ThreadAsync& h = dg_host::hopper[dg_host::current];
    for (; (int)h.store_groups.size() > n; h.store_groups.pop_front())
        for (const dg_host::BulkStore& s : h.store_groups.front()) dg_host::run_store(s);
}

void dg_host_named_barrier(int id, int count, bool wait) {
    using namespace dg_host;
    if (id < 1 || id > 15 || count <= 0 || count % 32 != 0)
        fault(SIGILL, "bar.%s %d, %d: ids 1..15 (0 is __syncthreads), a count of whole warps", wait ? "sync" : "arrive",
              id, count);
    publish_stores(current);
    char what[32];
    std::snprintf(what, sizeof what, "named barrier %d", id);
    meet(named[id], count, wait, what);
}

void dg_host_wgmma(float* d, int n, unsigned long long desc_a, unsigned long long desc_b, int trans_a, int trans_b,
                   bool bf16) {
    using namespace dg_host;
    warpgroups[current / 128].open.push_back(WgmmaOp{threadIdx.x, d, n, desc_a, desc_b, trans_a, trans_b, bf16});
}

void dg_host_wgmma_commit() {   // .sync.aligned: the warpgroup's threads meet here
    using namespace dg_host;
    WarpgroupMma& g = warpgroups[current / 128];
    if (meet(g.commit, 128, true, "wgmma.commit_group")) {   // the last one in closes the group
        g.groups.push_back(std::move(g.open));
        g.open.clear();
    }
}

void dg_host_wgmma_wait(int n) {
    dg_host::WarpgroupMma& g = dg_host::warpgroups[dg_host::current / 128];
    for (; (int)g.groups.size() > n; g.groups.pop_front())
        for (const dg_host::WgmmaOp& op : g.groups.front()) dg_host::run_wgmma(op, op.thread);
}

void dg_host_shared_load(unsigned addr, void* value, unsigned bytes) {
    std::memcpy(value, dg_host::shared_at(addr, bytes, "ld.shared", bytes), bytes);
}

void dg_host_shared_store(unsigned addr, const void* value, unsigned bytes) {
    std::memcpy(dg_host::shared_at(addr, bytes, "st.shared", bytes), value, bytes);
    for (unsigned w = addr & ~3u; w < addr + bytes; w += 4) {
        dg_host::unfenced[w] = dg_host::current;
        dg_host::written[dg_host::current].push_back(w);
    }
}

void dg_host_fence_async_shared() {
    using namespace dg_host;
    for (unsigned w : written[current]) {
        const auto it = unfenced.find(w);
        if (it != unfenced.end() && it->second == current) unfenced.erase(it);
    }
    written[current].clear();
}

void dg_host_unmodelled(const char* what) {
    dg_host::fault(SIGABRT, "%s: not modelled by the host build (thread-block clusters run on a GPU only)", what);
}

// The operands' byte ranges [ranges[2i], ranges[2i + 1]), for the launches that follow.
extern "C" __attribute__((visibility("default"))) void dg_host_operands(const unsigned long long* ranges,
                                                                        unsigned count) {
    dg_host::operands.clear();
    for (unsigned i = 0; i < count; ++i) dg_host::operands.emplace_back(ranges[2 * i], ranges[2 * i + 1]);
}

// The order of the blocks in the launches that follow: a block that writes a neighbour's elements
// (with wrong values) leaves them wrong only where it runs after the neighbour, so the launcher
// alternates the order between launches and one of the two shows it.
static bool blocks_backwards = false;
extern "C" __attribute__((visibility("default"))) void dg_host_blocks_backwards(int backwards) {
    blocks_backwards = backwards != 0;
}

// Every block of the grid, one after another (or the other way round: dg_host_blocks_backwards),
// each thread of a block running `thread(params)`.
int dg_host_run_grid(void (*thread)(const void*), const void* params, unsigned gx, unsigned gy, unsigned gz,
                     unsigned bx, unsigned by, unsigned bz, unsigned smem_bytes) {
    using namespace dg_host;
    constexpr size_t STACK = 128 * 1024, POISONED = 16 * 1024;
    gridDim = {gx, gy, gz};
    blockDim = {bx, by, bz};
    dg_host::thread_body = thread;
    dg_host::params = params;
    const unsigned n = bx * by * bz, warps = (n + 31) / 32;
    std::unique_ptr<char[]> stacks(new char[(size_t)n * STACK]);   // not zeroed: touched as used
    // ... but the top of each stack, where the kernel's frames live, is filled with 0xFF bytes (NaN,
    // or -1): a register a GPU thread reads before it writes it (an accumulator never zeroed) holds
    // garbage there, and would hold fresh zero pages here. Later blocks find the previous block's.
    for (unsigned i = 0; i < n; ++i) std::memset(stacks.get() + (size_t)i * STACK + STACK - POISONED, 0xFF, POISONED);
    SharedArena arena(smem_bytes);
    fibers.assign(n, Fiber{});
    state.assign(n, READY);
    lanes.assign(n, Lane{});
    std::vector<DgHostIndex> index(n);
    for (unsigned i = 0; i < n; ++i) index[i] = {i % bx, (i / bx) % by, i / (bx * by)};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = blocks_backwards ? DgHostIndex{gx - 1 - x, gy - 1 - y, gz - 1 - z} : DgHostIndex{x, y, z};
                std::memset(smem, 0xFF, smem_bytes);   // NaN in fp16 and bf16: what no copy or store wrote
                async.assign(n, AsyncCopies{});
                hopper.assign(n, ThreadAsync{});
                warpgroups.assign((n + 127) / 128, WarpgroupMma{});
                waits.assign(n, WaitFor{});
                handed_to.assign(n, 0);
                mbarriers.clear();
                unfenced.clear();
                written.assign(n, {});
                for (NamedBarrier& b : named) b = NamedBarrier{};
                for (unsigned i = 0; i < n; ++i) {
                    ucontext_t& start = fibers[i].start;
                    getcontext(&start);
                    start.uc_stack.ss_sp = stacks.get() + (size_t)i * STACK;
                    start.uc_stack.ss_size = STACK;
                    start.uc_link = nullptr;   // thread_main jumps back instead of returning
                    makecontext(&start, thread_main, 0);
                    fibers[i].started = false;
                    state[i] = READY;
                }
                // One phase: every warp up to its threads' next wait (a barrier, or with V5 an mbarrier
                // phase or a named barrier that others have yet to complete).
                for (unsigned phase = 0;; ++phase) {
                    const unsigned long long before = resumes;
                    for (unsigned v = 0; v < warps; ++v) {
                        const int rc = run_warp(phase % 2 ? warps - 1 - v : v, n, phase % 2, index);
                        if (rc != OK) return rc;
                    }
                    unsigned live = 0, at_barrier = 0;
                    for (unsigned i = 0; i < n; ++i) {
                        live += state[i] != FINISHED;
                        at_barrier += state[i] == AT_BARRIER;
                    }
                    if (live == 0) break;
                    if (at_barrier == live) {   // every live thread at __syncthreads
                        if (live != n) return BARRIER_MISMATCH;
                        for (unsigned i = 0; i < n; ++i) state[i] = READY;
                        ++block_syncs;
                    } else if (resumes == before) {   // nothing ran: the threads wait for each other
                        unsigned count[FINISHED + 1] = {};
                        for (unsigned i = 0; i < n; ++i) ++count[state[i]];
                        std::fprintf(stderr, "block (%u, %u, %u) hangs: %u threads at __syncthreads, %u at an mbarrier "
                                     "wait, %u at a named barrier, %u exited\n", blockIdx.x, blockIdx.y, blockIdx.z, count[AT_BARRIER],
                                     count[AT_MBARRIER], count[AT_NAMED], count[FINISHED]);
                        for (unsigned i = 0; i < n; ++i)
                            if (state[i] == AT_MBARRIER && (i % 32 == 0 || state[i - 1] != AT_MBARRIER))
                                std::fprintf(stderr, "  thread %u waits for the phase of parity %u of the mbarrier at %#x\n",
                                             i, waits[i].parity, waits[i].bar);
                        return HANG;
                    }
                }
                finish_block_stores();
            }
    return OK;
}
