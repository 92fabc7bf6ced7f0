// lanebus — MIT License.
// Delayed delivery and expiry (doc/delays.md): the times a publish resolves
// from OutgoingMessage::delay / deliver_at / ttl and TopicOptions::default_ttl,
// the slot's extension block that carries them (layout: message_pool.hpp),
// and DelayQueue, an in-memory topic's heap of slots waiting for their due
// time.
//
// Design notes
// - A message with neither a due time nor an expiry takes none of this: the
//   publish paths test has_times() (one branch), the runners test the slot's
//   kExtension bit (one branch).
// - DelayQueue has two parts. Publishers append {slot index} to a staging
//   ring (a LaneRing: linearizable, so ring order is publish order) after
//   writing the slot's due time to a per-slot array; no lock, one locked
//   instruction. The timer thread moves the ring into a binary min-heap of
//   {due time, sequence, slot index} ordered by due time, then sequence
//   (ring order): equal due times keep publish order, so per-key order among
//   delayed messages is due-time order. Items not earlier than the last one
//   taken in skip the heap: they go to a FIFO run (already sorted), and pops
//   take the earlier front of the two. Every entry pins a slot of the
//   topic's pool, so neither part holds more than the pool's capacity: their
//   storage is allocated once (the first delayed publish of the topic), and
//   nothing allocates after that.
// - Arming (the Dekker pair of push and pop_due): `armed_` is the due time
//   the timer will look at the topic next (kNone: never). A publisher appends
//   to the ring (seq_cst), then reads armed_ (seq_cst) and arms the timer
//   only when its due time is earlier (lowering armed_ by CAS): with a steady
//   delay, due times grow and publishers never touch the timer. pop_due,
//   having moved the ring and taken what is due, stores the next due time in
//   armed_, fences, and looks at the ring again: either it sees a racing
//   append (and takes it in), or that publisher sees the new armed_.
// - Solo publishers (bus_impl.hpp) append with push_solo inside their
//   in_push window: a plain store of the ring's tail and a light fence
//   before reading armed_, no locked instruction (the CAS and the seq_cst
//   store of push were two thirds of its samples). The other side of that
//   Dekker pair is then the heavy fence: the timer's pop_due runs it when
//   the topic was ever solo, as a worker letting go of a lane does. A
//   publisher's own try_pop_due needs none: its appends come before it in
//   program order, and any other publisher made the topic shared first
//   (make_shared's heavy fence), after which every append is seq_cst.
//   Pops are serialized by mu_, so the ring has one dequeuer at a time
//   (try_dequeue_single: no CAS on its head).
// - The bus's RetryTimer holds one TimerEntry per topic (Kind::Delayed); on
//   the timer thread release_due routes every due slot to the topic's groups
//   in heap order, through the timer thread's own publisher (solo while no
//   other thread publishes to the topic: no locked instruction per ring
//   append), then re-arms for the next one. The ordering rule follows: a
//   delayed message enters its lane when due, behind what the lane holds
//   then.
// - Publishers release (release_inline). A steady stream of delayed
//   publishes makes the timer thread a third busy thread: it woke every few
//   tens of µs to route a handful of slots, on a 2-vCPU machine taking turns
//   with the publisher and the worker. So a publisher that finds the
//   earliest item kInlineLagNs late (due_by: one relaxed load of armed_
//   against the clock it read anyway)
//   takes the due items itself (try_pop_due: never waits for the heap's
//   mutex) and routes them through its own publisher: solo like its other
//   publishes, so the topic stays solo. It does not touch the timer; the
//   timer, on its next look, finds the flag the publisher left and defers
//   by kTimerDeferNs instead of routing. A solo publisher's append that
//   does not arm the timer leaves the flag too: the timer routing through
//   its own publisher would make the topic shared for good (its first look
//   comes before the stream's first inline release). So the timer neither
//   races the publisher for the mutex nor makes the topic shared. Once the
//   publisher stops, the
//   timer's next look finds no flag and releases as before: in that one
//   case a message is late by at most 2 × kTimerDeferNs (doc/delays.md).
//   One releaser at a time (`releasing`, held from the pop to the last
//   route): items leave the heap in due order, and so enter their lanes.
// - The release touches no slot. A slot released 1 ms (or an hour) after
//   its publish is cold, and a stream of releases missed on each one. So
//   the publish stamps the slot with its due time (created_at_ns: a delayed
//   message's latency counts from its due time) and with the reference
//   count for one group (route writes another count only for more groups:
//   TopicImpl::route's `refs_set`), and the staging ring's cell and the
//   heap's item carry the due time and the lane beside the slot index.
//   The staging ring's cells are read in order; a side array of due times
//   indexed by slot was a miss per item (three quarters of take_staged's
//   samples). The magazine prefetches as many lines of its next slots as
//   the last message filled (Magazine::lines: 64 bytes of payload behind
//   a due time reach a third line).
// - Lock order: DelayQueue::mu_ (the heap: the timer thread and shutdown)
//   is a leaf; publishers never take it after the first push. release_due
//   routes with it released and arms the timer (its own leaf mutex) after.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <climits>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "asym_fence.hpp"
#include "lane_ring.hpp"
#include "lanebus/message.hpp"
#include "lanebus/status.hpp"
#include "message_pool.hpp"
#include "retry_timer.hpp"
#include "trace.hpp"
#include "wall_clock.hpp"

