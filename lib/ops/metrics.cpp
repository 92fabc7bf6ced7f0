// lanebus — MIT License.
// MetricsWindow, Monitor, the SLA evaluator and the Prometheus / JSON exports
// (doc/observability.md), plus the exposition writers shared with the CLI.
//
// Design notes:
// - Nothing here touches the bus's hot path: every number is a difference of
//   two BusStats snapshots (newest minus oldest sample in the window) divided
//   by the time between them, computed once per add().
// - The SLA hold is a "for" clause (like a Prometheus alert rule): the risk
//   condition must be true at every sample for `hold` before AtRisk is
//   reported, so a blip shorter than that never pages. Breached needs no hold:
//   a message older than the SLA has already missed it.
// - A stuck handler (LaneCounters::stuck_now) needs no hold either: the call
//   has already overrun attempt_timeout, and no counter projection can see it
//   (its lane's lag may well be 0), so it lifts Unknown/Ok to AtRisk at once.
#include "lanebus/metrics.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "exposition.hpp"
#include "store_stats.hpp"
#include "lanebus/bus.hpp"
#include "sync.hpp"

namespace lanebus {

// ---------------------------------------------------------------- writers

namespace detail {

std::string format_ns_as_seconds(std::uint64_t ns) {
  std::string s = std::to_string(ns / 1'000'000'000ull);
  std::uint64_t frac = ns % 1'000'000'000ull;
  if (frac != 0) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%09llu", static_cast<unsigned long long>(frac));
    std::string f(buf);
    while (!f.empty() && f.back() == '0') f.pop_back();
    s += "." + f;
  }
  return s;
}

std::string prom_escape_label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string prom_escape_help(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void PromWriter::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += prom_escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PromWriter::labels(const Labels& labels) {
  if (labels.empty()) return;
  out_ += '{';
  bool first = true;
  for (const auto& [k, v] : labels) {
    if (!first) out_ += ',';
    first = false;
    out_ += k;
    out_ += "=\"";
    out_ += prom_escape_label(v);
    out_ += '"';
  }
  out_ += '}';
}

void PromWriter::sample_text(std::string_view name, const Labels& l, std::string_view value) {
  out_ += name;
  labels(l);
  out_ += ' ';
  out_ += value;
  out_ += '\n';
}

void PromWriter::sample(std::string_view name, const Labels& l, double value) {
  sample_text(name, l, format_double(value));
}

void PromWriter::sample_u64(std::string_view name, const Labels& l, std::uint64_t value) {
  sample_text(name, l, std::to_string(value));
}

}  // namespace detail

// ---------------------------------------------------------------- SLA

const char* to_string(SlaState state) noexcept {
  switch (state) {
    case SlaState::Unknown: return "unknown";
    case SlaState::Ok: return "ok";
    case SlaState::AtRisk: return "at_risk";
    case SlaState::Breached: return "breached";
  }
  return "unknown";
}

namespace {

double seconds(std::chrono::nanoseconds d) { return static_cast<double>(d.count()) / 1e9; }

Status check_policy(const SlaPolicy& p, const char* where) {
  if (p.sla.count() <= 0) return Status(Code::InvalidArgument, std::string(where) + ": SlaPolicy::sla must be > 0");
  if (!(p.page_fraction > 0.0 && p.page_fraction <= 1.0))
    return Status(Code::InvalidArgument, std::string(where) + ": SlaPolicy::page_fraction must be in (0, 1]");
  if (p.hold.count() < 0) return Status(Code::InvalidArgument, std::string(where) + ": SlaPolicy::hold must be >= 0");
  return Status();
}

}  // namespace

SlaState classify_sla(const SlaPolicy& policy, double oldest_age_seconds, double projected_seconds) noexcept {
  const double sla = seconds(policy.sla);
  if (oldest_age_seconds >= sla) return SlaState::Breached;
  if (projected_seconds >= policy.page_fraction * sla) return SlaState::AtRisk;
  return SlaState::Ok;
}

// ---------------------------------------------------------------- snapshot lookup

const TopicMetrics* MetricsSnapshot::find_topic(std::string_view name) const noexcept {
  for (const auto& t : topics)
    if (t.name == name) return &t;
  return nullptr;
}

const GroupMetrics* MetricsSnapshot::find_group(std::string_view topic, std::string_view group) const noexcept {
  const TopicMetrics* t = find_topic(topic);
  if (t == nullptr) return nullptr;
  for (const auto& g : t->groups)
    if (g.name == group) return &g;
  return nullptr;
}

// ---------------------------------------------------------------- MetricsWindow

Result<MetricsWindow> MetricsWindow::create(const MetricsOptions& options) {
  if (options.window.count() <= 0) return Result<MetricsWindow>(Code::InvalidArgument, "MetricsOptions::window must be > 0");
  if (options.max_samples < 2) return Result<MetricsWindow>(Code::InvalidArgument, "MetricsOptions::max_samples must be >= 2");
  if (!(options.hot_lane_skew >= 1.0))
    return Result<MetricsWindow>(Code::InvalidArgument, "MetricsOptions::hot_lane_skew must be >= 1");
  if (options.default_sla) {
    Status s = check_policy(*options.default_sla, "MetricsOptions::default_sla");
    if (!s.ok()) return s;
  }
  return MetricsWindow(options);
}

MetricsWindow::SlaTrack* MetricsWindow::track(std::string_view topic, std::string_view group, bool create) {
  for (auto& t : sla_)
    if (t.topic == topic && t.group == group) return &t;
  if (!create) return nullptr;
  sla_.push_back(SlaTrack{std::string(topic), std::string(group), std::nullopt, std::nullopt, false});
  return &sla_.back();
}

Status MetricsWindow::set_sla(std::string_view topic, std::string_view group, const SlaPolicy& policy) {
  Status s = check_policy(policy, "set_sla");
  if (!s.ok()) return s;
  SlaTrack* t = track(topic, group, true);
  t->policy = policy;
  t->risk_since_ns.reset();  // a new policy starts a new hold
  return Status();
}

Status MetricsWindow::add(BusStats stats, std::int64_t steady_ns, std::int64_t wall_ns) {
  if (!samples_.empty() && steady_ns <= samples_.back().steady_ns)
    return Status(Code::InvalidArgument, "MetricsWindow::add: steady_ns " + std::to_string(steady_ns) +
                                             " is not later than the previous sample's " +
                                             std::to_string(samples_.back().steady_ns));
  samples_.push_back(Sample{steady_ns, wall_ns, std::move(stats)});
  // Keep the samples within the window (the oldest kept one may sit exactly
  // at its start) and at most max_samples.
  const std::int64_t start = steady_ns - options_.window.count();
  std::size_t drop = 0;
  while (drop + 1 < samples_.size() && samples_[drop].steady_ns < start) ++drop;
  if (samples_.size() - drop > options_.max_samples) drop = samples_.size() - options_.max_samples;
  samples_.erase(samples_.begin(), samples_.begin() + static_cast<std::ptrdiff_t>(drop));
  recompute();
  return Status();
}

namespace {

// A counter's growth between two readings; a counter that went down was reset
// (the bus was reopened) and counts from zero.
std::uint64_t grew(std::uint64_t now, std::uint64_t then) { return now >= then ? now - then : now; }

const TopicStats* find_topic(const BusStats& s, const std::string& name) {
  for (const auto& t : s.topics)
    if (t.name == name) return &t;
  return nullptr;
}

const GroupStats* find_group(const TopicStats* t, const std::string& name) {
  if (t == nullptr) return nullptr;
  for (const auto& g : t->groups)
    if (g.name == name) return &g;
  return nullptr;
}

std::uint64_t finished(const LaneCounters& c) { return c.acked + c.rejected + c.failed; }

// now - then, bucket by bucket (a bucket that went down means a reset: use now).
LatencyHistogram histogram_delta(const LatencyHistogram& now, const LatencyHistogram* then) {
  LatencyHistogram d;
  if (now.counts.empty()) return d;
  d.counts.assign(LatencyHistogram::kBuckets, 0);
  bool reset = then != nullptr && then->count > now.count;
  for (std::uint32_t i = 0; i < LatencyHistogram::kBuckets && i < now.counts.size(); ++i) {
    std::uint64_t old = (then != nullptr && !reset && i < then->counts.size()) ? then->counts[i] : 0;
    if (old > now.counts[i]) {
      reset = true;
      break;
    }
    d.counts[i] = now.counts[i] - old;
  }
  if (reset) return now;
  for (auto c : d.counts) d.count += c;
  d.sum_ns = then != nullptr ? grew(now.sum_ns, then->sum_ns) : now.sum_ns;
  if (d.count == 0) d.counts.clear();
  return d;
}

std::optional<double> quantile_seconds(const LatencyHistogram& h, double q) {
  if (h.count == 0) return std::nullopt;
  std::uint64_t ns = h.quantile_ns(q);
  // The last bucket has no upper bound: report infinity rather than 2^64 ns.
  if (ns == ~0ull) return std::numeric_limits<double>::infinity();
  return static_cast<double>(ns) / 1e9;
}

// Messages per second over the window (0 for a window of one sample).
struct PerSecond {
  double span;
  double operator()(std::uint64_t n) const { return span > 0 ? static_cast<double>(n) / span : 0.0; }
};

// The store-wide DLQ figures at `now`, and its arrivals and depth change since `base`.
DlqMetrics window_dlq(const BusStats& now, const BusStats& base, PerSecond per_s) {
  DlqMetrics m;
  if (!now.dlq_available) return m;
  const DlqCounters& d = now.dlq;
  m.available = true;
  m.depth = d.pending;
  m.oldest_age_seconds = static_cast<double>(d.oldest_pending_age_ns) / 1e9;
  for (int c = 0; c < 4; ++c) m.arrivals[c] = d.arrivals[c];
  if (base.dlq_available) {
    const DlqCounters& b = base.dlq;
    std::uint64_t now_arr = d.arrivals[0] + d.arrivals[1] + d.arrivals[2] + d.arrivals[3];
    std::uint64_t base_arr = b.arrivals[0] + b.arrivals[1] + b.arrivals[2] + b.arrivals[3];
    m.arrival_rate = per_s(now_arr >= base_arr ? now_arr - base_arr : now_arr);
    m.depth_change = static_cast<std::int64_t>(d.pending) - static_cast<std::int64_t>(b.pending);
  }
  return m;
}

// The store writer's totals at `now`, and its commits since `base`: their
// rate, average time and batch.
StoreMetrics window_store(const BusStats& now, const BusStats& base, PerSecond per_s) {
  StoreMetrics m;
  if (!now.store_available) return m;
  m.available = true;
  m.totals = now.store;
  if (!base.store_available) return m;
  const StoreWriteStats& a = now.store;
  const StoreWriteStats& b = base.store;
  // A store opened again since `base` starts its counters from 0: then the whole of `now`.
  const bool reopened = a.commits < b.commits;
  const std::uint64_t commits = reopened ? a.commits : a.commits - b.commits;
  m.commit_rate = per_s(commits);
  if (commits == 0) return m;
  const auto d = static_cast<double>(commits);
  m.commit_avg_seconds = static_cast<double>(grew(a.commit_ns, reopened ? 0 : b.commit_ns)) / 1e9 / d;
  m.commit_write_avg_seconds = static_cast<double>(grew(a.commit_write_ns, reopened ? 0 : b.commit_write_ns)) / 1e9 / d;
  m.operations_per_commit = static_cast<double>(grew(a.operations, reopened ? 0 : b.operations)) / d;
  return m;
}

// A topic's counters and publish rate, and how its publishes spread over the
// lanes in the window (skew, hot lane). Its groups are added by the caller.
TopicMetrics topic_metrics(const TopicStats& ts, const TopicStats* bt, PerSecond per_s, const MetricsOptions& options) {
  TopicMetrics tm;
  tm.name = ts.name;
  tm.is_queue = ts.is_queue;
  tm.durable = ts.durable;
  tm.lanes = ts.lanes;
  tm.published = ts.published;
  tm.publish_refused = ts.publish_refused;
  tm.unrouted = ts.unrouted;
  tm.publish_rate = per_s(grew(ts.published, bt ? bt->published : 0));
  std::uint64_t window_total = 0;
  std::vector<std::uint64_t> lane_delta(ts.lane_published.size());
  for (std::size_t i = 0; i < ts.lane_published.size(); ++i) {
    std::uint64_t old = (bt != nullptr && i < bt->lane_published.size()) ? bt->lane_published[i] : 0;
    lane_delta[i] = grew(ts.lane_published[i], old);
    window_total += lane_delta[i];
  }
  double max_share = 0;
  std::uint32_t max_lane = 0;
  for (std::size_t i = 0; i < ts.lane_published.size(); ++i) {
    LaneLoad ll;
    ll.lane = static_cast<std::uint32_t>(i);
    ll.published = ts.lane_published[i];
    ll.publish_rate = per_s(lane_delta[i]);
    ll.load_share = window_total > 0 ? static_cast<double>(lane_delta[i]) / static_cast<double>(window_total) : 0.0;
    if (ll.load_share > max_share) {
      max_share = ll.load_share;
      max_lane = ll.lane;
    }
    tm.lane_load.push_back(ll);
  }
  tm.load_skew = max_share * static_cast<double>(ts.lane_published.size());
  if (ts.lane_published.size() > 1 && window_total >= options.hot_lane_min_messages &&
      tm.load_skew >= options.hot_lane_skew)
    tm.hot_lane = max_lane;
  return tm;
}

// A group's counters, rates, lag and drain time, per lane too, and its
// latency over the window. The SLA verdict is added by the caller.
GroupMetrics group_metrics(const GroupStats& gs, const GroupStats* bg, std::int64_t now_wall_ns, PerSecond per_s) {
  const double span = per_s.span;
  GroupMetrics gm;
  gm.name = gs.name;
  gm.consumers = gs.consumers;
  gm.total = gs.total;
  gm.lag = gs.total.in_flight;
  const LaneCounters zero{};
  const LaneCounters& btot = bg ? bg->total : zero;
  gm.consume_rate = per_s(grew(finished(gs.total), finished(btot)));
  gm.error_rate = per_s(grew(gs.total.retried, btot.retried));
  gm.failure_rate = per_s(grew(gs.total.failed, btot.failed));
  gm.drop_rate = per_s(grew(gs.total.dropped, btot.dropped));
  if (gs.oldest_unprocessed_ns != 0) {
    gm.oldest_age_seconds = std::max(0.0, static_cast<double>(now_wall_ns - gs.oldest_unprocessed_ns) / 1e9);
  } else if (gm.lag == 0) {
    gm.oldest_age_seconds = 0.0;
  }
  if (gm.lag == 0) {
    gm.drain_seconds = 0.0;
  } else if (span > 0 && gm.consume_rate > 0) {
    gm.drain_seconds = static_cast<double>(gm.lag) / gm.consume_rate;
  } else if (span > 0) {
    gm.stalled = true;
  }
  for (std::size_t i = 0; i < gs.lanes.size(); ++i) {
    const LaneCounters& c = gs.lanes[i];
    const LaneCounters& b = (bg != nullptr && i < bg->lanes.size()) ? bg->lanes[i] : zero;
    GroupLaneMetrics lm;
    lm.lane = static_cast<std::uint32_t>(i);
    lm.counters = c;
    lm.lag = c.in_flight;
    lm.consume_rate = per_s(grew(finished(c), finished(b)));
    lm.error_rate = per_s(grew(c.retried, b.retried));
    if (lm.lag == 0) {
      lm.drain_seconds = 0.0;
    } else if (span > 0 && lm.consume_rate > 0) {
      lm.drain_seconds = static_cast<double>(lm.lag) / lm.consume_rate;
    }
    gm.lanes.push_back(lm);
  }
  gm.paused = gs.paused;
  gm.paused_since_ns = gs.paused_since_ns;
  gm.pause_reason = gs.pause_reason;
  gm.pause_last_error = gs.pause_last_error;
  gm.pauses = gs.pauses;
  gm.probes = gs.probes;
  gm.latency = gs.latency;
  gm.window_latency = histogram_delta(gs.latency, bg ? &bg->latency : nullptr);
  if (span <= 0) gm.window_latency = LatencyHistogram{};
  gm.latency_p50_seconds = quantile_seconds(gm.window_latency, 0.50);
  gm.latency_p99_seconds = quantile_seconds(gm.window_latency, 0.99);
  gm.latency_p999_seconds = quantile_seconds(gm.window_latency, 0.999);
  return gm;
}

}  // namespace

// Stuck lanes: how long this window has seen the same stuck call.
std::vector<StuckLane> MetricsWindow::track_stuck(const std::string& topic, const GroupStats& gs,
                                                  std::int64_t steady_ns) {
  std::vector<StuckLane> stuck_lanes;
  for (std::size_t i = 0; i < gs.lanes.size(); ++i) {
    const LaneCounters& c = gs.lanes[i];
    if (c.stuck_now == 0) continue;
    StuckTrack* st = nullptr;
    for (auto& x : stuck_)
      if (x.lane == i && x.topic == topic && x.group == gs.name) st = &x;
    if (st == nullptr) {
      stuck_.push_back(StuckTrack{topic, gs.name, static_cast<std::uint32_t>(i), steady_ns, c.stuck, false});
      st = &stuck_.back();
    } else if (c.stuck != st->stuck_total) {
      // Another call got stuck since the last sample (or the bus was reopened).
      st->since_ns = steady_ns;
      st->stuck_total = c.stuck;
    }
    st->seen = true;
    StuckLane sl;
    sl.topic = topic;
    sl.group = gs.name;
    sl.lane = static_cast<std::uint32_t>(i);
    sl.calls = c.stuck_now;
    sl.stuck_total = c.stuck;
    sl.seen_seconds = static_cast<double>(steady_ns - st->since_ns) / 1e9;
    stuck_lanes.push_back(std::move(sl));
  }
  return stuck_lanes;
}

// The SLA evaluator: nullopt when the group has no policy (its own or the default).
std::optional<SlaReport> MetricsWindow::evaluate_sla(const std::string& topic, const GroupMetrics& gm,
                                                     std::vector<StuckLane> stuck, const DlqMetrics& dlq,
                                                     std::int64_t steady_ns) {
  SlaTrack* tr = track(topic, gm.name, options_.default_sla.has_value());
  std::optional<SlaPolicy> policy;
  if (tr != nullptr) {
    tr->seen = true;
    policy = tr->policy ? tr->policy : options_.default_sla;
  }
  if (!policy) return std::nullopt;
  SlaReport r;
  r.sla_seconds = seconds(policy->sla);
  r.page_fraction = policy->page_fraction;
  r.threshold_seconds = r.page_fraction * r.sla_seconds;
  r.hold_seconds = policy->hold.count() > 0 ? seconds(policy->hold) : seconds(options_.window);
  const double age = gm.oldest_age_seconds.value_or(0.0);
  if (gm.stalled) {
    r.projected_seconds = std::numeric_limits<double>::infinity();
  } else if (gm.drain_seconds) {
    r.projected_seconds = age + *gm.drain_seconds;
  }
  // The instant verdict is classify_sla's (the one rule, also for tools); the hold
  // turns an instant AtRisk into a page only once it has lasted. An unknown age
  // (nullopt) is not a breach; an unknown projection is no risk yet.
  const SlaState instant =
      classify_sla(*policy, gm.oldest_age_seconds.value_or(0.0), r.projected_seconds.value_or(0.0));
  r.risk_condition = r.projected_seconds && instant != SlaState::Ok;
  if (r.risk_condition) {
    if (!tr->risk_since_ns) tr->risk_since_ns = steady_ns;
    r.risk_held_seconds = static_cast<double>(steady_ns - *tr->risk_since_ns) / 1e9;
  } else {
    tr->risk_since_ns.reset();
  }
  if (gm.oldest_age_seconds && instant == SlaState::Breached) {
    r.state = SlaState::Breached;
  } else if (!r.projected_seconds) {
    r.state = SlaState::Unknown;
  } else if (r.risk_condition && r.risk_held_seconds >= r.hold_seconds) {
    r.state = SlaState::AtRisk;
  } else {
    r.state = SlaState::Ok;
  }
  r.stuck = std::move(stuck);
  if (!r.stuck.empty() && (r.state == SlaState::Unknown || r.state == SlaState::Ok)) r.state = SlaState::AtRisk;
  // A group paused through a dependency outage delivers nothing but probes:
  // at risk at once, whatever its backlog's age says yet.
  if (gm.paused && (r.state == SlaState::Unknown || r.state == SlaState::Ok)) r.state = SlaState::AtRisk;
  // The DLQ is per store: growing = its depth rose over the window.
  if (dlq.depth_change) r.dlq_growing = *dlq.depth_change > 0;
  return r;
}

void MetricsWindow::recompute() {
  const Sample& now = samples_.back();
  const Sample& base = samples_.front();
  const double span = static_cast<double>(now.steady_ns - base.steady_ns) / 1e9;
  const PerSecond per_s{span};

  for (auto& t : sla_) t.seen = false;
  for (auto& t : stuck_) t.seen = false;

  MetricsSnapshot snap;
  snap.bus = now.stats.name;
  snap.steady_ns = now.steady_ns;
  snap.wall_ns = now.wall_ns;
  snap.window_seconds = span;
  snap.samples = samples_.size();
  snap.bridges = now.stats.bridges;
  snap.namespaces = now.stats.namespaces;
  snap.deprecated_fields = now.stats.deprecated_fields;
  snap.dlq = window_dlq(now.stats, base.stats, per_s);
  snap.store = window_store(now.stats, base.stats, per_s);
  for (const TopicStats& ts : now.stats.topics) {
    const TopicStats* bt = find_topic(base.stats, ts.name);
    TopicMetrics tm = topic_metrics(ts, bt, per_s, options_);
    for (const GroupStats& gs : ts.groups) {
      GroupMetrics gm = group_metrics(gs, find_group(bt, gs.name), now.wall_ns, per_s);
      std::vector<StuckLane> stuck = track_stuck(ts.name, gs, now.steady_ns);
      gm.sla = evaluate_sla(ts.name, gm, std::move(stuck), snap.dlq, now.steady_ns);
      tm.groups.push_back(std::move(gm));
    }
    snap.topics.push_back(std::move(tm));
  }
  // Forget the hold state of groups that are gone (explicit policies stay).
  std::erase_if(sla_, [](const SlaTrack& t) { return !t.seen && !t.policy; });
  // A lane that is no longer stuck (or gone) starts afresh next time.
  std::erase_if(stuck_, [](const StuckTrack& t) { return !t.seen; });
  latest_ = std::move(snap);
}

// ---------------------------------------------------------------- Monitor

MetricsClock MetricsClock::system() {
  MetricsClock c;
  c.steady_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  c.wall_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  return c;
}

struct Monitor::Impl {
  Impl(std::function<BusStats()> s, MetricsWindow w, MetricsClock c)
      : source(std::move(s)), clock(std::move(c)), window(std::move(w)) {}
  const std::function<BusStats()> source;
  const MetricsClock clock;
  mutable detail::Mutex mu;
  MetricsWindow window GUARDED_BY(mu);
};

Monitor::Monitor(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}
Monitor::~Monitor() = default;

Result<std::unique_ptr<Monitor>> Monitor::create(const Bus& bus, const MetricsOptions& options, MetricsClock clock) {
  const Bus* b = &bus;
  return create([b] { return b->stats(); }, options, std::move(clock));
}

Result<std::unique_ptr<Monitor>> Monitor::create(std::function<BusStats()> source, const MetricsOptions& options,
                                                 MetricsClock clock) {
  if (!source) return Result<std::unique_ptr<Monitor>>(Code::InvalidArgument, "Monitor::create: the stats source is empty");
  if (!clock.steady_ns || !clock.wall_ns)
    return Result<std::unique_ptr<Monitor>>(Code::InvalidArgument, "Monitor::create: a MetricsClock function is empty");
  auto w = MetricsWindow::create(options);
  if (!w.ok()) return w.status();
  auto impl = std::make_unique<Impl>(std::move(source), std::move(*w), std::move(clock));
  return std::unique_ptr<Monitor>(new Monitor(std::move(impl)));
}

Status Monitor::sample() {
  // Read the source and the clocks outside the lock: Bus::stats() may take a
  // while on a durable bus and must not hold up readers of the snapshot.
  BusStats s = impl_->source();
  const std::int64_t steady = impl_->clock.steady_ns();
  const std::int64_t wall = impl_->clock.wall_ns();
  detail::MutexLock l(&impl_->mu);
  return impl_->window.add(std::move(s), steady, wall);
}

Status Monitor::set_sla(std::string_view topic, std::string_view group, const SlaPolicy& policy) {
  detail::MutexLock l(&impl_->mu);
  return impl_->window.set_sla(topic, group, policy);
}

MetricsSnapshot Monitor::snapshot() const {
  detail::MutexLock l(&impl_->mu);
  return impl_->window.snapshot();
}

std::string Monitor::prometheus() const { return to_prometheus(snapshot()); }
std::string Monitor::json() const { return to_json(snapshot()); }

// ---------------------------------------------------------------- Prometheus

namespace {

using detail::PromWriter;
using Labels = PromWriter::Labels;

Labels topic_labels(const TopicMetrics& t) { return {{"topic", t.name}}; }
Labels group_labels(const TopicMetrics& t, const GroupMetrics& g) { return {{"topic", t.name}, {"group", g.name}}; }
Labels lane_labels(const TopicMetrics& t, const GroupMetrics& g, std::uint32_t lane) {
  return {{"topic", t.name}, {"group", g.name}, {"lane", std::to_string(lane)}};
}

template <typename F>
void each_group(const MetricsSnapshot& s, F&& f) {
  for (const auto& t : s.topics)
    for (const auto& g : t.groups) f(t, g);
}

// Dead-letter queue (per store).
void write_dlq(PromWriter& w, const MetricsSnapshot& s) {
  if (s.dlq.available) {
    w.family("lanebus_dlq_depth_messages", "gauge", "Dead-letter entries waiting for review or replay (store-wide).");
    w.sample_u64("lanebus_dlq_depth_messages", {}, s.dlq.depth.value_or(0));
    w.family("lanebus_dlq_oldest_age_seconds", "gauge", "Age of the oldest pending dead-letter entry (0 = none).");
    w.sample("lanebus_dlq_oldest_age_seconds", {}, s.dlq.oldest_age_seconds.value_or(0.0));
    w.family("lanebus_dlq_arrivals_total", "counter", "Messages dead-lettered since the store was created, per class.");
    const char* classes[4] = {"transient", "permanent", "poison", "expired"};
    for (int c = 0; c < 4; ++c) w.sample_u64("lanebus_dlq_arrivals_total", {{"class", classes[c]}}, s.dlq.arrivals[c]);
    if (s.dlq.arrival_rate) {
      w.family("lanebus_dlq_arrival_rate_per_second", "gauge", "Dead-letter arrivals per second over the window.");
      w.sample("lanebus_dlq_arrival_rate_per_second", {}, *s.dlq.arrival_rate);
    }
    if (s.dlq.depth_change) {
      w.family("lanebus_dlq_growing", "gauge", "1 when the dead-letter depth rose over the window.");
      w.sample("lanebus_dlq_growing", {}, *s.dlq.depth_change > 0 ? 1.0 : 0.0);
    }
  }
}

// The store writer (this process's commits).
void write_store(PromWriter& w, const MetricsSnapshot& s) {
  if (!s.store.available) return;
  const StoreWriteStats& t = s.store.totals;
  w.family("lanebus_store_commits_total", "counter", "Write transactions this process's store writer committed.");
  w.sample_u64("lanebus_store_commits_total", {}, t.commits);
  w.family("lanebus_store_operations_total", "counter",
           "Operations (appends, claims, acks, offset commits...) in those commits.");
  w.sample_u64("lanebus_store_operations_total", {}, t.operations);
  w.family("lanebus_store_appends_total", "counter", "Messages appended by this process's store writer.");
  w.sample_u64("lanebus_store_appends_total", {}, t.appends);
  w.family("lanebus_store_fsyncs_total", "counter", "Sync-mode commits plus async-mode flushes.");
  w.sample_u64("lanebus_store_fsyncs_total", {}, t.fsyncs);
  w.family("lanebus_store_commit_seconds_total", "counter",
           "Time from each write transaction's begin to its commit's return, summed.");
  w.sample_text("lanebus_store_commit_seconds_total", {}, detail::format_ns_as_seconds(t.commit_ns));
  w.family("lanebus_store_commit_write_seconds_total", "counter",
           "Of lanebus_store_commit_seconds_total, the time in LMDB's commit call (page writes and, in Sync mode, "
           "the flushes).");
  w.sample_text("lanebus_store_commit_write_seconds_total", {}, detail::format_ns_as_seconds(t.commit_write_ns));
  w.family("lanebus_store_max_write_lock_wait_seconds", "gauge",
           "The longest wait for LMDB's writer lock (another process writing).");
  w.sample_text("lanebus_store_max_write_lock_wait_seconds", {}, detail::format_ns_as_seconds(t.max_write_lock_wait_ns));
  if (s.store.commit_avg_seconds) {
    w.family("lanebus_store_commit_avg_seconds", "gauge", "The average commit over the window.");
    w.sample("lanebus_store_commit_avg_seconds", {}, *s.store.commit_avg_seconds);
    w.family("lanebus_store_operations_per_commit", "gauge", "Operations per commit over the window (the group commit's batch).");
    w.sample("lanebus_store_operations_per_commit", {}, s.store.operations_per_commit.value_or(0.0));
  }
}

// Topics.
void write_topics(PromWriter& w, const MetricsSnapshot& s) {
  w.family("lanebus_published_total", "counter", "Messages accepted by publish.");
  for (const auto& t : s.topics) w.sample_u64("lanebus_published_total", topic_labels(t), t.published);
  w.family("lanebus_publish_refused_total", "counter", "Publishes refused with WouldBlock or TimedOut.");
  for (const auto& t : s.topics) w.sample_u64("lanebus_publish_refused_total", topic_labels(t), t.publish_refused);
  w.family("lanebus_unrouted_total", "counter", "Publishes accepted while the topic had no consumer group.");
  for (const auto& t : s.topics) w.sample_u64("lanebus_unrouted_total", topic_labels(t), t.unrouted);
  w.family("lanebus_publish_rate_per_second", "gauge", "Messages published per second over the window.");
  for (const auto& t : s.topics) w.sample("lanebus_publish_rate_per_second", topic_labels(t), t.publish_rate);
  w.family("lanebus_lane_published_total", "counter", "Messages published into each lane.");
  for (const auto& t : s.topics)
    for (const auto& l : t.lane_load)
      w.sample_u64("lanebus_lane_published_total", {{"topic", t.name}, {"lane", std::to_string(l.lane)}}, l.published);
  w.family("lanebus_lane_load_share", "gauge", "Fraction (0..1) of the topic's publishes over the window in each lane.");
  for (const auto& t : s.topics)
    for (const auto& l : t.lane_load)
      w.sample("lanebus_lane_load_share", {{"topic", t.name}, {"lane", std::to_string(l.lane)}}, l.load_share);
  w.family("lanebus_lane_load_skew", "gauge",
           "Largest lane share times the lane count: 1 = even, the lane count = all traffic in one lane.");
  for (const auto& t : s.topics) w.sample("lanebus_lane_load_skew", topic_labels(t), t.load_skew);
  w.family("lanebus_lane_hot", "gauge", "1 for the lane carrying a hot key (see MetricsOptions::hot_lane_skew), else 0.");
  for (const auto& t : s.topics)
    for (const auto& l : t.lane_load)
      w.sample_u64("lanebus_lane_hot", {{"topic", t.name}, {"lane", std::to_string(l.lane)}},
                   t.hot_lane && *t.hot_lane == l.lane ? 1 : 0);
}

// Group lanes: lifetime counters and lag.
void write_lane_counters(PromWriter& w, const MetricsSnapshot& s) {
  struct Counter {
    const char* name;
    const char* help;
    std::uint64_t LaneCounters::*field;
    bool durable_queues_only = false;  // claims live in the store: only durable queue lanes have them
  };
  static constexpr Counter kCounters[] = {
      {"lanebus_delivered_total", "Handler calls (every attempt).", &LaneCounters::delivered},
      {"lanebus_acked_total", "Messages the handler acked.", &LaneCounters::acked},
      {"lanebus_retried_total", "Retry outcomes and caught handler exceptions.", &LaneCounters::retried},
      {"lanebus_rejected_total", "Messages the handler rejected.", &LaneCounters::rejected},
      {"lanebus_failed_total", "Messages that used up max_attempts.", &LaneCounters::failed},
      {"lanebus_timed_out_total", "Handler calls that overran attempt_timeout and then failed.",
       &LaneCounters::timed_out},
      {"lanebus_stuck_total", "Handler calls seen still running past attempt_timeout (each call counted once).",
       &LaneCounters::stuck},
      {"lanebus_dropped_total", "Messages discarded (DropOldest backpressure, or no consumer).", &LaneCounters::dropped},
      {"lanebus_expired_total", "Messages whose TTL ended before their handler started (never delivered).",
       &LaneCounters::expired},
      {"lanebus_skipped_total", "Durable messages deleted by retention before the group read them.",
       &LaneCounters::skipped},
  };
  for (const Counter& c : kCounters) {
    w.family(c.name, "counter", c.help);
    each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
      for (const auto& l : g.lanes) w.sample_u64(c.name, lane_labels(t, g, l.lane), l.counters.*(c.field));
    });
  }
  w.family("lanebus_consumer_lag_messages", "gauge", "Messages waiting for the group in each lane.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    for (const auto& l : g.lanes) w.sample_u64("lanebus_consumer_lag_messages", lane_labels(t, g, l.lane), l.lag);
  });
  static constexpr Counter kGauges[] = {
      {"lanebus_stuck_handlers", "Handler calls of the lane running past attempt_timeout now (0 or 1).",
       &LaneCounters::stuck_now},
      {"lanebus_set_aside_messages",
       "Messages held back by key_parallel_retry: in retry backoff, or behind one of their key.",
       &LaneCounters::set_aside},
      {"lanebus_claimed_messages", "Durable queue messages claimed by a consumer and not yet acked.",
       &LaneCounters::claimed, true},
      {"lanebus_overdue_claims",
       "Durable queue claims past their deadline: a consumer died with them or a handler overran attempt_timeout.",
       &LaneCounters::overdue, true},
  };
  for (const Counter& c : kGauges) {
    w.family(c.name, "gauge", c.help);
    each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
      if (c.durable_queues_only && !(t.is_queue && t.durable)) return;
      for (const auto& l : g.lanes) w.sample_u64(c.name, lane_labels(t, g, l.lane), l.counters.*(c.field));
    });
  }
}

