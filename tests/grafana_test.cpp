// lanebus — MIT License.
// contrib/grafana/lanebus.json: valid JSON, and every lanebus_* metric its
// queries (every "expr" and templating query) name is one the library exports.
#include <doctest/doctest.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "exposition_check.hpp"
#include "lanebus/metrics.hpp"

using namespace lanebus;
using lanebus::test::Json;

namespace {

// Every series name the Prometheus export can produce: a two-sample window
// over counters that exercise every family (DLQ, SLA, latency, lanes).
std::set<std::string> exported_names() {
  BusStats s;
  s.name = "b";
  s.dlq_available = true;
  s.dlq.pending = 3;
  s.dlq.arrivals[1] = 3;
  TopicStats t;
  t.name = "t";
  t.lanes = 2;
  t.lane_published = {100, 0};
  t.published = 100;
  GroupStats g;
  g.name = "g";
  g.consumers = 1;
  g.lanes.resize(2);
  g.lanes[0].in_flight = 50;
  g.lanes[0].acked = 50;
  g.total = g.lanes[0];
  g.oldest_unprocessed_ns = 1;
  g.latency.counts.assign(LatencyHistogram::kBuckets, 0);
  g.latency.counts[20] = 50;
  g.latency.count = 50;
  g.latency.sum_ns = 50'000'000;
  t.groups.push_back(g);
  s.topics.push_back(t);

  MetricsOptions o;
  o.default_sla = SlaPolicy{std::chrono::seconds(60), 0.75, std::chrono::nanoseconds(0)};
  auto w = MetricsWindow::create(o).value();
  REQUIRE(w.add(s, 1'000'000'000, 2'000'000'000).ok());
  BusStats later = s;
  later.topics[0].published = 200;
  later.topics[0].lane_published = {200, 0};
  later.topics[0].groups[0].lanes[0].acked = 90;
  later.topics[0].groups[0].total.acked = 90;
  later.topics[0].groups[0].latency.counts[20] = 90;
  later.topics[0].groups[0].latency.count = 90;
  later.dlq.pending = 5;
  REQUIRE(w.add(later, 2'000'000'000, 3'000'000'000).ok());
  const auto doc = lanebus::test::parse_prometheus(to_prometheus(w.snapshot()));
  REQUIRE(doc.errors.empty());
  std::set<std::string> names;
  for (const auto& series : doc.series) names.insert(series.name);
  return names;
}

void collect_queries(const Json& j, std::vector<std::string>& out) {
  if (const auto* o = std::get_if<Json::Object>(&j.v)) {
    for (const auto& [k, v] : *o) {
      if ((k == "expr" || k == "definition") && std::holds_alternative<std::string>(v.v)) out.push_back(v.str());
      collect_queries(v, out);
    }
  } else if (const auto* a = std::get_if<Json::Array>(&j.v)) {
    for (const auto& v : *a) collect_queries(v, out);
  }
}

}  // namespace

TEST_CASE("every metric the Grafana dashboard queries is exported") {
  const char* path = std::getenv("LANEBUS_GRAFANA_JSON");
  REQUIRE_MESSAGE(path != nullptr, "LANEBUS_GRAFANA_JSON is not set");
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, "cannot read " << path);
  std::stringstream text;
  text << in.rdbuf();
  std::string error;
  auto j = lanebus::test::parse_json(text.str(), &error);
  REQUIRE_MESSAGE(j, path << ": " << error);
  CHECK((*j)["title"].str() == "lanebus");

  std::vector<std::string> queries;
  collect_queries(*j, queries);
  CHECK(queries.size() >= 20);
  const std::set<std::string> exported = exported_names();
  std::set<std::string> used;
  for (const std::string& q : queries) {
    std::size_t in_query = 0;
    // Every lanebus_[a-z0-9_]+ word of the query (std::regex trips GCC 12's
    // bogus -Wmaybe-uninitialized under ASan, so a plain scan).
    for (std::size_t at = q.find("lanebus_"); at != std::string::npos; at = q.find("lanebus_", at + 1)) {
      if (at > 0 && (std::isalnum(static_cast<unsigned char>(q[at - 1])) || q[at - 1] == '_')) continue;
      std::size_t end = at + 8;
      while (end < q.size() && (std::islower(static_cast<unsigned char>(q[end])) ||
                                std::isdigit(static_cast<unsigned char>(q[end])) || q[end] == '_'))
        ++end;
      const std::string name = q.substr(at, end - at);
      used.insert(name);
      ++in_query;
      CHECK_MESSAGE(exported.count(name) == 1, "the dashboard queries " << name << ", which is not exported");
      at = end - 1;
    }
    CHECK_MESSAGE(in_query > 0, "a query names no lanebus metric: " << q);
  }
  // The dashboard covers the headline families.
  for (const char* m : {"lanebus_consumer_lag_messages", "lanebus_sla_state", "lanebus_sla_projected_seconds",
                        "lanebus_e2e_latency_seconds_bucket", "lanebus_dlq_depth_messages", "lanebus_dlq_arrivals_total",
                        "lanebus_lane_load_share", "lanebus_published_total", "lanebus_acked_total"})
    CHECK_MESSAGE(used.count(m) == 1, "the dashboard does not show " << m);
}

TEST_CASE("the check catches a metric that is not exported (negative control)") {
  const std::set<std::string> exported = exported_names();
  CHECK(exported.count("lanebus_consumer_lag_messages") == 1);
  CHECK(exported.count("lanebus_e2e_latency_seconds_bucket") == 1);
  CHECK(exported.count("lanebus_consumer_lag") == 0);
  CHECK(exported.count("lanebus_e2e_latency_seconds") == 0);  // histograms export _bucket/_sum/_count only
}