namespace lanebus::detail {

class TopicImpl;

/// The times of one message, wall clock ns since the epoch; 0 = none.
struct MessageTimes {
  std::int64_t due_ns = 0;      // deliver no earlier than this
  std::int64_t expires_ns = 0;  // never start a handler call at or after this
};

/// has_times in two halves: the message's fields (non-zero when it has a
/// delay, a due time, a TTL or headers) and the call's (the topic's default
/// TTL, the thread's trace context). publish_batch ors the first over the
/// batch and adds the second once.
inline std::int64_t message_time_bits(const OutgoingMessage& m) noexcept {
  return m.delay.count() | m.deliver_at | static_cast<std::int64_t>(m.ttl.has_value()) |
         static_cast<std::int64_t>(m.headers.size());
}
inline std::int64_t call_time_bits(std::int64_t default_ttl_ns) noexcept {
  return default_ttl_ns | reinterpret_cast<std::intptr_t>(tl_trace);
}
/// True when `m` (on a topic whose default TTL is `default_ttl_ns`) needs
/// the slot's extension block: a delay, a due time or an expiry
/// (resolve_times), headers, or the calling thread's trace context to add
/// (trace.hpp). One branch.
inline bool has_times(const OutgoingMessage& m, std::int64_t default_ttl_ns) noexcept {
  return (message_time_bits(m) | call_time_bits(default_ttl_ns)) != 0;
}

/// The due time and expiry of `m` published at `now_ns`, or InvalidArgument
/// naming the bad value (negative delay, delay and deliver_at both set, a
/// due time past 2200-01-01, a TTL not positive or over 100 years, an expiry
/// before the due time: that one names both values).
Status resolve_times(const OutgoingMessage& m, std::int64_t default_ttl_ns, std::int64_t now_ns,
                     MessageTimes* out);

/// TopicOptions::default_ttl's check at creation.
Status check_default_ttl(std::chrono::nanoseconds ttl);

// ---------------------------------------------------------------- the slot's extension block

/// The block's fixed part; message headers (doc/tracing.md) follow it in
/// their stored form (HeadersView), flag kExtHeaders, and the length grows.
inline constexpr std::uint16_t kExtensionBytes = 24;
inline constexpr std::uint16_t kExtDue = 1;
inline constexpr std::uint16_t kExtExpiry = 2;
inline constexpr std::uint16_t kExtHeaders = 4;

/// The slot's keys and header; the payload too unless `inline_payload` is
/// false (a large payload or a typed object: place_large puts it). `ext`:
/// the bytes of an extension block between the keys and the payload (0 on
/// the plain publish paths, where it folds away; kExtensionBytes on the
/// timed one, which sets Slot::kExtension and writes the block with
/// write_extension). Shared by every publish path (publish.cpp, delayed.cpp).
inline void fill_slot(Slot* s, const OutgoingMessage& m, std::uint32_t lane, std::uint64_t id,
                      std::int64_t created_at, std::uint16_t schema_version, bool inline_payload = true,
                      std::size_t ext = 0) noexcept {
  s->lane = static_cast<std::uint16_t>(lane);
  s->key_len = static_cast<std::uint16_t>(m.key.size());
  s->idem_len = static_cast<std::uint16_t>(m.idempotency_key.size());
  s->payload_len = static_cast<std::uint32_t>(m.payload.size());
  char* d = s->data();
  copy_short(d, m.key.data(), m.key.size());  // message_pool.hpp: short keys without a call
  // Most messages have no idempotency key: one branch instead of copy_short's three.
  if (!m.idempotency_key.empty()) [[unlikely]]
    copy_short(d + m.key.size(), m.idempotency_key.data(), m.idempotency_key.size());
  if (inline_payload)
    copy_payload(d + m.key.size() + m.idempotency_key.size() + ext, m.payload.data(), m.payload.size());
  s->header.id = id;
  s->header.created_at_ns = created_at;
  s->header.correlation_id = m.correlation_id;
  s->header.fencing_token = m.fencing_token;
  s->header.attempt = 0;
  s->header.content_type = m.content_type;
  s->header.schema_version = schema_version;
}

/// Write the block at `at` (the slot's data() + key_len + idem_len): the
/// times, then `headers` (a stored header block, may be empty).
inline void write_extension(char* at, const MessageTimes& t, std::string_view headers = {}) noexcept {
  const std::uint16_t len = static_cast<std::uint16_t>(kExtensionBytes + headers.size());
  const std::uint16_t flags =
      static_cast<std::uint16_t>((t.due_ns != 0 ? kExtDue : 0) | (t.expires_ns != 0 ? kExtExpiry : 0) |
                                 (headers.empty() ? 0 : kExtHeaders));
  const std::uint32_t reserved = 0;
  std::memcpy(at, &len, 2);
  std::memcpy(at + 2, &flags, 2);
  std::memcpy(at + 4, &reserved, 4);
  std::memcpy(at + 8, &t.due_ns, 8);
  std::memcpy(at + 16, &t.expires_ns, 8);
  if (!headers.empty()) std::memcpy(at + kExtensionBytes, headers.data(), headers.size());
}

/// The stored header block a slot carries (empty without one).
inline std::string_view slot_headers(const Slot* s) noexcept {
  if ((s->kind & Slot::kExtension) == 0) return {};
  const char* at = s->data() + s->key_len + s->idem_len;
  std::uint16_t len, flags;
  std::memcpy(&len, at, 2);
  std::memcpy(&flags, at + 2, 2);
  if ((flags & kExtHeaders) == 0) return {};
  return {at + kExtensionBytes, static_cast<std::size_t>(len - kExtensionBytes)};
}

/// The times a slot carries (zeros without an extension block).
inline MessageTimes slot_times(const Slot* s) noexcept {
  MessageTimes t;
  if ((s->kind & Slot::kExtension) == 0) return t;
  const char* at = s->data() + s->key_len + s->idem_len;
  std::memcpy(&t.due_ns, at + 8, 8);
  std::memcpy(&t.expires_ns, at + 16, 8);
  return t;
}

/// True when the slot carries an expiry that has passed at `now_ns` (wall clock).
inline bool slot_expired(const Slot* s, std::int64_t now_ns) noexcept {
  const MessageTimes t = slot_times(s);
  return t.expires_ns != 0 && now_ns >= t.expires_ns;
}

/// A retry's wait, cut to end at the slot's expiry (a retry never outlives the TTL).
inline std::int64_t clip_to_expiry(const Slot* s, std::int64_t wait_ns) noexcept {
  const MessageTimes t = slot_times(s);
  if (t.expires_ns == 0) return wait_ns;
  const std::int64_t left = t.expires_ns - WallClock::now_ns();
  return std::min(wait_ns, std::max<std::int64_t>(left, 0) + 1);
}

// ---------------------------------------------------------------- DelayQueue

/// The topic's timer entry (RetryTimer, Kind::Delayed).
struct DelayEntry : TimerEntry {
  TopicImpl* topic = nullptr;
};

/// Thread safety: thread-safe (push: any thread, lock-free after the first
/// call; the others take the heap's mutex).
class DelayQueue {
 public:
  struct Item {
    std::int64_t due_ns;  // wall clock
    std::uint64_t seq;
    std::uint32_t index;  // slot index in the topic's pool
    std::uint32_t lane;   // the slot's lane: the release routes without reading the slot
  };

