// lanebus — MIT License.
// I/O faults through the public Bus, injected into
// data.mdb by the faultfs shim (tests/support/faultfs.cpp, preloaded by meson):
// - an fsync that fails with EIO (and, as on Linux, drops the dirty pages):
//   the store refuses every later write until it is reopened, never fsyncs
//   again to "retry", and nothing reported durable is lost (fsyncgate);
// - ENOSPC: publish fails with DiskFull, nothing acknowledged is lost, and the
//   store works again, without a reopen, once space is back;
// - short writes: the commit fails, the store refuses writes until reopened;
// - the log hook (BusOptions::log, and the C API's callback) hears a failed
//   fsync at error, and the refused writes after it at most once a second.
// Publishers are in flight on several threads while the fault hits.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "durable_store.hpp"
#include "faultfs.hpp"
#include "lanebus/lanebus.h"
#include "lanebus/lanebus.hpp"
#include "powercut.hpp"
#include "temp_dir.hpp"
#include "wait.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace faults = lanebus::test::faultfs;
namespace pc = lanebus::test::powercut;

namespace {

void require_shim() {
  REQUIRE_MESSAGE(faults::present(),
                  "the faultfs shim is not preloaded: run through `meson test` (LD_PRELOAD=<build>/tests/libfaultfs.so, "
                  "plus ASAN_OPTIONS=verify_asan_link_order=0 under ASan)");
}

BusOptions options(const std::string& dir, Durability d = Durability::Sync) {
  BusOptions o;
  o.workers = 2;
  o.spin = std::chrono::nanoseconds(0);
  o.store.directory = dir;
  o.store.durability = d;
  o.store.async_flush_interval = 10ms;
  o.store.map_size_initial = 8ull << 20;
  o.durable_poll = 10ms;
  return o;
}

// Publisher threads that run until told to stop and remember every publish
// that returned OK (tag, seq -> CRC) and every failure.
struct Publishers {
  std::mutex mu;
  std::map<std::pair<std::string, std::uint64_t>, std::uint32_t> ok;
  std::vector<Status> failures;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> oks{0};
  // Set once a failure was seen; publishes that START after it must fail too.
  std::atomic<bool> failed{false};
  std::atomic<std::uint64_t> ok_after_failure{0};
  std::vector<std::thread> threads;

  int rounds = 0;
  void start(Topic topic, int n, std::size_t filler = 0) {
    ++rounds;
    for (int t = 0; t < n; ++t) {
      threads.emplace_back([this, topic, t, filler, r = rounds] {
        const std::string tag = "r" + std::to_string(r) + "t" + std::to_string(t);
        for (std::uint64_t seq = 1; !stop.load(); ++seq) {
          std::string p = pc::payload(tag, seq) + std::string(filler, 'f');
          const bool after = failed.load();
          Status s = topic.publish({.key = "k" + std::to_string(seq % 3), .payload = p});
          std::lock_guard<std::mutex> l(mu);
          if (s.ok()) {
            ok[{tag, seq}] = pc::crc32(p);
            oks.fetch_add(1);
            if (after) ok_after_failure.fetch_add(1);
          } else {
            failures.push_back(s);
            failed.store(true);
            if (failures.size() > 200) std::this_thread::sleep_for(1ms);  // the store is refusing: do not spin hard
          }
        }
      });
    }
  }
  void join() {
    stop.store(true);
    for (auto& t : threads) t.join();
    threads.clear();
  }
};

// Every message of `topic` in the store in `dir`: (tag, seq) -> CRC of the payload.
std::map<std::pair<std::string, std::uint64_t>, std::uint32_t> stored(const std::string& dir, const char* topic) {
  StoreOptions so;
  so.directory = dir;
  auto store = detail::DurableStore::open(so);
  REQUIRE_MESSAGE(store.ok(), store.status().to_string());
  std::map<std::pair<std::string, std::uint64_t>, std::uint32_t> out;
  auto t = (*store)->find_topic(topic);
  REQUIRE(t.ok());
  for (std::uint32_t lane = 0; lane < t->lanes; ++lane) {
    for (std::uint64_t from = 0;;) {
      auto b = (*store)->read(*t, lane, from);
      REQUIRE_MESSAGE(b.ok(), b.status().to_string());
      if (b->messages.empty()) break;
      for (const auto& m : b->messages) {
        std::string tag;
        std::uint64_t seq = 0;
        REQUIRE(pc::parse(m.payload, &tag, &seq));
        CHECK_MESSAGE(out.emplace(std::make_pair(tag, seq), pc::crc32(m.payload)).second,
                      tag << "/" << seq << " is stored twice");
      }
      from = b->next_offset;
    }
  }
  REQUIRE((*store)->close().ok());
  return out;
}

// Every publish that returned OK is stored with the same bytes.
void check_acknowledged_present(const Publishers& p, const std::map<std::pair<std::string, std::uint64_t>, std::uint32_t>& s) {
  std::uint64_t missing = 0, damaged = 0;
  for (const auto& [k, crc] : p.ok) {
    auto it = s.find(k);
    if (it == s.end()) {
      ++missing;
    } else if (it->second != crc) {
      ++damaged;
    }
  }
  CHECK_MESSAGE(missing == 0, missing << " of " << p.ok.size() << " acknowledged publishes are missing");
  CHECK(damaged == 0);
}

struct Target {
  lanebus::test::TempDir dir;
  std::string store, data, journal;
  Target() {
    require_shim();
    store = dir.file("store");
    data = store + "/data.mdb";
    journal = dir.file("journal");
    faults::set_target(data);
  }
  ~Target() {
    faults::set_journal("");
    faults::fail_fsync(0);
    faults::set_space(-1);
    faults::set_short_writes(false);
    faults::set_target("");
  }
};

}  // namespace