// Groups: derived gauges.
void write_group_gauges(PromWriter& w, const MetricsSnapshot& s) {
  w.family("lanebus_consumers", "gauge", "Subscriptions attached to the group.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample_u64("lanebus_consumers", group_labels(t, g), g.consumers);
  });
  w.family("lanebus_group_paused", "gauge",
           "1 while the group is paused through a dependency outage (GroupOptions::outage), else 0.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample_u64("lanebus_group_paused", group_labels(t, g), g.paused ? 1 : 0);
  });
  w.family("lanebus_group_paused_since_seconds", "gauge", "Wall clock (Unix seconds) the current pause began.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (g.paused)
      w.sample("lanebus_group_paused_since_seconds", group_labels(t, g),
               static_cast<double>(g.paused_since_ns) / 1e9);
  });
  w.family("lanebus_group_pauses_total", "counter", "Times the group was paused through a dependency outage.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample_u64("lanebus_group_pauses_total", group_labels(t, g), g.pauses);
  });
  w.family("lanebus_group_probes_total", "counter", "Probe messages delivered while the group was paused.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample_u64("lanebus_group_probes_total", group_labels(t, g), g.probes);
  });
  w.family("lanebus_consume_rate_per_second", "gauge",
           "Messages finished (acked + rejected + failed) per second over the window.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample("lanebus_consume_rate_per_second", group_labels(t, g), g.consume_rate);
  });
  w.family("lanebus_error_rate_per_second", "gauge",
           "Failing handler attempts (retry outcomes, exceptions) per second over the window.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    w.sample("lanebus_error_rate_per_second", group_labels(t, g), g.error_rate);
  });
  w.family("lanebus_oldest_unprocessed_age_seconds", "gauge",
           "Age of the oldest message the group has not finished (0 when none waits).");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (g.oldest_age_seconds)
      w.sample("lanebus_oldest_unprocessed_age_seconds", group_labels(t, g), *g.oldest_age_seconds);
  });
  w.family("lanebus_projected_drain_seconds", "gauge",
           "Lag divided by the consume rate: time to drain the backlog (+Inf when stalled).");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (g.stalled) {
      w.sample_text("lanebus_projected_drain_seconds", group_labels(t, g), "+Inf");
    } else if (g.drain_seconds) {
      w.sample("lanebus_projected_drain_seconds", group_labels(t, g), *g.drain_seconds);
    }
  });
}

