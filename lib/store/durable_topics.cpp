// lanebus — MIT License.
// TopicLog: the topic catalogue, appends and id reservation.
#include "durable_store.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <utility>
#include <vector>

#include "durable_store_impl.hpp"
#include "names.hpp"
#include "quote.hpp"

namespace lanebus::detail {

// ======================================================================
// topics

Result<TopicRef> TopicLog::topic_by_id(std::uint32_t id) const {
  MutexLock l(&topics_mutex_);
  auto it = topics_.find(id);
  if (it == topics_.end()) {
    return Status(Code::InvalidArgument, "topic id " + std::to_string(id) + " is not open in this store");
  }
  return it->second;
}

int TopicLog::topic_kind(std::uint32_t id, std::uint32_t* lanes) const {
  if (id < kKnownKinds) {
    // Relaxed: the value is whole in itself and never changes once stored.
    const std::uint64_t known = known_kinds_[id].load(std::memory_order_relaxed);
    if (known != 0) {
      *lanes = static_cast<std::uint32_t>(known);
      return static_cast<int>(known >> 32);
    }
  }
  MutexLock l(&topics_mutex_);
  auto it = topics_.find(id);
  if (it == topics_.end()) return 0;
  *lanes = it->second.lanes;
  const int kind = it->second.fence.empty() ? 1 : 2;
  if (id < kKnownKinds) {
    known_kinds_[id].store(static_cast<std::uint64_t>(kind) << 32 | it->second.lanes, std::memory_order_relaxed);
  }
  return kind;
}

void TopicLog::remember_topic(const TopicRef& t) {
  MutexLock l(&topics_mutex_);
  topics_[t.id] = t;
}

Result<TopicRef> TopicLog::open_topic(std::string_view name, const TopicSpec& spec) {
  Status s = check_name(name, "topic");
  if (!s.ok()) return s;
  if (spec.lanes == 0 || spec.lanes > kMaxLanes) {
    return Status(Code::InvalidArgument, "topic " + quoted(name) + ": lanes must be 1..4096, got " +
                                             std::to_string(spec.lanes));
  }
  if (spec.retention.max_age.count() < 0) {
    return Status(Code::InvalidArgument, "topic " + quoted(name) + ": retention max_age is negative");
  }
  if (!spec.fence.empty()) {
    if (Status fs = validate_topic_fence(name, spec.fence, spec.fence_per_lane, spec.lanes); !fs.ok()) return fs;
  }
  TopicRef out;
  s = s_.writer_->run_write(
      [&](WriteCtx& ctx) -> Status {
        auto v = ctx.get(s_.dbi_topics_, name);
        if (v.ok()) {
          TopicRef t;
          if (!decode_topic(name, *v, &t)) {
            return Status(Code::Corruption, "topic " + quoted(name) + ": stored record is malformed");
          }
          if (t.lanes != spec.lanes) {
            return Status(Code::Conflict, "topic " + quoted(name) + " exists with " + std::to_string(t.lanes) +
                                              " lanes, not " + std::to_string(spec.lanes) +
                                              " (the lane count is fixed: changing it would break per-key order)");
          }
          if (t.is_queue != spec.is_queue) {
            return Status(Code::Conflict, "topic " + quoted(name) + " exists as a " + (t.is_queue ? "queue" : "topic") +
                                              ", not a " + (spec.is_queue ? "queue" : "topic"));
          }
          if (t.fence != spec.fence || (!t.fence.empty() && t.fence_per_lane != spec.fence_per_lane)) {
            auto show = [](const std::string& f, bool per_lane) {
              return f.empty() ? std::string("no fence") : "fence " + quoted(f) + (per_lane ? " per lane" : " per topic");
            };
            return Status(Code::Conflict, "topic " + quoted(name) + " exists with " + show(t.fence, t.fence_per_lane) +
                                              ", not " + show(spec.fence, spec.fence_per_lane) +
                                              " (the fence is fixed at creation)");
          }
          if (t.retention.max_age != spec.retention.max_age || t.retention.max_bytes != spec.retention.max_bytes ||
              t.retention.max_count != spec.retention.max_count) {
            t.retention = spec.retention;
            Status ps = ctx.put(s_.dbi_topics_, name, encode_topic(t, ctx.now_ns));
            if (!ps.ok()) return ps;
          }
          out = t;
          return Status();
        }
        if (v.code() != Code::NotFound) return v.status();
        auto next = ctx.meta_u64("next_topic_id", 1);
        if (!next.ok()) return next.status();
        TopicRef t;
        t.id = static_cast<std::uint32_t>(*next);
        t.name = std::string(name);
        t.lanes = spec.lanes;
        t.is_queue = spec.is_queue;
        t.retention = spec.retention;
        t.fence = spec.fence;
        t.fence_per_lane = !spec.fence.empty() && spec.fence_per_lane;
        Status ps = ctx.put_meta_u64("next_topic_id", *next + 1);
        if (ps.ok()) ps = ctx.put(s_.dbi_topics_, name, encode_topic(t, ctx.now_ns));
        if (!ps.ok()) return ps;
        out = t;
        return Status();
      },
      true);
  if (!s.ok()) return s;
  remember_topic(out);
  return out;
}

Result<TopicRef> TopicLog::find_topic(std::string_view name) {
  Status s = check_name(name, "topic");
  if (!s.ok()) return s;
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto v = txn->get(s_.dbi_topics_, name);
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return Status(Code::NotFound, "topic " + quoted(name) + " not found in store " + quoted(s_.options_.directory));
    return v.status();
  }
  TopicRef t;
  if (!decode_topic(name, *v, &t)) return Status(Code::Corruption, "topic " + quoted(name) + ": stored record is malformed");
  remember_topic(t);
  return t;
}

