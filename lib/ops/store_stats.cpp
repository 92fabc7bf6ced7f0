// lanebus — MIT License.
// read_store_stats: a durable store's offsets and DLQ as BusStats.
#include "store_stats.hpp"

#include <algorithm>
#include <cstdio>

#include "coding.hpp"
#include "dlq.hpp"
#include "durable_store.hpp"
#include "exposition.hpp"
#include "outage.hpp"
#include "schema_registry.hpp"

namespace lanebus::detail {

void add_lane_counters(LaneCounters& into, const LaneCounters& c) noexcept {
  into.delivered += c.delivered;
  into.acked += c.acked;
  into.retried += c.retried;
  into.rejected += c.rejected;
  into.failed += c.failed;
  into.timed_out += c.timed_out;
  into.stuck += c.stuck;
  into.stuck_now += c.stuck_now;
  into.set_aside += c.set_aside;
  into.duplicates_skipped += c.duplicates_skipped;
  into.dropped += c.dropped;
  into.expired += c.expired;
  into.in_flight += c.in_flight;
  into.skipped += c.skipped;
  into.claimed += c.claimed;
  into.overdue += c.overdue;
}

Result<GroupLaneReading> read_group_lane(DurableStore& store, const TopicRef& topic, std::uint32_t lane,
                                         const LaneInfo& info, std::uint64_t committed) {
  GroupLaneReading out;
  const std::uint64_t from = std::max(committed, info.first_offset);
  out.lag = info.end_offset > from ? info.end_offset - from : 0;
  if (out.lag > 0) {
    ReadLimits one;
    one.max_messages = 1;
    auto m = store.read(topic, lane, from, one);
    if (!m.ok()) return m.status();
    if (!m->messages.empty()) out.oldest_created_ns = m->messages.front().header.created_at_ns;
  }
  return out;
}

namespace {

// A durable group's outage pause record (outage.hpp), if any; a damaged
// record shows as paused with the decoder's error as its reason.
void read_outage_pause(DurableStore& store, std::string_view topic, std::string_view group, GroupStats* gs) {
  const std::string key = outage_pause_key(topic, group);
  (void)store.read([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::User, key);
    if (!v.ok()) return Status();
    if (Status ds = decode_outage_pause(*v, gs); !ds.ok()) {
      gs->paused = true;
      gs->pause_reason = ds.to_string();
    }
    return Status();
  });
}

}  // namespace

Result<BusStats> read_store_stats(DurableStore& store) {
  BusStats out;
  out.name = store.options().directory;
  Status health = store.health();
  if (!health.ok()) out.store_error = health.to_string();
  auto topics = store.list_topics();
  if (!topics.ok()) return topics.status();
  for (const TopicRef& t : *topics) {
    TopicStats ts;
    ts.name = t.name;
    ts.is_queue = t.is_queue;
    ts.durable = true;
    ts.lanes = t.lanes;
    std::vector<LaneInfo> lanes;
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      auto li = store.lane_info(t, lane);
      if (!li.ok()) return li.status();
      lanes.push_back(*li);
      ts.lane_published.push_back(li->end_offset);
      ts.published += li->end_offset;
    }
    auto groups = store.list_groups(t);
    if (!groups.ok()) return groups.status();
    for (const GroupRef& g : *groups) {
      auto info = store.group_info(g);
      if (!info.ok()) return info.status();
      GroupStats gs;
      gs.name = g.name;
      for (std::uint32_t lane = 0; lane < t.lanes && lane < info->size(); ++lane) {
        const GroupLaneInfo& gi = (*info)[lane];
        LaneCounters c;
        auto r = read_group_lane(store, t, lane, lanes[lane], gi.committed);
        if (!r.ok()) return r.status();
        c.in_flight = r->lag;
        c.acked = gi.committed;
        c.skipped = gi.skipped;
        if (t.is_queue) {
          c.claimed = gi.in_flight;
          c.overdue = gi.overdue;
        }
        const std::int64_t created = r->oldest_created_ns;
        if (created != 0 && (gs.oldest_unprocessed_ns == 0 || created < gs.oldest_unprocessed_ns))
          gs.oldest_unprocessed_ns = created;
        add_lane_counters(gs.total, c);
        gs.lanes.push_back(c);
      }
      read_outage_pause(store, t.name, g.name, &gs);
      ts.groups.push_back(std::move(gs));
    }
    out.topics.push_back(std::move(ts));
  }
  DlqStore dlq(store);
  auto counters = dlq.counters();
  if (counters.ok()) {
    out.dlq_available = true;
    out.dlq = *counters;
  }
  auto bridges = read_bridge_status(store, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                               std::chrono::system_clock::now().time_since_epoch())
                                               .count());
  if (!bridges.ok()) return bridges.status();
  out.bridges = std::move(*bridges);
  // Deprecated fields of typed topics and who still reads them (doc/schemas.md).
  SchemaRegistry schemas(nullptr, &store);
  if (auto d = schemas.deprecated_fields(); d.ok()) out.deprecated_fields = std::move(*d);
  return out;
}