// Latency.
void write_latency(PromWriter& w, const MetricsSnapshot& s) {
  w.family("lanebus_e2e_latency_seconds", "histogram",
           "End-to-end latency: message created_at to handler done, since the bus opened.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    std::uint64_t cum = 0;
    for (std::uint32_t i = 0; i + 1 < LatencyHistogram::kBuckets; ++i) {
      if (i < g.latency.counts.size()) cum += g.latency.counts[i];
      Labels l = group_labels(t, g);
      l.emplace_back("le", detail::format_ns_as_seconds(LatencyHistogram::upper_bound_ns(i)));
      w.sample_u64("lanebus_e2e_latency_seconds_bucket", l, cum);
    }
    Labels inf = group_labels(t, g);
    inf.emplace_back("le", "+Inf");
    w.sample_u64("lanebus_e2e_latency_seconds_bucket", inf, g.latency.count);
    w.sample_text("lanebus_e2e_latency_seconds_sum", group_labels(t, g), detail::format_ns_as_seconds(g.latency.sum_ns));
    w.sample_u64("lanebus_e2e_latency_seconds_count", group_labels(t, g), g.latency.count);
  });
  // A summary in Prometheus' sense (client_golang's Summary): quantiles over
  // a sliding window, _sum and _count cumulative since the bus opened (the
  // histogram's). A gauge may not carry a `quantile` label (promtool).
  w.family("lanebus_e2e_latency_window_seconds", "summary",
           "End-to-end latency quantiles over the window (bucket upper bounds); _sum and _count since the bus opened.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    const std::pair<const char*, std::optional<double>> qs[] = {
        {"0.5", g.latency_p50_seconds}, {"0.99", g.latency_p99_seconds}, {"0.999", g.latency_p999_seconds}};
    for (const auto& [q, v] : qs) {
      if (!v) continue;
      Labels l = group_labels(t, g);
      l.emplace_back("quantile", q);
      w.sample("lanebus_e2e_latency_window_seconds", l, *v);
    }
    w.sample_text("lanebus_e2e_latency_window_seconds_sum", group_labels(t, g),
                  detail::format_ns_as_seconds(g.latency.sum_ns));
    w.sample_u64("lanebus_e2e_latency_window_seconds_count", group_labels(t, g), g.latency.count);
  });
}

