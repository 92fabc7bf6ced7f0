// lanebus — MIT License.
// Per-message delivery steps shared by the lane runners: handler calls,
// retry planning, idempotency, dead-lettering.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

void BusCore::record_latency(GroupLane* gl, std::int64_t created_at_ns) noexcept {
  const std::int64_t d = now_ns() - created_at_ns;
  gl->latency.record(d > 0 ? static_cast<std::uint64_t>(d) : 0);
}

Outcome BusCore::call_handler(Consumer* c, MessageView& view, GroupLane* gl, TxnState* tx) noexcept {
  const GroupOptions& o = gl->group->options;
  std::int64_t deadline = 0;
  if (o.attempt_timeout.count() > 0) {
    deadline = now_ns() + std::chrono::duration_cast<std::chrono::nanoseconds>(o.attempt_timeout).count();
    view.set_deadline_ns(deadline);
  }
  Outcome out = Outcome::ack();
  tl_running_consumer = c;
  tl_running_bus = this;
  try {
    if (c->tx_handler) {
      if (tx == nullptr) {
        out = Outcome::reject("transactional handler on a non-durable lane");
      } else {
        tx->clear();
        Transaction t(tx);
        out = c->tx_handler(view, t);
      }
    } else {
      out = c->handler(view);
    }
  } catch (const std::exception&) {
    out = Outcome::retry("handler threw an exception");
  } catch (...) {
    out = Outcome::retry("handler threw a non-standard exception");
  }
  tl_running_consumer = nullptr;
  tl_running_bus = nullptr;
  if (deadline != 0 && out.kind() == Outcome::Kind::Retry && now_ns() > deadline) bump(gl->timed_out);
  return out;
}

bool BusCore::plan_retry(GroupLane* gl, std::uint32_t attempt) noexcept {
  const GroupOptions& o = gl->group->options;
  if (attempt >= o.max_attempts) return false;
  gl->retry_delay_ns = 0;
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
    gl->retry_delay_ns = d > 0 ? static_cast<std::int64_t>(d) : 0;
  }
  return true;
}

BusCore::Dedup BusCore::dedup_claim(GroupLane* gl, std::string_view key) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || key.empty()) return Dedup::Proceed;
  try {
    auto r = idem->claim(key, false);
    if (!r.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      // An oversized or empty key can never be claimed: handle it unguarded
      // rather than wedging the lane. Storage errors: try again later.
      return (r.code() == Code::PayloadTooLarge || r.code() == Code::InvalidArgument) ? Dedup::Proceed
                                                                                          : Dedup::Later;
    }
    if (r->state == ClaimState::Done) return Dedup::Skip;
    if (r->state == ClaimState::InProgress) return Dedup::Later;
    return Dedup::Proceed;
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return Dedup::Later;
  }
}

