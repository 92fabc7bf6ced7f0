// lanebus — MIT License.
// The README demo: topics with consumer groups, a queue with competing
// consumers, lanes keeping per-key order, and the counters.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

int main() {
  auto bus_r = Bus::open({.name = "tour", .workers = 2});
  if (!bus_r.ok()) {
    std::fprintf(stderr, "open: %s\n", bus_r.status().to_string().c_str());
    return 1;
  }
  auto& bus = *bus_r;
  std::printf("lanebus %s tour\n\n", LANEBUS_VERSION_STRING);

  // 1. A topic fans out to consumer groups; each group sees every message.
  auto orders = bus->create_topic("shop.orders", {.lanes = 4}).value();
  std::mutex mu;
  std::map<std::string, std::vector<std::string>> billing_seen;  // per customer, in arrival order
  std::atomic<int> billing{0}, analytics{0};
  auto billing_sub = bus->subscribe(orders, "billing", [&](const MessageView& m) {
                            std::lock_guard lock(mu);
                            billing_seen[std::string(m.key())].push_back(std::string(m.payload()));
                            ++billing;
                            return Outcome::ack();
                          }).value();
  auto analytics_sub = bus->subscribe(orders, "analytics", [&](const MessageView&) {
                              ++analytics;
                              return Outcome::ack();
                            }).value();
  std::printf("1. topic \"shop.orders\" (%u lanes) with groups \"billing\" and \"analytics\"\n", orders.lanes());
  for (int i = 0; i < 12; ++i) {
    std::string customer = "customer-" + std::to_string(i % 3);
    std::string payload = "order #" + std::to_string(i);
    if (Status s = orders.publish({.key = customer, .payload = payload}); !s.ok()) {
      std::fprintf(stderr, "publish: %s\n", s.to_string().c_str());
      return 1;
    }
    std::printf("   published %-9s key=%s -> lane %u\n", payload.c_str(), customer.c_str(),
                lane_for_key(customer, orders.lanes()));
  }
  while (billing < 12 || analytics < 12) std::this_thread::sleep_for(1ms);
  std::printf("   billing handled %d, analytics handled %d (fan-out: each group got all 12)\n", billing.load(),
              analytics.load());
  {
    std::lock_guard lock(mu);
    for (auto& [customer, seen] : billing_seen) {
      std::printf("   billing saw %s in order:", customer.c_str());
      for (auto& p : seen) std::printf(" [%s]", p.c_str());
      std::printf("\n");
    }
  }

  // 2. A queue: competing consumers, each message handled by exactly one.
  auto jobs = bus->create_queue("shop.thumbnails", {.lanes = 8}).value();
  std::atomic<int> by_a{0}, by_b{0};
  auto worker_a = bus->consume(jobs, [&](const MessageView&) {
                         ++by_a;
                         return Outcome::ack();
                       }).value();
  auto worker_b = bus->consume(jobs, [&](const MessageView&) {
                         ++by_b;
                         return Outcome::ack();
                       }).value();
  std::printf("\n2. queue \"shop.thumbnails\" with two competing consumers\n");
  for (int i = 0; i < 100; ++i) {
    std::string key = "image-" + std::to_string(i);
    (void)jobs.publish({.key = key, .payload = "resize"});
  }
  while (by_a + by_b < 100) std::this_thread::sleep_for(1ms);
  std::printf("   100 jobs: consumer A took %d, consumer B took %d, total %d (each exactly once)\n", by_a.load(),
              by_b.load(), by_a + by_b);

  // 3. Handler outcomes: retry then ack; reject.
  auto payments = bus->create_topic("shop.payments", {.lanes = 1}).value();
  std::atomic<int> done{0};
  auto pay_sub = bus->subscribe(payments, "ledger", [&](const MessageView& m) {
                        if (m.payload() == "flaky" && m.attempt() < 2) {
                          std::printf("   attempt %u of \"flaky\": retry (transient)\n", m.attempt());
                          return Outcome::retry("gateway timeout");
                        }
                        ++done;
                        if (m.payload() == "bad") {
                          std::printf("   \"bad\": reject (permanent)\n");
                          return Outcome::reject("invalid amount");
                        }
                        std::printf("   attempt %u of \"%.*s\": ack\n", m.attempt(), int(m.payload().size()),
                                    m.payload().data());
                        return Outcome::ack();
                      }).value();
  std::printf("\n3. outcomes on \"shop.payments\" (one lane: strict order, retries hold the lane)\n");
  (void)payments.publish({.key = "p", .payload = "flaky"});
  (void)payments.publish({.key = "p", .payload = "bad"});
  (void)payments.publish({.key = "p", .payload = "fine"});
  while (done < 3) std::this_thread::sleep_for(1ms);

  // 4. Errors are values that name their cause.
  std::printf("\n4. bad input gets a clear error\n");
  std::printf("   create_topic(\"Shop Orders\")   -> %s\n", bus->create_topic("Shop Orders").status().to_string().c_str());
  std::printf("   create_topic(lanes 8 != 4)    -> %s\n",
              bus->create_topic("shop.orders", {.lanes = 8}).status().to_string().c_str());
  std::printf("   publish(empty payload)         -> %s\n", orders.publish({.key = "k", .payload = ""}).to_string().c_str());

  // 5. Counters, read without stopping the bus.
  std::printf("\n5. stats\n");
  for (const auto& t : bus->stats().topics) {
    std::printf("   %-16s %s published=%llu\n", t.name.c_str(), t.is_queue ? "queue" : "topic",
                static_cast<unsigned long long>(t.published));
    for (const auto& g : t.groups) {
      std::printf("     group %-10s consumers=%u delivered=%llu acked=%llu retried=%llu rejected=%llu\n",
                  g.name.empty() ? "(queue)" : g.name.c_str(), g.consumers,
                  static_cast<unsigned long long>(g.total.delivered), static_cast<unsigned long long>(g.total.acked),
                  static_cast<unsigned long long>(g.total.retried), static_cast<unsigned long long>(g.total.rejected));
    }
  }

  Status s = bus->shutdown(ShutdownMode::Drain, 2s);
  std::printf("\nshutdown(Drain): %s\n", s.to_string().c_str());
  std::printf("publish after shutdown -> %s\n", orders.publish({.key = "k", .payload = "late"}).to_string().c_str());
  return s.ok() ? 0 : 1;
}