Result<std::vector<TopicRef>> TopicLog::list_topics() {
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto c = LmdbCursor::open(*txn, s_.dbi_topics_, s_.options_.directory);
  if (!c.ok()) return c.status();
  std::vector<TopicRef> out;
  auto r = c->first();
  while (r.ok() && *r) {
    TopicRef t;
    if (!decode_topic(c->key(), c->value(), &t)) {
      return Status(Code::Corruption, "topic " + quoted(c->key()) + ": stored record is malformed");
    }
    // Names were checked when the topic was created: an invalid one in the
    // catalogue is a damaged key (LMDB does not checksum keys).
    if (Status ns = check_name(c->key(), "stored topic"); !ns.ok()) {
      return Status(Code::Corruption, "the topic catalogue of " + quoted(s_.options_.directory) + " is damaged: " +
                                          std::string(ns.message()));
    }
    out.push_back(t);
    r = c->next();
  }
  if (!r.ok()) return r.status();
  for (const TopicRef& t : out) remember_topic(t);
  return out;
}

// ======================================================================
// append

Status TopicLog::append_async(AppendRequest request, AppendCallback done) {
  WriteOp op;
  Status s = prepare_append(std::move(request), std::move(done), &op);
  if (!s.ok()) return s;
  return s_.writer_->enqueue(std::move(op), true);
}

Status TopicLog::prepare_append(AppendRequest&& request, AppendCallback&& done, WriteOp* op) {
  Status s = s_.check_writable();
  if (!s.ok()) return s;
  std::uint32_t lanes = 0;
  if (topic_kind(request.topic_id, &lanes) == 1 && request.lane < lanes && !request.payload.empty() &&
      request.key.size() <= 0xFFFF && request.idempotency_key.size() <= 0xFFFF &&
      request.payload.size() <= kMaxPayload) {
    // An unfenced topic and a valid request: no TopicRef copy on this path.
    op->is_append = true;
    op->request = std::move(request);
    op->append_done = std::move(done);
    return Status();
  }
  auto topic = topic_by_id(request.topic_id);
  if (!topic.ok()) return topic.status();
  if (request.lane >= topic->lanes) {
    return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": lane " + std::to_string(request.lane) +
                                             " out of range (lanes = " + std::to_string(topic->lanes) + ")");
  }
  if (request.payload.empty()) {
    return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": empty payload");
  }
  if (request.key.size() > 0xFFFF || request.idempotency_key.size() > 0xFFFF || request.payload.size() > kMaxPayload) {
    return Status(Code::PayloadTooLarge, "append to " + quoted(topic->name) +
                                             ": key and idempotency key are limited to 65535 bytes, payload to 1 GiB");
  }
  if (!topic->fence.empty() && s_.fences_.check_enabled()) {
    if (request.header.fencing_token == 0) {
      return Status(Code::InvalidArgument, "append to " + quoted(topic->name) + ": the topic is fenced by lease " +
                                               quoted(topic->fence) + " and the message has no fencing token");
    }
    // Ask the lease table now, on the caller's thread, so the writer never
    // waits on it while holding LMDB's writer lock (lib/features/fence.cpp).
    op->fence = s_.fences_.preconfirm(*topic, request.lane, request.header.fencing_token);
  }
  op->is_append = true;
  op->request = std::move(request);
  op->append_done = std::move(done);
  return Status();
}

Result<AppendResult> TopicLog::append(AppendRequest request) {
  if (s_.writer_->on_writer_thread()) {
    return Status(Code::Busy, "blocking append from a completion callback (writer thread)");
  }
  Waiter w;
  Status s = append_async(std::move(request), [&w](const Status& st, const AppendResult& r) { w.finish(st, r); });
  if (!s.ok()) return s;
  w.wait();
  if (!w.status.ok()) return w.status;
  return w.result;
}

namespace {
// append_batch's wait: one completion per queued request, each one's status kept.
struct BatchWaiter {
  std::mutex m;
  std::condition_variable cv;
  std::size_t left = 0;
  std::vector<Status> status;
  void finish(std::size_t i, const Status& s) {
    std::lock_guard<std::mutex> l(m);
    status[i] = s;
    if (--left == 0) cv.notify_one();
  }
  void wait() {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return left == 0; });
  }
};
}  // namespace

