// lanebus — MIT License.
// Durable topics (doc/durable.md): an "orders" topic with 8 lanes keyed by customer,
// a "billing" group handling each customer's orders in order, and an
// "analytics" group that starts later, replays from offset 0, is restarted
// halfway and resumes where it left off.
//
//   durable_orders [DIR]     (default: a fresh directory under /tmp, removed at exit)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

BusOptions options_for(const fs::path& dir) {
  BusOptions o;
  o.name = "orders-demo";
  o.workers = 2;
  o.store.directory = dir.string();
  o.store.durability = Durability::Sync;  // publish returns after the fsync
  return o;
}

template <typename Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 20000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  bool temporary = argc < 2;
  if (temporary) {
    char tmpl[] = "/tmp/lanebus-orders-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    dir = fs::path(tmpl) / "store";
  } else {
    dir = argv[1];
  }
  std::printf("store: %s\n\n", dir.c_str());
  constexpr int kOrders = 40;
  int rc = 0;
  {
    auto bus_r = Bus::open(options_for(dir));
    if (!bus_r.ok()) {
      std::fprintf(stderr, "open: %s\n", bus_r.status().to_string().c_str());
      return 1;
    }
    auto& bus = *bus_r;
    auto orders = bus->create_topic("shop.orders", {.lanes = 8, .durable = true}).value();

    // 1. Billing handles each customer's orders in publish order.
    std::mutex mu;
    std::map<std::string, std::vector<int>> billed;
    std::atomic<int> billing_count{0};
    auto billing = bus->subscribe(orders, "billing", [&](const MessageView& m) {
                          std::lock_guard l(mu);
                          billed[std::string(m.key())].push_back(std::stoi(std::string(m.payload())));
                          ++billing_count;
                          return Outcome::ack();
                        }).value();
    std::printf("1. publishing %d orders for 5 customers (sync: each publish returns after the fsync)\n", kOrders);
    for (int i = 0; i < kOrders; ++i) {
      std::string customer = "customer-" + std::to_string(i % 5);
      Status s = orders.publish({.key = customer, .payload = std::to_string(i)});
      if (!s.ok()) {
        std::fprintf(stderr, "publish: %s\n", s.to_string().c_str());
        return 1;
      }
    }
    if (!wait_for([&] { return billing_count == kOrders; })) rc = 1;
    {
      std::lock_guard l(mu);
      for (auto& [customer, ids] : billed) {
        bool in_order = std::is_sorted(ids.begin(), ids.end());
        std::printf("   billing %s (lane %u): %zu orders, %s\n", customer.c_str(), lane_for_key(customer, 8),
                    ids.size(), in_order ? "in order" : "OUT OF ORDER");
        if (!in_order) rc = 1;
      }
    }

    // 2. Analytics starts later and replays everything from offset 0; it
    //    stops after half of the orders (a "crash"), without finishing the rest.
    std::atomic<int> analytics_first_run{0};
    {
      auto analytics = bus->subscribe(orders, "analytics", [&](const MessageView&) {
                              // Handlers of different lanes run at once: take a place
                              // below the half in one step, or two could both pass a
                              // check at kOrders / 2 - 1 and ack one order too many.
                              int seen = analytics_first_run.load();
                              do {
                                if (seen >= kOrders / 2) return Outcome::retry("stopping");
                              } while (!analytics_first_run.compare_exchange_weak(seen, seen + 1));
                              return Outcome::ack();
                            },
                            {.max_attempts = 1000000, .backoff_initial = 50ms, .start = StartPosition::earliest()})
                           .value();
      wait_for([&] { return analytics_first_run >= kOrders / 2; });
      std::this_thread::sleep_for(100ms);
    }
    std::printf("\n2. analytics joined later, replayed from offset 0 and stopped after %d orders\n",
                analytics_first_run.load());
    (void)bus->shutdown(ShutdownMode::Drain, 5s);
  }
  {
    // 3. After a restart, analytics resumes from its committed offsets.
    auto bus = Bus::open(options_for(dir)).value();
    auto orders = bus->create_topic("shop.orders", {.lanes = 8, .durable = true}).value();
    std::atomic<int> resumed{0};
    auto analytics = bus->subscribe(orders, "analytics", [&](const MessageView&) {
                            ++resumed;
                            return Outcome::ack();
                          }).value();
    wait_for([&] { return resumed >= kOrders / 2; });
    std::this_thread::sleep_for(100ms);
    std::printf("\n3. after a restart analytics resumed and handled the remaining %d orders (none twice)\n",
                resumed.load());
    auto st = bus->stats();
    for (const auto& t : st.topics)
      for (const auto& g : t.groups)
        std::printf("   group %-9s lag=%llu messages\n", g.name.c_str(), static_cast<unsigned long long>(g.total.in_flight));
    if (resumed != kOrders / 2) rc = 1;  // exactly the rest: nothing lost, nothing twice
  }
  if (temporary) fs::remove_all(dir.parent_path());
  std::printf("\n%s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
}
