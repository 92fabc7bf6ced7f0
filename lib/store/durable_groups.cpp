// lanebus — MIT License.
// GroupOffsets: consumer groups and their committed offsets.
#include "durable_store.hpp"

#include <algorithm>
#include <vector>

#include "durable_store_impl.hpp"
#include "names.hpp"
#include "quote.hpp"

namespace lanebus::detail {

namespace {

Result<std::uint64_t> start_offset(LmdbTxn& txn, LmdbDbi log, std::uint32_t tid, std::uint32_t lane,
                                   const LaneState& ls, const StartPosition& start) {
  switch (start.from) {
    case StartFrom::Earliest: return ls.first;
    case StartFrom::Latest: return ls.next;
    case StartFrom::Offset: return std::clamp(start.offset, ls.first, ls.next);
    case StartFrom::Timestamp: return search_time(txn, log, tid, lane, ls, start.timestamp_ns);
  }
  return ls.first;
}

}  // namespace

// ======================================================================
// groups

Result<GroupRef> GroupOffsets::open_group(const TopicRef& topic, std::string_view name, StartPosition start) {
  Status s = check_name(name, "group");
  if (!s.ok()) return s;
  if (topic.id == 0) return Status(Code::InvalidArgument, "open group " + quoted(name) + ": invalid topic");
  GroupRef g;
  g.topic_id = topic.id;
  g.lanes = topic.lanes;
  g.name = std::string(name);
  s = s_.writer_->run_write(
      [&](WriteCtx& ctx) -> Status {
        std::string gk = group_key(topic.id, name);
        auto v = ctx.get(s_.dbi_groups_, gk);
        if (v.ok()) {
          if (v->size() < 8) return Status(Code::Corruption, "group " + quoted(name) + ": stored record is malformed");
          g.group_id = get_le32(v->data() + 4);
          return Status();
        }
        if (v.code() != Code::NotFound) return v.status();
        auto next = ctx.meta_u64("next_group_id", 1);
        if (!next.ok()) return next.status();
        g.group_id = static_cast<std::uint32_t>(*next);
        // Compute every lane's start before writing anything (no partial op).
        std::vector<std::uint64_t> starts(topic.lanes);
        for (std::uint32_t lane = 0; lane < topic.lanes; ++lane) {
          auto ls = ctx.lane(topic.id, lane);
          if (!ls.ok()) return ls.status();
          auto o = start_offset(*ctx.txn, s_.dbi_log_, topic.id, lane, **ls, start);
          if (!o.ok()) return ctx.fail(o.status());
          starts[lane] = *o;
        }
        std::string rec(16, '\0');
        put_le32(rec.data(), 1);
        put_le32(rec.data() + 4, g.group_id);
        put_le64(rec.data() + 8, static_cast<std::uint64_t>(ctx.now_ns));
        Status ps = ctx.put_meta_u64("next_group_id", *next + 1);
        if (ps.ok()) ps = ctx.put(s_.dbi_groups_, gk, rec);
        for (std::uint32_t lane = 0; ps.ok() && lane < topic.lanes; ++lane) {
          ps = ctx.put_cursor(topic.id, g.group_id, lane, CursorRec{starts[lane], 0});
        }
        return ps;
      },
      true);
  if (!s.ok()) return s;
  return g;
}

Result<GroupRef> GroupOffsets::find_group(const TopicRef& topic, std::string_view name) {
  Status s = check_name(name, "group");
  if (!s.ok()) return s;
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto v = txn->get(s_.dbi_groups_, group_key(topic.id, name));
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return Status(Code::NotFound, "group " + quoted(name) + " of " + quoted(topic.name) + " not found");
    return v.status();
  }
  if (v->size() < 8) return Status(Code::Corruption, "group " + quoted(name) + ": stored record is malformed");
  return GroupRef{topic.id, get_le32(v->data() + 4), topic.lanes, std::string(name)};
}

Result<std::vector<GroupRef>> GroupOffsets::list_groups(const TopicRef& topic) {
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  auto c = LmdbCursor::open(*txn, s_.dbi_groups_, s_.options_.directory);
  if (!c.ok()) return c.status();
  std::string prefix = group_key(topic.id, "");
  std::vector<GroupRef> out;
  auto r = c->seek(prefix);
  while (r.ok() && *r) {
    auto k = c->key();
    if (k.size() < 4 || k.substr(0, 4) != prefix) break;
    if (c->value().size() < 8) return Status(Code::Corruption, "group record is malformed");
    out.push_back(GroupRef{topic.id, get_le32(c->value().data() + 4), topic.lanes, std::string(k.substr(4))});
    r = c->next();
  }
  if (!r.ok()) return r.status();
  return out;
}

