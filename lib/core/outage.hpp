// lanebus — MIT License.
// OutageBreaker: a consumer group's outage pause (GroupOptions::outage,
// doc/retries.md "Outage pause"). Every lane of the group reports its
// transient failures and acks here; while the group is paused the lanes ask
// it before each delivery (gate) and only one probe at a time goes through.
//
// The window is a fixed ring of (steady time, key hash) inside the object
// (kRing entries): recording a failure, judging the window and the gate never
// allocate. An ack on a group whose window is empty and that is not paused
// costs one relaxed load (`quiet`).
//
// Thread safety: thread-safe (one mutex, taken only on failures, on acks
// while the window holds failures, and by the gate while paused).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/options.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class OutageBreaker {
 public:
  /// Largest OutageOptions::threshold and distinct_keys.
  static constexpr std::uint32_t kRing = 256;
  /// Longest reason and last-error text kept (longer ones are cut).
  static constexpr std::size_t kText = 160;
  /// The longest a waiting lane of a paused group sleeps before it asks again.
  static constexpr std::int64_t kPollNs = 100'000'000;

  /// What a transient failure did to the group.
  struct Verdict {
    bool paused = false;    ///< the group is paused: the attempt is not counted, no DLQ
    bool tripped = false;   ///< this failure paused it
    std::int64_t wait_ns = 0;  ///< paused: until the next probe may go
  };

  /// A copy of the state for stats().
  struct Snapshot {
    bool paused = false;
    std::int64_t since_ns = 0;
    std::string reason;
    std::string last_error;
    std::uint64_t pauses = 0;
    std::uint64_t probes = 0;
  };

  /// No window, no pause, nothing failed: an ack has nothing to clear.
  bool quiet() const noexcept { return !dirty_.load(std::memory_order_relaxed); }
  bool paused() const noexcept { return paused_.load(std::memory_order_acquire); }

  /// Before a delivery of a paused group: -1 = go (*probe: this delivery is
  /// the probe), else the ns to wait before asking again. `take` = false
  /// only looks (a queue deciding whether to claim). `steady_ns`: now.
  std::int64_t gate(const OutageOptions& o, std::int64_t steady_ns, bool take, bool* probe);

  /// A transient failure of a message with key hash `key`. `last`: the
  /// message would use up its attempts. `probe`: it was the probe.
  Verdict on_transient(const OutageOptions& o, std::int64_t steady_ns, std::int64_t wall_ns, std::uint64_t key,
                       bool last, bool probe, std::string_view reason);

  /// An ack: empties the window; while paused it resumes the group. True if
  /// it ended a pause.
  bool on_ack();

  /// The probe ended with neither an ack nor a transient failure (a reject,
  /// a busy key): the next probe may go at once.
  void end_probe();

  /// Bus::resume: end a pause. False if the group was not paused.
  bool resume();

  /// A durable group's pause read from the store at subscribe: start paused
  /// (probing after probe_initial).
  void restore(const OutageOptions& o, std::int64_t steady_ns, std::int64_t since_wall_ns, std::string_view reason,
               std::string_view last_error);

  Snapshot snapshot() const;

 private:
  struct Failure {
    std::int64_t at_ns = 0;
    std::uint64_t key = 0;
  };
  /// Lanes of a paused group look again at least this often (a probe's ack
  /// or a resume lets them go within it): the backoff, at most kPollNs.
  std::int64_t poll_ns() const REQUIRES(mu_);
  void clear_window() REQUIRES(mu_);
  /// Failures in the window and their distinct keys (counted up to `enough`).
  void judge(std::int64_t since_ns, std::uint32_t enough, std::uint32_t* failures, std::uint32_t* keys) const
      REQUIRES(mu_);
  static void copy_text(std::array<char, kText>& into, std::string_view s) noexcept;

  mutable Mutex mu_;
  std::atomic<bool> paused_{false};
  std::atomic<bool> dirty_{false};  // window non-empty or paused
  std::array<Failure, kRing> ring_ GUARDED_BY(mu_){};
  std::uint32_t head_ GUARDED_BY(mu_) = 0;   // next slot to write
  std::uint32_t count_ GUARDED_BY(mu_) = 0;  // valid entries (<= kRing)
  std::int64_t since_wall_ns_ GUARDED_BY(mu_) = 0;
  std::int64_t next_probe_ns_ GUARDED_BY(mu_) = 0;  // steady
  std::int64_t backoff_ns_ GUARDED_BY(mu_) = 0;
  bool probe_out_ GUARDED_BY(mu_) = false;
  std::array<char, kText> reason_ GUARDED_BY(mu_){};
  std::array<char, kText> last_error_ GUARDED_BY(mu_){};
  std::uint64_t pauses_ GUARDED_BY(mu_) = 0;
  std::uint64_t probes_ GUARDED_BY(mu_) = 0;
};