// ---------------------------------------------------------------- bridge status records

namespace {

constexpr std::uint8_t kBridgeStatusFormat = 1;
constexpr std::size_t kMaxStatusString = 1000;

// The record: ByteWriter / ByteReader (coding.hpp); strings after a u16 count,
// cut to kMaxStatusString bytes.

constexpr std::uint64_t BridgeMirrorStats::*kMirrorCounters[] = {
    &BridgeMirrorStats::published, &BridgeMirrorStats::acked,         &BridgeMirrorStats::duplicates,
    &BridgeMirrorStats::redelivered, &BridgeMirrorStats::stored,     &BridgeMirrorStats::dead_lettered,
    &BridgeMirrorStats::lag,       &BridgeMirrorStats::rewinds};

std::string seconds_text(std::int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fs", static_cast<double>(std::max<std::int64_t>(ns, 0)) / 1e9);
  return buf;
}

}  // namespace

std::string bridge_status_key(std::string_view bridge_name) {
  std::string k = "bridge";
  k.push_back('\0');
  k += "status/";
  k.append(bridge_name.substr(0, 400));
  return k;
}

std::string encode_bridge_status(const BridgeStats& s, std::uint32_t pid, std::int64_t interval_ms,
                                 std::int64_t written_ns, bool stopped) {
  ByteWriter w;
  auto str = [&w](std::string_view v) { w.str16(v.substr(0, kMaxStatusString)); };
  w.u8(kBridgeStatusFormat);
  w.u8(static_cast<std::uint8_t>(s.state));
  w.u8(stopped ? 1 : 0);
  w.u8(0);
  w.u32(pid);
  w.i64(interval_ms);
  w.i64(written_ns);
  w.i64(s.last_error_ns);
  w.u64(s.reconnects);
  str(s.name);
  str(s.last_error);
  const std::size_t n = std::min<std::size_t>(s.mirrors.size(), 1000);
  w.u16(static_cast<std::uint16_t>(n));
  for (std::size_t i = 0; i < n; ++i) {
    const BridgeMirrorStats& m = s.mirrors[i];
    str(m.direction);
    str(m.topic);
    str(m.stream);
    str(m.via);
    for (auto f : kMirrorCounters) w.u64(m.*f);
  }
  return w.take();
}

Result<BridgeStats> decode_bridge_status(std::string_view value, std::int64_t now_ns) {
  ByteReader r(value);
  BridgeStats b;
  const auto format = r.u8();
  if (r.ok() && format != kBridgeStatusFormat)
    return Status(Code::Corruption, "bridge status record: unknown format " + std::to_string(format));
  const auto state = r.u8();
  if (r.ok() && state > static_cast<std::uint8_t>(BridgeState::Failed))
    return Status(Code::Corruption, "bridge status record: unknown state " + std::to_string(state));
  b.state = static_cast<BridgeState>(state);
  b.stopped = (r.u8() & 1) != 0;
  (void)r.u8();
  b.status_pid = static_cast<std::uint32_t>(r.u32());
  b.status_interval_ms = static_cast<std::int64_t>(r.u64());
  b.status_written_ns = static_cast<std::int64_t>(r.u64());
  b.last_error_ns = static_cast<std::int64_t>(r.u64());
  b.reconnects = r.u64();
  b.name = r.str16();
  b.last_error = r.str16();
  const std::size_t n = r.u16();
  for (std::size_t i = 0; r.ok() && i < n; ++i) {
    BridgeMirrorStats m;
    m.direction = r.str16();
    m.topic = r.str16();
    m.stream = r.str16();
    m.via = r.str16();
    for (auto f : kMirrorCounters) m.*f = r.u64();
    b.total.published += m.published;
    b.total.acked += m.acked;
    b.total.duplicates += m.duplicates;
    b.total.redelivered += m.redelivered;
    b.total.stored += m.stored;
    b.total.dead_lettered += m.dead_lettered;
    b.total.lag += m.lag;
    b.total.rewinds += m.rewinds;
    b.mirrors.push_back(std::move(m));
  }
  if (!r.ok()) return Status(Code::Corruption, "bridge status record: truncated (" + std::to_string(value.size()) + " bytes)");
  const std::int64_t limit = std::max<std::int64_t>(3 * b.status_interval_ms, 5000) * 1'000'000;
  b.stale = !b.stopped && now_ns - b.status_written_ns > limit;
  return b;
}