TEST_CASE("fsync EIO (Sync): every later write is refused until reopen, no fsync is retried, nothing acknowledged is lost") {
  Target fx;
  // Journal on: the injected EIO also drops the unsynced pages, as Linux does.
  faults::set_journal(fx.journal);
  Publishers pubs;
  const unsigned long long eio_before = faults::counter(faults::kEioInjected);
  unsigned long long syncs_at_failure = 0;
  {
    auto bus = Bus::open(options(fx.store)).value();
    auto topic = bus->create_topic("fault.events", {.lanes = 4, .durable = true}).value();
    auto idem = bus->idempotency("fault.idem").value();
    pubs.start(topic, 4);
    REQUIRE(lanebus::test::wait_until([&] { return pubs.oks.load() >= 200; }, 60s));
    faults::fail_fsync(1);  // the next fsync of data.mdb fails
    REQUIRE(lanebus::test::wait_until([&] { return pubs.failed.load(); }, 60s));
    syncs_at_failure = faults::counter(faults::kSyncs);
    // Keep publishing for a while: all of it must be refused.
    const std::uint64_t fails_then = [&] {
      std::lock_guard<std::mutex> l(pubs.mu);
      return pubs.failures.size();
    }();
    REQUIRE(lanebus::test::wait_until(
        [&] {
          std::lock_guard<std::mutex> l(pubs.mu);
          return pubs.failures.size() >= fails_then + 100;
        },
        60s));
    // Other writes are refused too, with the same clear error.
    auto c = idem->claim("after-eio");
    REQUIRE_FALSE(c.ok());
    CHECK(c.code() == Code::IOError);
    CHECK(std::string(c.status().message()).find("close and reopen") != std::string::npos);
    pubs.join();
    CHECK(faults::counter(faults::kEioInjected) == eio_before + 1);
    CHECK_MESSAGE(pubs.ok_after_failure.load() == 0, "publishes that started after the failure returned OK");
    for (const Status& s : pubs.failures) {
      INFO(s.to_string());
      CHECK(s.code() == Code::IOError);
    }
    const std::string first = pubs.failures.front().to_string();
    MESSAGE("first failure: " << first);
    MESSAGE("later failure: " << pubs.failures.back().to_string());
    CHECK(first.find("EIO") != std::string::npos);
    CHECK(pubs.failures.back().to_string().find("close and reopen") != std::string::npos);
    (void)bus->shutdown(ShutdownMode::Abandon, 10s);
  }
  // fsyncgate: the store never called fsync again after the failure (a
  // retry would "succeed" on Linux and claim pages that were dropped).
  CHECK(faults::counter(faults::kSyncs) == syncs_at_failure);
  faults::set_journal("");
  check_acknowledged_present(pubs, stored(fx.store, "fault.events"));
  // Reopened, the store works again.
  auto bus = Bus::open(options(fx.store));
  REQUIRE_MESSAGE(bus.ok(), bus.status().to_string());
  auto topic = (*bus)->create_topic("fault.events", {.lanes = 4, .durable = true});
  REQUIRE_MESSAGE(topic.ok(), topic.status().to_string());
  CHECK(topic->publish({.key = "k", .payload = "after reopen"}).ok());
  MESSAGE("fsync EIO: acknowledged=" << pubs.ok.size() << " refused=" << pubs.failures.size());
}

