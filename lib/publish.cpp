// lanebus — MIT License.
// The publish path: ephemeral slots and rings with backpressure, durable appends.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

bool TopicImpl::drop_oldest(std::uint32_t first_lane) noexcept {
  bool dropped_any = false;
  std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < options.lanes; ++i) {
    std::uint32_t lane = (first_lane + i) % options.lanes;
    for (std::uint32_t gi = 0; gi < ng; ++gi) {
      GroupImpl* g = groups[gi].load(std::memory_order_acquire);
      if (g == nullptr) continue;
      GroupLane& gl = *g->lanes[lane];
      std::uint32_t idx;
      if (gl.ring.try_dequeue(idx)) {
        gl.dropped.fetch_add(1, std::memory_order_relaxed);
        pool.release(pool.at(idx));
        dropped_any = true;
      }
    }
    if (dropped_any) return true;
  }
  return false;
}

Slot* TopicImpl::acquire_slot(std::uint32_t lane, bool may_block) noexcept {
  Slot* s = pool.try_alloc();
  if (s != nullptr) return s;
  switch (options.backpressure) {
    case Backpressure::FailFast:
      return nullptr;
    case Backpressure::DropOldest: {
      // A drop frees a slot unless another group or a worker still holds the
      // message; keep dropping (bounded by the pool size) until one is free.
      for (std::uint32_t tries = 0; tries <= capacity; ++tries) {
        if (!drop_oldest(lane)) break;
        if ((s = pool.try_alloc()) != nullptr) return s;
      }
      if ((s = pool.try_alloc()) != nullptr) return s;
      if (!may_block) return nullptr;
      [[fallthrough]];
    }
    case Backpressure::Block: {
      if (!may_block) return nullptr;
      // Workers free slots in batches within microseconds: spin, then yield,
      // then sleep in short steps until the deadline. The deadline is taken
      // when the spinning ends, not on entry: a clock read costs 80-100 ns on
      // a VM (perf: a third of a blocked publisher's time), more than the
      // spin usually lasts; block_timeout is then late by the spin (< 50 µs).
      std::chrono::steady_clock::time_point deadline{};
      for (std::uint32_t spin = 0;; ++spin) {
        if ((s = pool.try_alloc()) != nullptr) return s;
        if (bus->closing()) return nullptr;
        if (spin < 256) {
          cpu_relax();
        } else if (spin < 2048) {
          if (spin == 256) deadline = std::chrono::steady_clock::now() + options.block_timeout;
          std::this_thread::yield();
        } else {
          if (std::chrono::steady_clock::now() >= deadline) return nullptr;
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    }
  }
  return nullptr;
}

// Typed topics (doc/schemas.md): the record must match the latest schema
// version; *version is the version stamped on the message. Untyped topics:
// one atomic load.
Status TopicImpl::check_schema(const OutgoingMessage& m, std::uint16_t* version) noexcept {
  *version = m.schema_version;
  const SchemaVersion* sv = schema.load(std::memory_order_acquire);
  if (sv == nullptr) return Status();
  Status st = bus->schemas()->check_publish(this, sv, m.payload, m.schema_version, version);
  if (!st.ok()) refused.fetch_add(1, std::memory_order_relaxed);
  return st;
}

Status TopicImpl::publish(const OutgoingMessage& m, bool may_block, std::uint64_t id) noexcept {
  if (m.payload.empty()) return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  std::uint16_t schema_version;
  if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  std::size_t need = m.key.size() + m.idempotency_key.size() + m.payload.size();
  if (need > options.slot_bytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: key + idempotency key + payload exceed the topic's slot_bytes "
                                "(raise TopicOptions::slot_bytes)");
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");

  const std::uint32_t lane = lane_for_key(m.key, options.lanes);
  Slot* s = acquire_slot(lane, may_block);
  if (s == nullptr) {
    if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
    refused.fetch_add(1, std::memory_order_relaxed);
    if (may_block && options.backpressure != Backpressure::FailFast)
      return Status::from_literal(Code::TimedOut, "publish: the topic stayed full for its whole block_timeout");
    return Status::from_literal(Code::WouldBlock, "publish: the topic is full (all capacity slots in use)");
  }
  // try_alloc incremented the pool's in_use (seq_cst); shutdown sets closing
  // and then waits on in_use, so either we see closing here or it waits for us.
  if (bus->closing()) {
    pool.free(s);
    return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  }

  s->lane = lane;
  s->key_len = static_cast<std::uint32_t>(m.key.size());
  s->idem_len = static_cast<std::uint32_t>(m.idempotency_key.size());
  s->payload_len = static_cast<std::uint32_t>(m.payload.size());
  char* d = s->data();
  if (!m.key.empty()) std::memcpy(d, m.key.data(), m.key.size());
  if (!m.idempotency_key.empty()) std::memcpy(d + m.key.size(), m.idempotency_key.data(), m.idempotency_key.size());
  std::memcpy(d + m.key.size() + m.idempotency_key.size(), m.payload.data(), m.payload.size());
  s->header.id = id;
  s->header.created_at_ns = now_ns();
  s->header.correlation_id = m.correlation_id;
  s->header.fencing_token = m.fencing_token;
  s->header.attempt = 0;
  s->header.content_type = m.content_type;
  s->header.schema_version = schema_version;
  // Route to every active group. The slot's reference count must be final
  // before the first ring push makes it visible, so collect the targets first
  // (a group deactivated meanwhile still drains its rings, so a stale target
  // is harmless). More groups than fit the local array: guard-reference path.
  constexpr std::uint32_t kInline = 16;
  GroupLane* targets[kInline];
  std::uint32_t n = 0;
  bool overflow = false;
  const std::uint32_t ng = group_count.load(std::memory_order_acquire);
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    if (n == kInline) {
      overflow = true;
      break;
    }
    targets[n++] = g->lanes[lane].get();
  }
  lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
  if (n == 0) {
    unrouted.fetch_add(1, std::memory_order_relaxed);
    pool.free(s);
    return Status();
  }
  const std::uint32_t index = pool.index_of(s);
  // The ring holds at most `capacity` entries and every entry pins a live
  // slot, so it cannot be full; a failed try only means a dequeuer of the
  // cell we need has not finished its store yet.
  auto push = [&](GroupLane* gl) {
    while (!gl->ring.try_enqueue(index)) std::this_thread::yield();
    bus->schedule(gl);
  };
  if (!overflow) {
    // relaxed: the seq_cst ring push below publishes the count with the slot.
    s->refs.store(n, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < n; ++i) push(targets[i]);
    return Status();
  }
  s->refs.store(1, std::memory_order_relaxed);  // the publisher's guard
  for (std::uint32_t gi = 0; gi < ng; ++gi) {
    GroupImpl* g = groups[gi].load(std::memory_order_acquire);
    if (g == nullptr || !g->active.load(std::memory_order_acquire)) continue;
    s->refs.fetch_add(1, std::memory_order_relaxed);  // relaxed: we still hold the guard
    push(g->lanes[lane].get());
  }
  pool.release(s);  // drop the guard
  return Status();
}

AppendRequest TopicImpl::append_request(const OutgoingMessage& m) const {
  AppendRequest req;
  req.topic_id = store_topic.id;
  req.lane = lane_for_key(m.key, options.lanes);
  req.header.id = 0;  // the store assigns ids unique across restarts and processes
  req.header.created_at_ns = now_ns();
  req.header.correlation_id = m.correlation_id;
  req.header.fencing_token = m.fencing_token;
  req.header.content_type = m.content_type;
  req.header.schema_version = m.schema_version;
  req.key.assign(m.key);
  req.idempotency_key.assign(m.idempotency_key);
  req.payload.assign(m.payload);
  return req;
}

Status TopicImpl::publish_durable(const OutgoingMessage& m, PublishCallback done) {
  if (m.payload.empty()) return Status::from_literal(Code::InvalidArgument, "publish: the payload is empty");
  if (bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
  std::uint16_t schema_version;
  if (Status st = check_schema(m, &schema_version); !st.ok()) return st;
  AppendRequest req = append_request(m);
  req.header.schema_version = schema_version;
  const std::uint32_t lane = req.lane;
  if (!done) {
    auto r = bus->store()->append(std::move(req));
    if (!r.ok()) {
      refused.fetch_add(1, std::memory_order_relaxed);
      return r.status();
    }
    lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
    return Status();
  }
  Status s = bus->store()->append_async(
      std::move(req), [this, lane, done = std::move(done)](const Status& st, const AppendResult& res) {
        if (st.ok()) {
          lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
        } else {
          refused.fetch_add(1, std::memory_order_relaxed);
        }
        done(st, res.offset);
      });
  if (!s.ok()) refused.fetch_add(1, std::memory_order_relaxed);
  return s;
}

}  // namespace lanebus::detail