// SLA.
void write_sla(PromWriter& w, const MetricsSnapshot& s) {
  w.family("lanebus_sla_seconds", "gauge", "The group's SLA: promised created_at to handled time.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (g.sla) w.sample("lanebus_sla_seconds", group_labels(t, g), g.sla->sla_seconds);
  });
  w.family("lanebus_sla_projected_seconds", "gauge",
           "Oldest unprocessed age plus projected drain time (+Inf when stalled).");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (g.sla && g.sla->projected_seconds)
      w.sample("lanebus_sla_projected_seconds", group_labels(t, g), *g.sla->projected_seconds);
  });
  w.family("lanebus_sla_state", "gauge",
           "SLA verdict as a state set: 1 for the current state (unknown, ok, at_risk, breached), else 0.");
  each_group(s, [&](const TopicMetrics& t, const GroupMetrics& g) {
    if (!g.sla) return;
    for (SlaState st : {SlaState::Unknown, SlaState::Ok, SlaState::AtRisk, SlaState::Breached}) {
      Labels l = group_labels(t, g);
      l.emplace_back("state", to_string(st));
      w.sample_u64("lanebus_sla_state", l, g.sla->state == st ? 1 : 0);
    }
  });
}

// Namespaces: usage and quotas (tenancy.hpp, doc/tenancy.md).
void write_namespaces(PromWriter& w, const MetricsSnapshot& s) {
  if (!s.namespaces.empty()) {
    struct NsCounter {
      const char* name;
      const char* type;
      const char* help;
      std::uint64_t NamespaceUsage::*field;
    };
    const NsCounter ns_counters[] = {
        {"lanebus_namespace_messages_in_total", "counter", "Publishes accepted into the namespace.",
         &NamespaceUsage::msgs_in},
        {"lanebus_namespace_bytes_in_total", "counter", "Key + idempotency key + payload bytes accepted.",
         &NamespaceUsage::bytes_in},
        {"lanebus_namespace_messages_out_total", "counter", "Handler calls of the namespace's topics.",
         &NamespaceUsage::msgs_out},
        {"lanebus_namespace_bytes_out_total", "counter", "Payload bytes of those handler calls.",
         &NamespaceUsage::bytes_out},
        {"lanebus_namespace_throttled_total", "counter", "Publishes that waited for the quota, plus consume slow-downs.",
         &NamespaceUsage::throttled},
        {"lanebus_namespace_refused_total", "counter", "Publishes refused with QuotaExceeded.",
         &NamespaceUsage::refused},
        {"lanebus_namespace_seconds_at_ceiling_total", "counter",
         "Seconds in which the publish quota throttled or refused something.", &NamespaceUsage::seconds_at_ceiling},
        {"lanebus_namespace_stored_bytes", "gauge", "Retained log bytes of the namespace's durable topics.",
         &NamespaceUsage::stored_bytes},
    };
    for (const NsCounter& c : ns_counters) {
      w.family(c.name, c.type, c.help);
      for (const NamespaceInfo& n : s.namespaces) w.sample_u64(c.name, {{"namespace", n.name}}, n.usage.*c.field);
    }
    w.family("lanebus_namespace_peak_in_per_second", "gauge", "Highest accepted publishes in one second (this run).");
    for (const NamespaceInfo& n : s.namespaces)
      w.sample("lanebus_namespace_peak_in_per_second", {{"namespace", n.name}}, n.usage.peak_in_per_s);
    w.family("lanebus_namespace_publish_quota_per_second", "gauge",
             "The namespace's publish quota in messages/s (0 = none).");
    for (const NamespaceInfo& n : s.namespaces)
      w.sample("lanebus_namespace_publish_quota_per_second", {{"namespace", n.name}}, n.policy.publish.msgs_per_s);
  }
}

