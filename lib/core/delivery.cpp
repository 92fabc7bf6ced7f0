// lanebus — MIT License.
// The delivery core (lib/core/delivery.hpp): admit, invoke and settle, shared by
// every lane runner (DeliveryCore), and dead-lettering.
#include "delivery.hpp"

#include <algorithm>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "trace.hpp"

namespace lanebus::detail {

void DeliveryCore::record_latency(GroupLane* gl, std::int64_t created_at_ns) noexcept {
  const std::int64_t d = now_ns() - created_at_ns;
  gl->latency.record(d > 0 ? static_cast<std::uint64_t>(d) : 0);
}

// ---------------------------------------------------------------- admit

Admission DeliveryCore::admit(GroupLane* gl, const Parcel& p, AdmitMode mode) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || p.idempotency_key.empty()) return Admission::Proceed;
  try {
    if (mode == AdmitMode::Check) {
      // Transactional consume: no in-progress claim. A done key is skipped
      // here; the commit decides again inside its own transaction.
      return idem->is_done(p.idempotency_key) ? Admission::Skip : Admission::Proceed;
    }
    auto r = idem->claim(p.idempotency_key, false);
    if (!r.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      // An oversized or empty key can never be claimed: handle it unguarded
      // rather than wedging the lane. Storage errors: try again later.
      return (r.code() == Code::PayloadTooLarge || r.code() == Code::InvalidArgument) ? Admission::Proceed
                                                                                          : Admission::Later;
    }
    if (r->state == ClaimState::Done) return Admission::Skip;
    if (r->state == ClaimState::InProgress) return Admission::Later;
    return Admission::Proceed;
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return Admission::Later;
  }
}

