// What the host harnesses share: counters and a failure report that prints the first 20 failures
// (each harness prints "checked N <things>, F failures" last and exits 1 on any).
#pragma once
#include <cstdio>

static long long checked = 0, failures = 0;

#define FAIL(...)                                  \
    do {                                           \
        if (failures++ < 20) {                     \
            std::printf(__VA_ARGS__);              \
            std::printf("\n");                     \
        }                                          \
    } while (0)
