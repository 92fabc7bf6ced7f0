// lanebus — MIT License.
// Namespaces, credentials and quotas behind Namespaces, Client and the
// publish/consume admission (public API: include/lanebus/tenancy.hpp,
// include/lanebus/client.hpp; manual and storage keys: doc/tenancy.md).
//
// Why no library: a token bucket that must be lock-free and allocation-free
// on the publish path is one atomic and a compare-exchange (GCRA, below);
// nothing off the shelf gives that without a lock or a clock thread.
//
// Invariants
// 1. A NamespaceState is never freed while its bus lives (topics point at it
//    through TopicImpl::ns; the pointer is swapped, never dangling).
// 2. The same counters drive enforcement and usage: a publish is counted in
//    msgs_in exactly when admit_publish let it through and the topic took it
//    (a later refusal calls unadmit_publish), refused exactly when
//    QuotaExceeded was returned.
// 3. The publish path takes no lock and allocates nothing: relaxed atomics
//    for the counters, one CAS loop per limited bucket (GCRA: a bucket is
//    its "theoretical arrival time"; taking n units moves it n × cost ahead;
//    a take that would move it more than the burst past now is refused).
//    A publishing thread takes its namespace's quota in chunks of up to
//    kCreditChunkNs (PublishCredit, tenancy.cpp) and spends them with no
//    atomic at all: the shared buckets never admit more than GCRA allows;
//    a thread that stops publishing strands at most one chunk (100 µs of the
//    quota) until it publishes to that namespace again.
// 4. Credential secrets exist only as salted PBKDF2-HMAC-SHA256 hashes, in
//    memory and in the store; they are compared with CRYPTO_memcmp.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include <time.h>
#include <vector>

#include "log.hpp"
#include "fair_queue.hpp"
#include "lanebus/tenancy.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class DurableStore;

/// Injected clock for tests (detail::Access::set_tenancy_clock): steady
/// nanoseconds and a sleep that advances them. nullptr = the real clock.
struct TenancyClock {
  std::int64_t (*now_ns)() = nullptr;
  void (*sleep_ns)(std::int64_t ns) = nullptr;
};

/// GCRA token bucket (invariant 3).
struct TokenBucket {
  std::atomic<double> ns_per_unit{0};  // 0 = unlimited
  std::atomic<std::int64_t> tau_ns{0};  // burst window
  std::atomic<std::int64_t> tat{0};

  bool limited() const noexcept { return ns_per_unit.load(std::memory_order_relaxed) > 0; }
  /// ns of the bucket one unit costs (0 = unlimited).
  double per_unit() const noexcept { return ns_per_unit.load(std::memory_order_relaxed); }
  void configure(double per_s, double burst_s) noexcept;
  /// 0: `inc` ns of the bucket (units × per_unit()) taken at `now`; else ns
  /// until they could be.
  std::int64_t take_ns(std::int64_t inc, std::int64_t now) noexcept;
  /// Undo a take (the publish was refused later for another reason).
  void give_back_ns(std::int64_t inc) noexcept;
  std::int64_t cost_ns(double units) const noexcept {
    return static_cast<std::int64_t>(units * ns_per_unit.load(std::memory_order_relaxed) + 0.5);
  }
  /// Take unconditionally (consume side: charged after the handler ran).
  void charge(double units, std::int64_t now) noexcept;
  /// ns until the bucket is back within its burst (0 = now).
  std::int64_t debt(std::int64_t now) const noexcept;
};

/// Written by publishers (in, throttled, refused, ceiling) and by workers
/// (out, throttled): two cache lines, so the two sides do not false-share.
struct UsageCounters {
  alignas(64) std::atomic<std::uint64_t> msgs_in{0}, bytes_in{0}, refused{0}, seconds_at_ceiling{0};
  alignas(64) std::atomic<std::uint64_t> msgs_out{0}, bytes_out{0}, throttled{0};
};

class TenancyImpl;

/// Publisher slots of a bus (BusCore::kPublisherSlots): each Publisher that
/// holds one counts its accepted messages in its own tally of the namespace.
inline constexpr std::uint32_t kPublisherTallies = 64;

/// One publisher's share of a namespace's msgs_in / bytes_in: written by that
/// publisher only (plain increments, no locked instruction), summed by readers.
struct alignas(64) PublisherTally {
  std::atomic<std::uint64_t> msgs{0}, bytes{0};
};

