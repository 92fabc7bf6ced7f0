// lanebus — MIT License.
// QueueClaims: queue claims, acks and releases (the `inflight` table).
#include "durable_store.hpp"

#include <algorithm>
#include <optional>
#include <span>
#include <vector>

#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

// ======================================================================
// queues

Status QueueClaims::claim_in(WriteCtx& ctx, const TopicRef& topic, const GroupRef& group, std::uint32_t lane,
                              const ClaimOptions& options, std::uint32_t max, std::vector<ClaimedMessage>* out,
                              ClaimAhead* box) {
  out->clear();
  bool passed = false;  // went past an in-flight claim of `box` (claim_ahead.hpp, invariant 3)
  auto ls = ctx.lane(group.topic_id, lane);
  if (!ls.ok()) return ls.status();
  auto cur = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!cur.ok()) return cur.status();
  CursorRec rec = *cur;
  bool cursor_dirty = false;
  if (rec.committed < (*ls)->first) {
    // Retention deleted messages this group never acked: skip and count.
    rec.skipped += (*ls)->first - rec.committed;
    Status ds = ctx.drop_inflight_below(group.topic_id, group.group_id, lane, (*ls)->first);
    if (!ds.ok()) return ds;
    rec.committed = (*ls)->first;
    cursor_dirty = true;
  }
  // What the mailbox's consumer acked no longer lets a claim pass.
  if (box != nullptr) box->settled_below(rec.committed);
  const std::int64_t visibility_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.visibility).count();
  std::uint64_t end = std::min<std::uint64_t>((*ls)->next, rec.committed + options.scan_limit);
  LaneLog log(*ctx.txn, s_.dbi_log_, group.topic_id, lane, topic.name);
  for (std::uint64_t o = rec.committed; o < end && out->size() < max; ++o) {
    Key ik = inflight_key(group.topic_id, group.group_id, lane, o);
    auto inf = ctx.inflight(ik);
    if (!inf.ok()) return inf.status();
    InflightRec claim;
    if (!inf->has_value()) {
      claim.attempt = 1;
      claim.first_claim_ns = ctx.now_ns;
    } else if ((*inf)->state == kInflightAcked) {
      if (o == rec.committed) {  // acked out of order earlier: advance past it
        Status ds = ctx.del(s_.dbi_inflight_, ik.sv());
        if (!ds.ok() && ds.code() != Code::NotFound) return ds;
        rec.committed = o + 1;
        cursor_dirty = true;
      }
      continue;
    } else if ((*inf)->deadline_ns > ctx.now_ns) {
      if (!options.ordered) continue;
      // The lane's head is in flight: only the mailbox it was handed to, at
      // its first attempt, may claim behind it.
      if (box == nullptr || (*inf)->attempt != 1 || !box->holds(o, (*inf)->deadline_ns)) break;
      passed = true;
      continue;
    } else {
      // A redelivery (its claim expired, or it was given back). Ordered
      // claims take it alone: if the process dies with it, only this message
      // is charged a crash (poison detection), not a whole batch; never
      // behind a passed claim (it would be charged that one's crash).
      if (options.ordered && (!out->empty() || passed)) break;
      claim = **inf;
      claim.attempt += 1;
    }
    claim.state = kInflightClaimed;
    claim.deadline_ns = ctx.now_ns + visibility_ns;
    auto found = log.seek(o);
    if (!found.ok()) return ctx.fail(found.status());
    if (!*found) {
      return Status(Code::Corruption, "claim from " + quoted(topic.name) + ": offset " + std::to_string(o) +
                                          " is missing from the log");
    }
    ClaimedMessage cm;
    Status ds = decode_record(log.record(), topic.name, lane, o, &cm.message);
    if (!ds.ok()) {
      if (out->empty() && !cursor_dirty) return ds;  // nothing written yet for this op
      break;  // hand out what was claimed; the damaged record fails the next claim
    }
    Status ps = ctx.put_inflight(ik, claim);
    if (!ps.ok()) return ps;
    cm.attempt = claim.attempt;
    cm.deadline_ns = claim.deadline_ns;
    cm.claimed_ns = ctx.now_ns;
    cm.message.header.attempt = claim.attempt;
    ctx.claims += 1;
    if (claim.attempt > 1) ctx.redeliveries += 1;
    if (passed) ctx.claims_passed += 1;
    const bool redelivery = claim.attempt > 1;
    out->push_back(std::move(cm));
    if (redelivery && options.ordered) break;
  }
  if (cursor_dirty) return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
  return Status();
}

