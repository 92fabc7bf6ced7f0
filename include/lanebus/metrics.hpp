// lanebus — MIT License.
// Observability (doc/observability.md): rates, lag, drain time, latency quantiles, per-lane
// load and an SLA evaluator, computed on read from BusStats counter snapshots;
// export as Prometheus text exposition and JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class Bus;

// ---------------------------------------------------------------- SLA

/// A service-level agreement on one consumer group: every message must be
/// handled within `sla` of its created_at. Plain struct.
struct SlaPolicy {
  /// The promised end-to-end time. Default 60 s. Must be > 0.
  std::chrono::nanoseconds sla{std::chrono::seconds(60)};
  /// Page when the projected time reaches this fraction of `sla` (75 %:
  /// 45 s of a 60 s SLA). Default 0.75. In (0, 1].
  double page_fraction = 0.75;
  /// How long the risk condition must hold, seen at every sample, before the
  /// state becomes AtRisk: a lag blip that clears within it is not a page.
  /// Default 0 = the window (MetricsOptions::window). Must be >= 0.
  std::chrono::nanoseconds hold{0};
};

/// What the SLA evaluator says about a group.
enum class SlaState : std::uint8_t {
  /// Not enough data: messages wait but no consume rate is known yet (one sample).
  Unknown,
  /// The projection is below the page threshold (or it crossed it for less than `hold`).
  Ok,
  /// oldest age + projected drain time >= page_fraction * sla, held for `hold`.
  /// A stalled group (messages waiting, nothing consumed over the window) projects infinity.
  /// Also, at once and whatever the projection: a lane of the group has a
  /// handler call running past GroupOptions::attempt_timeout (SlaReport::stuck).
  AtRisk,
  /// The oldest unprocessed message is already older than the SLA: a fact, not
  /// a forecast, so no hold applies.
  Breached,
};

/// "unknown", "ok", "at_risk", "breached" (the export's label values). Never null.
LANEBUS_API const char* to_string(SlaState state) noexcept;

/// The instant classification, without hold: Breached when
/// oldest_age_seconds >= sla; AtRisk when projected_seconds >= page_fraction *
/// sla (+infinity counts); else Ok. projected_seconds is oldest age + drain
/// time. Pure function: the one SLA rule, which MetricsWindow applies at every
/// sample before its hold (so `lanebus stats` and `lanebus serve`, which feed a
/// MetricsWindow from the store, judge by it too).
LANEBUS_API SlaState classify_sla(const SlaPolicy& policy, double oldest_age_seconds,
                                  double projected_seconds) noexcept;

/// A lane of a group whose handler call is running past
/// GroupOptions::attempt_timeout at the newest sample (LaneCounters::stuck_now
/// > 0): the lane is held up behind that call while its other messages age.
struct StuckLane {
  std::string topic{};
  std::string group{};  ///< "" for a queue's consumers.
  std::uint32_t lane = 0;
  std::uint64_t calls = 0;        ///< LaneCounters::stuck_now: calls past their budget now (1 per lane).
  std::uint64_t stuck_total = 0;  ///< LaneCounters::stuck: calls of this lane ever seen stuck.
  /// How long the window has seen this same stuck call: from the first sample
  /// that showed it (0 at that sample) to the newest one. A lower bound of how
  /// long it has been stuck (it was found up to one sampling interval late),
  /// and the call had already run attempt_timeout by then. A rise of
  /// `stuck_total` between samples means another call got stuck: it restarts.
  double seen_seconds = 0;
};

