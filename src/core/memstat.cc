#include "core/memstat.hpp"

#include <atomic>

namespace dsm {
namespace memstat {

namespace {

struct Counter {
    std::atomic<size_t> now{0}, high{0};
};
Counter counters[kKinds];
Counter uses[kUses];

Counter &of(Kind kind) noexcept { return counters[static_cast<int>(kind)]; }
Counter &of(Use use) noexcept { return uses[static_cast<int>(use)]; }

void raise(Counter &c, size_t bytes) noexcept {
    const size_t v = c.now.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    size_t h = c.high.load(std::memory_order_relaxed);
    while (v > h && !c.high.compare_exchange_weak(h, v, std::memory_order_relaxed)) {
    }
}

} // namespace

void add(Kind kind, size_t bytes) noexcept { raise(of(kind), bytes); }

void sub(Kind kind, size_t bytes) noexcept { of(kind).now.fetch_sub(bytes, std::memory_order_relaxed); }

size_t current(Kind kind) noexcept { return of(kind).now.load(std::memory_order_relaxed); }

size_t peak(Kind kind) noexcept { return of(kind).high.load(std::memory_order_relaxed); }

void reset_peaks() noexcept {
    for (Counter &c : counters) c.high.store(c.now.load(std::memory_order_relaxed), std::memory_order_relaxed);
    for (Counter &c : uses) c.high.store(c.now.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

void use_add(Use use, size_t bytes) noexcept { raise(of(use), bytes); }

void use_sub(Use use, size_t bytes) noexcept { of(use).now.fetch_sub(bytes, std::memory_order_relaxed); }

size_t use_current(Use use) noexcept { return of(use).now.load(std::memory_order_relaxed); }

size_t use_peak(Use use) noexcept { return of(use).high.load(std::memory_order_relaxed); }

const char *kind_name(Kind kind) noexcept {
    switch (kind) {
    case Kind::HOST: return "host";
    case Kind::DEVICE: return "device";
    case Kind::SHARED: return "shared";
    }
    return "?";
}

} // namespace memstat
} // namespace dsm