Result<std::optional<ClaimedMessage>> QueueClaims::claim(const GroupRef& group, std::uint32_t lane,
                                                          const ClaimOptions& options) {
  auto r = claim_batch(group, lane, 1, options);
  if (!r.ok()) return r.status();
  std::optional<ClaimedMessage> out;
  if (!r->empty()) out = std::move(r->front());
  return out;
}

Result<std::vector<ClaimedMessage>> QueueClaims::claim_batch(const GroupRef& group, std::uint32_t lane,
                                                              std::uint32_t max, const ClaimOptions& options) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "claim from group " + quoted(group.name) + ": lane out of range");
  if (max == 0) return Status(Code::InvalidArgument, "claim from group " + quoted(group.name) + ": max must be at least 1");
  auto topic = s_.log_->topic_by_id(group.topic_id);
  if (!topic.ok()) return topic.status();
  std::vector<ClaimedMessage> out;
  Status s = s_.writer_->run_write([&](WriteCtx& ctx) -> Status { return claim_in(ctx, *topic, group, lane, options, max, &out); },
                       true);
  if (!s.ok()) return s;
  return out;
}

Status QueueClaims::release_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                std::uint32_t attempt, std::int64_t deadline_ns, bool undo_attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "release in group " + quoted(group.name) + ": lane out of range");
  Key ik = inflight_key(group.topic_id, group.group_id, lane, offset);
  auto inf = ctx.inflight(ik);
  if (!inf.ok()) return inf.status();
  if (!inf->has_value() || (*inf)->state != kInflightClaimed) {
    return Status(Code::NotFound, "release of offset " + std::to_string(offset) + " in group " + quoted(group.name) +
                                      ": not in flight");
  }
  if ((*inf)->attempt != attempt) {
    return Status(Code::StaleToken, "release of offset " + std::to_string(offset) + " attempt " +
                                        std::to_string(attempt) + ": the message was redelivered (current attempt " +
                                        std::to_string((*inf)->attempt) + ")");
  }
  InflightRec r = **inf;
  if (undo_attempt) {
    if (r.attempt <= 1) {
      // Never handed out before this claim: back to "never claimed".
      Status ds = ctx.del(s_.dbi_inflight_, ik.sv());
      return (ds.ok() || ds.code() == Code::NotFound) ? Status() : ds;
    }
    r.attempt -= 1;
  }
  r.deadline_ns = deadline_ns;
  return ctx.put_inflight(ik, r);
}

Status QueueClaims::ack_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                            std::uint32_t attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "ack in group " + quoted(group.name) + ": lane out of range");

  Key ik = inflight_key(group.topic_id, group.group_id, lane, offset);
  auto inf = ctx.inflight(ik);
  if (!inf.ok()) return inf.status();
  if (!inf->has_value() || (*inf)->state != kInflightClaimed) {
    return Status(Code::NotFound, "ack of offset " + std::to_string(offset) + " in group " + quoted(group.name) +
                                      " lane " + std::to_string(lane) + ": not in flight (already acked or never claimed)");
  }
  if ((*inf)->attempt != attempt) {
    return Status(Code::StaleToken, "ack of offset " + std::to_string(offset) + " attempt " +
                                        std::to_string(attempt) + " in group " + quoted(group.name) +
                                        ": the message was redelivered (current attempt " +
                                        std::to_string((*inf)->attempt) + ")");
  }
  auto cur = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!cur.ok()) return cur.status();
  CursorRec rec = *cur;
  ctx.acks += 1;
  if (offset != rec.committed) {  // out of order (unordered claims): mark, advance later
    InflightRec r = **inf;
    r.state = kInflightAcked;
    return ctx.put_inflight(ik, r);
  }
  Status ds = ctx.del(s_.dbi_inflight_, ik.sv());
  if (!ds.ok() && ds.code() != Code::NotFound) return ds;
  rec.committed = offset + 1;
  // Advance past messages acked earlier out of order.
  for (;;) {
    Key nk = inflight_key(group.topic_id, group.group_id, lane, rec.committed);
    auto n = ctx.inflight(nk);
    if (!n.ok()) return n.status();
    if (!n->has_value() || (*n)->state != kInflightAcked) break;
    ds = ctx.del(s_.dbi_inflight_, nk.sv());
    if (!ds.ok() && ds.code() != Code::NotFound) return ds;
    rec.committed += 1;
  }
  return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
}

