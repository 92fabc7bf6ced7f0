// lanebus — MIT License.
// The public lease API: LeaseTable (forwarding to LeaseTableImpl), LeaseOwner and LeaseGuard.
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "lanebus/lease.hpp"
#include "lease_table.hpp"
#include "process_identity.hpp"

namespace lanebus {

namespace {
constexpr std::int64_t kMaxTtlNs = 366LL * 24 * 3600 * 1000000000LL;

Status check_ttl(std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0) {
    return Status(Code::InvalidArgument, "lease ttl must be positive (got " +
                                             std::to_string(ttl.count()) + " ms)");
  }
  if (ttl.count() > kMaxTtlNs / 1000000) {
    return Status(Code::InvalidArgument, "lease ttl " + std::to_string(ttl.count()) +
                                             " ms is longer than a year");
  }
  return Status::OK();
}
}  // namespace

// ---------------------------------------------------------------------------
// LeaseOwner

Result<LeaseOwner> LeaseOwner::generate() {
  LeaseOwner o;
  o.pid = static_cast<std::uint32_t>(getpid());
  o.start_time = detail::read_start_time(static_cast<pid_t>(o.pid));
  if (o.start_time == 0) {
    return Status(Code::IOError, "LeaseOwner::generate: no start time in /proc/self/stat");
  }
  if (getrandom(&o.nonce, sizeof(o.nonce), 0) != static_cast<ssize_t>(sizeof(o.nonce))) {
    return Status(Code::IOError, "LeaseOwner::generate: getrandom failed");
  }
  return o;
}

std::string LeaseOwner::to_string() const {
  char buf[80];
  std::snprintf(buf, sizeof(buf), "%u:%llu:%016llx", pid, static_cast<unsigned long long>(start_time),
                static_cast<unsigned long long>(nonce));
  return buf;
}

// ---------------------------------------------------------------------------
// LeaseTable

LeaseTable::LeaseTable(std::unique_ptr<detail::LeaseTableImpl> impl) : impl_(std::move(impl)) {}
LeaseTable::~LeaseTable() = default;

Result<std::unique_ptr<LeaseTable>> LeaseTable::open(const std::string& path,
                                                     const LeaseTableOptions& options) {
  return detail::LeaseTableImpl::open(path, options, detail::LeaseTableHooks{});
}

std::int64_t LeaseTable::now() noexcept {
  struct timespec ts {};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

Result<Lease> LeaseTable::acquire(std::string_view name, const LeaseOwner& owner,
                                  std::chrono::milliseconds ttl) {
  Status s = check_ttl(ttl);
  if (!s.ok()) return s;
  return impl_->acquire(name, owner, static_cast<std::int64_t>(ttl.count()) * 1000000LL);
}

Result<Lease> LeaseTable::acquire_any_slot(std::string_view task, std::uint32_t n,
                                           const LeaseOwner& owner, std::chrono::milliseconds ttl) {
  if (n == 0 || n > 4096) {
    return Status(Code::InvalidArgument, "acquire_any_slot: n must be 1..4096 (got " +
                                             std::to_string(n) + ")");
  }
  std::string name(task);
  name += "/slot-";
  std::size_t base = name.size();
  Status s = detail::validate_lease_name(name + std::to_string(n - 1));
  if (!s.ok()) return s;
  s = check_ttl(ttl);
  if (!s.ok()) return s;
  std::uint32_t start = static_cast<std::uint32_t>((owner.nonce ^ owner.pid) % n);
  for (std::uint32_t k = 0; k < n; ++k) {
    name.resize(base);
    name += std::to_string((start + k) % n);
    Result<Lease> r = impl_->acquire(name, owner, static_cast<std::int64_t>(ttl.count()) * 1000000LL);
    if (r.ok() || r.code() != Code::Busy) return r;
    // Busy because held (or the mutex stalled): try the next slot.
  }
  return Status(Code::Busy, "acquire_any_slot: all " + std::to_string(n) + " slots of \"" +
                                std::string(task) + "\" are held");
}

Result<Lease> LeaseTable::renew(std::string_view name, const LeaseOwner& owner, std::uint64_t token) {
  return impl_->renew(name, owner, token);
}

Status LeaseTable::release(std::string_view name, const LeaseOwner& owner, std::uint64_t token) {
  return impl_->release(name, owner, token);
}

Status LeaseTable::confirm_grant(std::string_view name, std::uint64_t token) {
  return impl_->confirm_grant(name, token);
}

Result<LeaseInfo> LeaseTable::inspect(std::string_view name) { return impl_->inspect(name); }
Result<std::vector<LeaseInfo>> LeaseTable::list() { return impl_->list(); }
std::uint64_t LeaseTable::epoch() const noexcept { return impl_->epoch(); }
std::uint32_t LeaseTable::capacity() const noexcept { return impl_->capacity(); }
const std::string& LeaseTable::path() const noexcept { return impl_->path(); }

// ---------------------------------------------------------------------------
// LeaseGuard

struct LeaseGuard::State {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;  // guarded by mu
  std::atomic<std::int64_t> deadline{0};
  std::atomic<bool> lost{false};
  std::atomic<bool> notified{false};
  std::atomic<bool> released{false};
  std::int64_t margin_ns = 0;
  std::int64_t interval_ns = 0;
  std::thread thread;
};

Result<std::unique_ptr<LeaseGuard>> LeaseGuard::acquire(LeaseTable& table, std::string_view name,
                                                        const LeaseOwner& owner,
                                                        LeaseGuardOptions options) {
  if (options.safety_margin.count() == 0) options.safety_margin = options.ttl / 5;
  if (options.renew_interval.count() == 0) options.renew_interval = options.ttl / 3;
  if (options.safety_margin >= options.ttl || options.safety_margin.count() < 0) {
    return Status(Code::InvalidArgument, "LeaseGuardOptions::safety_margin must be in [0, ttl)");
  }
  Result<Lease> lease = table.acquire(name, owner, options.ttl);
  if (!lease.ok()) return lease.status();
  return std::unique_ptr<LeaseGuard>(new LeaseGuard(table, std::move(*lease), std::move(options)));
}

LeaseGuard::LeaseGuard(LeaseTable& table, Lease lease, LeaseGuardOptions options)
    : table_(table), lease_(std::move(lease)), options_(std::move(options)),
      state_(std::make_unique<State>()) {
  state_->deadline.store(lease_.expires_at_ns, std::memory_order_relaxed);
  state_->margin_ns = static_cast<std::int64_t>(options_.safety_margin.count()) * 1000000LL;
  state_->interval_ns = static_cast<std::int64_t>(options_.renew_interval.count()) * 1000000LL;
  if (options_.background_renewal) state_->thread = std::thread([this] { renew_loop(); });
}

LeaseGuard::~LeaseGuard() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  if (!state_->lost.load() && !state_->released.exchange(true)) {
    (void)table_.release(lease_.name, lease_.owner, lease_.token);
  }
}

