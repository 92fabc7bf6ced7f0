// lanebus — MIT License.
// fill_queue DIR QUEUE N: a C++ producer for python/tests/test_cross_process.py.
// Opens the durable store in DIR, creates the durable queue QUEUE (4 lanes)
// and publishes N messages "msg-<i>" with keys "k<i % 16>", all in flight at
// once (publish_async: they share a few fsyncs instead of one each), waits
// until every one is committed and fsynced, prints "published N" and exits.
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "lanebus/lanebus.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fill_queue DIR QUEUE N\n");
    return 2;
  }
  lanebus::BusOptions o;
  o.name = "fill_queue";
  o.workers = 1;
  o.store.directory = argv[1];
  auto bus = lanebus::Bus::open(o);
  if (!bus.ok()) {
    std::fprintf(stderr, "fill_queue: %s\n", bus.status().to_string().c_str());
    return 1;
  }
  auto queue = (*bus)->create_queue(argv[2], {.lanes = 4, .durable = true});
  if (!queue.ok()) {
    std::fprintf(stderr, "fill_queue: %s\n", queue.status().to_string().c_str());
    return 1;
  }
  const int n = std::atoi(argv[3]);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  lanebus::Status first_error;
  for (int i = 0; i < n; ++i) {
    const std::string payload = "msg-" + std::to_string(i);
    const std::string key = "k" + std::to_string(i % 16);
    lanebus::Status s = queue->publish_async({.key = key, .payload = payload}, [&](const lanebus::Status& st, std::uint64_t) {
      std::lock_guard lock(mu);
      if (!st.ok() && first_error.ok()) first_error = st;
      ++done;
      cv.notify_all();
    });
    if (!s.ok()) {
      std::fprintf(stderr, "fill_queue: publish %d: %s\n", i, s.to_string().c_str());
      return 1;
    }
  }
  {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return done == n; });
    if (!first_error.ok()) {
      std::fprintf(stderr, "fill_queue: %s\n", first_error.to_string().c_str());
      return 1;
    }
  }
  std::printf("published %d\n", n);
  return (*bus)->shutdown(lanebus::ShutdownMode::Drain).ok() ? 0 : 1;
}
