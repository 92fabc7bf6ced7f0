// lanebus — MIT License.
// Delayed delivery and expiry on in-memory topics (delayed.hpp, doc/delays.md):
// resolving a message's times, the timed publish, the topic's delay heap,
// and the expiry check of the lane runners.
#include "delayed.hpp"

#include <algorithm>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

namespace {
// 2200-01-01T00:00:00Z in ns since the epoch: later due times are refused
// (they are mistakes, and the arithmetic stays far from overflow).
constexpr std::int64_t kLatestDueNs = 7'258'118'400LL * 1'000'000'000LL;
// 100 years.
constexpr std::int64_t kLongestTtlNs = 100LL * 365 * 24 * 3600 * 1'000'000'000LL;

std::string ns_text(std::int64_t ns) {
  // "1500000000 ns (1.5 s)"
  std::string s = std::to_string(ns) + " ns";
  if (ns >= 1'000'000 || ns <= -1'000'000) {
    char buf[48];
    std::snprintf(buf, sizeof buf, " (%.3f s)", static_cast<double>(ns) / 1e9);
    s += buf;
  }
  return s;
}
}  // namespace

Status check_default_ttl(std::chrono::nanoseconds ttl) {
  if (ttl.count() < 0 || ttl.count() > kLongestTtlNs)
    return Status(Code::InvalidArgument, "TopicOptions::default_ttl is " + ns_text(ttl.count()) +
                                             "; it must be 0 (none) or positive and at most 100 years");
  return Status();
}

Status resolve_times(const OutgoingMessage& m, std::int64_t default_ttl_ns, std::int64_t now_ns,
                     MessageTimes* out) {
  *out = MessageTimes{};
  const std::int64_t delay = m.delay.count();
  if (delay < 0)
    return Status(Code::InvalidArgument, "publish: OutgoingMessage::delay is negative (" + ns_text(delay) + ")");
  if (m.deliver_at < 0)
    return Status(Code::InvalidArgument, "publish: OutgoingMessage::deliver_at is negative (" +
                                             std::to_string(m.deliver_at) + " ns since the epoch)");
  if (delay != 0 && m.deliver_at != 0)
    return Status::from_literal(Code::InvalidArgument,
                                "publish: set OutgoingMessage::delay or deliver_at, not both");
  if (delay > kLatestDueNs - now_ns || m.deliver_at > kLatestDueNs)
    return Status(Code::InvalidArgument,
                  "publish: the due time (" + (delay != 0 ? "delay " + ns_text(delay) : "deliver_at " +
                                               std::to_string(m.deliver_at) + " ns since the epoch") +
                      ") is after 2200-01-01");
  if (delay != 0) out->due_ns = now_ns + delay;
  if (m.deliver_at != 0) out->due_ns = m.deliver_at;  // in the past: due now
  std::int64_t ttl = default_ttl_ns;
  if (m.ttl) {
    ttl = m.ttl->count();
    if (ttl <= 0 || ttl > kLongestTtlNs)
      return Status(Code::InvalidArgument, "publish: OutgoingMessage::ttl is " + ns_text(ttl) +
                                               "; it must be positive and at most 100 years");
  }
  if (ttl != 0) {
    out->expires_ns = now_ns + ttl;
    if (out->due_ns != 0 && out->expires_ns <= out->due_ns)
      return Status(Code::InvalidArgument,
                    "publish: the message would expire before it is due: ttl " + ns_text(ttl) + " ends at " +
                        std::to_string(out->expires_ns) + " ns since the epoch, its due time (" +
                        (delay != 0 ? "delay " + ns_text(delay) : "deliver_at") + ") is " +
                        std::to_string(out->due_ns) + " ns since the epoch");
  }
  return Status();
}

// ---------------------------------------------------------------- DelayQueue

void DelayQueue::init(std::uint32_t capacity) {
  std::lock_guard l(mu_);
  if (ready_.load(std::memory_order_relaxed)) return;
  // The pool's capacity is a power of two (the ring needs one).
  auto ring = std::make_unique<BasicLaneRing<Staged>>(capacity);
  auto run = std::make_unique<Item[]>(capacity);
  heap_.reserve(capacity);  // once per topic (design notes)
  ring_ = std::move(ring);
  run_ = std::move(run);
  run_mask_ = capacity - 1;
  ready_.store(true, std::memory_order_release);  // pairs with push's and pop_due's acquire
}