bool LeaseGuard::valid() const noexcept {
  if (state_->lost.load(std::memory_order_acquire)) return false;
  // relaxed: deadline is a single value; an older one is only more conservative.
  if (LeaseTable::now() >= state_->deadline.load(std::memory_order_relaxed) - state_->margin_ns) {
    state_->lost.store(true, std::memory_order_release);  // fail closed, and stay closed
    return false;
  }
  return true;
}

std::int64_t LeaseGuard::deadline() const noexcept {
  return state_->deadline.load(std::memory_order_relaxed);
}

std::uint64_t LeaseGuard::token() const noexcept { return lease_.token; }

void LeaseGuard::mark_lost(LeaseLoss why) {
  state_->lost.store(true, std::memory_order_release);
  if (!state_->notified.exchange(true) && options_.on_lost) options_.on_lost(lease_, why);
}

Status LeaseGuard::renew() {
  if (state_->released.load()) {
    return Status(Code::StaleToken, "lease \"" + lease_.name + "\" was released by this guard");
  }
  if (!valid()) {
    mark_lost(LeaseLoss::DeadlineReached);
    return Status(Code::StaleToken, "lease \"" + lease_.name + "\" (token " +
                                        std::to_string(lease_.token) +
                                        ") reached its safety margin before renewal");
  }
  Result<Lease> r = table_.renew(lease_.name, lease_.owner, lease_.token);
  if (!r.ok()) {
    mark_lost(LeaseLoss::RenewFailed);
    return r.status();
  }
  state_->deadline.store(r->expires_at_ns, std::memory_order_relaxed);
  return Status::OK();
}

Status LeaseGuard::release() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
  if (state_->released.exchange(true)) return Status::OK();
  state_->lost.store(true, std::memory_order_release);
  return table_.release(lease_.name, lease_.owner, lease_.token);
}

void LeaseGuard::renew_loop() {
  std::unique_lock<std::mutex> lk(state_->mu);
  while (!state_->stop) {
    state_->cv.wait_for(lk, std::chrono::nanoseconds(state_->interval_ns), [this] { return state_->stop; });
    if (state_->stop) break;
    lk.unlock();
    Status s = renew();  // marks the guard lost (and notifies) on failure
    lk.lock();
    if (!s.ok()) break;
  }
}

}  // namespace lanebus
