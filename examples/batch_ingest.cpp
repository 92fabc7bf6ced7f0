// lanebus — MIT License.
// Batch handlers on a durable topic (doc/durable.md, "Consuming"): a
// clickstream topic ingested into a warehouse one bulk write per handler
// call. Each call gets a span of one lane's messages (Bus::subscribe_batch,
// up to GroupOptions::batch_max); the handler answers with one BatchOutcome:
//   - a malformed event: the rows before it are written and acked, the event
//     is rejected (it goes to the dead-letter queue), and the rest of the span
//     comes again in the next call;
//   - the warehouse refusing a write: nothing of the span is acked, the first
//     event is retried after the backoff, the others come again with it.
// After a restart the group resumes where it stopped: nothing twice.
//
//   batch_ingest [DIR]     (default: a fresh directory under /tmp, removed at exit)
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <mutex>
#include <span>
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
  o.name = "ingest-demo";
  o.workers = 2;
  o.store.directory = dir.string();
  o.store.durability = Durability::Sync;
  return o;
}

template <typename Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 20000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

// The warehouse: rows in bulk writes, the third of which it refuses once.
struct Warehouse {
  std::mutex mu;
  std::vector<std::string> rows;
  std::map<std::string, std::vector<int>> by_user;  // each user's click numbers, in write order
  int writes = 0;
  bool refused = false;
  std::size_t largest = 0;
  bool write(std::span<const MessageView> events) {
    std::lock_guard l(mu);
    if (++writes == 3 && !refused) {
      refused = true;
      return false;
    }
    largest = std::max(largest, events.size());
    for (const MessageView& m : events) {
      rows.emplace_back(m.payload());
      const std::string p(m.payload());
      by_user[std::string(m.key())].push_back(std::stoi(p.substr(p.rfind(',') + 1)));
    }
    return true;
  }
  std::size_t size() {
    std::lock_guard l(mu);
    return rows.size();
  }
};

// The handler: rows up to the first malformed event in one write.
BatchOutcome ingest(Warehouse& w, std::span<const MessageView> events) {
  std::size_t good = 0;
  while (good < events.size() && events[good].payload().find(',') != std::string_view::npos) ++good;
  if (good > 0 && !w.write(events.first(good))) return BatchOutcome::stop_at(0, Outcome::retry("warehouse busy"));
  if (good < events.size()) return BatchOutcome::stop_at(good, Outcome::reject("malformed click: no fields"));
  return BatchOutcome::all_acked();
}

Status publish_clicks(const Topic& clicks, int from, int to, int malformed_at) {
  std::vector<std::string> payloads;
  std::vector<std::string> keys;
  for (int i = from; i < to; ++i) {
    keys.push_back("user-" + std::to_string(i % 7));
    payloads.push_back(i == malformed_at ? std::string("garbage") : keys.back() + ",/page/" + std::to_string(i % 13) + "," + std::to_string(i));
  }
  std::vector<OutgoingMessage> batch;
  for (std::size_t i = 0; i < payloads.size(); ++i) batch.push_back({.key = keys[i], .payload = payloads[i]});
  // One writer request and one fsync per chunk (Topic::publish_batch on a durable topic).
  for (std::size_t at = 0; at < batch.size(); at += 250) {
    const std::size_t n = std::min<std::size_t>(250, batch.size() - at);
    BatchPublishResult r = clicks.publish_batch(std::span<const OutgoingMessage>(batch).subspan(at, n));
    if (!r.ok()) return r.status;
  }
  return Status();
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  const bool temporary = argc < 2;
  if (temporary) {
    char tmpl[] = "/tmp/lanebus-ingest-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    dir = fs::path(tmpl) / "store";
  } else {
    dir = argv[1];
  }
  std::printf("store: %s\n\n", dir.c_str());
  constexpr int kClicks = 2000, kMalformed = 777, kLater = 100;
  const GroupOptions group{.backoff_initial = 20ms, .batch_max = 256};
  int rc = 0;
  Warehouse warehouse;
  std::atomic<int> calls{0};
  {
    auto bus_r = Bus::open(options_for(dir));
    if (!bus_r.ok()) {
      std::fprintf(stderr, "open: %s\n", bus_r.status().to_string().c_str());
      return 1;
    }
    auto& bus = *bus_r;
    auto clicks = bus->create_topic("web.clicks", {.lanes = 4, .durable = true}).value();
    std::printf("1. publishing %d clicks of 7 users (click %d is malformed), 250 per fsync\n", kClicks, kMalformed);
    if (Status s = publish_clicks(clicks, 0, kClicks, kMalformed); !s.ok()) {
      std::fprintf(stderr, "publish: %s\n", s.to_string().c_str());
      return 1;
    }
    auto sub = bus->subscribe_batch(
                      clicks, "warehouse",
                      [&](std::span<const MessageView> events) {
                        calls.fetch_add(1);
                        return ingest(warehouse, events);
                      },
                      group)
                   .value();
    if (!wait_for([&] { return warehouse.size() == kClicks - 1; })) rc = 1;
    std::printf("2. the warehouse group wrote %zu rows in %d calls (largest span %zu, up to batch_max %u)\n",
                warehouse.size(), calls.load(), warehouse.largest, group.batch_max);
    std::printf("   the warehouse refused one write: that span came again after the backoff\n");
    auto dead = (*bus->dead_letters())->list({.topic = "web.clicks"});
    if (dead.ok() && dead->size() == 1) {
      std::printf("   dead letter: lane %u offset %llu payload \"%s\": %s\n", dead->front().lane,
                  static_cast<unsigned long long>(dead->front().offset), dead->front().payload.c_str(),
                  dead->front().reason.c_str());
    } else {
      std::printf("   expected one dead letter\n");
      rc = 1;
    }
    bool in_order = true;
    {
      std::lock_guard l(warehouse.mu);
      for (auto& [user, seq] : warehouse.by_user)
        in_order = in_order && std::is_sorted(seq.begin(), seq.end()) &&
                   std::adjacent_find(seq.begin(), seq.end()) == seq.end();
    }
    std::printf("   every user's clicks in the warehouse in click order, each once: %s\n", in_order ? "yes" : "NO");
    if (!in_order) rc = 1;
  }
  {
    // 3. After a restart the group resumes past everything it settled.
    auto bus = Bus::open(options_for(dir)).value();
    auto clicks = bus->create_topic("web.clicks", {.lanes = 4, .durable = true}).value();
    auto sub = bus->subscribe_batch(
                      clicks, "warehouse",
                      [&](std::span<const MessageView> events) { return ingest(warehouse, events); }, group)
                   .value();
    if (!publish_clicks(clicks, kClicks, kClicks + kLater, -1).ok()) rc = 1;
    if (!wait_for([&] { return warehouse.size() == kClicks - 1 + kLater; })) rc = 1;
    std::this_thread::sleep_for(100ms);
    std::printf("\n3. after a restart: %d new clicks published, the warehouse has %zu rows (nothing twice)\n", kLater,
                warehouse.size());
    if (warehouse.size() != kClicks - 1 + kLater) rc = 1;
  }
  if (temporary) fs::remove_all(dir.parent_path());
  std::printf("\n%s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
}