Status QueueClaims::ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "ack in group " + quoted(group.name) + ": lane out of range");
  return s_.writer_->run_write([&](WriteCtx& ctx) -> Status { return ack_in(ctx, group, lane, offset, attempt); }, true);
}

Status QueueClaims::release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                             std::chrono::milliseconds delay) {
  if (lane >= group.lanes) return Status(Code::InvalidArgument, "release in group " + quoted(group.name) + ": lane out of range");
  return s_.writer_->run_write(
      [&](WriteCtx& ctx) -> Status {
        return release_in(ctx, group, lane, offset, attempt,
                          ctx.now_ns + std::chrono::duration_cast<std::chrono::nanoseconds>(delay).count(), false);
      },
      true);
}


// ======================================================================
// claims in the append's transaction (claim_ahead.hpp)

void QueueClaims::watch(ClaimAhead* box) {
  std::lock_guard l(ahead_mu_);
  ahead_[WriteCtx::lk(box->group().topic_id, box->lane())].push_back(box);
  ahead_count_.fetch_add(1, std::memory_order_relaxed);
}

void QueueClaims::unwatch(ClaimAhead* box) {
  std::lock_guard l(ahead_mu_);  // a batch claiming for it holds this until hand_over
  auto it = ahead_.find(WriteCtx::lk(box->group().topic_id, box->lane()));
  if (it == ahead_.end()) return;
  auto& boxes = it->second;
  auto pos = std::find(boxes.begin(), boxes.end(), box);
  if (pos == boxes.end()) return;
  boxes.erase(pos);
  if (boxes.empty()) ahead_.erase(it);
  ahead_count_.fetch_sub(1, std::memory_order_relaxed);
}

std::unique_lock<std::mutex> QueueClaims::lock_ahead() {
  // Relaxed: a hint; a mailbox watched after this look is served by the next batch.
  if (ahead_count_.load(std::memory_order_relaxed) == 0) return {};
  return std::unique_lock<std::mutex>(ahead_mu_);
}

Status QueueClaims::request(ClaimAhead* box) {
  WriteOp op;
  op.bookkeeping = true;
  // The claim itself runs at the batch's end (claim_ahead_in), after every
  // append and settle of the batch; re-runnable: ctx is new for each attempt.
  op.apply = [box](WriteCtx& ctx) {
    ctx.ahead_requests.push_back(box);
    return Status();
  };
  // After hand_over (the completions run after it): a request refused while
  // this one was out, or a failed batch, makes the lane look again.
  op.done = [this, box](const Status& st) {
    if (box->answered() || !st.ok()) ahead_woken_.emplace_back(WriteCtx::lk(box->group().topic_id, box->lane()), 0);
  };
  return s_.writer_->enqueue(std::move(op), true);
}

