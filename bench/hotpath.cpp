// lanebus — MIT License.
// bench/hotpath: a fixed, deterministic in-process workload for instruction
// counting (doc/performance.md): run it under `valgrind --tool=callgrind` and
// divide a function's inclusive Ir by the message count. Wall-clock numbers
// on a shared VM swing by 2x; instruction counts do not.
//
// Usage: hotpath [--msgs N] [--batch B] [--groups G] [--metrics 0|1] [--handler one|batch]
//                [--stream 0|1] [--delay-us D] [--payload BYTES] [--workers W]
//   --payload BYTES: the payload's size (8 to 1024, default 64). With a 56-byte
//   slot header and a 5- or 6-byte key, up to 2 bytes of payload fill one
//   cache line, 66 two and 130 three (doc/performance.md, eleventh round: "The lines a message fills").
//   --delay-us D: every message published with OutgoingMessage::delay of D µs
//   (doc/delays.md): Publisher::publish then counts the timed publish and the
//   publisher's releases of due messages (release_inline).
//   --handler batch: Bus::subscribe_batch instead of subscribe.
//   One producer thread publishes N 64-byte messages (16 keys over 8 lanes)
//   to one topic with G groups on one worker: through Publisher::publish
//   (B = 1, the default) or Publisher::publish_batch in spans of B. The
//   producer publishes in rounds of 1,024 and waits for each round to be
//   handled, so the worker never finds its lane empty mid-round (no spinning
//   in the profile) and the rounds are identical.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "lanebus/bus.hpp"