Result<std::vector<GroupLaneInfo>> GroupOffsets::group_info(const GroupRef& group) {
  auto view = s_.begin_read();
  if (!view.ok()) return view.status();
  LmdbTxn* txn = &view->txn;
  std::vector<GroupLaneInfo> out(group.lanes);
  const std::int64_t now = WallClock::realtime_ns();
  auto c = LmdbCursor::open(*txn, s_.dbi_inflight_, s_.options_.directory);
  if (!c.ok()) return c.status();
  for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
    auto v = txn->get(s_.dbi_cursors_, cursor_key(group.topic_id, group.group_id, lane).sv());
    if (v.ok() && v->size() == 16) {
      out[lane].committed = get_le64(v->data());
      out[lane].skipped = get_le64(v->data() + 8);
    } else if (!v.ok() && v.code() != Code::NotFound) {
      return v.status();
    }
    Key prefix = cursor_key(group.topic_id, group.group_id, lane);
    auto r = c->seek(prefix.sv());
    while (r.ok() && *r && c->key().size() == 20 && c->key().substr(0, 12) == prefix.sv()) {
      if (c->value().size() == 24 && get_le32(c->value().data() + 4) == kInflightClaimed) {
        ++out[lane].in_flight;
        if (static_cast<std::int64_t>(get_le64(c->value().data() + 8)) <= now) ++out[lane].overdue;
      }
      r = c->next();
    }
    if (!r.ok()) return r.status();
  }
  return out;
}

Status GroupOffsets::commit_offset_async(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                         StatusCallback done) {
  Status s = s_.check_writable();
  if (!s.ok()) return s;
  if (lane >= group.lanes) {
    return Status(Code::InvalidArgument, "commit offset of group " + quoted(group.name) + ": lane out of range");
  }
  WriteOp op;
  op.bookkeeping = true;
  op.done = std::move(done);
  op.apply = [this, group, lane, offset](WriteCtx& ctx) -> Status {
    return commit_offset_in(ctx, group, lane, offset);
  };
  return s_.writer_->enqueue(std::move(op), true);
}

Status GroupOffsets::commit_offset_in(WriteCtx& ctx, const GroupRef& group, std::uint32_t lane,
                                      std::uint64_t offset) {
  if (lane >= group.lanes) {
    return Status(Code::InvalidArgument, "commit offset of group " + quoted(group.name) + ": lane out of range");
  }
  auto ls = ctx.lane(group.topic_id, lane);
  if (!ls.ok()) return ls.status();
  if (offset > (*ls)->next) {
    return Status(Code::InvalidArgument, "commit offset " + std::to_string(offset) + " of group " + quoted(group.name) +
                                             " lane " + std::to_string(lane) + ": beyond the end (" +
                                             std::to_string((*ls)->next) + ")");
  }
  auto c = ctx.cursor(group.topic_id, group.group_id, lane);
  if (!c.ok()) return c.status();
  CursorRec rec = *c;
  rec.committed = offset;
  return ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
}

Status GroupOffsets::commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  if (s_.writer_->on_writer_thread()) {
    return Status(Code::Busy, "blocking commit_offset from a completion callback (writer thread)");
  }
  Waiter w;
  Status s = commit_offset_async(group, lane, offset, [&w](const Status& st) { w.finish(st, {}); });
  if (!s.ok()) return s;
  w.wait();
  return w.status;
}

Status GroupOffsets::seek(const GroupRef& group, const StartPosition& start) {
  auto topic = s_.log_->topic_by_id(group.topic_id);
  if (!topic.ok()) return topic.status();
  return s_.writer_->run_write(
      [&](WriteCtx& ctx) -> Status {
        std::vector<std::uint64_t> starts(group.lanes);
        for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
          auto ls = ctx.lane(group.topic_id, lane);
          if (!ls.ok()) return ls.status();
          auto o = start_offset(*ctx.txn, s_.dbi_log_, group.topic_id, lane, **ls, start);
          if (!o.ok()) return ctx.fail(o.status());
          starts[lane] = *o;
        }
        for (std::uint32_t lane = 0; lane < group.lanes; ++lane) {
          auto c = ctx.cursor(group.topic_id, group.group_id, lane);
          if (!c.ok()) return c.status();
          CursorRec rec = *c;
          rec.committed = starts[lane];
          Status ps = ctx.put_cursor(group.topic_id, group.group_id, lane, rec);
          if (ps.ok() && topic->is_queue) ps = ctx.drop_inflight_below(group.topic_id, group.group_id, lane, ~0ull);
          if (!ps.ok()) return ps;
        }
        return Status();
      },
      true);
}

}  // namespace lanebus::detail