void DeliveryCore::finish_key(GroupLane* gl, std::string_view key, bool acked) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || key.empty()) return;
  try {
    Status s = acked ? idem->complete(key, {}) : idem->release(key);
    if (!s.ok() && s.code() != Code::PayloadTooLarge && s.code() != Code::InvalidArgument &&
        s.code() != Code::NotFound)
      gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------- invoke

Invocation DeliveryCore::invoke(Consumer* c, GroupLane* gl, const Parcel& p, TxnState* tx) noexcept {
  const GroupOptions& o = gl->group->options;
  MessageView view(*p.header, p.key, p.idempotency_key, p.payload, p.lane, p.offset);
  Access::set_attempt(view, p.attempt);
  Access::set_headers(view, p.headers);
  // Trace context and the tracer's span (trace.hpp): only with headers or a tracer.
  HandlerTrace trace;
  if (options_.tracer != nullptr || !p.headers.empty()) [[unlikely]] {
    const GroupImpl* g = gl->group;
    trace.begin(options_.tracer, g->topic->name, g->topic->is_queue ? std::string_view("queue") : g->name, view);
  }
  std::int64_t deadline = 0;
  bump(gl->delivered);
  if (o.attempt_timeout.count() > 0) {
    deadline = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(o.attempt_timeout).count();
    Access::set_deadline_ns(view, deadline);
    // The watchdog (scheduler.cpp) reads these while the call runs; the
    // owner is the only writer, so plain stores (no read-modify-write).
    gl->running_offset.store(p.offset, std::memory_order_relaxed);
    gl->running_attempt.store(p.attempt, std::memory_order_relaxed);
    gl->call_seq.store(gl->call_seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    gl->running_since_ns.store(RetryTimer::now_ns(), std::memory_order_release);
  } else {
    // No budget, no watchdog: only mark the call as running (for shutdown's
    // report), without a clock read on the hot path.
    gl->running_since_ns.store(kRunningUntimed, std::memory_order_relaxed);
  }
  Invocation inv;
  ++tl_delivered_msgs;  // tenancy usage (scheduler.cpp)
  tl_delivered_bytes += p.payload.size();
  tl_running_consumer = c;
  tl_running_bus = &bus_;
  tl_running_lane = gl;
  try {
    if (c->tx_handler) {
      if (tx == nullptr) {
        inv.outcome = Outcome::reject("transactional handler on a non-durable lane");
      } else {
        tx->clear();
        Transaction t = Access::transaction(tx);
        inv.outcome = c->tx_handler(view, t);
      }
    } else if (c->batch_handler) {
      // A batch handler outside the batch runner: a span of one.
      const BatchOutcome b = c->batch_handler(std::span<const MessageView>(&view, 1));
      inv.outcome = b.acked() >= 1 ? Outcome::ack() : b.next();
    } else {
      inv.outcome = c->handler(view);
    }
  } catch (const std::exception&) {
    inv.outcome = Outcome::retry("handler threw an exception");
  } catch (...) {
    inv.outcome = Outcome::retry("handler threw a non-standard exception");
  }
  trace.end(inv.outcome.kind());
  tl_running_consumer = nullptr;
  tl_running_bus = nullptr;
  tl_running_lane = nullptr;
  gl->running_since_ns.store(0, std::memory_order_release);
  inv.late = deadline != 0 && now_ns() > deadline;
  return inv;
}

BatchOutcome DeliveryCore::invoke_span(Consumer* c, GroupLane* gl, std::span<const MessageView> views) noexcept {
  tl_running_consumer = c;
  tl_running_bus = &bus_;
  tl_running_lane = gl;
  gl->running_since_ns.store(kRunningUntimed, std::memory_order_relaxed);
  const BatchOutcome out = call_batch_handler(c->batch_handler, views);
  tl_running_consumer = nullptr;
  tl_running_bus = nullptr;
  tl_running_lane = nullptr;
  gl->running_since_ns.store(0, std::memory_order_release);
  return out;
}

std::size_t DeliveryCore::span_settled(GroupLane* gl, const BatchOutcome& out, std::span<const MessageView> views,
                                       std::size_t* acked) noexcept {
  const std::size_t n = views.size();
  std::size_t a = std::min<std::size_t>(out.acked(), n);
  if (a < n && out.next().kind() == Outcome::Kind::Ack) ++a;  // an ack at the stop
  const std::size_t settled = a + (a < n ? 1 : 0);
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < settled; ++i) bytes += views[i].payload().size();
  tl_delivered_msgs += settled;  // tenancy usage (scheduler.cpp)
  tl_delivered_bytes += bytes;
  gl->delivered.store(gl->delivered.load(std::memory_order_relaxed) + settled, std::memory_order_relaxed);
  if (options_.metrics && a > 0) {
    const std::int64_t now = now_ns();
    for (std::size_t i = 0; i < a; ++i) {
      const std::int64_t d = now - views[i].created_at_ns();
      gl->latency.record(d > 0 ? static_cast<std::uint64_t>(d) : 0);
    }
  }
  *acked = a;
  return settled;
}

// ---------------------------------------------------------------- settle

bool DeliveryCore::plan_retry(GroupLane* gl, std::uint32_t attempt, std::int64_t* delay_ns) noexcept {
  const GroupOptions& o = gl->group->options;
  if (attempt >= o.max_attempts) return false;
  *delay_ns = 0;
  if (o.backoff_initial.count() > 0) {
    double d = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(o.backoff_initial).count());
    for (std::uint32_t i = 1; i < attempt; ++i) d *= o.backoff_multiplier;
    const double cap = static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(o.backoff_max).count());
    if (d > cap) d = cap;
    // xorshift64: per-lane state, owner-only, allocation-free.
    gl->rng ^= gl->rng << 13;
    gl->rng ^= gl->rng >> 7;
    gl->rng ^= gl->rng << 17;
    const double u = static_cast<double>(gl->rng >> 11) / 9007199254740992.0;  // [0, 1)
    d *= 1.0 + o.backoff_jitter * (2.0 * u - 1.0);
    *delay_ns = d > 0 ? static_cast<std::int64_t>(d) : 0;
  }
  return true;
}

Settlement DeliveryCore::settle(GroupLane* gl, const Parcel& p, const Invocation& inv, AdmitMode mode, bool durable,
                           std::uint32_t outcomes, std::int64_t* first_failure_ns) noexcept {
  Settlement st;
  const Outcome::Kind kind = inv.outcome.kind();
  // A claimed key: an ack completes it (durable lanes: in the commit that
  // acks), anything else releases it so a redelivery can claim it again.
  if (mode == AdmitMode::Claim && gl->group->idempotency != nullptr && !(durable && kind == Outcome::Kind::Ack)) {
    finish_key(gl, p.idempotency_key, kind == Outcome::Kind::Ack);
  }
  if (kind == Outcome::Kind::Ack) {
    st.acked = true;
    if (!durable) bump(gl->acked);
    if (options_.metrics) record_latency(gl, p.header->created_at_ns);
    *first_failure_ns = 0;
    if (gl->group->options.outage.enabled) outages_.on_ack(gl);
    return st;
  }
  const bool outage = gl->group->options.outage.enabled;
  if (*first_failure_ns == 0) *first_failure_ns = now_ns();
  if (kind == Outcome::Kind::Retry) {
    // fetch_add: a durable queue's commit completion also counts conflicts here.
    gl->retried.fetch_add(1, std::memory_order_relaxed);
    if (inv.late) bump(gl->timed_out);
    // A paused group (or this failure pauses it): uncounted, no DLQ.
    if (outage && outages_.on_transient(gl, p, inv, &st)) return st;
    if (plan_retry(gl, p.attempt, &st.delay_ns)) {
      st.next = Settlement::Next::Retry;
      return st;
    }
    bump(gl->failed);
  } else {
    bump(gl->rejected);
    if (outage) outages_.end_probe(gl);  // a permanent failure says nothing of the dependency
  }
  if (options_.metrics) record_latency(gl, p.header->created_at_ns);
  if (!dlq_) return st;  // an in-memory bus: failures are only counted
  st.next = Settlement::Next::DeadLetter;
  const std::uint32_t poison_after = durable ? dlq_->options().poison_after_crashes : 0;
  st.error_class = classify_failure(kind, p.attempt, std::max(outcomes, p.attempt > 0 ? 1u : 0u), inv.late,
                                    poison_after);
  return st;
}

