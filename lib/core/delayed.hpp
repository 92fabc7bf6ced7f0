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
// - DelayQueue is a binary min-heap of {due time, sequence, slot index}
//   ordered by due time, then publish sequence: equal due times keep publish
//   order, so per-key order among delayed messages is due-time order. Every
//   entry pins a slot of the topic's pool, so the heap never holds more than
//   the pool's capacity: its storage is reserved once (the first delayed
//   publish of the topic), and no push allocates after that.
// - The heap's earliest entry arms the bus's RetryTimer (one TimerEntry per
//   topic, Kind::Delayed); on the timer thread, release_due routes every due
//   slot to the topic's groups as a publish would, in heap order, then
//   re-arms for the next one. The ordering rule follows: a delayed message
//   enters its lane when due, behind what the lane holds then.
// - Lock order: DelayQueue::mu_ is a leaf, except that release_due routes
//   with it released and arms the timer (its own leaf mutex) after it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "lanebus/message.hpp"
#include "lanebus/status.hpp"
#include "message_pool.hpp"
#include "retry_timer.hpp"
#include "trace.hpp"

namespace lanebus::detail {

class TopicImpl;

/// The times of one message, wall clock ns since the epoch; 0 = none.
struct MessageTimes {
  std::int64_t due_ns = 0;      // deliver no earlier than this
  std::int64_t expires_ns = 0;  // never start a handler call at or after this
};

/// True when `m` (on a topic whose default TTL is `default_ttl_ns`) needs
/// the slot's extension block: a delay, a due time or an expiry
/// (resolve_times), headers, or the calling thread's trace context to add
/// (trace.hpp). One branch.
inline bool has_times(const OutgoingMessage& m, std::int64_t default_ttl_ns) noexcept {
  return (m.delay.count() | m.deliver_at | default_ttl_ns | static_cast<std::int64_t>(m.ttl.has_value()) |
          static_cast<std::int64_t>(m.headers.size()) | reinterpret_cast<std::intptr_t>(tl_trace)) != 0;
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

// ---------------------------------------------------------------- DelayQueue

/// The topic's timer entry (RetryTimer, Kind::Delayed).
struct DelayEntry : TimerEntry {
  TopicImpl* topic = nullptr;
};

/// Thread safety: thread-safe (one mutex).
class DelayQueue {
 public:
  struct Item {
    std::int64_t due_ns;  // wall clock
    std::uint64_t seq;
    std::uint32_t index;  // slot index in the topic's pool
  };

  /// Add slot `index` due at `due_ns` (wall clock). Reserves the heap's
  /// storage (`capacity` items) on the first call. Returns true when it is
  /// the new earliest entry (the caller arms the timer).
  bool push(std::uint32_t index, std::int64_t due_ns, std::uint32_t capacity);
  /// Up to `max` items due at `now_ns` (wall clock), earliest first. *next:
  /// the due time of the earliest remaining item (0 = none).
  std::uint32_t pop_due(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next) noexcept;
  /// Every item, for discarding at shutdown.
  std::uint32_t pop_any(Item* out, std::uint32_t max) noexcept;
  std::size_t size() const noexcept;

  DelayEntry entry;

 private:
  static bool before(const Item& a, const Item& b) noexcept {
    return a.due_ns < b.due_ns || (a.due_ns == b.due_ns && a.seq < b.seq);
  }
  void pop_root() noexcept;

  mutable std::mutex mu_;
  std::vector<Item> heap_;  // guarded by mu_; capacity reserved once
  std::uint64_t seq_ = 0;   // guarded by mu_
};

}  // namespace lanebus::detail