Result<std::vector<BridgeStats>> read_bridge_status(DurableStore& store, std::int64_t now_ns) {
  std::vector<BridgeStats> out;
  const std::string prefix = bridge_status_key("");
  Status s = store.read([&](StoreTxn& t) -> Status {
    out.clear();
    return t.scan(StoreTable::User, prefix, prefix, [&](std::string_view key, std::string_view value) {
      auto b = decode_bridge_status(value, now_ns);
      if (b.ok()) {
        out.push_back(std::move(*b));
      } else {  // shown, not fatal: the rest of the stats stays readable
        BridgeStats bad;
        bad.name = std::string(key.substr(prefix.size()));
        bad.state = BridgeState::Failed;
        bad.last_error = b.status().to_string();
        bad.stale = true;
        out.push_back(std::move(bad));
      }
      return true;
    });
  });
  if (!s.ok()) return s;
  return out;
}

std::string bridge_status_text(const std::vector<BridgeStats>& bridges, std::int64_t now_ns) {
  std::string out;
  char buf[512];
  for (const BridgeStats& b : bridges) {
    const std::int64_t age = now_ns - b.status_written_ns;
    std::snprintf(buf, sizeof buf, "\nbridge %s  state=%s  pid=%u  updated %s ago", b.name.c_str(),
                  b.stopped ? "stopped" : to_string(b.state), b.status_pid, seconds_text(age).c_str());
    out += buf;
    if (b.stale) out += "  STALE: not updated for " + seconds_text(age) + " (the bridge process died or hangs)";
    out += "\n";
    if (!b.last_error.empty())
      out += "  last_error: " + b.last_error +
             (b.last_error_ns > 0 ? " (" + seconds_text(now_ns - b.last_error_ns) + " ago)" : std::string()) + "\n";
    std::snprintf(buf, sizeof buf, "  reconnects=%llu\n", static_cast<unsigned long long>(b.reconnects));
    out += buf;
    for (const BridgeMirrorStats& m : b.mirrors) {
      const bool in = m.direction == "in";
      std::snprintf(buf, sizeof buf,
                    "  %-3s %s %s %s (%s)  published=%llu acked=%llu duplicates=%llu redelivered=%llu stored=%llu "
                    "dead_lettered=%llu lag=%llu rewinds=%llu\n",
                    m.direction.c_str(), in ? m.stream.c_str() : m.topic.c_str(), "->",
                    in ? m.topic.c_str() : m.stream.c_str(), m.via.c_str(),
                    static_cast<unsigned long long>(m.published), static_cast<unsigned long long>(m.acked),
                    static_cast<unsigned long long>(m.duplicates), static_cast<unsigned long long>(m.redelivered),
                    static_cast<unsigned long long>(m.stored), static_cast<unsigned long long>(m.dead_lettered),
                    static_cast<unsigned long long>(m.lag), static_cast<unsigned long long>(m.rewinds));
      out += buf;
    }
  }
  return out;
}

std::string bridges_json(const std::vector<BridgeStats>& bridges, std::int64_t now_ns) {
  JsonWriter j;
  j.begin_array();
  for (const BridgeStats& b : bridges) {
    j.begin_object();
    j.key("name"); j.string(b.name);
    j.key("state"); j.string(b.stopped ? "stopped" : to_string(b.state));
    j.key("last_error"); j.string(b.last_error);
    j.key("last_error_ns"); j.i64(b.last_error_ns);
    j.key("reconnects"); j.u64(b.reconnects);
    if (b.status_written_ns != 0) {  // a record read from the store
      j.key("status_written_ns"); j.i64(b.status_written_ns);
      j.key("status_age_seconds"); j.number(static_cast<double>(now_ns - b.status_written_ns) / 1e9);
      j.key("status_interval_ms"); j.i64(b.status_interval_ms);
      j.key("pid"); j.u64(b.status_pid);
      j.key("stopped"); j.boolean(b.stopped);
      j.key("stale"); j.boolean(b.stale);
    }
    j.key("mirrors");
    j.begin_array();
    for (const BridgeMirrorStats& m : b.mirrors) {
      j.begin_object();
      j.key("direction"); j.string(m.direction);
      j.key("topic"); j.string(m.topic);
      j.key("stream"); j.string(m.stream);
      j.key("via"); j.string(m.via);
      j.key("published"); j.u64(m.published);
      j.key("acked"); j.u64(m.acked);
      j.key("duplicates"); j.u64(m.duplicates);
      j.key("redelivered"); j.u64(m.redelivered);
      j.key("stored"); j.u64(m.stored);
      j.key("dead_lettered"); j.u64(m.dead_lettered);
      j.key("lag"); j.u64(m.lag);
      j.key("rewinds"); j.u64(m.rewinds);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  return j.take();
}

}  // namespace lanebus::detail
