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
#include <memory>
#include <vector>

struct DgHostIndex {
    unsigned x, y, z;
};
DgHostIndex threadIdx, blockIdx, blockDim, gridDim;

namespace dg_host {
enum State : unsigned char { READY, AT_BARRIER, AT_COLLECTIVE, FINISHED };
struct Fiber {
    ucontext_t start;   // the thread's entry on its stack, entered once
    jmp_buf at;         // where it yielded
    bool started;
};
static jmp_buf scheduler;
static std::vector<Fiber> fibers;
static std::vector<unsigned char> state;   // State, per thread of the running block
static unsigned current = 0;
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

static unsigned char* shared_at(unsigned addr, unsigned bytes, const char* what) {
    if (addr < SMEM_BASE || addr - SMEM_BASE > smem_bytes || smem_bytes - (addr - SMEM_BASE) < bytes)
        fault(SIGSEGV, "%s at shared address %#x, outside the block's %u bytes of dynamic shared memory", what, addr,
              smem_bytes);
    if (addr % 16 != 0) fault(SIGBUS, "%s at shared address %#x, not 16-byte aligned", what, addr);
    return smem + (addr - SMEM_BASE);
}

// ---- cp.async: per thread, the copies issued since the last commit and the committed groups ----
// The operands' byte ranges (dg_host_operands): a copy that reads must have all its 16 bytes inside
// one, whatever its src_bytes, as compute-sanitizer's memcheck counts them (measured on the H200;
// cp_async.cuh). A guard page cannot show it: the 16 bytes of an aligned copy never cross one.
static std::vector<std::pair<uintptr_t, uintptr_t>> operands;

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

// ---- the scheduler --------------------------------------------------------------------------------
enum { OK = 0, BARRIER_MISMATCH = 1, WARP_MISMATCH = 2 };

static void thread_main() {
    const unsigned me = current;
    thread_body(params);
    AsyncCopies& q = async[me];   // copies still in flight land at the latest when their thread exits
    for (; !q.groups.empty(); q.groups.pop_front()) land(q.groups.front());
    land(q.open);
    publish_stores(me);
    state[me] = FINISHED;
    _longjmp(scheduler, 1);   // never returns: its stack is left as it is
}

// Resumes thread i until it waits (barrier, collective) or returns.
static void resume(unsigned i, const DgHostIndex& index) {
    current = i;
    threadIdx = index;
    state[i] = READY;
    if (_setjmp(scheduler)) return;   // it yielded or returned
    if (fibers[i].started) _longjmp(fibers[i].at, 1);
    fibers[i].started = true;
    setcontext(&fibers[i].start);
}

// Runs warp w's ready lanes (in thread order, or reversed) up to their next barrier, meeting their
// collectives on the way: when every lane waits at the same one, it is computed and they go on.
static int run_warp(unsigned w, unsigned n, bool reverse, const std::vector<DgHostIndex>& index) {
    const unsigned first = 32 * w, count = n - first < 32 ? n - first : 32;
    for (;;) {
        for (unsigned j = 0; j < count; ++j) {
            const unsigned i = first + (reverse ? count - 1 - j : j);
            if (state[i] == READY) resume(i, index[i]);
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

void dg_host_cp_async_16(unsigned dst, const void* src, int src_bytes) {
    using namespace dg_host;
    shared_at(dst, 16, "cp.async destination");
    if (reinterpret_cast<uintptr_t>(src) % 16 != 0) fault(SIGBUS, "misaligned 16-byte cp.async source %p", src);
    if (src_bytes < 0 || src_bytes > 16) fault(SIGILL, "cp.async of 16 bytes with a source size of %d", src_bytes);
    if (src_bytes > 0 && !operands.empty()) {
        const uintptr_t lo = reinterpret_cast<uintptr_t>(src);
        bool inside = false;
        for (const auto& r : operands) inside |= r.first <= lo && lo + 16 <= r.second;
        if (!inside)
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

// The operands' byte ranges [ranges[2i], ranges[2i + 1]), for the launches that follow.
extern "C" __attribute__((visibility("default"))) void dg_host_operands(const unsigned long long* ranges,
                                                                        unsigned count) {
    dg_host::operands.clear();
    for (unsigned i = 0; i < count; ++i) dg_host::operands.emplace_back(ranges[2 * i], ranges[2 * i + 1]);
}

// Every block of the grid, one after another, each thread of a block running `thread(params)`.
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
                blockIdx = {x, y, z};
                std::memset(smem, 0xFF, smem_bytes);   // NaN in fp16 and bf16: what no copy or store wrote
                async.assign(n, AsyncCopies{});
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
                for (unsigned phase = 0;; ++phase) {   // one phase: every warp up to its threads' next barrier
                    for (unsigned v = 0; v < warps; ++v) {
                        const int rc = run_warp(phase % 2 ? warps - 1 - v : v, n, phase % 2, index);
                        if (rc != OK) return rc;
                    }
                    unsigned live = 0;
                    for (unsigned i = 0; i < n; ++i) live += state[i] != FINISHED;
                    if (live == 0) break;
                    if (live != n) return BARRIER_MISMATCH;
                    for (unsigned i = 0; i < n; ++i) state[i] = READY;
                }
            }
    return OK;
}