/// The evaluator's verdict for one group at the newest sample.
struct SlaReport {
  SlaState state = SlaState::Unknown;
  double sla_seconds = 0;
  double page_fraction = 0;
  double threshold_seconds = 0;  ///< page_fraction * sla_seconds.
  double hold_seconds = 0;       ///< The hold in effect (the window when the policy says 0).
  /// oldest age (0 when unknown) + projected drain time; +infinity when the
  /// group is stalled; nullopt when the drain time is not known yet.
  std::optional<double> projected_seconds{};
  /// The projection is at or past the threshold at the newest sample.
  bool risk_condition = false;
  /// How long the risk condition has held (0 when it does not hold now).
  double risk_held_seconds = 0;
  /// Whether the DLQ depth grew over the window (not merely non-empty). The
  /// DLQ is per store, so this is the store's DLQ (see MetricsSnapshot::dlq);
  /// nullopt for a bus without a store.
  std::optional<bool> dlq_growing{};
  /// The group's lanes with a handler call running past attempt_timeout now,
  /// by lane. Non-empty makes an Unknown or Ok state AtRisk, with no hold: the
  /// call has already overrun its own budget and no projection from counters
  /// can see that (an ephemeral lane's lag does not even count the message
  /// being handled). Breached stays Breached. projected_seconds,
  /// risk_condition and risk_held_seconds ignore it.
  std::vector<StuckLane> stuck{};
};

// ---------------------------------------------------------------- snapshots

/// Dead-letter queue metrics. The DLQ is kept per store (one per bus), so the
/// bus-wide value is MetricsSnapshot::dlq; GroupMetrics::dlq is unavailable
/// (its fields nullopt, never a made-up zero): the DLQ keeps no per-group
/// counters. A bus without a store has no DLQ (available = false).
struct DlqMetrics {
  bool available = false;
  std::optional<std::uint64_t> depth;         ///< Messages in the DLQ.
  std::optional<double> oldest_age_seconds{};   ///< Age of its oldest entry.
  std::optional<double> arrival_rate{};         ///< Messages per second into it over the window.
  /// Arrivals since the store was created, per class (index = ErrorClass).
  std::uint64_t arrivals[4] = {0, 0, 0, 0};
  /// Depth now minus depth at the start of the window (> 0: growing).
  std::optional<std::int64_t> depth_change{};
};

/// This process's store writer (BusStats::store): its commits over the window.
struct StoreMetrics {
  bool available = false;  ///< false without a store (or read-only).
  StoreWriteStats totals;  ///< Since the store was opened, at the newest sample.
  double commit_rate = 0;  ///< Commits per second over the window.
  /// Over the window: the average commit (begin to return; in Sync mode
  /// mostly the device's flushes, what a durable publish waits for), the
  /// part of it in LMDB's commit call, and the operations per commit (the
  /// group commit's batch). nullopt when nothing was committed in the window.
  std::optional<double> commit_avg_seconds{}, commit_write_avg_seconds{}, operations_per_commit{};
};

/// One lane of a topic: its share of the publishes (hot-key detection).
struct LaneLoad {
  std::uint32_t lane = 0;
  std::uint64_t published = 0;  ///< Lifetime publishes routed to this lane.
  double publish_rate = 0;      ///< Messages per second over the window.
  /// This lane's fraction (0..1) of the topic's publishes over the window; 0
  /// everywhere when nothing was published in the window.
  double load_share = 0;
};

/// One lane of a consumer group.
struct GroupLaneMetrics {
  std::uint32_t lane = 0;
  LaneCounters counters;   ///< Lifetime counters (in_flight = lag) at the newest sample.
  double consume_rate = 0; ///< (acked + rejected + failed) per second over the window.
  double error_rate = 0;   ///< retried per second over the window (see GroupMetrics::error_rate).
  std::uint64_t lag = 0;   ///< Messages waiting (= counters.in_flight).
  /// lag / consume_rate in seconds; 0 when lag is 0; nullopt when unknown (one
  /// sample) or when nothing was consumed in the lane over the window.
  std::optional<double> drain_seconds{};
};