// Deprecated fields of typed topics and who still reads them (doc/schemas.md).
void write_deprecated_fields(PromWriter& w, const MetricsSnapshot& s) {
  if (!s.deprecated_fields.empty()) {
    w.family("lanebus_deprecated_field_window_end_seconds", "gauge",
             "When the deprecation window of the field ends (seconds since the epoch); removal is refused before.");
    for (const DeprecatedField& f : s.deprecated_fields)
      w.sample("lanebus_deprecated_field_window_end_seconds",
               {{"topic", f.topic}, {"field", f.field}, {"replacement", f.replacement}},
               static_cast<double>(f.window_ends_ns) / 1e9);
    w.family("lanebus_deprecated_field_reads_total", "counter",
             "Audited reads of a deprecated field by a group since the deprecation (flushed counts).");
    for (const DeprecatedField& f : s.deprecated_fields)
      for (const DeprecatedFieldReader& r : f.readers)
        w.sample_u64("lanebus_deprecated_field_reads_total", {{"topic", f.topic}, {"field", f.field}, {"group", r.group}},
                     r.reads);
    w.family("lanebus_deprecated_field_last_read_seconds", "gauge",
             "Wall clock of the group's last audited read of the deprecated field (0 = none since the deprecation).");
    for (const DeprecatedField& f : s.deprecated_fields)
      for (const DeprecatedFieldReader& r : f.readers)
        w.sample("lanebus_deprecated_field_last_read_seconds", {{"topic", f.topic}, {"field", f.field}, {"group", r.group}},
                 static_cast<double>(r.last_read_ns) / 1e9);
    w.family("lanebus_deprecated_field_in_contract", "gauge",
             "1: the group's contract (GroupOptions::reads) declares the deprecated field (the contract is flagged).");
    for (const DeprecatedField& f : s.deprecated_fields)
      for (const DeprecatedFieldReader& r : f.readers)
        w.sample_u64("lanebus_deprecated_field_in_contract", {{"topic", f.topic}, {"field", f.field}, {"group", r.group}},
                     r.contract_declares ? 1 : 0);
  }
}

