// lanebus — MIT License.
// A bus with live traffic behind a MetricsServer, for the browser test
// (tests/browser/dashboard_test.mjs) and for looking at the dashboard by hand:
//   dashboard_server [--listen HOST:PORT] [--topics N]
// - orders/billing: a slow consumer (one message per 20 ms) behind a faster
//   publisher with a hot key: its lag grows and its SLA (600 s, paged at 1 %
//   = 6 s projected, 1 s hold) goes at risk within seconds;
// - payments/ledger: keeps up (SLA ok);
// - audit/checker (durable): rejects every 4th message, so the DLQ grows;
// - N idle topics (default 300; LANEBUS_DASHBOARD_TOPICS) for paging and filtering;
// - a held lease "orders-writer".
// Prints the URL on the first line of stdout, serves until SIGTERM/SIGINT or
// stdin closes, then exits 0.
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;

namespace {

std::atomic<bool> g_stop{false};
extern "C" void on_signal(int) { g_stop.store(true); }

int fail(const char* what, const Status& s) {
  std::fprintf(stderr, "dashboard_server: %s: %s\n", what, s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "127.0.0.1:0";
  int idle_topics = 300;
  if (const char* e = std::getenv("LANEBUS_DASHBOARD_TOPICS")) idle_topics = std::atoi(e);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
      listen = argv[++i];
    } else if (std::strcmp(argv[i], "--topics") == 0 && i + 1 < argc) {
      idle_topics = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: dashboard_server [--listen HOST:PORT] [--topics N]\n");
      return 2;
    }
  }
  if (idle_topics < 0 || idle_topics > 1000) idle_topics = 300;

  std::string tmpl = (std::filesystem::temp_directory_path() / "lanebus-dashboard-XXXXXX").string();
  if (mkdtemp(tmpl.data()) == nullptr) return fail("mkdtemp", Status(Code::IOError, std::strerror(errno)));
  const std::string dir = tmpl;

  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  LeaseTableOptions lo;
  auto leases = LeaseTable::open(dir + "/leases", lo);
  if (!leases.ok()) return fail("lease table", leases.status());
  auto owner = LeaseOwner::generate();
  if (!owner.ok()) return fail("lease owner", owner.status());
  if (auto l = (*leases)->acquire("orders-writer", *owner, 3600s); !l.ok()) return fail("acquire", l.status());

  BusOptions bo;
  bo.name = "dashboard-demo";
  bo.workers = 3;
  bo.max_topics = 1024 + 8;
  bo.store.directory = dir + "/store";
  bo.store.durability = Durability::Async;
  auto bus = Bus::open(bo);
  if (!bus.ok()) return fail("open", bus.status());

  TopicOptions big;
  big.lanes = 8;
  big.capacity = 1 << 16;
  big.slot_bytes = 64;
  auto orders = (*bus)->create_topic("orders", big);
  auto payments = (*bus)->create_topic("payments", big);
  TopicOptions durable;
  durable.lanes = 1;
  durable.durable = true;
  auto audit = (*bus)->create_topic("audit", durable);
  if (!orders.ok() || !payments.ok() || !audit.ok()) return fail("create_topic", Status(Code::Internal, "topics"));
  TopicOptions small;
  small.lanes = 1;
  small.capacity = 16;
  small.slot_bytes = 32;
  for (int i = 0; i < idle_topics; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "idle-%04d", i);
    if (auto t = (*bus)->create_topic(name, small); !t.ok()) return fail("create_topic idle", t.status());
  }

  auto billing = (*bus)->subscribe(*orders, "billing", [](const MessageView&) {
    std::this_thread::sleep_for(20ms);
    return Outcome::ack();
  });
  auto ledger = (*bus)->subscribe(*payments, "ledger", [](const MessageView&) { return Outcome::ack(); });
  std::atomic<std::uint64_t> audited{0};
  auto checker = (*bus)->subscribe(*audit, "checker", [&](const MessageView&) {
    return audited.fetch_add(1) % 4 == 3 ? Outcome::reject("checksum mismatch") : Outcome::ack();
  });
  if (!billing.ok() || !ledger.ok() || !checker.ok()) return fail("subscribe", Status(Code::Internal, "subscribe"));

  MetricsServerOptions so;
  so.listen = listen;
  so.sample_interval = 250ms;
  so.metrics.window = 5s;
  so.slas.push_back(GroupSla{"orders", "billing", SlaPolicy{600s, 0.01, 1s}});
  so.slas.push_back(GroupSla{"payments", "ledger", SlaPolicy{600s, 0.75, 1s}});
  so.leases = leases->get();
  auto server = MetricsServer::start(**bus, so);
  if (!server.ok()) return fail("MetricsServer", server.status());
  std::printf("dashboard_server: %s\n", (*server)->url().c_str());
  std::fflush(stdout);

  // Publishers: orders at ~300/s (60 % on one hot key), payments at ~100/s,
  // audit at ~7/s. try_publish: a full topic refuses (counted), never blocks.
  std::thread publisher([&] {
    std::uint64_t n = 0;
    while (!g_stop.load()) {
      for (int i = 0; i < 3; ++i, ++n) {
        const std::string key = n % 5 < 3 ? "customer-42" : "customer-" + std::to_string(n % 97);
        OutgoingMessage m;
        m.key = key;
        m.payload = "order";
        (void)orders->try_publish(m);
      }
      const std::string pkey = "p" + std::to_string(n % 13);  // OutgoingMessage holds views: keep it alive
      OutgoingMessage p;
      p.key = pkey;
      p.payload = "payment";
      (void)payments->try_publish(p);
      if (n % 15 == 0) {
        OutgoingMessage a;
        a.key = "a";
        a.payload = "audit";
        (void)audit->publish(a);
      }
      std::this_thread::sleep_for(10ms);
    }
  });

  // Until a signal, or stdin closes (the test's pipe), whichever comes first.
  while (!g_stop.load()) {
    struct pollfd p{0, POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char c;
      if (read(0, &c, 1) <= 0) break;
    }
  }
  g_stop.store(true);
  publisher.join();
  (*server)->stop();
  (void)(*bus)->shutdown(ShutdownMode::Abandon, 2s);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return 0;
}