/// One consumer group (or a queue's consumer set).
struct GroupMetrics {
  std::string name{};
  std::uint32_t consumers = 0;
  LaneCounters total;       ///< Lifetime counters summed over lanes.
  std::uint64_t lag = 0;    ///< Messages waiting, all lanes (ephemeral: queued; durable: stored, not committed).
  /// Messages finished per second over the window: acked + rejected + failed.
  double consume_rate = 0;
  /// Failing handler attempts per second over the window: retry outcomes and
  /// caught exceptions (`retried`). The last attempt of a message that then
  /// fails is already counted here, so `failed` is not added again.
  double error_rate = 0;
  double failure_rate = 0;  ///< Messages that used up max_attempts, per second.
  double drop_rate = 0;     ///< Messages dropped (DropOldest / no consumer), per second.
  /// Now minus created_at of the oldest message not yet finished; 0 when
  /// nothing waits; nullopt when messages wait but their age is unknown
  /// (BusOptions::metrics off).
  std::optional<double> oldest_age_seconds{};
  /// lag / consume_rate. 0 when lag is 0; nullopt when unknown (one sample)
  /// or stalled.
  std::optional<double> drain_seconds{};
  /// Messages wait and none was finished over the window (infinite drain time).
  bool stalled = false;
  LatencyHistogram latency;         ///< Lifetime end-to-end latency (created_at → handler done).
  LatencyHistogram window_latency;  ///< The part of `latency` recorded within the window.
  /// Quantiles of window_latency in seconds (a bucket's upper bound: within one
  /// bucket, at most 25 % above the truth); nullopt when no message finished
  /// in the window.
  std::optional<double> latency_p50_seconds, latency_p99_seconds, latency_p999_seconds;
  DlqMetrics dlq;
  /// The SLA verdict when a policy applies to this group (set_sla or default_sla).
  /// A paused group (outage pause) is at least at_risk at once.
  std::optional<SlaReport> sla{};
  std::vector<GroupLaneMetrics> lanes;  ///< Indexed by lane.
  // Outage pause (GroupOptions::outage; GroupStats has the same fields).
  bool paused = false;
  std::int64_t paused_since_ns = 0;  ///< Wall clock; 0 when not paused.
  std::string pause_reason{};
  std::string pause_last_error{};
  std::uint64_t pauses = 0;
  std::uint64_t probes = 0;
};

/// One topic or queue.
struct TopicMetrics {
  std::string name{};
  bool is_queue = false;
  bool durable = false;
  std::uint32_t lanes = 0;
  std::uint64_t published = 0;        ///< Lifetime publishes accepted.
  std::uint64_t publish_refused = 0;  ///< Lifetime WouldBlock / TimedOut results.
  std::uint64_t unrouted = 0;         ///< Lifetime publishes with no group to deliver to.
  double publish_rate = 0;            ///< Messages per second over the window.
  std::vector<LaneLoad> lane_load;    ///< Indexed by lane.
  /// max(load_share) * lanes: 1 = perfectly even, `lanes` = everything in one lane.
  double load_skew = 0;
  /// The lane carrying a hot key: set when load_skew >= MetricsOptions::hot_lane_skew,
  /// lanes > 1 and at least hot_lane_min_messages were published in the window.
  std::optional<std::uint32_t> hot_lane;
  std::vector<GroupMetrics> groups;
};

/// Everything the window computes at its newest sample. Plain data.
struct LANEBUS_API MetricsSnapshot {
  std::string bus{};
  std::int64_t steady_ns = 0;  ///< Monotonic time of the newest sample.
  std::int64_t wall_ns = 0;    ///< Wall-clock time (ns since the Unix epoch) of the newest sample.
  /// The span the rates cover (newest minus the oldest sample in the window);
  /// 0 = one sample only: every rate is 0 and drain times are unknown.
  double window_seconds = 0;
  std::size_t samples = 0;  ///< Samples in the window.
  std::vector<TopicMetrics> topics;
  /// The store's dead-letter queue (available = false without a store).
  DlqMetrics dlq;
  /// This process's store writer (available = false without a store).
  StoreMetrics store;
  /// Open bridges to NATS JetStream (bridge.hpp), as in the newest sample.
  std::vector<BridgeStats> bridges;
  /// Namespaces with their policy and usage (tenancy.hpp), as in the newest sample.
  std::vector<NamespaceInfo> namespaces;
  /// Deprecated fields of typed topics and their readers (doc/schemas.md), as in the newest sample.
  std::vector<DeprecatedField> deprecated_fields;

