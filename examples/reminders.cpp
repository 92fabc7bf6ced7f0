// lanebus — MIT License.
// Delayed delivery and expiry (doc/delays.md):
// - reminders: a durable topic; each reminder is published with a delay
//   ("remind me in 1.5 s") and the process that published them closes its
//   bus before any is due, as a restart would. A new bus on the same store
//   delivers every reminder at its due time (the store's delayed index, no
//   timer wheel of the application, no scan of the topic), in due-time order
//   per user, and none early;
// - presence pings: an in-memory topic with TopicOptions::default_ttl 200 ms.
//   While the consumer is busy (a slow handler holds the lane) pings go
//   stale; they are never delivered, counted as `expired`, and dead-lettered
//   with class `expired` because the group asks for it;
// - a reminder whose TTL would end before its due time is refused at
//   publish (InvalidArgument naming both values).
// Exits non-zero if any of that does not hold.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
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

std::int64_t wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

template <typename Pred>
bool wait_for(Pred pred, std::chrono::seconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

Result<std::unique_ptr<Bus>> open(const fs::path& dir) {
  BusOptions bo;
  bo.workers = 2;
  bo.store.directory = (dir / "store").string();
  return Bus::open(bo);
}

Result<Topic> reminders_topic(Bus& bus) {
  TopicOptions to;
  to.lanes = 4;
  to.durable = true;
  return bus.create_topic("reminders", to);
}

constexpr int kUsers = 5;
constexpr int kPerUser = 4;

}  // namespace