// ---------------------------------------------------------------- dead letters

DlqEntry DeliveryCore::dlq_entry(GroupLane* gl, const MessageHeader& h, std::string_view key, std::string_view idem,
                            std::string_view payload, std::string_view headers, std::uint64_t offset,
                            const Outcome& out, std::uint32_t attempts, ErrorClass cls,
                            std::int64_t first_failure_ns) {
  const GroupImpl* g = gl->group;
  DlqEntry e;
  e.header = h;
  e.header.attempt = attempts;
  e.key.assign(key);
  e.idempotency_key.assign(idem);
  e.payload.assign(payload);
  e.headers.assign(headers);
  e.error_class = cls;
  e.reason.assign(out.reason().empty() ? (out.kind() == Outcome::Kind::Reject ? "rejected" : "retries exhausted")
                                       : out.reason());
  e.error_text = std::string(to_string(cls)) + " failure after " + std::to_string(attempts) + " attempt(s)";
  e.attempts = attempts;
  e.last_failure_ns = now_ns();
  e.first_failure_ns = first_failure_ns ? first_failure_ns : e.last_failure_ns;
  e.topic = g->topic->name;
  e.topic_id = g->topic->durable ? g->topic->store_topic.id : 0;
  e.lane = gl->lane;
  e.offset = offset;
  e.group = g->topic->is_queue ? std::string("queue") : g->name;
  return e;
}

DlqEntry DeliveryCore::dlq_entry(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                                 ErrorClass cls, std::int64_t first_failure_ns) {
  return dlq_entry(gl, m.header, m.key, m.idempotency_key, m.payload, m.headers, m.offset, out, attempts, cls,
                   first_failure_ns);
}

void DeliveryCore::dead_letter_ephemeral(GroupLane* gl, const Slot* s, const Outcome& out, std::uint32_t attempts,
                                    ErrorClass cls, std::int64_t first_failure_ns) noexcept {
  if (!dlq_) return;  // an in-memory bus: failures are only counted
  try {
    auto r = dlq_->add(dlq_entry(gl, s->header, s->key(), s->idempotency_key(), s->payload(), slot_headers(s), 0, out,
                                 attempts, cls, first_failure_ns));
    if (!r.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

bool DeliveryCore::dead_letter_topic(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                                ErrorClass cls, std::int64_t first_failure_ns, std::uint64_t commit_to) {
  GroupImpl* g = gl->group;
  DlqEntry e = dlq_entry(gl, m, out, attempts, cls, first_failure_ns);
  Status s = store_->write([&](StoreTxn& t) -> Status {
    return dlq_
        ->add_in(t, e,
                 [&]() -> Status {
                   return commit_to > gl->committed_sent ? t.commit_offset(g->store_group, gl->lane, commit_to)
                                                         : Status();
                 })
        .status();
  });
  if (s.ok()) {
    if (commit_to > gl->committed_sent) gl->committed_sent = commit_to;
    return true;
  }
  gl->errors.fetch_add(1, std::memory_order_relaxed);
  return false;
}

// ---------------------------------------------------------------- expiry (doc/delays.md)

bool DeliveryCore::expire_if_due(GroupLane* gl, Slot* s, std::uint32_t attempts, std::int64_t first_failure_ns) noexcept {
  // A delayed message without an expiry reads no clock (one per delivery was
  // 6 % of delayed_1to1's samples: clock_gettime and the wall clock's refresh).
  const MessageTimes t = slot_times(s);
  if (t.expires_ns == 0 || now_ns() < t.expires_ns) return false;
  gl->expired.fetch_add(1, std::memory_order_relaxed);
  if (gl->group->options.dead_letter_expired)
    dead_letter_ephemeral(gl, s, Outcome::reject("expired: its ttl ended before a handler call started"), attempts,
                          ErrorClass::Expired, first_failure_ns);
  return true;
}

}  // namespace lanebus::detail