  /// Lookup helpers; nullptr when absent. Valid while the snapshot lives.
  const TopicMetrics* find_topic(std::string_view name) const noexcept;
  const GroupMetrics* find_group(std::string_view topic, std::string_view group) const noexcept;
};

// ---------------------------------------------------------------- the window

/// Options of a MetricsWindow / Monitor. Plain struct.
struct MetricsOptions {
  /// Rates, window latency quantiles and the default SLA hold span this much
  /// time. Default 15 s. Must be > 0.
  std::chrono::nanoseconds window{std::chrono::seconds(15)};
  /// Most samples kept (the oldest are dropped first, shortening the window
  /// when sampling is faster than window / max_samples). Default 1024; >= 2.
  std::size_t max_samples = 1024;
  /// A lane is "hot" when it carries at least this many times its fair share
  /// (1 / lanes) of the window's publishes. Default 2.0; >= 1.
  double hot_lane_skew = 2.0;
  /// No lane is called hot below this many publishes in the window. Default 100.
  std::uint64_t hot_lane_min_messages = 100;
  /// The SLA of every group without its own policy (MetricsWindow::set_sla).
  /// Default none: groups get no SLA verdict.
  std::optional<SlaPolicy> default_sla{};
};

/// A sliding window of timestamped BusStats samples; computes rates, lag,
/// drain times, latency quantiles, lane load and SLA verdicts from counter
/// differences when a sample is added. Nothing runs on the bus's hot path.
///
/// Counters are matched between samples by topic name, group name and lane; a
/// counter that went down (the bus was reopened) counts from zero, as in
/// Prometheus. A topic or group that appeared within the window counts all of
/// its counts as recent.
///
/// Thread safety: const methods are safe; others need external synchronization.
class LANEBUS_API MetricsWindow {
 public:
  /// Errors: InvalidArgument (window <= 0, max_samples < 2, hot_lane_skew < 1,
  /// an invalid default_sla; the message names the field).
  [[nodiscard]] static Result<MetricsWindow> create(const MetricsOptions& options = {});

  /// Set the SLA policy of one group (replacing the default); applies from the
  /// next add(). Errors: InvalidArgument (sla <= 0, page_fraction outside (0,1],
  /// hold < 0).
  [[nodiscard]] Status set_sla(std::string_view topic, std::string_view group, const SlaPolicy& policy);

  /// Add a reading taken at `steady_ns` (a monotonic clock: rates) and
  /// `wall_ns` (ns since the Unix epoch, the clock of created_at: ages), drop
  /// samples older than the window, and recompute the snapshot and the SLA
  /// hold state. Errors: InvalidArgument when steady_ns is not later than the
  /// previous sample's (nothing is added).
  [[nodiscard]] Status add(BusStats stats, std::int64_t steady_ns, std::int64_t wall_ns);

  /// The metrics at the newest sample (an empty snapshot before the first add).
  const MetricsSnapshot& snapshot() const noexcept { return latest_; }
  std::size_t sample_count() const noexcept { return samples_.size(); }
  const MetricsOptions& options() const noexcept { return options_; }

 private:
  struct Sample {
    std::int64_t steady_ns = 0;
    std::int64_t wall_ns = 0;
    BusStats stats;
  };
  struct SlaTrack {
    std::string topic, group;
    std::optional<SlaPolicy> policy;   // set_sla; else the default applies
    std::optional<std::int64_t> risk_since_ns;
    bool seen = false;
  };
  // A lane seen with stuck_now > 0: since when, and its `stuck` counter then
  // (a higher counter later means another call got stuck).
  struct StuckTrack {
    std::string topic, group;
    std::uint32_t lane = 0;
    std::int64_t since_ns = 0;
    std::uint64_t stuck_total = 0;
    bool seen = false;
  };
  explicit MetricsWindow(const MetricsOptions& options) : options_(options) {}
  void recompute();
  SlaTrack* track(std::string_view topic, std::string_view group, bool create);
  // recompute's steps that keep state between samples (lib/ops/metrics.cpp).
  std::vector<StuckLane> track_stuck(const std::string& topic, const GroupStats& group, std::int64_t steady_ns);
  std::optional<SlaReport> evaluate_sla(const std::string& topic, const GroupMetrics& group,
                                        std::vector<StuckLane> stuck, const DlqMetrics& dlq, std::int64_t steady_ns);