bool DelayQueue::push(std::uint32_t index, std::uint32_t lane, std::int64_t due_ns, std::uint32_t capacity) {
  if (!ready_.load(std::memory_order_acquire)) init(capacity);
  // Never full: every entry pins one of the pool's `capacity` slots; a failed
  // try only means the cell's previous reader has not finished its store.
  while (!ring_->try_enqueue(Staged{due_ns, index, lane})) std::this_thread::yield();
  // seq_cst, after the ring's seq_cst store: the Dekker pair with pop_due.
  return lower_armed(due_ns);
}

// Inline in hand_off, its one caller (as times_of and hand_off in publish):
// a call's frame per step was a fifth of the timed publish's instructions.
[[gnu::always_inline]] inline bool DelayQueue::push_solo(std::uint32_t index, std::uint32_t lane, std::int64_t due_ns,
                                                      std::uint32_t capacity) {
  if (!ready_.load(std::memory_order_acquire)) init(capacity);
  ring_->push_solo(Staged{due_ns, index, lane});  // never full (push)
  AsymmetricFence::light();  // the entry, then armed_: pop_due's heavy fence is the other half
  if (lower_armed(due_ns)) return true;
  note_publisher_release();  // a stream: the timer defers to this publisher (design notes)
  return false;
}

bool DelayQueue::lower_armed(std::int64_t due_ns) noexcept {
  std::int64_t armed = armed_.load(std::memory_order_seq_cst);
  while (due_ns < armed) {
    if (armed_.compare_exchange_weak(armed, due_ns, std::memory_order_seq_cst)) return true;
  }
  return false;
}

void DelayQueue::push_heap(const Item& it) noexcept {
  heap_.push_back(it);  // within the reserved capacity: no allocation
  std::size_t i = heap_.size() - 1;
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!before(heap_[i], heap_[parent])) break;
    std::swap(heap_[i], heap_[parent]);
    i = parent;
  }
}

void DelayQueue::take_staged() noexcept {
  constexpr std::uint32_t kTakeChunk = 256;
  // One dequeuer (mu_ is held): read what is there, then free the cells at
  // once (one release store of the ring's bound, not one per item).
  for (;;) {
    const std::uint64_t first = ring_->head_position();
    const std::uint32_t n = ring_->peek_each(first, kTakeChunk, [this](std::uint32_t, const Staged& st) {
      const Item it{st.due_ns, seq_++, st.index, st.lane};
      // Not before the run's last item (a steady delay: always): the run's
      // tail, O(1); else the heap. Both stay sorted by (due time, sequence).
      if (run_tail_ == run_head_ || !before(it, run_[(run_tail_ - 1) & run_mask_])) {
        run_[run_tail_++ & run_mask_] = it;
      } else {
        push_heap(it);
      }
      return true;
    });
    if (n == 0) return;
    ring_->advance_single(n);
    if (n < kTakeChunk) return;
  }
}

const DelayQueue::Item* DelayQueue::first() const noexcept {
  const Item* r = run_tail_ != run_head_ ? &run_[run_head_ & run_mask_] : nullptr;
  const Item* h = heap_.empty() ? nullptr : &heap_.front();
  if (r == nullptr) return h;
  if (h == nullptr) return r;
  return before(*h, *r) ? h : r;
}

void DelayQueue::pop_first(const Item* f) noexcept {
  if (!heap_.empty() && f == &heap_.front()) {
    pop_root();
  } else {
    ++run_head_;
  }
}

void DelayQueue::pop_root() noexcept {
  heap_.front() = heap_.back();
  heap_.pop_back();
  const std::size_t n = heap_.size();
  std::size_t i = 0;
  for (;;) {
    std::size_t best = i;
    const std::size_t l = 2 * i + 1;
    const std::size_t r = l + 1;
    if (l < n && before(heap_[l], heap_[best])) best = l;
    if (r < n && before(heap_[r], heap_[best])) best = r;
    if (best == i) return;
    std::swap(heap_[i], heap_[best]);
    i = best;
  }
}

std::uint32_t DelayQueue::pop_due(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next,
                                  const std::atomic<bool>& ever_solo) noexcept {
  *next = 0;
  if (!ready_.load(std::memory_order_acquire)) return 0;
  std::lock_guard l(mu_);
  return pop_due_locked(now_ns, out, max, next, &ever_solo);
}