int main() {
  char tmpl[] = "/tmp/lanebus-reminders-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const fs::path dir = tmpl;
  int rc = 0;
  std::int64_t first_due = 0;
  {
    // ---- 1. Schedule reminders, then the process "restarts" before any is due.
    auto bus = open(dir).value();
    auto topic = reminders_topic(*bus).value();
    first_due = wall_ns() + 1'500'000'000;
    // publish_async: the twenty reminders share the store's group commits. One
    // fsync after another (publish) could take past a due time on a slow disk,
    // and a reminder already due when it is stored is appended at once, in
    // publish order (here latest-first), not held in the delayed index.
    std::atomic<int> pending{kUsers * kPerUser};
    std::atomic<bool> failed{false};
    // A failure is reported once, whichever way it comes: in the completion,
    // or up front (then there is no completion).
    auto done = [&pending, &failed](const Status& st) {
      if (!st.ok()) {
        std::printf("publish failed: %s\n", std::string(st.message()).c_str());
        failed = true;
      }
      pending.fetch_sub(1);
    };
    for (int u = 0; u < kUsers; ++u) {
      for (int r = kPerUser - 1; r >= 0; --r) {  // published latest-first: delivery follows the due times
        const std::int64_t due = first_due + (std::int64_t{r} * kUsers + u) * 40'000'000;
        char body[64];
        std::snprintf(body, sizeof body, "%lld:user-%d reminder %d", static_cast<long long>(due), u, r);
        const std::string user = "user-" + std::to_string(u);  // OutgoingMessage holds views: keep the string
        OutgoingMessage m{.key = user, .payload = body};
        m.deliver_at = due;
        Status s = topic.publish_async(m, [done](const Status& st, std::uint64_t) { done(st); });
        if (!s.ok()) done(s);
      }
    }
    while (pending.load() > 0) std::this_thread::sleep_for(1ms);
    if (failed) return 1;
    std::printf("scheduled %d reminders due in 1.5 s .. 2.3 s; closing the bus (a restart)\n", kUsers * kPerUser);
    // A reminder that would expire before it is due is refused, naming both values.
    OutgoingMessage bad{.key = "user-0", .payload = "too late to matter"};
    bad.delay = 10s;
    bad.ttl = 2s;
    Status refused = topic.publish(bad);
    std::printf("delay 10 s with ttl 2 s: %s\n", std::string(refused.message()).c_str());
    if (refused.code() != Code::InvalidArgument) rc = 1;
  }
  {
    // ---- 2. A new bus on the same store delivers them on time.
    auto bus = open(dir).value();
    auto topic = reminders_topic(*bus).value();
    std::mutex mu;
    std::map<std::string, std::vector<int>> per_user;
    std::vector<std::int64_t> lateness;
    int early = 0;
    auto sub = bus->subscribe(topic, "notifier", [&](const MessageView& m) {
                    const std::int64_t now = wall_ns();
                    const std::string body(m.payload());
                    const std::int64_t due = std::stoll(body.substr(0, body.find(':')));
                    std::lock_guard l(mu);
                    if (now + 1'000'000 < due) ++early;
                    lateness.push_back(now - due);
                    per_user[std::string(m.key())].push_back(std::atoi(body.substr(body.rfind(' ') + 1).c_str()));
                    return Outcome::ack();
                  }).value();
    const bool all = wait_for([&] {
      std::lock_guard l(mu);
      return lateness.size() == static_cast<std::size_t>(kUsers * kPerUser);
    }, 30s);
    std::lock_guard l(mu);
    std::sort(lateness.begin(), lateness.end());
    bool ordered = true;
    for (auto& [user, order] : per_user) ordered = ordered && std::is_sorted(order.begin(), order.end());
    std::printf("after the restart: %zu of %d reminders delivered, %d early, in due-time order per user: %s, "
                "lateness median %.1f ms, max %.1f ms (loaded machines vary)\n",
                lateness.size(), kUsers * kPerUser, early, ordered ? "yes" : "NO",
                lateness.empty() ? 0.0 : static_cast<double>(lateness[lateness.size() / 2]) / 1e6,
                lateness.empty() ? 0.0 : static_cast<double>(lateness.back()) / 1e6);
    if (!all || early != 0 || !ordered) rc = 1;

    // ---- 3. Presence pings that go stale are never delivered.
    TopicOptions po;
    po.lanes = 1;
    po.default_ttl = 200ms;
    auto presence = bus->create_topic("presence", po).value();
    std::atomic<bool> busy{true};
    std::atomic<int> shown{0};
    GroupOptions g;
    g.dead_letter_expired = true;
    auto watcher = bus->subscribe(presence, "status-bar", [&](const MessageView& m) {
                        if (m.payload() == "slow-render")
                          while (busy.load()) std::this_thread::sleep_for(1ms);
                        else
                          shown.fetch_add(1);
                        return Outcome::ack();
                      }, g).value();
    // The slow render carries a ttl of its own: with the topic's 200 ms it could
    // itself expire before a worker of a loaded machine starts it (51 expired).
    OutgoingMessage slow{.key = "ui", .payload = "slow-render"};
    slow.ttl = 10s;
    (void)presence.publish(slow);
    for (int i = 0; i < 50; ++i) (void)presence.publish({.key = "ui", .payload = "alice: online"});
    std::this_thread::sleep_for(300ms);  // the pings are stale now
    busy = false;
    OutgoingMessage fresh{.key = "ui", .payload = "alice: away"};
    // Its own ttl overrides the topic's, and outlives a loaded machine: the 50
    // pings ahead of it are dead-lettered one fsynced write at a time.
    fresh.ttl = 60s;
    (void)presence.publish(fresh);
    const bool settled = wait_for([&] {
      for (const TopicStats& t : bus->stats().topics)
        if (t.name == "presence")
          for (const GroupStats& gs : t.groups) return gs.total.expired == 50 && shown.load() == 1;
      return false;
    }, 60s);
    std::uint64_t expired_dlq = 0;
    auto entries = (*bus->dead_letters())->list();
    if (entries.ok())
      for (const DlqEntry& e : *entries)
        if (e.error_class == ErrorClass::Expired) ++expired_dlq;
    std::printf("presence: 50 stale pings expired (never shown), %d fresh one shown, %llu dead-lettered as "
                "`expired`\n",
                shown.load(), static_cast<unsigned long long>(expired_dlq));
    if (!settled || expired_dlq != 50) rc = 1;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  std::printf(rc == 0 ? "reminders: OK\n" : "reminders: FAILED\n");
  return rc;
}