TEST_CASE("fsync EIO (Async): a failed flush makes the store refuse every later write until reopen") {
  Target fx;
  auto bus = Bus::open(options(fx.store, Durability::Async)).value();
  auto topic = bus->create_topic("fault.async", {.lanes = 2, .durable = true}).value();
  Publishers pubs;
  pubs.start(topic, 2);
  REQUIRE(lanebus::test::wait_until([&] { return pubs.oks.load() >= 100; }, 60s));
  faults::fail_fsync(1);  // the next flush fails
  REQUIRE(lanebus::test::wait_until([&] { return pubs.failed.load(); }, 60s));
  const std::uint64_t ok_then = pubs.oks.load();
  std::this_thread::sleep_for(50ms);  // several flush intervals
  pubs.join();
  CHECK(pubs.ok_after_failure.load() == 0);
  for (const Status& s : pubs.failures) CHECK(s.code() == Code::IOError);
  MESSAGE("async flush EIO: " << pubs.failures.front().to_string() << " (acknowledged before: " << ok_then << ")");
}

TEST_CASE("disk full (ENOSPC): publish fails with DiskFull, nothing acknowledged is lost, writes work again once space is back") {
  Target fx;
  Publishers pubs;
  {
    auto bus = Bus::open(options(fx.store)).value();
    auto topic = bus->create_topic("fault.full", {.lanes = 4, .durable = true}).value();
    REQUIRE(topic.publish({.key = "k", .payload = pc::payload("warm", 1)}).ok());
    faults::set_space(64 * 1024);  // 64 KiB more, then the file system is full
    pubs.start(topic, 3, 1500);
    REQUIRE(lanebus::test::wait_until([&] { return pubs.failed.load(); }, 60s));
    // Still full: later publishes keep failing with DiskFull (the store is not wedged or fatal).
    REQUIRE(lanebus::test::wait_until(
        [&] {
          std::lock_guard<std::mutex> l(pubs.mu);
          return pubs.failures.size() >= 50;
        },
        60s));
    pubs.stop.store(true);
    for (auto& t : pubs.threads) t.join();
    pubs.threads.clear();
    const std::uint64_t full_oks = pubs.oks.load();
    for (const Status& s : pubs.failures) {
      INFO(s.to_string());
      CHECK(s.code() == Code::DiskFull);
    }
    MESSAGE("disk full: " << pubs.failures.front().to_string());
    CHECK(pubs.failures.front().to_string().find("ENOSPC") != std::string::npos);
    CHECK(faults::counter(faults::kEnospcInjected) > 0);
    // Space comes back: the same open store takes publishes again.
    faults::set_space(-1);
    pubs.stop.store(false);
    pubs.failed.store(false);
    const std::size_t failures_before = pubs.failures.size();
    pubs.start(topic, 3, 1500);
    REQUIRE(lanebus::test::wait_until([&] { return pubs.oks.load() >= full_oks + 100; }, 60s));
    pubs.join();
    CHECK(pubs.failures.size() == failures_before);
    MESSAGE("disk full: acknowledged=" << pubs.ok.size() << " before full=" << full_oks
                                       << " refused=" << failures_before);
    REQUIRE(bus->shutdown(ShutdownMode::Drain, 10s).ok());
  }
  auto s = stored(fx.store, "fault.full");
  check_acknowledged_present(pubs, s);
  // Nothing that failed was stored: acknowledged + the warm-up message.
  CHECK(s.size() == pubs.ok.size() + 1);
}

TEST_CASE("short writes: the commit fails with a clear error, the store refuses writes until reopen, nothing acknowledged is lost") {
  Target fx;
  Publishers pubs;
  {
    auto bus = Bus::open(options(fx.store)).value();
    auto topic = bus->create_topic("fault.short", {.lanes = 2, .durable = true}).value();
    pubs.start(topic, 2);
    REQUIRE(lanebus::test::wait_until([&] { return pubs.oks.load() >= 50; }, 60s));
    faults::set_short_writes(true);
    REQUIRE(lanebus::test::wait_until([&] { return pubs.failed.load(); }, 60s));
    faults::set_short_writes(false);  // the disk is fine again, but the store must not trust what it wrote
    std::this_thread::sleep_for(20ms);
    pubs.join();
    CHECK(pubs.ok_after_failure.load() == 0);
    MESSAGE("short write: " << pubs.failures.front().to_string());
    for (const Status& s : pubs.failures) CHECK((s.code() == Code::IOError || s.code() == Code::DiskFull));
    CHECK(faults::counter(faults::kShortInjected) > 0);
    (void)bus->shutdown(ShutdownMode::Abandon, 10s);
  }
  check_acknowledged_present(pubs, stored(fx.store, "fault.short"));
  auto bus = Bus::open(options(fx.store));
  REQUIRE_MESSAGE(bus.ok(), bus.status().to_string());
  auto topic = (*bus)->create_topic("fault.short", {.lanes = 2, .durable = true});
  REQUIRE_MESSAGE(topic.ok(), topic.status().to_string());
  CHECK(topic->publish({.key = "k", .payload = "after reopen"}).ok());
}