// Bridges to NATS JetStream (bridge.hpp).
void write_bridges(PromWriter& w, const MetricsSnapshot& s) {
  if (!s.bridges.empty()) {
    w.family("lanebus_bridge_state", "gauge",
             "Bridge connection state as a state set: 1 for the current state (connected, retrying, failed).");
    for (const BridgeStats& b : s.bridges)
      for (BridgeState st : {BridgeState::Connected, BridgeState::Retrying, BridgeState::Failed})
        w.sample_u64("lanebus_bridge_state", {{"bridge", b.name}, {"state", to_string(st)}},
                     b.state == st && !b.stopped ? 1 : 0);  // a stopped bridge (status record): none
    struct Counter {
      const char* name;
      const char* type;
      const char* help;
      std::uint64_t BridgeMirrorStats::*field;
    };
    const Counter counters[] = {
        {"lanebus_bridge_published_total", "counter", "Publishes sent to JetStream (re-sends included).",
         &BridgeMirrorStats::published},
        {"lanebus_bridge_acked_total", "counter", "PubAcks received (out) or messages acked to JetStream (in).",
         &BridgeMirrorStats::acked},
        {"lanebus_bridge_duplicates_total", "counter",
         "Re-sends JetStream removed by Nats-Msg-Id (out); redeliveries already stored (in).",
         &BridgeMirrorStats::duplicates},
        {"lanebus_bridge_redelivered_total", "counter", "Messages JetStream delivered more than once (in).",
         &BridgeMirrorStats::redelivered},
        {"lanebus_bridge_stored_total", "counter", "Messages appended to the local topic (in).",
         &BridgeMirrorStats::stored},
        {"lanebus_bridge_dead_lettered_total", "counter", "Messages dead-lettered as too large for the server (out).",
         &BridgeMirrorStats::dead_lettered},
        {"lanebus_bridge_rewinds_total", "counter",
         "Consumer re-created at the first un-stored sequence to keep sequence order (in).",
         &BridgeMirrorStats::rewinds},
        {"lanebus_bridge_lag_messages", "gauge",
         "Out: stored and not yet acknowledged by JetStream; in: pending in the JetStream consumer.",
         &BridgeMirrorStats::lag},
    };
    // Status records read from the store (`lanebus serve`): how old each is.
    bool records = false;
    for (const BridgeStats& b : s.bridges) records = records || b.status_written_ns != 0;
    if (records) {
      const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count();
      w.family("lanebus_bridge_status_age_seconds", "gauge",
               "Age of the bridge's status record in the store; large when the bridge process died or hangs.");
      for (const BridgeStats& b : s.bridges)
        if (b.status_written_ns != 0)
          w.sample("lanebus_bridge_status_age_seconds", {{"bridge", b.name}},
                   static_cast<double>(now - b.status_written_ns) / 1e9);
    }
    for (const Counter& c : counters) {
      w.family(c.name, c.type, c.help);
      for (const BridgeStats& b : s.bridges)
        for (const BridgeMirrorStats& m : b.mirrors)
          w.sample_u64(c.name,
                       {{"bridge", b.name}, {"direction", m.direction}, {"topic", m.topic}, {"stream", m.stream}},
                       m.*c.field);
    }
  }
}

}  // namespace