struct NamespaceState {
  NamespaceState(TenancyImpl* t, std::string n) : tenancy(t), name(std::move(n)) {}

  TenancyImpl* const tenancy;
  const std::string name;
  bool declared = false;   // guarded by TenancyImpl::mu_
  NamespacePolicy policy;  // guarded by TenancyImpl::mu_

  // Publisher side and worker side on separate cache lines.
  alignas(64) TokenBucket pub_msgs, pub_bytes;
  std::atomic<bool> pub_limited{false};
  // Bumped by apply_policy: credit taken under an older policy is dropped.
  std::atomic<std::uint64_t> policy_epoch{0};
  alignas(64) TokenBucket con_msgs, con_bytes;
  std::atomic<bool> con_limited{false};

  // The namespace's share of the workers (fair_queue.hpp); weight from the policy.
  alignas(64) SchedClass sched;

  alignas(64) UsageCounters live;               // this run (msgs_in / bytes_in: plus pub_tally)
  PublisherTally pub_tally[kPublisherTallies];  // msgs_in / bytes_in of slotted publishers
  std::atomic<std::int64_t> last_ceiling_sec{-1};
  std::atomic<std::uint64_t> peak_per_s{0};     // ticker
  std::uint64_t ticker_last_in = 0;             // ticker-owned
  std::uint64_t ticker_last_refused = 0;        // ticker-owned (the log hook's ceiling line)
  std::uint64_t ticker_last_throttled = 0;      // ticker-owned
  // Persisted totals of earlier runs and what this run flushed (TenancyImpl::mu_).
  NamespaceUsage base{};
  NamespaceUsage flushed{};