std::uint32_t DelayQueue::try_pop_due(std::int64_t now_ns, Item* out, std::uint32_t max,
                                      std::int64_t* next) noexcept {
  *next = 0;
  if (!ready_.load(std::memory_order_acquire)) return 0;
  std::unique_lock l(mu_, std::try_to_lock);
  if (!l.owns_lock()) return 0;
  return pop_due_locked(now_ns, out, max, next, nullptr);
}

std::uint32_t DelayQueue::pop_due_locked(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next,
                                         const std::atomic<bool>* ever_solo) noexcept {
  std::uint32_t n = 0;
  for (int round = 0;; ++round) {
    take_staged();
    for (const Item* f; n < max && (f = first()) != nullptr && f->due_ns <= now_ns;) {
      out[n++] = *f;
      pop_first(f);
    }
    const Item* e = first();
    const std::int64_t earliest = e == nullptr ? kNone : e->due_ns;
    if (n == max) {  // the caller comes back at once
      *next = earliest == kNone ? 0 : earliest;
      return n;
    }
    // Everything due is taken: publish the next due time, then look at the
    // ring again (design notes: a racing append is seen here, or its
    // publisher sees armed_ and arms the timer itself).
    armed_.store(earliest, std::memory_order_seq_cst);
    // A solo publisher appends with a light fence (push_solo): the heavy one
    // here. ever_solo is read after the store: one that reads it false does
    // so before the first solo claim's heavy fence (publish.cpp
    // open_window_slow), whose publisher then sees the store.
    if (ever_solo != nullptr && ever_solo->load(std::memory_order_seq_cst)) {
      AsymmetricFence::heavy();
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
    if (!ring_->ready()) {
      *next = earliest == kNone ? 0 : earliest;
      return n;
    }
    if (round == 16) {  // publishers keep appending: come back at once
      *next = now_ns;
      return n;
    }
  }
}

std::uint32_t DelayQueue::pop_any(Item* out, std::uint32_t max) noexcept {
  if (!ready_.load(std::memory_order_acquire)) return 0;
  std::lock_guard l(mu_);
  take_staged();
  std::uint32_t n = 0;
  for (const Item* f; n < max && (f = first()) != nullptr;) {
    out[n++] = *f;
    pop_first(f);
  }
  return n;
}

std::size_t DelayQueue::size() const noexcept {
  if (!ready_.load(std::memory_order_acquire)) return 0;
  std::lock_guard l(mu_);
  return heap_.size() + static_cast<std::size_t>(run_tail_ - run_head_) + ring_->size_approx();
}

// ---------------------------------------------------------------- the timed publish

TopicDelays::TopicDelays(TopicImpl& topic) noexcept : t_(topic) {
  queue.entry.topic = &topic;
  queue.entry.kind = TimerEntry::Kind::Delayed;
}

[[gnu::always_inline]] inline Status TopicDelays::times_of(const OutgoingMessage& m, std::int64_t now,
                                                          MessageTimes* times) noexcept {
  const std::int64_t delay = m.delay.count();
  if (delay > 0 && delay < kLongestTtlNs && m.deliver_at == 0 && !m.ttl && t_.options.default_ttl.count() == 0 &&
      now < kLatestDueNs - kLongestTtlNs) [[likely]] {
    *times = MessageTimes{.due_ns = now + delay};  // a plain delay: resolve_times' answer without its checks
    return Status();
  }
  try {
    Status st = resolve_times(m, t_.options.default_ttl.count(), now, times);
    if (!st.ok()) t_.refused.fetch_add(1, std::memory_order_relaxed);
    return st;
  } catch (const std::bad_alloc&) {
    return Status::from_literal(Code::InvalidArgument, "publish: bad delay or ttl (out of memory naming it)");
  }
}

Status TopicDelays::publish(const OutgoingMessage& m, bool may_block, std::uint64_t id,
                                const PayloadFill* fill, PublisherState* pub, Magazine* mag) noexcept {
  const std::uint32_t pub_slot = pub != nullptr ? pub->slot : kNoPublisherSlot;
  if (m.payload.empty() && fill == nullptr)
    return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  if (fill == nullptr && t_.objects_only.load(std::memory_order_relaxed))
    return Status::from_literal(Code::InvalidArgument,
                                "publish: the topic carries typed objects; publish through its TypedTopic<T>");
  const std::int64_t now = now_ns();
  MessageTimes times;
  if (Status st = times_of(m, now, &times); !st.ok()) return st;
  std::uint16_t schema_version = m.schema_version;
  if (t_.schema.load(std::memory_order_relaxed) != nullptr) {
    if (Status st = t_.check_schema(m, &schema_version); !st.ok()) return st;
  }
  if ((m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the key or idempotency key exceeds 65535 bytes (the limit of an "
                                "in-memory topic's slot)");
  // Headers, and the calling handler's trace context (trace.hpp), after the
  // times. Neither (a plain delay or TTL): no call.
  HeaderBlock headers;
  if (!m.headers.empty() || tl_trace != nullptr) {
    if (Status st = stored_headers(m, &headers); !st.ok()) {
      t_.refused.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
  }
  const std::size_t ext = kExtensionBytes + headers.bytes().size();
  const std::size_t keys = m.key.size() + m.idempotency_key.size();
  const std::size_t need = keys + (fill ? fill->size : m.payload.size());
  const bool large = need + ext > t_.options.slot_bytes || fill != nullptr;
  if (large) {
    if (keys + ext > t_.options.slot_bytes) {
      t_.refused.fetch_add(1, std::memory_order_relaxed);
      return Status::from_literal(Code::PayloadTooLarge,
                                  "publish: key + idempotency key + the headers (and trace context) exceed the "
                                  "topic's slot_bytes (raise TopicOptions::slot_bytes; doc/tracing.md)");
    }
    if (Status st = check_large(t_, m, fill, ext); !st.ok()) return st;
  }
  if (t_.bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  NamespaceState* const nsp = t_.ns.load(std::memory_order_acquire);
  // A slotted publisher in a namespace without a publish quota counts the
  // message in its own tally once it is taken (count_in_slot, as publish_via
  // does: no locked instruction); anything else is admitted here, and a
  // refusal below undoes it (unadmit).
  const bool tally = pub_slot != kNoPublisherSlot && !nsp->pub_limited.load(std::memory_order_relaxed);
  if (!tally) {
    if (Status q = nsp->admit_publish(need, may_block && t_.options.backpressure == Backpressure::Block,
                                      t_.options.block_timeout);
        !q.ok())
      return q;
  }
  auto unadmit = [&] {
    if (!tally) nsp->unadmit_publish(need);
  };
  const std::uint32_t lane = t_.lane_of(m.key);
  // A publisher's magazine (publish_via) takes a slot with plain loads and
  // stores; the shared path with try_alloc's locked instruction.
  Slot* s = mag != nullptr ? t_.pool.take(*mag) : t_.pool.try_alloc();
  if (s == nullptr) s = t_.acquire_slot(lane, may_block);
  if (s == nullptr) {
    unadmit();
    return t_.no_slot(may_block);
  }
  if (mag != nullptr) {
    // The slot counts in in_use; then read closing (shutdown's Dekker, as in
    // publish_via: a light fence here, shutdown runs the heavy one).
    if (pub->asym) {
      AsymmetricFence::light();
    } else {
      std::atomic_thread_fence(std::memory_order_seq_cst);
    }
  }
  if (t_.bus->closing()) {  // shutdown's Dekker, as in publish
    t_.pool.free(s);
    unadmit();
    return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  }
  if (mag != nullptr) mag->note_lines(large ? keys + ext + sizeof(void*) : need + ext);
  s->kind = Slot::kExtension;  // a free slot is kInline (MessagePool::recycle)
  // The release touches no slot (delayed.hpp, "The release"): the count for one group, the due time.
  s->refs.store(1, std::memory_order_relaxed);
  fill_slot(s, m, lane, id, std::max(times.due_ns, now), schema_version, !large, ext);
  write_extension(s->data() + keys, times, headers.bytes());
  if (large) {
    if (Status st = place_large(t_, s, m, fill, lane, may_block); !st.ok()) {
      t_.pool.free(s);
      unadmit();
      return st;
    }
  }
  if (Status st = hand_off(s, times.due_ns, now, pub); !st.ok()) {
    t_.pool.free(s);
    unadmit();
    return st;
  }
  if (tally) nsp->count_in_slot(pub_slot, 1, need);
  return Status();
}

[[gnu::always_inline]] inline Status TopicDelays::hand_off(Slot* s, std::int64_t due_ns, std::int64_t now,
                                                          PublisherState* pub) noexcept {
  if (due_ns <= now) {
    // Not delayed (only an expiry), or due already: routed now, solo when
    // the publisher owns the topic.
    t_.route_due(pub, &s, 1);
    return Status();
  }
  // The staging ring takes solo appends from the topic's solo publisher
  // (delayed.hpp, "Solo publishers"); any other append makes the topic shared first.
  const bool solo = t_.enter_solo(pub);
  bool earliest;
  try {
    const std::uint32_t index = t_.pool.index_of(s);
    earliest = solo ? queue.push_solo(index, s->lane, due_ns, t_.pool.capacity())
                     : queue.push(index, s->lane, due_ns, t_.pool.capacity());
  } catch (const std::bad_alloc&) {  // the heap's one-time reservation (before any append)
    if (solo) t_.leave_solo(pub);
    return Status::from_literal(Code::Internal, "publish: out of memory reserving the topic's delay heap");
  }
  if (solo) t_.leave_solo(pub);
  if (earliest) {
    t_.bus->arm_delayed(&queue.entry, due_ns);
  } else if (pub != nullptr && queue.due_by(now - kInlineLagNs)) {
    release_inline(pub, now);  // earlier messages are due: route them here (design notes)
  }
  return Status();
}

namespace {
constexpr std::uint32_t kReleaseChunk = 64;  // route_popped's most
}  // namespace

void TopicDelays::route_popped(PublisherState* p, const DelayQueue::Item* items, std::uint32_t n) noexcept {
  // Nothing of the slots is read or written here (delayed.hpp, "The release").
  const bool solo = p != nullptr && t_.enter_solo(p);
  for (std::uint32_t i = 0; i < n; ++i) t_.route(t_.pool.at(items[i].index), items[i].lane, solo, 1);
  if (solo) t_.leave_solo(p);
}

void TopicDelays::release_inline(PublisherState* p, std::int64_t now) noexcept {
  DelayQueue::Item items[kReleaseChunk];
  std::int64_t next = 0;
  std::unique_lock releasing(queue.releasing, std::try_to_lock);
  if (!releasing.owns_lock()) return;  // the timer or another publisher releases now
  const std::uint32_t n = queue.try_pop_due(now, items, kReleaseChunk, &next);
  if (n == 0) return;
  route_popped(p, items, n);
  // No arming: the timer stays armed at or before the next due time
  // (armed_ only grew), and defers once it sees this (design notes).
  queue.note_publisher_release();
}

void TopicDelays::release_due() noexcept {
  DelayQueue::Item items[kReleaseChunk];
  if (queue.take_publisher_release()) {
    // A publisher releases due items as it publishes: leave them to it and
    // look again in kTimerDeferNs (design notes, "Publishers release").
    t_.bus->arm_delayed(&queue.entry, now_ns() + kTimerDeferNs);
    return;
  }
  // The timer routes with shared appends, the topic lent to it
  // (lend_to_timer): it neither takes solo ownership nor ends it, so the
  // topic's publisher stays solo after a pause in its stream.
  // Lent a chunk at a time: the topic's publisher waits for one chunk's
  // routes at most, not for a whole backlog's.
  std::int64_t next = 0;
  std::unique_lock releasing(queue.releasing);  // after a publisher's routing of earlier items
  for (;;) {
    const std::uint32_t n = queue.pop_due(now_ns(), items, kReleaseChunk, &next, t_.ever_solo);
    if (n > 0) {
      const std::uintptr_t lent = t_.lend_to_timer();
      route_popped(nullptr, items, n);
      t_.give_back(lent);
    }
    if (n < kReleaseChunk) break;
  }
  if (next != 0) t_.bus->arm_delayed(&queue.entry, next);
}

void TopicDelays::discard() noexcept {
  constexpr std::uint32_t kChunk = 64;
  DelayQueue::Item items[kChunk];
  for (;;) {
    const std::uint32_t n = queue.pop_any(items, kChunk);
    for (std::uint32_t i = 0; i < n; ++i) t_.pool.free(t_.pool.at(items[i].index));
    if (n < kChunk) return;
  }
}

}  // namespace lanebus::detail