// The whole snapshot in the text exposition format, one section of families
// after another, always in this order.
std::string to_prometheus(const MetricsSnapshot& s) {
  PromWriter w;
  w.family("lanebus_metrics_window_seconds", "gauge", "Time span the rates are computed over (0 = one sample).");
  w.sample("lanebus_metrics_window_seconds", {}, s.window_seconds);
  write_dlq(w, s);
  write_store(w, s);
  write_topics(w, s);
  write_lane_counters(w, s);
  write_group_gauges(w, s);
  write_latency(w, s);
  write_sla(w, s);
  write_namespaces(w, s);
  write_deprecated_fields(w, s);
  write_bridges(w, s);
  return w.take();
}

// ---------------------------------------------------------------- JSON

namespace {

void counters_json(detail::JsonWriter& j, const LaneCounters& c) {
  j.begin_object();
  j.key("delivered"); j.u64(c.delivered);
  j.key("acked"); j.u64(c.acked);
  j.key("retried"); j.u64(c.retried);
  j.key("rejected"); j.u64(c.rejected);
  j.key("failed"); j.u64(c.failed);
  j.key("timed_out"); j.u64(c.timed_out);
  j.key("stuck"); j.u64(c.stuck);
  j.key("stuck_now"); j.u64(c.stuck_now);
  j.key("set_aside"); j.u64(c.set_aside);
  j.key("dropped"); j.u64(c.dropped);
  j.key("expired"); j.u64(c.expired);
  j.key("skipped"); j.u64(c.skipped);
  j.key("in_flight"); j.u64(c.in_flight);
  j.key("claimed"); j.u64(c.claimed);
  j.key("overdue"); j.u64(c.overdue);
  j.end_object();
}

// The store-wide DLQ figures (a group's are fewer: group_json).
void dlq_json(detail::JsonWriter& j, const DlqMetrics& d) {
  j.begin_object();
  j.key("available"); j.boolean(d.available);
  j.key("depth");
  if (d.depth) {
    j.u64(*d.depth);
  } else {
    j.null();
  }
  j.key("oldest_age_seconds"); j.number(d.oldest_age_seconds);
  j.key("arrival_rate"); j.number(d.arrival_rate);
  j.key("arrivals");  // per class, since the store was created
  j.begin_object();
  j.key("transient"); j.u64(d.arrivals[0]);
  j.key("permanent"); j.u64(d.arrivals[1]);
  j.key("poison"); j.u64(d.arrivals[2]);
  j.key("expired"); j.u64(d.arrivals[3]);
  j.end_object();
  j.key("growing");
  if (d.depth_change) {
    j.boolean(*d.depth_change > 0);
  } else {
    j.null();
  }
  j.end_object();
}

// A group's SLA verdict and the lanes it found stuck.
void sla_json(detail::JsonWriter& j, const SlaReport& r) {
  j.begin_object();
  j.key("state"); j.string(to_string(r.state));
  j.key("sla_seconds"); j.number(r.sla_seconds);
  j.key("page_fraction"); j.number(r.page_fraction);
  j.key("threshold_seconds"); j.number(r.threshold_seconds);
  j.key("hold_seconds"); j.number(r.hold_seconds);
  j.key("projected_seconds"); j.number(r.projected_seconds);
  j.key("risk_condition"); j.boolean(r.risk_condition);
  j.key("risk_held_seconds"); j.number(r.risk_held_seconds);
  j.key("dlq_growing");
  if (r.dlq_growing) {
    j.boolean(*r.dlq_growing);
  } else {
    j.null();
  }
  j.key("stuck");
  j.begin_array();
  for (const StuckLane& st : r.stuck) {
    j.begin_object();
    j.key("topic"); j.string(st.topic);
    j.key("group"); j.string(st.group);
    j.key("lane"); j.u64(st.lane);
    j.key("calls"); j.u64(st.calls);
    j.key("stuck_total"); j.u64(st.stuck_total);
    j.key("seen_seconds"); j.number(st.seen_seconds);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

// One group of a topic: its figures, latency, DLQ, SLA and lanes.
void group_json(detail::JsonWriter& j, const GroupMetrics& g) {
  j.begin_object();
  j.key("name"); j.string(g.name);
  j.key("consumers"); j.u64(g.consumers);
  j.key("lag"); j.u64(g.lag);
  j.key("consume_rate"); j.number(g.consume_rate);
  j.key("error_rate"); j.number(g.error_rate);
  j.key("failure_rate"); j.number(g.failure_rate);
  j.key("drop_rate"); j.number(g.drop_rate);
  j.key("oldest_age_seconds"); j.number(g.oldest_age_seconds);
  j.key("drain_seconds"); j.number(g.drain_seconds);
  j.key("stalled"); j.boolean(g.stalled);
  j.key("paused"); j.boolean(g.paused);
  j.key("paused_since_ns"); j.i64(g.paused_since_ns);
  j.key("pause_reason"); j.string(g.pause_reason);
  j.key("pause_last_error"); j.string(g.pause_last_error);
  j.key("pauses"); j.u64(g.pauses);
  j.key("probes"); j.u64(g.probes);
  j.key("totals"); counters_json(j, g.total);
  j.key("latency");
  j.begin_object();
  j.key("count"); j.u64(g.latency.count);
  j.key("sum_seconds"); j.number(static_cast<double>(g.latency.sum_ns) / 1e9);
  j.key("window_count"); j.u64(g.window_latency.count);
  j.key("p50_seconds"); j.number(g.latency_p50_seconds);
  j.key("p99_seconds"); j.number(g.latency_p99_seconds);
  j.key("p999_seconds"); j.number(g.latency_p999_seconds);
  j.end_object();
  j.key("dlq");
  j.begin_object();
  j.key("available"); j.boolean(g.dlq.available);
  j.key("depth");
  if (g.dlq.depth) {
    j.u64(*g.dlq.depth);
  } else {
    j.null();
  }
  j.key("oldest_age_seconds"); j.number(g.dlq.oldest_age_seconds);
  j.key("arrival_rate"); j.number(g.dlq.arrival_rate);
  j.end_object();
  j.key("sla");
  if (g.sla) {
    sla_json(j, *g.sla);
  } else {
    j.null();
  }
  j.key("lanes");
  j.begin_array();
  for (const auto& l : g.lanes) {
    j.begin_object();
    j.key("lane"); j.u64(l.lane);
    j.key("lag"); j.u64(l.lag);
    j.key("consume_rate"); j.number(l.consume_rate);
    j.key("error_rate"); j.number(l.error_rate);
    j.key("drain_seconds"); j.number(l.drain_seconds);
    j.key("counters"); counters_json(j, l.counters);
    j.end_object();
  }
  j.end_array();
  j.end_object();
}

// One topic: its figures, lane load and groups.
void topic_json(detail::JsonWriter& j, const TopicMetrics& t) {
  j.begin_object();
  j.key("name"); j.string(t.name);
  j.key("kind"); j.string(t.is_queue ? "queue" : "topic");
  j.key("durable"); j.boolean(t.durable);
  j.key("lanes"); j.u64(t.lanes);
  j.key("published"); j.u64(t.published);
  j.key("publish_refused"); j.u64(t.publish_refused);
  j.key("unrouted"); j.u64(t.unrouted);
  j.key("publish_rate"); j.number(t.publish_rate);
  j.key("load_skew"); j.number(t.load_skew);
  j.key("hot_lane");
  if (t.hot_lane) {
    j.u64(*t.hot_lane);
  } else {
    j.null();
}
j.key("lane_load");
j.begin_array();
for (const auto& l : t.lane_load) {
  j.begin_object();
  j.key("lane"); j.u64(l.lane);
  j.key("published"); j.u64(l.published);
  j.key("publish_rate"); j.number(l.publish_rate);
  j.key("load_share"); j.number(l.load_share);
  j.end_object();
}
j.end_array();
j.key("groups");
j.begin_array();
  for (const auto& g : t.groups) group_json(j, g);
j.end_array();
j.end_object();
}

// Usage, quotas and weight per namespace (tenancy.hpp).
void namespaces_json(detail::JsonWriter& j, const std::vector<NamespaceInfo>& namespaces) {
  j.key("namespaces");
  j.begin_array();
  for (const NamespaceInfo& n : namespaces) {
    j.begin_object();
    j.key("name"); j.string(n.name);
    j.key("declared"); j.boolean(n.declared);
    j.key("msgs_in"); j.u64(n.usage.msgs_in);
    j.key("bytes_in"); j.u64(n.usage.bytes_in);
    j.key("msgs_out"); j.u64(n.usage.msgs_out);
    j.key("bytes_out"); j.u64(n.usage.bytes_out);
    j.key("throttled"); j.u64(n.usage.throttled);
    j.key("refused"); j.u64(n.usage.refused);
    j.key("seconds_at_ceiling"); j.u64(n.usage.seconds_at_ceiling);
    j.key("stored_bytes"); j.u64(n.usage.stored_bytes);
    j.key("peak_in_per_s"); j.number(n.usage.peak_in_per_s);
    j.key("avg_in_per_s"); j.number(n.usage.avg_in_per_s);
    j.key("publish_quota_msgs_per_s"); j.number(n.policy.publish.msgs_per_s);
    j.key("publish_quota_bytes_per_s"); j.number(n.policy.publish.bytes_per_s);
    j.key("consume_quota_msgs_per_s"); j.number(n.policy.consume.msgs_per_s);
    j.key("consume_quota_bytes_per_s"); j.number(n.policy.consume.bytes_per_s);
    j.key("weight"); j.u64(n.policy.weight);
    j.end_object();
  }
  j.end_array();
}

// Deprecated fields and their readers (doc/schemas.md).
void deprecated_fields_json(detail::JsonWriter& j, const std::vector<DeprecatedField>& fields) {
  j.key("deprecated_fields");
  j.begin_array();
  for (const DeprecatedField& f : fields) {
    j.begin_object();
    j.key("topic"); j.string(f.topic);
    j.key("field"); j.string(f.field);
    j.key("replacement"); j.string(f.replacement);
    j.key("since_ns"); j.i64(f.since_ns);
    j.key("window_ends_ns"); j.i64(f.window_ends_ns);
    j.key("readers");
    j.begin_array();
    for (const DeprecatedFieldReader& r : f.readers) {
      j.begin_object();
      j.key("group"); j.string(r.group);
      j.key("reads"); j.u64(r.reads);
      j.key("last_read_ns"); j.i64(r.last_read_ns);
      j.key("contract_declares"); j.boolean(r.contract_declares);
      j.end_object();
    }
    j.end_array();
    j.end_object();
  }
  j.end_array();
}

// This process's store writer (MetricsSnapshot::store).
void store_json(detail::JsonWriter& j, const StoreMetrics& m) {
  const StoreWriteStats& t = m.totals;
  j.key("store");
  j.begin_object();
  j.key("commits"); j.u64(t.commits);
  j.key("operations"); j.u64(t.operations);
  j.key("appends"); j.u64(t.appends);
  j.key("fsyncs"); j.u64(t.fsyncs);
  j.key("commit_ns"); j.u64(t.commit_ns);
  j.key("commit_write_ns"); j.u64(t.commit_write_ns);
  j.key("max_write_lock_wait_ns"); j.u64(t.max_write_lock_wait_ns);
  j.key("commit_rate"); j.number(m.commit_rate);
  j.key("commit_avg_seconds"); j.number(m.commit_avg_seconds);
  j.key("commit_write_avg_seconds"); j.number(m.commit_write_avg_seconds);
  j.key("operations_per_commit"); j.number(m.operations_per_commit);
  j.end_object();
}

}  // namespace

std::string to_json(const MetricsSnapshot& s) {
  detail::JsonWriter j;
  j.begin_object();
  j.key("bus"); j.string(s.bus);
  j.key("steady_ns"); j.i64(s.steady_ns);
  j.key("wall_ns"); j.i64(s.wall_ns);
  j.key("window_seconds"); j.number(s.window_seconds);
  j.key("samples"); j.u64(s.samples);
  j.key("dlq");
  dlq_json(j, s.dlq);
  if (s.store.available) store_json(j, s.store);  // absent without a store
  j.key("topics");
  j.begin_array();
  for (const auto& t : s.topics) topic_json(j, t);
  j.end_array();
  if (!s.namespaces.empty()) namespaces_json(j, s.namespaces);  // tenancy.hpp
  if (!s.deprecated_fields.empty()) deprecated_fields_json(j, s.deprecated_fields);  // absent without deprecations
  if (!s.bridges.empty()) {  // absent without bridges: the output of a bus without one is unchanged
    j.key("bridges");
    j.raw(detail::bridges_json(s.bridges, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                              std::chrono::system_clock::now().time_since_epoch())
                                              .count()));
  }
  j.end_object();
  return j.take();
}

}  // namespace lanebus