int main(int argc, char** argv) {
  std::uint64_t msgs = 100'000;
  std::uint32_t batch = 1, groups = 1;
  bool metrics = true;
  bool batch_handler = false;
  bool stream = false;
  std::int64_t delay_us = 0;
  std::uint32_t payload_bytes = 64;
  std::size_t workers = 1;  // --workers: the bus's worker threads (fanout1to4 runs 2)
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string_view a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--msgs") msgs = std::strtoull(v, nullptr, 10);
    else if (a == "--batch") batch = static_cast<std::uint32_t>(std::atoi(v));
    else if (a == "--groups") groups = static_cast<std::uint32_t>(std::atoi(v));
    else if (a == "--metrics") metrics = std::atoi(v) != 0;
    else if (a == "--handler") batch_handler = std::string_view(v) == "batch";
    else if (a == "--stream") stream = std::atoi(v) != 0;
    else if (a == "--delay-us") delay_us = std::atoll(v);
    else if (a == "--payload") payload_bytes = static_cast<std::uint32_t>(std::atoi(v));
    else if (a == "--workers") workers = static_cast<std::size_t>(std::atoi(v));
    else {
      std::fprintf(stderr,
                   "usage: hotpath [--msgs N] [--batch B] [--groups G] [--metrics 0|1] [--handler one|batch] "
                   "[--stream 0|1] [--delay-us D] [--payload BYTES] [--workers W]\n");
      return 2;
    }
  }
  if (batch == 0 || batch > 1024 || workers == 0 || workers > 64 || groups == 0 || delay_us < 0 || payload_bytes < 8 || payload_bytes > 1024) return 2;
  // spin = 0: the worker lingers 1 µs on an emptied lane and parks at once,
  // so the wait between rounds adds no spinning to the counts.
  // --stream 1 (for perf): one unbroken stream under the topic's backpressure,
  // the default spin, and the rate printed: the 1to1 case without baselines.
  auto bus = lanebus::Bus::open({.name = "hotpath",
                                 .workers = workers,
                                 .spin = stream ? std::chrono::nanoseconds(50'000) : std::chrono::nanoseconds(0),
                                 .metrics = metrics})
                 .value();
  // Delayed messages hold their slots for the delay (doc/delays.md, "Sizing").
  auto topic = bus->create_topic("hotpath", {.lanes = 8,
                                             .capacity = delay_us > 0 ? 65536u : 4096u,
                                             .slot_bytes = std::max<std::uint32_t>(256, payload_bytes + 16)})
                   .value();
  // The handlers' counter on a line of its own: on main's stack beside the
  // publisher's locals, every handler's increment cost the publisher a miss.
  struct alignas(64) Counter : std::atomic<std::uint64_t> {
    using std::atomic<std::uint64_t>::atomic;
    char pad[64 - sizeof(std::atomic<std::uint64_t>)];
  };
  Counter handled{0};
  std::vector<lanebus::Subscription> subs;
  for (std::uint32_t g = 0; g < groups; ++g) {
    if (batch_handler) {
      // Bus::subscribe_batch: spans of up to 64 messages of one lane.
      subs.push_back(bus->subscribe_batch(topic, "g" + std::to_string(g), [&](std::span<const lanebus::MessageView> ms) {
                          for (const lanebus::MessageView& m : ms) {
                            std::uint64_t seq;
                            std::memcpy(&seq, m.payload().data(), sizeof seq);
                          }
                          handled.fetch_add(ms.size(), std::memory_order_relaxed);
                          return lanebus::BatchOutcome::all_acked();
                        }).value());
      continue;
    }
    subs.push_back(bus->subscribe(topic, "g" + std::to_string(g), [&](const lanebus::MessageView& m) {
                        std::uint64_t seq;
                        std::memcpy(&seq, m.payload().data(), sizeof seq);
                        handled.fetch_add(1, std::memory_order_relaxed);
                        return lanebus::Outcome::ack();
                      }).value());
  }
  // The clock (lib/util/wall_clock.hpp) reads CLOCK_REALTIME until its TSC
  // rate is measured, over the process's first 100 ms: a long-lived bus pays
  // that once, but it was a third of this short run's clock reads under
  // callgrind (about 30 instructions a message). One message, then 150 ms,
  // then the counted run: the counts are the steady state. (The one
  // message adds its publish and delivery to the totals: 1 in --msgs.)
  {
    lanebus::Publisher warm = bus->publisher();
    const char one[8] = {};
    if (!warm.publish(topic, {.payload = std::string_view(one, sizeof one)}).ok()) return 1;
    while (handled.load(std::memory_order_relaxed) < groups) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    handled.fetch_sub(groups, std::memory_order_relaxed);
  }
  std::vector<std::string> keys;
  for (int k = 0; k < 16; ++k) keys.push_back("key-" + std::to_string(k));
  std::vector<char> payload_buf(payload_bytes);
  char* const payload = payload_buf.data();
  std::vector<lanebus::OutgoingMessage> span(1024);
  lanebus::Publisher pub = bus->publisher();
  const std::uint64_t kRound = stream ? msgs : 1024;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::uint64_t done = 0; done < msgs;) {
    const std::uint64_t round = std::min<std::uint64_t>(kRound, msgs - done);
    for (std::uint64_t i = 0; i < round;) {
      const std::uint32_t b = static_cast<std::uint32_t>(std::min<std::uint64_t>(batch, round - i));
      for (std::uint32_t j = 0; j < b; ++j) {
        const std::uint64_t seq = done + i + j;
        std::memcpy(payload, &seq, sizeof seq);
        span[j] = {.key = keys[seq % keys.size()],
                   .payload = std::string_view(payload, payload_bytes),
                   .delay = std::chrono::microseconds(delay_us)};
        if (batch == 1 && !pub.publish(topic, span[0]).ok()) return 1;
      }
      if (batch > 1) {
        // payload is one buffer: fine for counting, every message carries the last seq.
        auto r = pub.publish_batch(topic, std::span<const lanebus::OutgoingMessage>(span.data(), b));
        if (!r.ok()) return 1;
      }
      i += b;
    }
    done += round;
    while (handled.load(std::memory_order_relaxed) < done * groups) std::this_thread::yield();
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (void)bus->shutdown(lanebus::ShutdownMode::Drain);
  std::printf("bench=hotpath msgs=%llu batch=%u groups=%u metrics=%d stream=%d delay_us=%lld payload=%u handled=%llu "
              "msgs_per_sec=%.0f\n",
              static_cast<unsigned long long>(msgs), batch, groups, metrics ? 1 : 0, stream ? 1 : 0,
              static_cast<long long>(delay_us), payload_bytes,
              static_cast<unsigned long long>(handled.load()), static_cast<double>(msgs) / secs);
  return 0;
}
