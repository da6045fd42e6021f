// What the host harnesses share: counters and a failure report that prints the first 20 failures
// (each harness prints "checked N <things>, F failures" last and exits 1 on any), and operands
// that end exactly at the end of a readable page, between two inaccessible pages, so that a read
// outside one stops the harness.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

static long long checked = 0, failures = 0;

#define FAIL(...)                                  \
    do {                                           \
        if (failures++ < 20) {                     \
            std::printf(__VA_ARGS__);              \
            std::printf("\n");                     \
        }                                          \
    } while (0)

// Element (outer o, inner i) of a matrix: nonzero, so that zero means "filled, not loaded".
static unsigned short value_at(long long o, long long i) {
    return (unsigned short)(1 + (o * 131 + i * 7) % 30011);
}

// `span` 16-bit elements: an operand of `outer` rows of `ld` elements, `inner` of them in the
// matrix (value_at) and the rest padding (0xFFFF, never to be loaded), ending at its last element.
struct Operand {
    unsigned short* base;
    long long span;
    char* map;
    size_t len, data_len;

    Operand(int outer, int inner, long long ld) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        span = (long long)(outer - 1) * ld + inner;
        data_len = (2 * (size_t)span + page - 1) / page * page;
        len = data_len + 2 * page;
        map = (char*)mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED || mprotect(map + page, data_len, PROT_READ | PROT_WRITE) != 0) {
            std::perror("mmap");
            std::exit(2);
        }
        base = (unsigned short*)(map + page + data_len - 2 * (size_t)span);
        for (long long e = 0; e < span; ++e) base[e] = e % ld < inner ? value_at(e / ld, e % ld) : 0xFFFF;
        mprotect(map + page, data_len, PROT_READ);
    }
    ~Operand() { munmap(map, len); }
    Operand(const Operand&) = delete;
    Operand& operator=(const Operand&) = delete;
};