void BusCore::dedup_finish(GroupLane* gl, std::string_view key, bool acked) noexcept {
  IdempotencyImpl* idem = gl->group->idempotency;
  if (idem == nullptr || key.empty()) return;
  try {
    Status s = acked ? idem->complete(key, {}) : idem->release(key);
    if (!s.ok() && s.code() != Code::PayloadTooLarge && s.code() != Code::InvalidArgument)
      gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

// ---------------------------------------------------------------- dead letters

DlqEntry BusCore::dlq_entry(GroupLane* gl, const MessageHeader& h, std::string_view key, std::string_view idem,
                            std::string_view payload, std::uint64_t offset, const Outcome& out,
                            std::uint32_t attempts, ErrorClass cls) const {
  const GroupImpl* g = gl->group;
  DlqEntry e;
  e.header = h;
  e.header.attempt = attempts;
  e.key.assign(key);
  e.idempotency_key.assign(idem);
  e.payload.assign(payload);
  e.error_class = cls;
  e.reason.assign(out.reason().empty() ? (out.kind() == Outcome::Kind::Reject ? "rejected" : "retries exhausted")
                                       : out.reason());
  e.error_text = std::string(to_string(cls)) + " failure after " + std::to_string(attempts) + " attempt(s)";
  e.attempts = attempts;
  e.last_failure_ns = now_ns();
  e.first_failure_ns = gl->first_failure_ns ? gl->first_failure_ns : e.last_failure_ns;
  e.topic = g->topic->name;
  e.topic_id = g->topic->durable ? g->topic->store_topic.id : 0;
  e.lane = gl->lane;
  e.offset = offset;
  e.group = g->topic->is_queue ? std::string("queue") : g->name;
  return e;
}

void BusCore::dead_letter_ephemeral(GroupLane* gl, const Slot* s, const Outcome& out) noexcept {
  if (!dlq_) return;  // an in-memory bus: failures are only counted
  try {
    const ErrorClass cls = classify_failure(out.kind(), gl->attempts, gl->attempts, false, 0);
    auto r = dlq_->add(dlq_entry(gl, s->header, s->key(), s->idempotency_key(), s->payload(), 0, out, gl->attempts,
                                 cls));
    if (!r.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
  } catch (...) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

bool BusCore::dead_letter_durable(GroupLane* gl, const StoredMessage& m, const Outcome& out, std::uint32_t attempts,
                                  ErrorClass cls) {
  GroupImpl* g = gl->group;
  const bool queue = g->topic->is_queue;
  DlqEntry e = dlq_entry(gl, m.header, m.key, m.idempotency_key, m.payload, m.offset, out, attempts, cls);
  Status s = store_->write([&](StoreTxn& t) -> Status {
    return dlq_
        ->add_in(t, e,
                 [&]() -> Status {
                   if (!queue) return t.commit_offset(g->store_group, gl->lane, m.offset + 1);
                   Status as = t.ack(g->store_group, gl->lane, m.offset, m.header.attempt);
                   return as.ok() ? dlq_->forget_outcomes_in(t, g->store_group, gl->lane, m.offset) : as;
                 })
        .status();
  });
  if (s.ok() || s.code() == Code::StaleToken) return true;  // StaleToken: already redelivered elsewhere
  gl->errors.fetch_add(1, std::memory_order_relaxed);
  return false;
}

Status BusCore::republish(const DlqEntry& e) {
  TopicImpl* t = find(e.topic);
  if (t == nullptr) return Status(Code::NotFound, "dlq replay: no topic \"" + e.topic + "\" in this bus");
  OutgoingMessage m;
  m.key = e.key;
  m.payload = e.payload;
  m.idempotency_key = e.idempotency_key;
  m.correlation_id = e.header.correlation_id;
  m.content_type = e.header.content_type;
  m.schema_version = e.header.schema_version;
  return t->durable ? t->publish_durable(m, {}) : t->publish(m, true, take_ids(1));
}

Status BusCore::release_claim(GroupLane* gl, const StoredMessage& m, std::uint32_t attempt,
                              std::chrono::milliseconds delay) {
  GroupImpl* g = gl->group;
  if (dlq_) {
    // Every deliberate release counts as an attempt that came back with an
    // outcome: poison detection treats claims without one as consumer crashes.
    // (A crash between the two commits errs towards "not poison".)
    Status ns = store_->write([&](StoreTxn& t) -> Status {
      return dlq_->note_outcome_in(t, g->store_group, gl->lane, m.offset).status();
    });
    if (!ns.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
  return store_->release(g->store_group, gl->lane, m.offset, attempt, delay);
}

void BusCore::dlq_maintenance() noexcept {
  if (!dlq_) return;
  try {
    for (int i = 0; i < 16; ++i) {
      auto r = dlq_->expire();
      if (!r.ok() || *r < dlq_->options().expire_batch) break;
    }
    (void)dlq_->replay_due_transient(dlq_->options().transient_cooldown, "auto",
                                     [this](const DlqEntry& e) { return republish(e); });
  } catch (...) {
  }
}

}  // namespace lanebus::detail
