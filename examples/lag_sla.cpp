// lanebus — MIT License.
// A producer outruns a slow consumer for a while, then stops; a Monitor samples
// the bus and the SLA evaluator moves from ok to at_risk and back to ok as the
// consumer catches up. A 60 s SLA (doc/observability.md), scaled down to 2 s.
//
// Timeline (consumer: 500 msg/s; SLA 2 s, page at 75 % = 1.5 s, window 0.5 s):
//   0.0 s - 0.6 s  producer at 250 msg/s: no lag, ok
//   0.6 s - 2.0 s  producer at 1000 msg/s: lag grows 500/s; oldest age + lag/500
//                  passes 1.5 s about 1 s in, and pages once it has held 0.5 s
//   2.0 s -        producer stops; the projection falls below 1.5 s, then the
//                  lag drains (the oldest message never gets 2 s old: no breach)
// Exits 0 when it saw ok -> at_risk -> ok and never breached, else 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kConsumerPeriod = 2ms;  // 500 msg/s

std::string secs(std::optional<double> s) {
  if (!s) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.2fs", *s);
  return b;
}

}  // namespace

int main() {
  auto bus_r = lanebus::Bus::open({.name = "lag-sla", .workers = 1});
  if (!bus_r.ok()) {
    std::fprintf(stderr, "open: %s\n", bus_r.status().to_string().c_str());
    return 1;
  }
  auto& bus = *bus_r;
  auto topic = bus->create_topic("ingest", {.lanes = 1}).value();

  // The slow consumer: one message per period on an absolute schedule (sleep
  // overshoot does not slow it down), restarted after it has been idle. `next`
  // is only touched by the handler, which runs one call at a time (one lane).
  Clock::time_point next{};
  auto sub = bus->subscribe(topic, "persist", [&next](const lanebus::MessageView&) {
    const auto now = Clock::now();
    if (now - next > 20ms) next = now;  // idle: no credit for the time without work
    next += kConsumerPeriod;
    std::this_thread::sleep_until(next);
    return lanebus::Outcome::ack();
  });
  if (!sub.ok()) {
    std::fprintf(stderr, "subscribe: %s\n", sub.status().to_string().c_str());
    return 1;
  }

  lanebus::MetricsOptions mo;
  mo.window = 500ms;
  mo.default_sla = lanebus::SlaPolicy{2s, 0.75, 0ns};  // hold 0 = the window
  auto mon = lanebus::Monitor::create(*bus, mo).value();

  // The producer: message i of a phase goes out at phase_start + i * period.
  std::atomic<bool> producing{true};
  std::thread producer([&] {
    struct Phase {
      std::chrono::microseconds period;
      std::chrono::milliseconds length;
    };
    for (Phase p : {Phase{4000us, 600ms}, Phase{1000us, 1400ms}}) {
      const auto start = Clock::now();
      for (int i = 0; Clock::now() - start < p.length; ++i) {
        std::this_thread::sleep_until(start + i * p.period);
        if (!topic.publish({.key = "sensor", .payload = "reading"}).ok()) break;
      }
    }
    producing = false;
  });

  std::printf("SLA 2.00s, at risk from 1.50s held for 0.50s; consumer 500 msg/s\n");
  std::printf("%6s %6s %9s %8s %8s %9s %9s\n", "t", "lag", "cons/s", "oldest", "drain", "projected", "state");
  const auto t0 = Clock::now();
  std::vector<lanebus::SlaState> states;  // distinct consecutive states
  bool breached = false;
  int idle_samples = 0, tick = 0;
  while (Clock::now() - t0 < 9s) {
    std::this_thread::sleep_for(50ms);
    if (!mon->sample().ok()) continue;
    const auto snap = mon->snapshot();
    const lanebus::GroupMetrics* g = snap.find_group("ingest", "persist");
    if (g == nullptr || !g->sla) continue;
    const lanebus::SlaState st = g->sla->state;
    const bool changed = st != lanebus::SlaState::Unknown && (states.empty() || states.back() != st);
    if (changed) states.push_back(st);
    breached |= st == lanebus::SlaState::Breached;
    if (changed || ++tick % 5 == 0) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      std::printf("%5.2fs %6llu %9.0f %8s %8s %9s %9s%s\n", t, static_cast<unsigned long long>(g->lag), g->consume_rate,
                  secs(g->oldest_age_seconds).c_str(), secs(g->drain_seconds).c_str(),
                  secs(g->sla->projected_seconds).c_str(), lanebus::to_string(st), changed ? "   <- state change" : "");
    }
    // Done once the producer stopped and the group has been idle for a window.
    idle_samples = (!producing && g->lag == 0 && st == lanebus::SlaState::Ok) ? idle_samples + 1 : 0;
    if (idle_samples >= 10) break;
  }
  producer.join();
  (void)sub->close();

  std::string seq;
  for (auto s : states) seq += std::string(seq.empty() ? "" : " -> ") + lanebus::to_string(s);
  std::printf("states: %s\n", seq.c_str());
  const bool expected = states.size() >= 3 && states[0] == lanebus::SlaState::Ok &&
                        states[1] == lanebus::SlaState::AtRisk && states.back() == lanebus::SlaState::Ok && !breached;
  if (!expected) {
    std::printf("expected ok -> at_risk -> ok without a breach\n");
    return 1;
  }
  std::printf("ok -> at_risk -> ok: the page fired while the backlog threatened the SLA and cleared as it drained\n");
  return 0;
}