  MetricsOptions options_;
  std::vector<Sample> samples_;  // oldest first
  std::vector<SlaTrack> sla_;
  std::vector<StuckTrack> stuck_;
  MetricsSnapshot latest_;
};

// ---------------------------------------------------------------- Monitor

/// The clocks a Monitor reads: replace them in tests.
struct LANEBUS_API MetricsClock {
  std::function<std::int64_t()> steady_ns;  ///< Monotonic nanoseconds.
  std::function<std::int64_t()> wall_ns;    ///< Nanoseconds since the Unix epoch (created_at's clock).
  /// std::chrono::steady_clock and std::chrono::system_clock.
  static MetricsClock system();
};

/// A MetricsWindow fed from a stats source (a Bus, or any function returning
/// BusStats) and a clock: call sample() periodically (e.g. every second, or on
/// each Prometheus scrape) and read snapshot(), prometheus() or json().
///
/// Thread safety: thread-safe (one internal mutex; sample() holds it while it
/// computes, not while it reads the source).
class LANEBUS_API Monitor {
 public:
  /// Sample `bus`. REQUIRES: the bus outlives the Monitor.
  /// Errors: as MetricsWindow::create; InvalidArgument when a clock is empty.
  [[nodiscard]] static Result<std::unique_ptr<Monitor>> create(const Bus& bus, const MetricsOptions& options = {},
                                                               MetricsClock clock = MetricsClock::system());
  /// Sample any source (tests inject counters here). The source runs inside
  /// sample(), on the caller's thread. Errors: as above; InvalidArgument when
  /// `source` is empty.
  [[nodiscard]] static Result<std::unique_ptr<Monitor>> create(std::function<BusStats()> source,
                                                               const MetricsOptions& options = {},
                                                               MetricsClock clock = MetricsClock::system());
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;

  /// Take one reading (Bus::stats(): no bus lock held for long) and add it.
  /// Errors: InvalidArgument when the steady clock did not advance since the
  /// previous sample (the reading is discarded).
  [[nodiscard]] Status sample();
  /// As MetricsWindow::set_sla.
  [[nodiscard]] Status set_sla(std::string_view topic, std::string_view group, const SlaPolicy& policy);
  /// A copy of the newest snapshot.
  MetricsSnapshot snapshot() const;
  /// to_prometheus(snapshot()) / to_json(snapshot()).
  std::string prometheus() const;
  std::string json() const;

 private:
  struct Impl;
  explicit Monitor(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------- export

/// Prometheus text exposition format 0.0.4 (doc/observability.md lists every
/// family). Each family is one block: `# HELP`, `# TYPE`, then its samples.
/// Labels: topic, group, lane (and le / quantile / state where the type
/// needs them), values escaped (\\, \", \n). The latency histogram has every
/// bucket (cumulative, `le` in seconds, ending with "+Inf" == _count), _sum and
/// _count. Series whose value is unknown are omitted; DLQ series are absent
/// for a bus without a store. Stuck handlers (GroupOptions::attempt_timeout)
/// and key_parallel_retry, per topic, group and lane: `lanebus_stuck_total`
/// (counter: calls seen running past the budget, once per call),
/// `lanebus_stuck_handlers` (gauge: such calls running now) and
/// `lanebus_set_aside_messages` (gauge: messages held back behind a key in
/// backoff).
LANEBUS_API std::string to_prometheus(const MetricsSnapshot& snapshot);

/// One JSON object (RFC 8259, UTF-8 strings escaped, no trailing newline).
/// Unknown values and non-finite numbers are null. Layout in doc/observability.md;
/// every counters object also has `stuck`, `stuck_now` and `set_aside`, and
/// an SLA object has `stuck`: [{topic, group, lane, calls, stuck_total,
/// seen_seconds}] (SlaReport::stuck).
LANEBUS_API std::string to_json(const MetricsSnapshot& snapshot);

}  // namespace lanebus