  /// Add slot `index` (< `capacity`, the pool's; of lane `lane`) due at `due_ns` (wall
  /// clock). Allocates the ring, the run and the heap (`capacity`
  /// each) on the first call (std::bad_alloc then). Returns true when the
  /// caller must arm the timer for `due_ns` (earlier than what it is armed for).
  bool push(std::uint32_t index, std::uint32_t lane, std::int64_t due_ns, std::uint32_t capacity);
  /// push for the topic's solo publisher, inside its in_push window (bus_impl.hpp,
  /// "Solo publishers"): a plain append (lane_ring.hpp invariant 5) and a
  /// light fence, no locked instruction. The timer's pop_due pays the heavy
  /// fence instead (its `ever_solo`). Returns as push.
  bool push_solo(std::uint32_t index, std::uint32_t lane, std::int64_t due_ns, std::uint32_t capacity);
  /// The timer thread: up to `max` items due at `now_ns` (wall clock),
  /// earliest first. *next: the due time of the earliest remaining item (0 =
  /// none). Returning fewer than `max`, it has taken in every append that
  /// does not arm the timer itself (design notes).
  /// `ever_solo`: the topic's flag (TopicImpl::ever_solo), read after the
  /// store of the next due time: once set, a solo publisher may append
  /// without a full fence (push_solo), and the heavy fence (asym_fence.hpp)
  /// stands in for the full one of the Dekker pair with push.
  std::uint32_t pop_due(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next,
                        const std::atomic<bool>& ever_solo) noexcept;
  /// pop_due for a publisher (release_inline), which has just appended: 0
  /// at once if another thread holds the heap (the timer thread, or another
  /// publisher releasing). No heavy fence: the caller is the solo publisher,
  /// or the topic is shared for good and every append is seq_cst.
  std::uint32_t try_pop_due(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next) noexcept;
  /// Is an item due at `now_ns`, as far as the timer's next look knows
  /// (one relaxed load: the publishers' test before try_pop_due)?
  bool due_by(std::int64_t now_ns) const noexcept { return armed_.load(std::memory_order_relaxed) <= now_ns; }
  /// A publisher released due items, or the solo publisher appended one not
  /// earliest (and so releases what is due at its next appends), since the
  /// timer's last look: publishers set it, the timer thread takes it (design
  /// notes, "Publishers release").
  void note_publisher_release() noexcept {
    if (!publisher_releases_.load(std::memory_order_relaxed))
      publisher_releases_.store(true, std::memory_order_relaxed);
  }
  bool take_publisher_release() noexcept { return publisher_releases_.exchange(false, std::memory_order_relaxed); }
  /// Held across a pop and the routing of what it took (release_due locks
  /// it, release_inline tries): a second releaser routing its later items
  /// first would break the order rule within a key.
  std::mutex releasing;
  /// Every item, for discarding at shutdown.
  std::uint32_t pop_any(Item* out, std::uint32_t max) noexcept;
  /// Waiting items (approximate while publishers run).
  std::size_t size() const noexcept;

