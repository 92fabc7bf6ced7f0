// lanebus — MIT License.
// Transactional consume (doc/idempotency.md): user tables, the Transaction handle and
// the commit of a handler's effects with its ack.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "names.hpp"
#include "trace.hpp"

namespace lanebus {
namespace detail {

// ---------------------------------------------------------------- transactional consume

namespace {

constexpr std::size_t kMaxUserKey = 500;

Result<std::string> user_key(std::string_view table, std::string_view key) {
  if (Status s = check_name(table, "table"); !s.ok()) return s;
  if (key.empty() || key.size() > kMaxUserKey)
    return Status(Code::InvalidArgument, "table \"" + std::string(table) + "\": keys must be 1.." +
                                             std::to_string(kMaxUserKey) + " bytes");
  std::string k(table);
  k.push_back('\0');
  k.append(key);
  return k;
}

}  // namespace

Result<std::string> user_key_public(std::string_view table, std::string_view key) { return user_key(table, key); }


Status validate_reads(StoreTxn& t, const TxnState& tx, std::string_view topic) {
  for (const TxnState::Read& r : tx.reads) {
    auto cur = t.get(StoreTable::User, r.key);
    if (!cur.ok() && cur.code() != Code::NotFound) return cur.status();
    const bool found = cur.ok();
    if (found != r.found || (found && *cur != r.value))
      return Status(Code::Conflict, "transaction of \"" + std::string(topic) + "\": a value it read changed");
  }
  // A fence it passed: the decision holds only if the record is unchanged
  // (the HWM only rises, so a changed record may now refuse this token).
  for (const TxnState::Fence& f : tx.fences) {
    auto cur = t.get(StoreTable::Fence, f.key);
    if (!cur.ok() && cur.code() != Code::NotFound) return cur.status();
    const bool found = cur.ok();
    if (found != f.found || (found && *cur != f.seen))
      return Status(Code::Conflict, "transaction of \"" + std::string(topic) + "\": a fence it checked moved");
  }
  return Status();
}

Status write_effects(StoreTxn& t, const TxnState& tx) {
  // A refused fence voided the transaction: its buffers are empty (fence.cpp).
  for (const TxnState::Fence& f : tx.fences) {
    if (!f.advance) continue;
    Status fs = t.put(StoreTable::Fence, f.key, *f.advance);
    if (!fs.ok()) return fs;
  }
  for (const auto& [k, v] : tx.writes) {
    Status ws = v ? t.put(StoreTable::User, k, *v) : t.del(StoreTable::User, k);
    if (!ws.ok() && ws.code() != Code::NotFound) return ws;
  }
  for (const AppendRequest& req : tx.outbox) {
    auto r = t.append(req);
    if (!r.ok()) return r.status();
  }
  return Status();
}

void count_outbox(const TxnState& tx) noexcept {
  for (std::size_t i = 0; i < tx.outbox.size() && i < tx.outbox_ns.size(); ++i) {
    if (NamespaceState* ns = tx.outbox_ns[i]; ns != nullptr) {
      const AppendRequest& r = tx.outbox[i];
      ns->count_in(1, r.key.size() + r.idempotency_key.size() + r.payload.size());
    }
  }
}

Status DurableRunner::apply_tx(StoreTxn& t, GroupLane* gl, TxnState& tx, const StoredMessage& m, std::uint32_t attempt,
                         bool* duplicate) {
  GroupImpl* g = gl->group;
  const bool queue = g->topic->is_queue;
  IdempotencyImpl* idem = (g->idempotency != nullptr && !m.idempotency_key.empty()) ? g->idempotency : nullptr;
  *duplicate = false;
  // 1. Validate everything the handler read (no write yet: a Conflict
  //    leaves the batch's other operations untouched).
  if (Status vs = validate_reads(t, tx, g->topic->name); !vs.ok()) return vs;
  // The idempotency key decides here, in the same transaction as the
  // effects: a key done meanwhile (a duplicate in another lane) writes nothing.
  if (idem != nullptr) {
    auto rec = idem->status_in(t, m.idempotency_key);
    if (!rec.ok() && rec.code() != Code::NotFound && rec.code() != Code::PayloadTooLarge &&
        rec.code() != Code::InvalidArgument)
      return rec.status();
    *duplicate = rec.ok() && rec->state == ClaimState::Done;
  }
  // 2. The ack / offset commit validates before it writes (a redelivered
  //    queue message gives StaleToken here, before anything is written).
  Status as = queue ? t.ack(g->store_group, gl->lane, m.offset, attempt)
                    : t.commit_offset(g->store_group, gl->lane, m.offset + 1);
  if (!as.ok()) return as;
  // 3. From here on only storage errors can fail (they abort the batch).
  if (queue && bus_.dlq_ && attempt > 1) {
    Status fs = bus_.dlq_->forget_outcomes_in(t, g->store_group, gl->lane, m.offset);
    if (!fs.ok() && fs.code() != Code::NotFound) return fs;
  }
  if (*duplicate) return Status();
  if (idem != nullptr) {
    Status cs = idem->complete_in(t, m.idempotency_key, {}, false);
    if (!cs.ok() && cs.code() != Code::PayloadTooLarge && cs.code() != Code::InvalidArgument) return cs;
  }
  return write_effects(t, tx);
}

}  // namespace detail

// ---------------------------------------------------------------- public API

Result<std::string> Transaction::get(std::string_view table, std::string_view key) {
  if (state_->is_void()) return state_->refused;
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  auto w = state_->writes.find(*k);
  if (w != state_->writes.end()) {
    if (!w->second) return Status(Code::NotFound, "table \"" + std::string(table) + "\": key deleted in this transaction");
    return *w->second;
  }
  for (const auto& r : state_->reads)
    if (r.key == *k) {
      if (!r.found) return Status(Code::NotFound, "table \"" + std::string(table) + "\": no such key");
      return r.value;
    }
  detail::TxnState::Read read;
  read.key = *k;
  if (state_->overlay != nullptr) {
    // Written by an earlier message of the same lane batch, not committed
    // yet: it commits first, in the same transaction (validation sees it).
    auto o = state_->overlay->find(*k);
    if (o != state_->overlay->end()) {
      read.found = o->second.has_value();
      if (read.found) read.value = *o->second;
      state_->reads.push_back(read);
      if (!read.found) return Status(Code::NotFound, "table \"" + std::string(table) + "\": no such key");
      return read.value;
    }
  }
  Status s = state_->store->read([&](detail::StoreTxn& t) -> Status {
    auto v = t.get(detail::StoreTable::User, read.key);
    if (!v.ok() && v.code() != Code::NotFound) return v.status();
    read.found = v.ok();
    if (v.ok()) read.value.assign(*v);
    return Status();
  });
  if (!s.ok()) return s;
  state_->reads.push_back(read);
  if (!read.found) return Status(Code::NotFound, "table \"" + std::string(table) + "\": no such key");
  return read.value;
}

Status Transaction::put(std::string_view table, std::string_view key, std::string_view value) {
  if (state_->is_void()) return state_->refused;
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  state_->writes[*k] = std::string(value);
  return Status();
}

Status Transaction::del(std::string_view table, std::string_view key) {
  if (state_->is_void()) return state_->refused;
  auto k = detail::user_key_public(table, key);
  if (!k.ok()) return k.status();
  state_->writes[*k] = std::nullopt;
  return Status();
}

Status Transaction::publish(const Topic& topic, const OutgoingMessage& message) {
  if (state_->is_void()) return state_->refused;
  if (topic.impl_ == nullptr || topic.impl_->bus != state_->bus || !topic.impl_->durable)
    return Status(Code::InvalidArgument, "outbox publish: the topic must be a durable topic or queue of this bus");
  detail::TopicImpl* t = topic.impl_;
  auto enqueue = [this, t](const OutgoingMessage& m) -> Status {
    if (m.payload.empty()) return Status(Code::InvalidArgument, "outbox publish: the payload is empty");
    // A typed topic checks the record like a normal publish (doc/schemas.md):
    // a bad record is refused here and never reaches the outbox.
    std::uint16_t schema_version;
    if (Status st = t->check_schema(m, &schema_version); !st.ok()) return st;
    // Headers, and the handler's trace context as the parent (trace.hpp).
    detail::HeaderBlock headers;
    if (Status st = detail::stored_headers(m, &headers); !st.ok()) return st;
    state_->outbox.push_back(t->append_request(m, headers.bytes()));
    state_->outbox.back().header.schema_version = schema_version;
    state_->outbox_ns.push_back(t->ns.load(std::memory_order_acquire));
    return Status();
  };
  // The Tracer's publish span (trace.hpp): it ends when the message is in the
  // outbox, not at the transaction's commit.
  if (Tracer* tracer = t->bus->options.tracer)
    return detail::traced_publish(tracer, t->name, lane_for_key(message.key, t->options.lanes), message, enqueue);
  return enqueue(message);
}
}  // namespace lanebus
