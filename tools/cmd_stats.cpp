// lanebus — MIT License.
// `lanebus stats DIR [--json|--prom] [--watch SECONDS] [--sla SECONDS]`: lag, the
// age of the oldest unprocessed message, rates and drain time of a live durable
// store, and the overdue claims of its queues, read through a read-only open;
// --watch redraws every N seconds.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "commands.hpp"
#include "durable_store.hpp"
#include "exposition.hpp"
#include "lanebus/metrics.hpp"
#include "store_stats.hpp"

namespace lanebus::tool {
namespace {

void stats_usage(std::FILE* out) {
  std::fprintf(out,
               "usage: lanebus stats DIR [--json|--prom] [--watch SECONDS] [--sla SECONDS [--page-fraction F]]\n\n"
               "Consumer lag of every durable topic and queue in the store in DIR, per group and lane:\n"
               "end offset, committed offset, lag in messages, and the age of the oldest unprocessed\n"
               "message (the one at the committed offset). Rates (published and consumed messages per\n"
               "second) and the projected drain time (lag / consume rate) need two readings: with\n"
               "--watch they come from consecutive readings SECONDS apart; without it they are shown\n"
               "as '-' (null in JSON, absent in Prometheus).\n"
               "  --json           one JSON document per reading (one line each under --watch)\n"
               "  --prom           Prometheus text exposition per reading (blank line between readings)\n"
               "  --watch SECONDS  read again every SECONDS (> 0, fractions allowed) until Ctrl-C;\n"
               "                   the table redraws in place on a terminal\n"
               "  --sla SECONDS    judge each group against this SLA: ok / at_risk / breached from the\n"
               "                   oldest age + drain time; at_risk needs the condition at two\n"
               "                   consecutive readings (a blip within one interval is not a page)\n"
               "  --page-fraction  fraction of the SLA that is at risk (default 0.75)\n"
               "For queues, each lane also shows in_flight (claimed, not acked) and overdue: claims\n"
               "whose deadline has passed, held by a consumer that died with them or by a handler that\n"
               "overran attempt_timeout (the bus ends such a claim at once). A lane with overdue > 0 is\n"
               "marked 'overdue: stuck or dead consumer' in the table (\"overdue\" in JSON,\n"
               "lanebus_overdue_claims in Prometheus).\n"
               "Opens the store read-only; safe while other processes use it. Exit status: 0, or 1 when\n"
               "the store cannot be read, 2 for a usage error.\n"
               "The CLI shows what the store knows (offsets, claims, overdue claims), not the counters\n"
               "of the processes using it: handler outcomes, latency, stuck handlers (attempt_timeout)\n"
               "and messages set aside by key_parallel_retry are exported by the in-process Monitor\n"
               "(lanebus_stuck_total, lanebus_stuck_handlers, lanebus_set_aside_messages; JSON stuck,\n"
               "stuck_now, set_aside).\n");
}

volatile sig_atomic_t g_stop = 0;
extern "C" void on_signal(int) { g_stop = 1; }

std::int64_t steady_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::int64_t wall_now() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// ---------------------------------------------------------------- one reading

struct GroupLaneReading {
  std::uint64_t committed = 0;
  std::uint64_t lag = 0;
  std::uint64_t in_flight = 0;       // queues: claimed, not acked
  std::uint64_t overdue = 0;         // queues: of those, claims past their deadline
  std::int64_t oldest_created_ns = 0;  // 0 = nothing waits
};
struct GroupReading {
  std::string name;
  std::vector<GroupLaneReading> lanes;
};
struct TopicReading {
  std::string name;
  bool is_queue = false;
  std::vector<detail::LaneInfo> lanes;
  std::vector<GroupReading> groups;
};
struct Reading {
  std::int64_t steady_ns = 0, wall_ns = 0;
  std::vector<TopicReading> topics;
};

Result<Reading> read_store(detail::DurableStore& store) {
  Reading r;
  auto topics = store.list_topics();
  if (!topics.ok()) return topics.status();
  for (const detail::TopicRef& t : *topics) {
    TopicReading tr;
    tr.name = t.name;
    tr.is_queue = t.is_queue;
    for (std::uint32_t lane = 0; lane < t.lanes; ++lane) {
      auto li = store.lane_info(t, lane);
      if (!li.ok()) return li.status();
      tr.lanes.push_back(*li);
    }
    auto groups = store.list_groups(t);
    if (!groups.ok()) return groups.status();
    for (const detail::GroupRef& g : *groups) {
      auto info = store.group_info(g);
      if (!info.ok()) return info.status();
      GroupReading gr;
      gr.name = g.name;
      for (std::uint32_t lane = 0; lane < t.lanes && lane < info->size(); ++lane) {
        const detail::GroupLaneInfo& gi = (*info)[lane];
        GroupLaneReading lr;
        lr.committed = gi.committed;
        lr.in_flight = gi.in_flight;
        lr.overdue = gi.overdue;
        // Retention may have deleted messages the group never read: they are
        // skipped, not waiting.
        const std::uint64_t from = std::max(gi.committed, tr.lanes[lane].first_offset);
        lr.lag = tr.lanes[lane].end_offset > from ? tr.lanes[lane].end_offset - from : 0;
        if (lr.lag > 0) {
          detail::ReadLimits one;
          one.max_messages = 1;
          auto m = store.read(t, lane, from, one);
          if (!m.ok()) return m.status();
          if (!m->messages.empty()) lr.oldest_created_ns = m->messages.front().header.created_at_ns;
        }
        gr.lanes.push_back(lr);
      }
      tr.groups.push_back(std::move(gr));
    }
    r.topics.push_back(std::move(tr));
  }
  r.steady_ns = steady_now();
  r.wall_ns = wall_now();
  return r;
}

// ---------------------------------------------------------------- derived view

struct LaneView {
  std::uint64_t first = 0, end = 0;
  std::optional<double> publish_rate;
};
struct GroupLaneView {
  std::uint64_t committed = 0, lag = 0, in_flight = 0, overdue = 0;
  std::optional<double> oldest_age, consume_rate;
};
struct GroupView {
  std::string name;
  std::uint64_t lag = 0;
  std::optional<double> oldest_age;  // 0 when nothing waits
  std::optional<double> consume_rate, drain;
  bool stalled = false;
  std::optional<SlaState> sla;
  std::optional<double> projected;
  std::vector<GroupLaneView> lanes;
};
struct TopicView {
  std::string name;
  bool is_queue = false;
  std::uint64_t published = 0;  // sum of end offsets: every message ever appended
  std::optional<double> publish_rate;
  std::optional<std::uint32_t> hot_lane;
  std::vector<LaneView> lanes;
  std::vector<GroupView> groups;
};
struct View {
  std::int64_t wall_ns = 0;
  std::optional<double> interval;
  std::vector<TopicView> topics;
};

struct SlaFlags {
  std::optional<SlaPolicy> policy;
};

const TopicReading* find_topic(const Reading* r, const std::string& name) {
  if (r == nullptr) return nullptr;
  for (const auto& t : r->topics)
    if (t.name == name) return &t;
  return nullptr;
}
const GroupReading* find_group(const TopicReading* t, const std::string& name) {
  if (t == nullptr) return nullptr;
  for (const auto& g : t->groups)
    if (g.name == name) return &g;
  return nullptr;
}

double age_seconds(std::int64_t wall, std::int64_t created) {
  return std::max(0.0, static_cast<double>(wall - created) / 1e9);
}

// `prev_risk`: the groups whose risk condition held at the previous reading
// (topic + '\0' + group); updated for the next call.
View derive(const Reading& cur, const Reading* prev, const SlaFlags& sla, std::vector<std::string>& prev_risk) {
  View v;
  v.wall_ns = cur.wall_ns;
  const double dt = prev != nullptr ? static_cast<double>(cur.steady_ns - prev->steady_ns) / 1e9 : 0.0;
  if (dt > 0) v.interval = dt;
  auto rate = [&](std::uint64_t now, std::uint64_t then) -> std::optional<double> {
    if (dt <= 0) return std::nullopt;
    return now >= then ? static_cast<double>(now - then) / dt : 0.0;  // went back: the store was replaced
  };
  std::vector<std::string> risk_now;
  for (const TopicReading& t : cur.topics) {
    const TopicReading* pt = find_topic(prev, t.name);
    TopicView tv;
    tv.name = t.name;
    tv.is_queue = t.is_queue;
    std::uint64_t prev_total = 0, window_total = 0, max_delta = 0;
    std::uint32_t max_lane = 0;
    for (std::size_t i = 0; i < t.lanes.size(); ++i) {
      LaneView lv;
      lv.first = t.lanes[i].first_offset;
      lv.end = t.lanes[i].end_offset;
      const std::uint64_t then = (pt != nullptr && i < pt->lanes.size()) ? pt->lanes[i].end_offset : 0;
      if (prev != nullptr) {
        lv.publish_rate = rate(lv.end, then);
        const std::uint64_t d = lv.end >= then ? lv.end - then : 0;
        window_total += d;
        if (d > max_delta) {
          max_delta = d;
          max_lane = static_cast<std::uint32_t>(i);
        }
      }
      tv.published += lv.end;
      prev_total += then;
      tv.lanes.push_back(lv);
    }
    if (prev != nullptr) tv.publish_rate = rate(tv.published, prev_total);
    // Same rule as MetricsOptions' defaults: >= 2x the fair share, >= 100 messages.
    if (t.lanes.size() > 1 && window_total >= 100 &&
        static_cast<double>(max_delta) * static_cast<double>(t.lanes.size()) >= 2.0 * static_cast<double>(window_total))
      tv.hot_lane = max_lane;

    for (const GroupReading& g : t.groups) {
      const GroupReading* pg = find_group(pt, g.name);
      GroupView gv;
      gv.name = g.name;
      std::uint64_t committed = 0, prev_committed = 0;
      std::int64_t oldest = 0;
      for (std::size_t i = 0; i < g.lanes.size(); ++i) {
        const GroupLaneReading& l = g.lanes[i];
        GroupLaneView lv;
        lv.committed = l.committed;
        lv.lag = l.lag;
        lv.in_flight = l.in_flight;
        lv.overdue = l.overdue;
        if (l.oldest_created_ns != 0) {
          lv.oldest_age = age_seconds(cur.wall_ns, l.oldest_created_ns);
        } else if (l.lag == 0) {
          lv.oldest_age = 0.0;
        }
        // A group first seen now started from 0 as far as we know: no rate.
        if (pg != nullptr && i < pg->lanes.size()) lv.consume_rate = rate(l.committed, pg->lanes[i].committed);
        committed += l.committed;
        prev_committed += (pg != nullptr && i < pg->lanes.size()) ? pg->lanes[i].committed : 0;
        gv.lag += l.lag;
        if (l.oldest_created_ns != 0 && (oldest == 0 || l.oldest_created_ns < oldest)) oldest = l.oldest_created_ns;
        gv.lanes.push_back(lv);
      }
      if (oldest != 0) {
        gv.oldest_age = age_seconds(cur.wall_ns, oldest);
      } else if (gv.lag == 0) {
        gv.oldest_age = 0.0;
      }
      if (pg != nullptr) gv.consume_rate = rate(committed, prev_committed);
      if (gv.lag == 0) {
        gv.drain = 0.0;
      } else if (gv.consume_rate && *gv.consume_rate > 0) {
        gv.drain = static_cast<double>(gv.lag) / *gv.consume_rate;
      } else if (gv.consume_rate) {
        gv.stalled = true;
      }
      if (sla.policy) {
        const double age = gv.oldest_age.value_or(0.0);
        if (gv.stalled) {
          gv.projected = INFINITY;
        } else if (gv.drain) {
          gv.projected = age + *gv.drain;
        }
        const std::string key = t.name + '\0' + g.name;
        if (gv.oldest_age && classify_sla(*sla.policy, *gv.oldest_age, 0.0) == SlaState::Breached) {
          gv.sla = SlaState::Breached;
        } else if (!gv.projected) {
          gv.sla = SlaState::Unknown;
        } else {
          const bool risk = classify_sla(*sla.policy, 0.0, *gv.projected) != SlaState::Ok;
          if (risk) risk_now.push_back(key);
          const bool held = std::find(prev_risk.begin(), prev_risk.end(), key) != prev_risk.end();
          gv.sla = risk && held ? SlaState::AtRisk : SlaState::Ok;
        }
      }
      tv.groups.push_back(std::move(gv));
    }
    v.topics.push_back(std::move(tv));
  }
  prev_risk = std::move(risk_now);
  return v;
}

// ---------------------------------------------------------------- output

std::string fmt_rate(std::optional<double> r) {
  if (!r) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", *r);
  return b;
}

std::string fmt_secs(std::optional<double> s, bool stalled = false) {
  if (stalled) return "stalled";
  if (!s) return "-";
  if (std::isinf(*s)) return "inf";
  char b[32];
  if (*s < 1) {
    std::snprintf(b, sizeof b, "%.0fms", *s * 1e3);
  } else if (*s < 120) {
    std::snprintf(b, sizeof b, "%.1fs", *s);
  } else if (*s < 7200) {
    std::snprintf(b, sizeof b, "%.1fm", *s / 60);
  } else {
    std::snprintf(b, sizeof b, "%.1fh", *s / 3600);
  }
  return b;
}

void print_table(const std::string& dir, const View& v, const SlaFlags& sla) {
  char when[64] = "?";
  std::time_t secs = static_cast<std::time_t>(v.wall_ns / 1'000'000'000);
  std::tm tm{};
  if (localtime_r(&secs, &tm) != nullptr) std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
  std::printf("lanebus stats %s   %s   %s\n", dir.c_str(), when,
              v.interval ? ("rates over " + fmt_secs(v.interval)).c_str() : "single reading: no rates (use --watch)");
  if (sla.policy)
    std::printf("SLA %.1fs, at risk from %.0f%% (%.1fs)\n", static_cast<double>(sla.policy->sla.count()) / 1e9,
                sla.policy->page_fraction * 100,
                sla.policy->page_fraction * static_cast<double>(sla.policy->sla.count()) / 1e9);
  if (v.topics.empty()) std::printf("(no durable topics)\n");
  for (const TopicView& t : v.topics) {
    std::printf("\n%s %s  lanes=%zu  published=%llu  pub/s=%s%s\n", t.is_queue ? "queue" : "topic", t.name.c_str(),
                t.lanes.size(), static_cast<unsigned long long>(t.published), fmt_rate(t.publish_rate).c_str(),
                t.hot_lane ? ("  HOT lane " + std::to_string(*t.hot_lane)).c_str() : "");
    if (t.groups.empty()) {
      std::printf("  (no consumer groups)\n");
      continue;
    }
    std::printf("  %-20s %10s %10s %10s %10s %10s\n", "GROUP", "LAG", "OLDEST", "CONS/S", "DRAIN", sla.policy ? "SLA" : "");
    for (const GroupView& g : t.groups) {
      std::printf("  %-20s %10llu %10s %10s %10s %10s\n", g.name.c_str(), static_cast<unsigned long long>(g.lag),
                  fmt_secs(g.oldest_age).c_str(), fmt_rate(g.consume_rate).c_str(), fmt_secs(g.drain, g.stalled).c_str(),
                  g.sla ? to_string(*g.sla) : "");
      std::printf("    %-6s %12s %12s %10s %10s %10s %10s%s\n", "lane", "end", "committed", "lag", "oldest", "pub/s",
                  "cons/s", t.is_queue ? "  in_flight    overdue" : "");
      for (std::size_t i = 0; i < g.lanes.size() && i < t.lanes.size(); ++i) {
        const GroupLaneView& l = g.lanes[i];
        std::printf("    %-6zu %12llu %12llu %10llu %10s %10s %10s", i, static_cast<unsigned long long>(t.lanes[i].end),
                    static_cast<unsigned long long>(l.committed), static_cast<unsigned long long>(l.lag),
                    fmt_secs(l.oldest_age).c_str(), fmt_rate(t.lanes[i].publish_rate).c_str(),
                    fmt_rate(l.consume_rate).c_str());
        if (t.is_queue)
          std::printf(" %10llu %10llu", static_cast<unsigned long long>(l.in_flight),
                      static_cast<unsigned long long>(l.overdue));
        std::printf("%s%s\n", t.hot_lane && *t.hot_lane == i ? "  <- hot" : "",
                    l.overdue > 0 ? "  overdue: stuck or dead consumer" : "");
      }
    }
  }
}

std::string to_json_doc(const std::string& dir, const View& v, const SlaFlags& sla) {
  detail::JsonWriter j;
  j.begin_object();
  j.key("store");
  j.string(dir);
  j.key("wall_ns");
  j.i64(v.wall_ns);
  j.key("interval_seconds");
  j.number(v.interval);
  j.key("sla_seconds");
  j.number(sla.policy ? std::optional<double>(static_cast<double>(sla.policy->sla.count()) / 1e9) : std::nullopt);
  j.key("topics");
  j.begin_array();
  for (const TopicView& t : v.topics) {
    j.begin_object();
    j.key("name");
    j.string(t.name);
    j.key("kind");
    j.string(t.is_queue ? "queue" : "topic");
    j.key("published");
    j.u64(t.published);
    j.key("publish_rate");
    j.number(t.publish_rate);
    j.key("hot_lane");
    if (t.hot_lane) {
      j.u64(*t.hot_lane);
    } else {
      j.null();
    }
    j.key("lanes");
    j.begin_array();
    for (std::size_t i = 0; i < t.lanes.size(); ++i) {
      j.begin_object();
      j.key("lane");
      j.u64(i);
      j.key("first_offset");
      j.u64(t.lanes[i].first);
      j.key("end_offset");
      j.u64(t.lanes[i].end);
      j.key("publish_rate");
      j.number(t.lanes[i].publish_rate);
      j.end_object();
    }
    j.end_array();
    j.key("groups");
    j.begin_array();
    for (const GroupView& g : t.groups) {
      j.begin_object();
      j.key("name");
      j.string(g.name);
      j.key("lag");
      j.u64(g.lag);
      j.key("oldest_age_seconds");
      j.number(g.oldest_age);
      j.key("consume_rate");
      j.number(g.consume_rate);
      j.key("drain_seconds");
      j.number(g.drain);
      j.key("stalled");
      j.boolean(g.stalled);
      j.key("sla_state");
      if (g.sla) {
        j.string(to_string(*g.sla));
      } else {
        j.null();
      }
      j.key("projected_seconds");
      j.number(g.projected);
      j.key("lanes");
      j.begin_array();
      for (std::size_t i = 0; i < g.lanes.size(); ++i) {
        const GroupLaneView& l = g.lanes[i];
        j.begin_object();
        j.key("lane");
        j.u64(i);
        j.key("committed");
        j.u64(l.committed);
        j.key("lag");
        j.u64(l.lag);
        if (t.is_queue) {
          j.key("in_flight");
          j.u64(l.in_flight);
          j.key("overdue");
          j.u64(l.overdue);
        }
        j.key("oldest_age_seconds");
        j.number(l.oldest_age);
        j.key("consume_rate");
        j.number(l.consume_rate);
        j.end_object();
      }
      j.end_array();
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
  j.end_object();
  return j.take();
}

std::string to_prom_doc(const View& v, const SlaFlags& sla) {
  using L = detail::PromWriter::Labels;
  detail::PromWriter w;
  auto lane_l = [](const TopicView& t, std::size_t i) -> L { return {{"topic", t.name}, {"lane", std::to_string(i)}}; };
  auto group_l = [](const TopicView& t, const GroupView& g) -> L { return {{"topic", t.name}, {"group", g.name}}; };
  w.family("lanebus_published_total", "counter", "Messages appended to the topic's log (sum of lane end offsets).");
  for (const auto& t : v.topics) w.sample_u64("lanebus_published_total", {{"topic", t.name}}, t.published);
  w.family("lanebus_lane_end_offset", "gauge", "One past the last offset appended to the lane.");
  for (const auto& t : v.topics)
    for (std::size_t i = 0; i < t.lanes.size(); ++i) w.sample_u64("lanebus_lane_end_offset", lane_l(t, i), t.lanes[i].end);
  w.family("lanebus_lane_first_offset", "gauge", "Earliest offset retention kept in the lane.");
  for (const auto& t : v.topics)
    for (std::size_t i = 0; i < t.lanes.size(); ++i)
      w.sample_u64("lanebus_lane_first_offset", lane_l(t, i), t.lanes[i].first);
  w.family("lanebus_publish_rate_per_second", "gauge", "Messages appended per second between the last two readings.");
  for (const auto& t : v.topics)
    if (t.publish_rate) w.sample("lanebus_publish_rate_per_second", {{"topic", t.name}}, *t.publish_rate);
  w.family("lanebus_group_committed_offset", "gauge", "The group's committed offset: everything before it is done.");
  for (const auto& t : v.topics)
    for (const auto& g : t.groups)
      for (std::size_t i = 0; i < g.lanes.size(); ++i) {
        L l = group_l(t, g);
        l.emplace_back("lane", std::to_string(i));
        w.sample_u64("lanebus_group_committed_offset", l, g.lanes[i].committed);
      }
  w.family("lanebus_consumer_lag_messages", "gauge", "Messages waiting for the group in each lane.");
  for (const auto& t : v.topics)
    for (const auto& g : t.groups)
      for (std::size_t i = 0; i < g.lanes.size(); ++i) {
        L l = group_l(t, g);
        l.emplace_back("lane", std::to_string(i));
        w.sample_u64("lanebus_consumer_lag_messages", l, g.lanes[i].lag);
      }
  w.family("lanebus_overdue_claims", "gauge",
           "Queue claims past their deadline: a consumer died with them or a handler overran attempt_timeout.");
  for (const auto& t : v.topics)
    if (t.is_queue)
      for (const auto& g : t.groups)
        for (std::size_t i = 0; i < g.lanes.size(); ++i) {
          L l = group_l(t, g);
          l.emplace_back("lane", std::to_string(i));
          w.sample_u64("lanebus_overdue_claims", l, g.lanes[i].overdue);
        }
  w.family("lanebus_oldest_unprocessed_age_seconds", "gauge",
           "Age of the oldest message the group has not finished (0 when none waits).");
  for (const auto& t : v.topics)
    for (const auto& g : t.groups)
      if (g.oldest_age) w.sample("lanebus_oldest_unprocessed_age_seconds", group_l(t, g), *g.oldest_age);
  w.family("lanebus_consume_rate_per_second", "gauge", "Committed-offset progress per second between the last two readings.");
  for (const auto& t : v.topics)
    for (const auto& g : t.groups)
      if (g.consume_rate) w.sample("lanebus_consume_rate_per_second", group_l(t, g), *g.consume_rate);
  w.family("lanebus_projected_drain_seconds", "gauge", "Lag divided by the consume rate (+Inf when stalled).");
  for (const auto& t : v.topics)
    for (const auto& g : t.groups) {
      if (g.stalled) {
        w.sample_text("lanebus_projected_drain_seconds", group_l(t, g), "+Inf");
      } else if (g.drain) {
        w.sample("lanebus_projected_drain_seconds", group_l(t, g), *g.drain);
      }
    }
  if (sla.policy) {
    w.family("lanebus_sla_seconds", "gauge", "The SLA given with --sla.");
    for (const auto& t : v.topics)
      for (const auto& g : t.groups)
        w.sample("lanebus_sla_seconds", group_l(t, g), static_cast<double>(sla.policy->sla.count()) / 1e9);
    w.family("lanebus_sla_projected_seconds", "gauge", "Oldest unprocessed age plus projected drain time.");
    for (const auto& t : v.topics)
      for (const auto& g : t.groups)
        if (g.projected) w.sample("lanebus_sla_projected_seconds", group_l(t, g), *g.projected);
    w.family("lanebus_sla_state", "gauge", "SLA verdict as a state set: 1 for the current state, else 0.");
    for (const auto& t : v.topics)
      for (const auto& g : t.groups)
        for (SlaState st : {SlaState::Unknown, SlaState::Ok, SlaState::AtRisk, SlaState::Breached}) {
          L l = group_l(t, g);
          l.emplace_back("state", to_string(st));
          w.sample_u64("lanebus_sla_state", l, g.sla && *g.sla == st ? 1 : 0);
        }
  }
  return w.take();
}

bool parse_seconds(const char* s, double* out) {
  if (s == nullptr || *s == '\0') return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !(v > 0) || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

int cmd_stats(int argc, char** argv) {
  enum class Format { Table, Json, Prom } format = Format::Table;
  std::string dir;
  std::optional<double> watch;
  SlaFlags sla;
  double page_fraction = 0.75;
  std::optional<double> sla_seconds;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (std::strcmp(a, "--help") == 0 || std::strcmp(a, "-h") == 0) {
      stats_usage(stdout);
      return 0;
    } else if (std::strcmp(a, "--json") == 0 || std::strcmp(a, "--prom") == 0) {
      if (format != Format::Table) {
        std::fprintf(stderr, "lanebus stats: --json and --prom are exclusive\n");
        return 2;
      }
      format = a[2] == 'j' ? Format::Json : Format::Prom;
    } else if (std::strcmp(a, "--watch") == 0) {
      double v;
      if (!parse_seconds(value(), &v)) {
        std::fprintf(stderr, "lanebus stats: --watch needs a number of seconds > 0\n");
        return 2;
      }
      watch = v;
    } else if (std::strcmp(a, "--sla") == 0) {
      double v;
      if (!parse_seconds(value(), &v)) {
        std::fprintf(stderr, "lanebus stats: --sla needs a number of seconds > 0\n");
        return 2;
      }
      sla_seconds = v;
    } else if (std::strcmp(a, "--page-fraction") == 0) {
      double v;
      if (!parse_seconds(value(), &v) || v > 1) {
        std::fprintf(stderr, "lanebus stats: --page-fraction needs a number in (0, 1]\n");
        return 2;
      }
      page_fraction = v;
    } else if (a[0] == '-') {
      std::fprintf(stderr, "lanebus stats: unknown option %s\n\n", a);
      stats_usage(stderr);
      return 2;
    } else if (dir.empty()) {
      dir = a;
    } else {
      std::fprintf(stderr, "lanebus stats: more than one directory given\n\n");
      stats_usage(stderr);
      return 2;
    }
  }
  if (dir.empty()) {
    stats_usage(stderr);
    return 2;
  }
  if (sla_seconds)
    sla.policy = SlaPolicy{std::chrono::nanoseconds(static_cast<std::int64_t>(*sla_seconds * 1e9)), page_fraction,
                           std::chrono::nanoseconds(0)};

  StoreOptions o;
  o.directory = dir;
  o.read_only = true;
  auto store = detail::DurableStore::open(o);
  if (!store.ok()) {
    std::fprintf(stderr, "lanebus stats: cannot read %s as a lanebus store: %s\n", dir.c_str(),
                 store.status().to_string().c_str());
    return 1;
  }

  if (watch) {
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
  }
  const bool tty = isatty(STDOUT_FILENO) == 1;
  std::optional<Reading> prev;
  std::vector<std::string> prev_risk;
  for (;;) {
    auto cur = read_store(**store);
    if (!cur.ok()) {
      std::fprintf(stderr, "lanebus stats: reading %s: %s\n", dir.c_str(), cur.status().to_string().c_str());
      return 1;
    }
    View v = derive(*cur, prev ? &*prev : nullptr, sla, prev_risk);
    // Bridges' status records (lib/store_stats.hpp, doc/bridge.md): their state and counters.
    const std::int64_t bridges_now = wall_now();
    auto bridges = detail::read_bridge_status(**store, bridges_now);
    if (!bridges.ok()) bridges = std::vector<BridgeStats>{};
    switch (format) {
      case Format::Table:
        if (watch && tty) std::printf("\x1b[H\x1b[2J");  // home + clear: redraw in place
        print_table(dir, v, sla);
        std::fputs(detail::bridge_status_text(*bridges, bridges_now).c_str(), stdout);
        if (watch) std::printf(tty ? "\n(every %gs; Ctrl-C to quit)\n" : "\n", *watch);
        break;
      case Format::Json: {
        std::string doc = to_json_doc(dir, v, sla);
        if (!bridges->empty() && !doc.empty() && doc.back() == '}')  // one more member: "bridges"
          doc.insert(doc.size() - 1, ",\"bridges\":" + detail::bridges_json(*bridges, bridges_now));
        std::printf("%s\n", doc.c_str());
        break;
      }
      case Format::Prom:
        std::printf("%s%s", prev ? "\n" : "", to_prom_doc(v, sla).c_str());
        break;
    }
    std::fflush(stdout);
    if (!watch) return 0;
    prev = std::move(*cur);
    // Sleep in short steps so Ctrl-C exits promptly.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(*watch);
    while (g_stop == 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (g_stop != 0) return 0;
  }
}

}  // namespace lanebus::tool