void QueueClaims::claim_ahead_in(WriteCtx& ctx) {
  ahead_pending_.clear();  // a batch retried after MapFull claims again
  auto claim_for = [&](ClaimAhead* box) {
    for (const AheadClaims& p : ahead_pending_)
      if (p.box == box) return;  // appended to and requested: once
    std::uint32_t max = 0;
    ClaimOptions options;
    std::uint64_t gen = 0;
    if (!box->wanted(&max, &options, &gen)) return;
    std::vector<ClaimedMessage> got;
    Status s = claim_in(ctx, box->topic(), box->group(), box->lane(), options, max, &got, box);
    if (!ctx.dead.ok()) return;
    if (!s.ok()) {
      box->note_error();  // a damaged record: counted as the consumer's store error
      return;
    }
    if (got.empty()) return;  // nothing deliverable (the head is in flight): stays armed
    ahead_pending_.push_back(AheadClaims{box, gen, std::move(got)});
  };
  for (ClaimAhead* box : ctx.ahead_requests) {
    claim_for(box);
    if (!ctx.dead.ok()) return;  // the batch fails; the request's completion wakes the lane
  }
  for (const auto& [k, appended] : ctx.dirty) {
    if (!appended) continue;
    auto it = ahead_.find(k);
    if (it == ahead_.end()) continue;
    for (ClaimAhead* box : it->second) {
      claim_for(box);
      if (!ctx.dead.ok()) return;
    }
  }
}

void QueueClaims::hand_over(bool committed) {
  if (committed) {
    std::uint64_t n = 0;
    for (AheadClaims& p : ahead_pending_) {
      n += p.claims.size();
      const std::uint64_t end = p.claims.back().message.offset + 1;
      if (p.box->offer(&p.claims, p.gen)) {
        ahead_woken_.emplace_back(WriteCtx::lk(p.box->group().topic_id, p.box->lane()), end);
      } else {
        give_back_async(p.box->group(), p.box->lane(), p.claims);
      }
    }
    s_.counters_.claims_ahead.fetch_add(n, std::memory_order_relaxed);  // relaxed: a statistic
  }
  ahead_pending_.clear();
}

void QueueClaims::take_woken(std::map<std::uint64_t, std::uint64_t>* ends) {
  for (const auto& [k, end] : ahead_woken_) {
    if (ends == nullptr) break;
    std::uint64_t& e = (*ends)[k];
    e = std::max(e, end);
  }
  ahead_woken_.clear();
}

namespace {
// Unclaim each of `claims` (never handled): its attempt is not counted and it
// is deliverable at once. A claim that is gone (expired and taken again) is
// left to its new holder.
Status unclaim_each(QueueClaims& q, StorePart::WriteCtx& ctx, std::span<const ClaimedMessage> claims,
                    const GroupRef& group, std::uint32_t lane) {
  for (const ClaimedMessage& cm : claims) {
    Status s = q.release_in(ctx, group, lane, cm.message.offset, cm.attempt, ctx.now_ns, true);
    if (!ctx.dead.ok()) return ctx.dead;
    (void)s;  // NotFound / StaleToken: not ours any more
  }
  return Status();
}
}  // namespace

Status QueueClaims::give_back_later(std::vector<ClaimedMessage> claims, const GroupRef& group, std::uint32_t lane,
                                    bool block) {
  WriteOp op;
  op.bookkeeping = true;
  op.apply = [this, group, lane, claims = std::move(claims)](WriteCtx& ctx) {
    return unclaim_each(*this, ctx, claims, group, lane);
  };
  return s_.writer_->enqueue(std::move(op), block);
}

void QueueClaims::give_back_async(const GroupRef& group, std::uint32_t lane, const std::vector<ClaimedMessage>& claims) {
  // The writer thread cannot wait for a write: queue it. Refused (closing, or
  // the queue is full) the claims expire after their visibility, as a dead
  // consumer's do.
  Status s = give_back_later(claims, group, lane, false);
  if (!s.ok()) s_.log_failure("giving back the claims of a closed consumer (they expire)", s);
}

Status QueueClaims::give_back(std::span<const ClaimedMessage> claims, const GroupRef& group, std::uint32_t lane) {
  if (claims.empty()) return Status();
  return s_.writer_->run_write([&](WriteCtx& ctx) { return unclaim_each(*this, ctx, claims, group, lane); }, true);
}

}  // namespace lanebus::detail
