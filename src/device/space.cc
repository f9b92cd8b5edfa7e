// The host-addressable spaces (space.hpp): the host, which runs every call
// at once, and the simulated device, which defers every call to its queue.
#include "device/space.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <new>

#include "core/error.hpp"
#include "core/memstat.hpp"

namespace dsm {
namespace device {

namespace {

void *aligned_host(size_t bytes, const char *what) {
    const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
    void *p = std::aligned_alloc(64, rounded);
    DSM_REQUIRE(p != nullptr, DSM_ERR_OUT_OF_MEMORY, what, ": cannot allocate ", bytes, " bytes");
    return p;
}

// memset, on the OpenMP threads in blocks of 1 MiB when there are 8 MiB or
// more (the gradients zeroed after a step: one thread does not reach the
// memory bandwidth).
void zero_bytes(void *p, size_t bytes) {
    constexpr size_t kBlock = size_t(1) << 20;
    if (bytes < 8 * kBlock) {
        std::memset(p, 0, bytes);
        return;
    }
    const long long nb = static_cast<long long>((bytes + kBlock - 1) / kBlock);
    char *c = static_cast<char *>(p);
#pragma omp parallel for schedule(static)
    for (long long b = 0; b < nb; ++b) {
        const size_t at = static_cast<size_t>(b) * kBlock;
        std::memset(c + at, 0, std::min(kBlock, bytes - at));
    }
}

// Every call of the base runs through run(): the host runs it now, the
// simulated device queues it.
class HostAddressable : public Space {
public:
    void *alloc_host(size_t bytes) override { return aligned_host(bytes, "host staging"); }
    void free_host(void *p) noexcept override { std::free(p); }
    void zero(void *p, size_t bytes) override {
        if (bytes > 0) run([=] { zero_bytes(p, bytes); });
    }
    void copy(void *dst, const void *src, size_t bytes) override {
        if (bytes > 0 && dst != src) run([=] { std::memmove(dst, src, bytes); });
    }
};

class HostSpace final : public HostAddressable {
public:
    std::unique_ptr<Mark> mark() override { return std::make_unique<Mark>(); }
    void record(Mark &) override {}
    void wait_mark(Mark &) override {}
    bool idle() override { return true; }
    bool pin(void *, size_t, std::string &) override { return true; }
    Kind kind() const noexcept override { return Kind::HOST; }
    std::string name() const override { return "host"; }
    Queue queue() const noexcept override { return Queue::host(); }
    void *alloc(size_t bytes) override { return aligned_host(bytes, "host memory"); }
    void free(void *p) noexcept override { std::free(p); }
    void upload(void *dst, const void *h, size_t bytes) override {
        if (bytes > 0 && dst != h) std::memmove(dst, h, bytes);
    }
    void download(void *h, const void *src, size_t bytes) override {
        if (bytes > 0 && h != src) std::memmove(h, src, bytes);
    }
    void synchronize() override {}
    void run(std::function<void()> work) override { work(); }
};

// The simulated device: its memory is host memory filled with 0xff bytes
// when allocated (NaN in every float dtype), its queue a list of deferred
// calls run in order by synchronize().
class SimSpace final : public HostAddressable {
public:
    ~SimSpace() override {
        try {
            synchronize();
        } catch (...) {
        }
    }
    Kind kind() const noexcept override { return Kind::SIM; }
    std::string name() const override { return "simulated"; }
    Queue queue() const noexcept override { return Queue(const_cast<SimSpace *>(this), &SimSpace::wait); }
    void *alloc(size_t bytes) override {
        void *p = aligned_host(bytes, "simulated device memory");
        std::memset(p, 0xff, bytes);
        return p;
    }
    void free(void *p) noexcept override {
        // The queue may still use it: run what is queued first.
        try {
            synchronize();
        } catch (...) {
        }
        std::free(p);
    }
    void upload(void *dst, const void *h, size_t bytes) override {
        if (bytes == 0) return;
        // The caller may reuse `h` at once: the queued copy reads a copy of it.
        auto bounce = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char *>(h),
                                                                   static_cast<const unsigned char *>(h) + bytes);
        run([dst, bounce] { std::memcpy(dst, bounce->data(), bounce->size()); });
    }
    void download(void *h, const void *src, size_t bytes) override {
        synchronize();
        if (bytes > 0) std::memcpy(h, src, bytes);
    }
    void synchronize() override { run_upto(done_ + queue_.size()); }
    void run(std::function<void()> work) override { queue_.push_back(std::move(work)); }

    struct Position final : Mark {
        uint64_t upto = 0; // calls enqueued in all when recorded
    };
    std::unique_ptr<Mark> mark() override { return std::make_unique<Position>(); }
    void record(Mark &m) override { static_cast<Position &>(m).upto = done_ + queue_.size(); }
    void wait_mark(Mark &m) override { run_upto(static_cast<Position &>(m).upto); }
    // Work counts as in flight until it is waited for, so callers take the
    // path a busy device makes them take.
    bool idle() override { return queue_.empty(); }
    bool pin(void *, size_t, std::string &) override { return true; }

private:
    static void wait(void *self) { static_cast<SimSpace *>(self)->synchronize(); }
    // Run the queue until `upto` calls are done in all. Work that fails
    // leaves the rest of the queue dropped, as a device error poisons a
    // stream.
    void run_upto(uint64_t upto) {
        while (done_ < upto && !queue_.empty()) {
            std::function<void()> w = std::move(queue_.front());
            queue_.pop_front();
            ++done_;
            try {
                w();
            } catch (...) {
                done_ += queue_.size();
                queue_.clear();
                throw;
            }
        }
    }
    std::deque<std::function<void()>> queue_;
    uint64_t done_ = 0; // calls run (or dropped) so far
};

} // namespace

Space &host() {
    static HostSpace h;
    return h;
}

std::unique_ptr<Space> make_sim() { return std::make_unique<SimSpace>(); }

// ---------------------------------------------------------------- Buffer

Buffer::Buffer(Space &space, size_t bytes, bool zero) : space_(&space), bytes_(bytes) {
    if (bytes == 0) return;
    capacity_ = (bytes + 63) / 64 * 64;
    ptr_ = space.alloc(capacity_);
    memstat::add(stat_kind(space), capacity_);
    if (zero) space.zero(ptr_, capacity_);
}

void Buffer::reset() noexcept {
    if (ptr_ != nullptr) {
        space_->free(ptr_);
        memstat::sub(stat_kind(*space_), capacity_);
    }
    ptr_ = nullptr;
    bytes_ = capacity_ = 0;
}

void Buffer::swap(Buffer &o) noexcept {
    std::swap(space_, o.space_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(capacity_, o.capacity_);
}

Staging::Staging(Space &space, size_t bytes) : space_(&space), ptr_(space.alloc_host(bytes)), bytes_(bytes) {
    memstat::add(memstat::Kind::HOST, bytes_);
}

Staging::~Staging() {
    space_->free_host(ptr_);
    memstat::sub(memstat::Kind::HOST, bytes_);
}

memstat::Kind stat_kind(const Space &space) noexcept {
    return space.kind() == Kind::HOST ? memstat::Kind::HOST : memstat::Kind::DEVICE;
}

} // namespace device
} // namespace dsm