DurableStore::AppendBatchResult TopicLog::append_batch(std::span<AppendRequest> requests) {
  DurableStore::AppendBatchResult out;
  if (requests.empty()) return out;
  if (s_.writer_->on_writer_thread()) {
    out.status = Status(Code::Busy, "blocking append from a completion callback (writer thread)");
    return out;
  }
  bool fenced = false;
  for (const AppendRequest& r : requests) {
    std::uint32_t lanes = 0;
    fenced = fenced || topic_kind(r.topic_id, &lanes) != 1;  // fenced, or unknown (append says which)
  }
  if (fenced) {
    for (AppendRequest& r : requests) {
      auto a = append(std::move(r));
      if (!a.ok()) {
        out.status = a.status();
        return out;
      }
      ++out.appended;
    }
    return out;
  }
  BatchWaiter w;
  w.status.resize(requests.size());
  std::vector<WriteOp> ops(requests.size());
  std::size_t prepared = 0;
  Status refused;  // the first request refused up front, which ends the batch
  for (; prepared < requests.size(); ++prepared) {
    refused = prepare_append(std::move(requests[prepared]),
                             [&w, i = prepared](const Status& st, const AppendResult&) { w.finish(i, st); },
                             &ops[prepared]);
    if (!refused.ok()) break;
  }
  // Every prepared request completes once queued; the ones enqueue_all could
  // not queue (the store closing) never do, so they leave the count again.
  {
    std::lock_guard<std::mutex> l(w.m);
    w.left = prepared;
  }
  Status not_queued;
  const std::size_t queued = s_.writer_->enqueue_all(std::span<WriteOp>(ops.data(), prepared), &not_queued);
  if (queued < prepared) {
    std::lock_guard<std::mutex> l(w.m);
    w.left -= prepared - queued;
  }
  w.wait();
  for (; out.appended < queued; ++out.appended) {
    if (!w.status[out.appended].ok()) {
      out.status = w.status[out.appended];
      return out;
    }
  }
  if (queued < prepared) {
    out.status = not_queued;
  } else if (prepared < requests.size()) {
    out.status = refused;
  }
  return out;
}

Result<std::uint64_t> TopicLog::reserve_ids(std::uint64_t count) {
  if (count == 0) return Status(Code::InvalidArgument, "reserve_ids: count is 0");
  std::uint64_t first = 0;
  Status s = s_.writer_->run_write(
      [&](WriteCtx& ctx) -> Status {
        auto r = ctx.take_ids(count);
        if (!r.ok()) return r.status();
        first = *r;
        return Status();
      },
      true);
  if (!s.ok()) return s;
  return first;
}

Status TopicLog::apply_append(WriteCtx& ctx, WriteOp& op) {
  AppendRequest& r = op.request;
  std::uint32_t lanes = 0;
  const int kind = topic_kind(r.topic_id, &lanes);  // no lock for ids below kKnownKinds
  if (kind == 0) return topic_by_id(r.topic_id).status();
  auto hit = ctx.append_lane(r.topic_id, r.lane);
  if (!hit.ok()) return hit.status();
  // Fenced topics (doc/leases.md, lib/features/fence.cpp): decided here, in the transaction,
  // against the high-water as left by earlier ops of this batch, before
  // anything of this op is written. A duplicate writes nothing.
  FencePlan fence;
  if (kind == 2) {
    auto topic = topic_by_id(r.topic_id);
    if (!topic.ok()) return topic.status();
    StoreTxn ft(&s_, &ctx, ctx.txn, ctx.now_ns);
    Status fs = s_.fences_.check(ft, *topic, r, op.fence, &fence);
    if (!fs.ok()) return fs;
    if (fence.duplicate) {
      op.result = AppendResult{fence.dup_offset, fence.dup_id, true};
      return Status();
    }
  }
  MessageHeader h = r.header;
  if (h.id == 0) {
    auto id = ctx.take_ids(1);
    if (!id.ok()) return id.status();
    h.id = *id;
  }
  if (h.created_at_ns == 0) h.created_at_ns = ctx.now_ns;
  LaneState& s = *(*hit)->state;
  std::int64_t index_ts = std::max(s.last_ts, h.created_at_ns);
  std::size_t size = record_size(r);
  char* at = nullptr;
  if (ctx.stage_appends) {
    auto staged = ctx.stage_log(r.topic_id, r.lane, s.next, size);
    if (!staged.ok()) return staged.status();
    at = *staged;
  }
  if (at == nullptr) {
    auto p = ctx.reserve_log(r.topic_id, r.lane, log_key(r.topic_id, r.lane, s.next).sv(), size);
    if (!p.ok()) return p.status();
    at = *p;
  }
  encode_record(at, size, r, h, index_ts);
  op.result = AppendResult{s.next, h.id};
  s.next += 1;
  s.count += 1;
  s.bytes += size;
  s.last_ts = index_ts;
  ctx.mark_appended(**hit);
  if (fence.fenced) {
    StoreTxn ft(&s_, &ctx, ctx.txn, ctx.now_ns);
    return s_.fences_.record(ft, fence, r, op.result);
  }
  return Status();
}

}  // namespace lanebus::detail