namespace {

// Log lines as the hook gave them (BusOptions::log or the C callback).
struct LogLines {
  std::mutex mu;
  std::vector<std::pair<int, std::string>> lines;  // level, text
  void add(int level, std::string_view text) {
    std::lock_guard<std::mutex> l(mu);
    lines.emplace_back(level, std::string(text));
  }
  std::size_t count(int level, std::string_view part) {
    std::lock_guard<std::mutex> l(mu);
    std::size_t n = 0;
    for (const auto& [lv, text] : lines) n += lv == level && text.find(part) != std::string::npos;
    return n;
  }
  std::string dump() {
    std::lock_guard<std::mutex> l(mu);
    std::string out;
    for (const auto& [lv, text] : lines) out += std::to_string(lv) + ": " + text + "\n";
    return out;
  }
};

void c_log(lanebus_log_level level, const char* message, std::size_t length, void* user) {
  static_cast<LogLines*>(user)->add(static_cast<int>(level), std::string_view(message, length));
}

}  // namespace

TEST_CASE("the log hook hears a failed fsync at error, and the refused writes after it at most once a second") {
  Target fx;
  LogLines log;
  BusOptions o = options(fx.store, Durability::Async);
  o.log = [&log](LogLevel level, std::string_view text) { log.add(static_cast<int>(level), text); };
  auto bus = Bus::open(o).value();
  auto topic = bus->create_topic("fault.logged", {.lanes = 2, .durable = true}).value();
  Publishers pubs;
  pubs.start(topic, 2);
  REQUIRE(lanebus::test::wait_until([&] { return pubs.oks.load() >= 100; }, 60s));
  CHECK(log.count(static_cast<int>(LogLevel::Error), "") == 0);  // negative control: healthy, silent
  const auto t0 = std::chrono::steady_clock::now();
  faults::fail_fsync(1);  // the next flush fails
  REQUIRE(lanebus::test::wait_until([&] {
    std::lock_guard<std::mutex> l(pubs.mu);
    return pubs.failures.size() >= 500;
  }, 60s));
  pubs.join();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(log.dump());
  CHECK(log.count(static_cast<int>(LogLevel::Error), "the async flush (fsync) failed: IOError") == 1);
  CHECK(log.count(static_cast<int>(LogLevel::Error), "EIO") >= 1);
  const std::size_t lines = log.count(static_cast<int>(LogLevel::Error), "store \"");
  CHECK(static_cast<double>(lines) <= elapsed + 2);  // hundreds of refusals, one line a second
  MESSAGE(pubs.failures.size() << " refused publishes in " << elapsed << " s gave " << lines << " line(s):\n"
                               << log.dump());
  (void)bus->shutdown(ShutdownMode::Abandon, 10s);
}

TEST_CASE("the C API's log callback hears a failed fsync of a Sync store at LANEBUS_LOG_ERROR") {
  Target fx;
  LogLines log;
  lanebus_error err{};
  lanebus_bus* bus = nullptr;
  REQUIRE(lanebus_open_logged("capi-fault", fx.store.c_str(), 2, c_log, &log, &bus, &err) == LANEBUS_OK);
  lanebus_topic* topic = nullptr;
  REQUIRE(lanebus_create_topic(bus, "fault.c", 1, LANEBUS_DURABLE, &topic, &err) == LANEBUS_OK);
  REQUIRE(lanebus_publish(topic, "k", 1, "before", 6, &err) == LANEBUS_OK);
  faults::fail_fsync(1);  // the next commit's fsync fails
  lanebus_code rc = LANEBUS_OK;
  for (int i = 0; i < 100 && rc == LANEBUS_OK; ++i) rc = lanebus_publish(topic, "k", 1, "after", 5, &err);
  CHECK(rc == LANEBUS_IO_ERROR);
  INFO(log.dump());
  CHECK(lanebus::test::wait_until([&] { return log.count(LANEBUS_LOG_ERROR, "EIO") >= 1; }, 10s));
  CHECK(log.count(LANEBUS_LOG_ERROR, "bus \"capi-fault\": store \"") >= 1);
  (void)lanebus_close(bus, &err);
}