  /// Admission of one publish of `bytes` (invariant 2). may_block: wait up
  /// to `timeout` for the quota (Backpressure::Block), else refuse at once.
  Status admit_publish(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept;
  void unadmit_publish(std::size_t bytes) noexcept;
  /// The publish quota's part of admit_publish alone (a limited namespace):
  /// for a slotted publisher, which counts the message itself
  /// (count_in_slot) once the topic took it. give_back_credit undoes it.
  Status admit_credit(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept;
  void give_back_credit(std::size_t bytes) noexcept;
  /// A slotted publisher (`slot` < kPublisherTallies) counts `bytes` of one
  /// accepted message (admitted by admit_credit in a limited namespace):
  /// usage only, no atomic RMW.
  /// One thread per slot at a time.
  void count_in_slot(std::uint32_t slot, std::uint64_t msgs, std::uint64_t bytes) noexcept {
    PublisherTally& t = pub_tally[slot];
    t.msgs.store(t.msgs.load(std::memory_order_relaxed) + msgs, std::memory_order_relaxed);
    t.bytes.store(t.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
  }
  /// live.msgs_in / bytes_in plus every publisher tally.
  std::uint64_t msgs_in() const noexcept;
  std::uint64_t bytes_in() const noexcept;
  /// Count appends that bypass admission (DLQ replays, transactional
  /// outbox appends): usage only, no quota.
  void count_in(std::uint64_t msgs, std::uint64_t bytes) noexcept {
    live.msgs_in.fetch_add(msgs, std::memory_order_relaxed);
    live.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
  }
  /// After a worker ran a lane of this namespace: count and charge what it delivered.
  void delivered(std::uint64_t msgs, std::uint64_t bytes) noexcept;
  /// ns the namespace's lanes must wait before running (consume quota), 0 = now.
  std::int64_t consume_wait() noexcept;

  void apply_policy() noexcept;  // policy → buckets
 private:
  void mark_ceiling(std::int64_t now) noexcept;
  Status admit_limited(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept;
};

struct CredentialState {
  std::string id;
  std::atomic<std::uint64_t> version{1};  // bumped on every grant change / removal
  Mutex mu;
  std::shared_ptr<const std::vector<Grant>> grants GUARDED_BY(mu);
  std::string salt, hash;                 // raw bytes
  std::uint32_t iterations = 0;
  bool removed GUARDED_BY(mu) = false;
};

/// Deliveries of the lane a worker is running (delivery.cpp counts them,
/// scheduler.cpp hands them to the lane's namespace after run_lane).
extern thread_local constinit std::uint64_t tl_delivered_msgs;
extern thread_local constinit std::uint64_t tl_delivered_bytes;

/// Does `prefix` cover `name` segment-wise ("a.b" covers "a.b" and "a.b.c", not "a.bc")?
bool prefix_covers(std::string_view prefix, std::string_view name) noexcept;

class TenancyImpl {
 public:
  /// store: the bus's store or nullptr (in memory). closing: the bus's flag.
  TenancyImpl(DurableStore* store, const std::atomic<bool>* closing);
  ~TenancyImpl();

  /// Load namespaces, credentials and usage totals; start the ticker.
  Status open();
  /// Stop the ticker and flush usage (the store must still be open).
  void close();

  /// The namespace of `name` (created implicitly if undeclared). Never null.
  NamespaceState* resolve(std::string_view name);

  Status create(std::string_view name, const NamespacePolicy& policy);
  Status set_policy(std::string_view name, const NamespacePolicy& policy);
  Result<NamespaceInfo> describe(std::string_view name) const;
  std::vector<NamespaceInfo> list() const;
  std::string namespace_of(std::string_view name) const;

  Status add_credential(const Credential& c, const std::vector<Grant>& grants);
  Status set_grants(std::string_view id, const std::vector<Grant>& grants);
  Status remove_credential(std::string_view id);
  Result<std::vector<Grant>> grants(std::string_view id) const;
  /// The credential if id and secret match; PermissionDenied otherwise (the
  /// same answer for an unknown id and a wrong secret).
  Result<std::shared_ptr<CredentialState>> authenticate(const Credential& c) const;

  /// Write this run's usage deltas to the store (by minute). Also done every
  /// minute by the ticker and by close().
  Status flush_usage();
  /// One ticker step (peak rates); tests call it on an injected clock.
  void tick() noexcept;

  /// CLOCK_MONOTONIC_COARSE (a few ns instead of a full clock read on the
  /// publish path; its ~4 ms steps are below the smallest burst, 10 ms).
  std::int64_t now() const noexcept {
    if (auto f = clock_.now_ns) return f();
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }
  void sleep(std::int64_t ns) const noexcept;
  bool closing() const noexcept { return closing_->load(std::memory_order_relaxed); }
  /// Unique per TenancyImpl of the process (never reused, unlike an address):
  /// tells a thread's publish credit whose namespaces it holds.
  std::uint64_t uid() const noexcept { return uid_; }
  void set_clock(TenancyClock c) noexcept { clock_ = c; }
  /// Called after a namespace is declared: topics must re-resolve (BusCore).
  void set_rebind(std::function<void()> fn) { rebind_ = std::move(fn); }
  /// Where the ticker reports a namespace at its publish quota ceiling (once
  /// per tick, so once a second, per namespace). Before open(); must outlive this.
  void set_logger(const Logger* logger) noexcept { logger_ = logger; }

 private:
  NamespaceState* resolve_locked(std::string_view name) REQUIRES(mu_);
  NamespaceState* exact_locked(std::string_view name) REQUIRES(mu_);
  const NamespaceState* declared_locked(std::string_view name) const REQUIRES(mu_);
  NamespaceUsage usage_locked(const NamespaceState& ns) const REQUIRES(mu_);
  Status persist(std::string key, std::string value, bool erase = false);
  void ticker_main();

  DurableStore* const store_;
  const std::atomic<bool>* const closing_;
  TenancyClock clock_{};
  const Logger* logger_ = nullptr;
  std::function<void()> rebind_;
  const std::int64_t opened_ns_;
  const std::uint64_t uid_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<NamespaceState>, std::less<>> namespaces_ GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<CredentialState>, std::less<>> credentials_ GUARDED_BY(mu_);
  Mutex flush_mu_;  // one flush at a time (ticker, close, callers)
  std::thread ticker_;
  std::mutex ticker_mu_;
  std::condition_variable ticker_cv_;
  bool ticker_stop_ = false;  // guarded by ticker_mu_
};

// ---- the encodings of doc/tenancy.md ("Storage"), shared with tools/cmd_usage.cpp ----
std::string encode_policy(const NamespacePolicy& p);
bool decode_policy(std::string_view s, NamespacePolicy* p);
/// Usage record of one namespace and minute: key and value.
std::string usage_key(std::string_view ns, std::uint64_t minute);
bool parse_usage_key(std::string_view key, std::string* ns, std::uint64_t* minute);
std::string encode_usage(const NamespaceUsage& u);
bool decode_usage(std::string_view s, NamespaceUsage* u);
Status check_policy(std::string_view name, const NamespacePolicy& p);

}  // namespace lanebus::detail
