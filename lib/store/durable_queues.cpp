// lanebus — MIT License.
// QueueClaims: queue claims, acks and releases (the `inflight` table).
#include "durable_store.hpp"

#include <algorithm>
#include <optional>
#include <vector>

#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

// ======================================================================
// queues

Status QueueClaims::claim_in(WriteCtx& ctx, const TopicRef& topic, const GroupRef& group, std::uint32_t lane,
                              const ClaimOptions& options, std::uint32_t max, std::vector<ClaimedMessage>* out) {
  out->clear();
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
  const std::int64_t visibility_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options.visibility).count();
  std::uint64_t end = std::min<std::uint64_t>((*ls)->next, rec.committed + options.scan_limit);
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
      if (options.ordered) break;  // the lane's head is in flight
      continue;
    } else {
      // A redelivery (its claim expired, or it was given back). Ordered
      // claims take it alone: if the process dies with it, only this message
      // is charged a crash (poison detection), not a whole batch.
      if (options.ordered && !out->empty()) break;
      claim = **inf;
      claim.attempt += 1;
    }
    claim.state = kInflightClaimed;
    claim.deadline_ns = ctx.now_ns + visibility_ns;
    auto v = ctx.get(s_.dbi_log_, log_key(group.topic_id, lane, o).sv());
    if (!v.ok()) {
      if (v.code() == Code::NotFound) {
        return Status(Code::Corruption, "claim from " + quoted(topic.name) + ": offset " + std::to_string(o) +
                                            " is missing from the log");
      }
      return v.status();
    }
    ClaimedMessage cm;
    Status ds = decode_record(*v, topic.name, lane, o, &cm.message);
    if (!ds.ok()) {
      if (out->empty() && !cursor_dirty) return ds;  // nothing written yet for this op
      break;  // hand out what was claimed; the damaged record fails the next claim
    }
    Status ps = ctx.put_inflight(ik, claim);
    if (!ps.ok()) return ps;
    cm.attempt = claim.attempt;
    cm.deadline_ns = claim.deadline_ns;
    cm.message.header.attempt = claim.attempt;
    ctx.claims += 1;
    if (claim.attempt > 1) ctx.redeliveries += 1;
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

}  // namespace lanebus::detail