// ---- a durable group's pause record (doc/storage-format.md, `user` db, key
// "outage\0pause/<topic>\0<group>"): written when the group pauses, deleted
// when it resumes; read at subscribe (a restarted process comes back paused)
// and by `lanebus stats`. `lanebus resume` deletes it and leaves a request
// under "outage\0resume/<topic>\0<group>" that the live process obeys
// within about a second.

class DurableStore;
class Logger;
struct GroupImpl;
struct GroupLane;
struct Parcel;
struct Invocation;
struct Settlement;

/// The delivery core's side of the outage pause (outage.cpp): the lane
/// runners ask it before a delivery and tell it what a delivery did; it
/// keeps each durable group's pause record in the store and obeys
/// `lanebus resume` requests. One per bus; it owns the list of durable
/// groups with the option (registered by restore at subscribe).
/// Thread safety: thread-safe; mu_ is a leaf (restore runs under the
/// registry's lock).
class OutageGate {
 public:
  explicit OutageGate(const Logger& logger) noexcept : logger_(logger) {}
  /// The bus's store (BusCore::start; nullptr without one).
  void set_store(DurableStore* store) noexcept { store_ = store; }

  /// Before a delivery: -1 = go (marks the lane's probe), else wait this long. `take`: false only looks.
  std::int64_t gate(GroupLane* gl, bool take) noexcept;
  /// The runners' gate (taking the probe): a parked message that may not go
  /// (`parked_index` >= 0) is due again after the wait.
  std::int64_t wait(GroupLane* gl, std::ptrdiff_t parked_index) noexcept;
  /// wait() for durable lanes: true (gl->retry_delay_ns = the wait) when the lane must wait.
  bool held(GroupLane* gl, std::ptrdiff_t parked_index) noexcept;
  /// Durable queues, before a claim: true (gl->retry_delay_ns = the wait) when no probe may go yet.
  bool claim_later(GroupLane* gl) noexcept;
  /// settle's transient failure of a group with the option: true (and *st set) if the group is paused.
  bool on_transient(GroupLane* gl, const Parcel& p, const Invocation& inv, Settlement* st) noexcept;
  /// An ack: empties the window, ends a pause.
  void on_ack(GroupLane* gl) noexcept;
  /// The lane's probe ended with neither an ack nor a transient failure.
  void end_probe(GroupLane* gl) noexcept;
  /// Bus::resume's part: end `g`'s pause (and delete its record). False if it was not paused.
  bool resume(GroupImpl* g) noexcept;
  /// At subscribe: a durable group recorded as paused starts paused; a
  /// durable group with the option is listed for poll_resume.
  void restore(GroupImpl* g);
  /// `lanebus resume` requests for this process's paused durable groups (maintenance).
  void poll_resume() noexcept;

 private:
  /// A durable group's pause record: written (paused) or deleted.
  void record(GroupImpl* g, bool paused) noexcept;

  const Logger& logger_;
  DurableStore* store_ = nullptr;
  Mutex mu_;
  std::vector<GroupImpl*> durable_ GUARDED_BY(mu_);  // durable groups with the option
};

/// Subscribe's check of GroupOptions::outage. Errors: InvalidArgument naming the field.
Status check_outage_options(std::string_view topic, const OutageOptions& o);

std::string outage_pause_key(std::string_view topic, std::string_view group);
std::string outage_resume_key(std::string_view topic, std::string_view group);
/// The record's value: since (wall clock), reason and last error, the pid.
std::string encode_outage_pause(std::int64_t since_ns, std::string_view reason, std::string_view last_error);
/// Fills gs->paused, paused_since_ns, pause_reason, pause_last_error. Errors: Corruption.
Status decode_outage_pause(std::string_view value, GroupStats* gs);
/// `lanebus resume`: end a durable group's pause from any process. Errors:
/// NotFound (no pause recorded for it), storage codes.
Status request_outage_resume(DurableStore& store, std::string_view topic, std::string_view group);

}  // namespace lanebus::detail
