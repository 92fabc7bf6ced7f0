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

bool DelayQueue::push(std::uint32_t index, std::int64_t due_ns, std::uint32_t capacity) {
  std::lock_guard l(mu_);
  if (heap_.capacity() < capacity) heap_.reserve(capacity);  // once per topic (design notes)
  heap_.push_back(Item{due_ns, seq_++, index});
  std::size_t i = heap_.size() - 1;
  while (i > 0) {
    const std::size_t parent = (i - 1) / 2;
    if (!before(heap_[i], heap_[parent])) break;
    std::swap(heap_[i], heap_[parent]);
    i = parent;
  }
  return i == 0;
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

std::uint32_t DelayQueue::pop_due(std::int64_t now_ns, Item* out, std::uint32_t max, std::int64_t* next) noexcept {
  std::lock_guard l(mu_);
  std::uint32_t n = 0;
  while (n < max && !heap_.empty() && heap_.front().due_ns <= now_ns) {
    out[n++] = heap_.front();
    pop_root();
  }
  *next = heap_.empty() ? 0 : heap_.front().due_ns;
  return n;
}

std::uint32_t DelayQueue::pop_any(Item* out, std::uint32_t max) noexcept {
  std::lock_guard l(mu_);
  std::uint32_t n = 0;
  while (n < max && !heap_.empty()) {
    out[n++] = heap_.front();
    pop_root();
  }
  return n;
}

std::size_t DelayQueue::size() const noexcept {
  std::lock_guard l(mu_);
  return heap_.size();
}

// ---------------------------------------------------------------- the timed publish

namespace {
/// A slot with an extension block: the keys, the block (times, then the
/// stored headers), the payload unless `inline_payload` is false (place_large
/// puts it), and the header.
void fill_extended_slot(Slot* s, const OutgoingMessage& m, std::uint32_t lane, std::uint64_t id, std::int64_t now,
                        std::uint16_t schema_version, const MessageTimes& times, std::string_view headers,
                        bool inline_payload) noexcept {
  const std::size_t keys = m.key.size() + m.idempotency_key.size();
  s->lane = static_cast<std::uint16_t>(lane);
  s->kind = Slot::kExtension;  // a free slot is kInline (MessagePool::recycle)
  s->key_len = static_cast<std::uint16_t>(m.key.size());
  s->idem_len = static_cast<std::uint16_t>(m.idempotency_key.size());
  s->payload_len = static_cast<std::uint32_t>(m.payload.size());
  char* d = s->data();
  if (!m.key.empty()) std::memcpy(d, m.key.data(), m.key.size());
  if (!m.idempotency_key.empty()) std::memcpy(d + m.key.size(), m.idempotency_key.data(), m.idempotency_key.size());
  write_extension(d + keys, times, headers);
  if (inline_payload) std::memcpy(d + keys + kExtensionBytes + headers.size(), m.payload.data(), m.payload.size());
  s->header.id = id;
  s->header.created_at_ns = now;
  s->header.correlation_id = m.correlation_id;
  s->header.fencing_token = m.fencing_token;
  s->header.attempt = 0;
  s->header.content_type = m.content_type;
  s->header.schema_version = schema_version;
}
}  // namespace

Status TopicImpl::publish_timed(const OutgoingMessage& m, bool may_block, std::uint64_t id,
                                const PayloadFill* fill) noexcept {
  if (owner.load(std::memory_order_relaxed) != 1) make_shared();
  if (m.payload.empty() && fill == nullptr)
    return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  if (fill == nullptr && objects_only.load(std::memory_order_relaxed))
    return Status::from_literal(Code::InvalidArgument,
                                "publish: the topic carries typed objects; publish through its TypedTopic<T>");
  const std::int64_t now = now_ns();
  MessageTimes times;
  try {
    if (Status st = resolve_times(m, options.default_ttl.count(), now, &times); !st.ok()) {
      refused.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
  } catch (const std::bad_alloc&) {
    return Status::from_literal(Code::InvalidArgument, "publish: bad delay or ttl (out of memory naming it)");
  }
  std::uint16_t schema_version = m.schema_version;
  if (schema.load(std::memory_order_relaxed) != nullptr) {
    if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  }
  if ((m.key.size() | m.idempotency_key.size()) > Slot::kMaxKeyBytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the key or idempotency key exceeds 65535 bytes (the limit of an "
                                "in-memory topic's slot)");
  // Headers, and the calling handler's trace context (trace.hpp), after the times.
  HeaderBlock headers;
  if (Status st = stored_headers(m, &headers); !st.ok()) {
    refused.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  const std::size_t ext = kExtensionBytes + headers.bytes().size();
  const std::size_t keys = m.key.size() + m.idempotency_key.size();
  const std::size_t need = keys + (fill ? fill->size : m.payload.size());
  const bool large = need + ext > options.slot_bytes || fill != nullptr;
  if (large) {
    if (keys + ext > options.slot_bytes) {
      refused.fetch_add(1, std::memory_order_relaxed);
      return Status::from_literal(Code::PayloadTooLarge,
                                  "publish: key + idempotency key + the headers (and trace context) exceed the "
                                  "topic's slot_bytes (raise TopicOptions::slot_bytes; doc/tracing.md)");
    }
    if (Status st = check_large(m, fill, ext); !st.ok()) return st;
  }
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  NamespaceState* const nsp = ns.load(std::memory_order_acquire);
  if (Status q = nsp->admit_publish(need, may_block && options.backpressure == Backpressure::Block,
                                    options.block_timeout);
      !q.ok())
    return q;
  const std::uint32_t lane = lane_for_key(m.key, options.lanes);
  Slot* s = pool.try_alloc();
  if (s == nullptr) s = acquire_slot(lane, may_block);
  if (s == nullptr) {
    nsp->unadmit_publish(need);
    return no_slot(may_block);
  }
  if (bus->closing()) {  // shutdown's Dekker, as in publish
    pool.free(s);
    nsp->unadmit_publish(need);
    return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  }
  fill_extended_slot(s, m, lane, id, now, schema_version, times, headers.bytes(), !large);
  if (large) {
    if (Status st = place_large(s, m, fill, lane, may_block); !st.ok()) {
      pool.free(s);
      nsp->unadmit_publish(need);
      return st;
    }
  }
  if (times.due_ns <= now) {
    route(s, lane, false);  // not delayed (only an expiry), or due already
    return Status();
  }
  bool earliest;
  try {
    earliest = delays.push(pool.index_of(s), times.due_ns, pool.capacity());
  } catch (const std::bad_alloc&) {  // the heap's one-time reservation
    pool.free(s);
    nsp->unadmit_publish(need);
    return Status::from_literal(Code::Internal, "publish: out of memory reserving the topic's delay heap");
  }
  if (earliest) bus->arm_delayed(&delays.entry, times.due_ns);
  return Status();
}

void TopicImpl::release_due() noexcept {
  constexpr std::uint32_t kChunk = 64;
  DelayQueue::Item items[kChunk];
  std::int64_t next = 0;
  for (;;) {
    const std::uint32_t n = delays.pop_due(now_ns(), items, kChunk, &next);
    for (std::uint32_t i = 0; i < n; ++i) {
      Slot* s = pool.at(items[i].index);
      s->header.created_at_ns = items[i].due_ns;  // it enters its lane now (the order rule; latency from here)
      route(s, s->lane, false);
    }
    if (n < kChunk) break;
  }
  if (next != 0) bus->arm_delayed(&delays.entry, next);
}

void TopicImpl::discard_delayed() noexcept {
  constexpr std::uint32_t kChunk = 64;
  DelayQueue::Item items[kChunk];
  for (;;) {
    const std::uint32_t n = delays.pop_any(items, kChunk);
    for (std::uint32_t i = 0; i < n; ++i) pool.free(pool.at(items[i].index));
    if (n < kChunk) return;
  }
}

// ---------------------------------------------------------------- the bus side

void BusCore::arm_delayed(DelayEntry* e, std::int64_t due_wall_ns) noexcept {
  if (!timer_) return;
  const std::int64_t wait = due_wall_ns - now_ns();
  try {
    timer_->arm(e, RetryTimer::now_ns() + std::max<std::int64_t>(wait, 0));
  } catch (...) {
    // RetryTimer::arm takes a std::mutex: it throws only if locking fails.
  }
}

void BusCore::discard_delayed() noexcept {
  MutexLock l(&mu_);
  for (auto& [name, t] : topics_)
    if (!t->durable) t->discard_delayed();
}

bool BusCore::expire_if_due(GroupLane* gl, Slot* s, std::uint32_t attempts, std::int64_t first_failure_ns) noexcept {
  if (!slot_expired(s, now_ns())) return false;
  gl->expired.fetch_add(1, std::memory_order_relaxed);
  if (gl->group->options.dead_letter_expired)
    dead_letter_ephemeral(gl, s, Outcome::reject("expired: its ttl ended before a handler call started"), attempts,
                          ErrorClass::Expired, first_failure_ns);
  return true;
}

std::int64_t BusCore::clip_to_expiry(const Slot* s, std::int64_t wait_ns) noexcept {
  const MessageTimes t = slot_times(s);
  if (t.expires_ns == 0) return wait_ns;
  const std::int64_t left = t.expires_ns - now_ns();
  return std::min(wait_ns, std::max<std::int64_t>(left, 0) + 1);
}

}  // namespace lanebus::detail