  DelayEntry entry;

 private:
  static constexpr std::int64_t kNone = INT64_MAX;
  static bool before(const Item& a, const Item& b) noexcept {
    return a.due_ns < b.due_ns || (a.due_ns == b.due_ns && a.seq < b.seq);
  }
  void init(std::uint32_t capacity);
  /// push's end: lower armed_ to `due_ns` if that is earlier (true: the caller arms the timer).
  bool lower_armed(std::int64_t due_ns) noexcept;
  /// `ever_solo`: as pop_due; nullptr for try_pop_due.
  std::uint32_t pop_due_locked(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next,
                               const std::atomic<bool>* ever_solo) noexcept;
  void take_staged() noexcept;  // REQUIRES: mu_ held (and so for the three below)
  const Item* first() const noexcept;  // the earliest of the run and the heap, or nullptr
  void pop_first(const Item* f) noexcept;
  void push_heap(const Item& it) noexcept;
  void pop_root() noexcept;

  mutable std::mutex mu_;
  // Set once (release) after ring_, run_ and heap_'s storage exist.
  std::atomic<bool> ready_{false};
  // A staged slot with its due time and lane in the same cell (design
  // notes, "The release touches no slot").
  struct Staged {
    std::int64_t due_ns;
    std::uint32_t index;
    std::uint32_t lane;
  };
  std::unique_ptr<BasicLaneRing<Staged>> ring_;  // staged items, publish order
  // Staged items whose due time is not before the last one's (a steady
  // delay: all of them) go to the run, a FIFO already in (due, sequence)
  // order: O(1) in and out. The others go to the heap (the sift-down was
  // 13 % of delayed_1to1's samples). Pops take the earlier of the two fronts.
  std::unique_ptr<Item[]> run_;            // [capacity], a ring; guarded by mu_
  std::uint64_t run_head_ = 0, run_tail_ = 0, run_mask_ = 0;  // guarded by mu_
  std::vector<Item> heap_;                 // guarded by mu_; capacity reserved once
  std::uint64_t seq_ = 0;                  // guarded by mu_
  alignas(64) std::atomic<std::int64_t> armed_{kNone};
  std::atomic<bool> publisher_releases_{false};  // on armed_'s line: the appends read it anyway
};

}  // namespace lanebus::detail
