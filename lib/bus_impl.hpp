// lanebus — MIT License.
// BusCore and the objects it owns: topics, groups, per-(group, lane) state,
// consumers and the worker pool.
//
// Design notes
// - Data path: publish copies the message into a pooled Slot of its topic, sets
//   refs = 1 (the publisher's guard), and for each active group adds a ref and
//   pushes the slot index into that group's LaneRing for the message's lane;
//   then it schedules the lane (below) and drops its guard.
// - Scheduling: a GroupLane is "scheduled" from the moment a publisher (or a
//   worker) sets its flag until the worker that ran it clears the flag. Only
//   whoever flips the flag false→true pushes the lane onto the run queue, so a
//   lane is queued at most once and runs on at most one worker at a time.
// - Lost-wakeup freedom (Dekker): the publisher makes its ring entry visible
//   (seq_cst store) and then reads the flag (seq_cst exchange); the worker
//   clears the flag (seq_cst store) and then checks the ring (seq_cst loads).
//   One of the two must see the other's write, so a message never sits in a
//   ring whose lane is not scheduled.
// - Consumers: a worker "pins" one consumer of the group for a batch
//   (calls += 1, then re-checks enabled; close() clears enabled, then waits for
//   calls == 0). Hence no handler call starts after close() returns.
// - Memory: everything (slots, rings, groups, consumer tables) is allocated
//   when a topic or group is created; the hot path never allocates.
//
// Lock order: BusCore::mu_ is the only lock; it guards the registry (topic
// map, group creation, consumer slot assignment). No lock is held while a
// handler runs, and the data path takes none.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "lane_ring.hpp"
#include "lanebus/bus.hpp"
#include "message_pool.hpp"
#include "mpmc_queue.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class TopicImpl;
struct GroupImpl;

/// A counter written by one thread at a time (the lane's current owner) and
/// read by stats(). relaxed: a plain tally; ownership hand-offs through the
/// run queue order successive writers.
inline void bump(std::atomic<std::uint64_t>& c) noexcept {
  c.store(c.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

/// One consumer group's state in one lane.
struct alignas(64) GroupLane {
  GroupLane(GroupImpl* g, std::uint32_t l, std::uint32_t ring_capacity) : group(g), lane(l), ring(ring_capacity) {}

  GroupImpl* const group;
  const std::uint32_t lane;
  LaneRing ring;
  alignas(64) std::atomic<bool> scheduled{false};

  // Owned by the worker running the lane.
  alignas(64) Slot* current = nullptr;  // taken from the ring, not yet finished (retry pending)
  std::uint32_t attempts = 0;           // deliveries of `current` so far

  // Counters (see LaneCounters). Single-writer ones use bump().
  std::atomic<std::uint64_t> delivered{0}, acked{0}, retried{0}, rejected{0}, failed{0};
  std::atomic<std::uint64_t> dropped{0};  // multi-writer (droppers, worker): fetch_add
};

/// One subscription's slot in its group's consumer table.
struct Consumer {
  GroupImpl* group = nullptr;
  Handler handler;                    // written under BusCore::mu_ before `enabled` is set
  std::atomic<bool> enabled{false};   // may receive messages
  std::atomic<std::uint32_t> calls{0};  // workers pinning this consumer
  bool in_use = false;                // slot assigned (guarded by BusCore::mu_)
};

struct GroupImpl {
  GroupImpl(TopicImpl* t, std::string n, const GroupOptions& o, std::uint32_t lanes, std::uint32_t ring_capacity,
            std::uint32_t max_consumers);

  TopicImpl* const topic;
  const std::string name;
  const GroupOptions options;
  std::vector<std::unique_ptr<GroupLane>> lanes;
  std::unique_ptr<Consumer[]> consumers;
  const std::uint32_t max_consumers;
  std::atomic<std::uint32_t> consumers_hw{0};  // consumer slots ever used (scan bound)
  std::atomic<std::uint32_t> consumer_count{0};
  std::atomic<std::uint32_t> rr{0};  // round-robin start for picking a consumer
  // Receives publishes. A topic group is active while it has consumers; a
  // queue's group is always active (messages wait for a consumer).
  std::atomic<bool> active{false};
  const bool persistent;  // queue group: keep messages while no consumer is attached
};

class BusCore;

class TopicImpl {
 public:
  TopicImpl(BusCore* bus, std::string name, bool is_queue, const TopicOptions& options);

  Status publish(const OutgoingMessage& m, bool may_block, std::uint64_t id) noexcept;

  BusCore* const bus;
  const std::string name;
  const bool is_queue;
  const TopicOptions options;
  const std::uint32_t capacity;  // power of two
  MessagePool pool;
  std::unique_ptr<std::atomic<GroupImpl*>[]> groups;  // [options.max_groups]
  std::atomic<std::uint32_t> group_count{0};
  std::vector<std::unique_ptr<GroupImpl>> owned_groups;  // guarded by BusCore::mu_

  struct alignas(64) LaneLoad {
    std::atomic<std::uint64_t> published{0};
  };
  std::unique_ptr<LaneLoad[]> lane_load;
  std::atomic<std::uint64_t> unrouted{0};
  std::atomic<std::uint64_t> refused{0};

 private:
  Slot* acquire_slot(std::uint32_t lane, bool may_block) noexcept;
  bool drop_oldest(std::uint32_t first_lane) noexcept;
};

/// Per-thread publishing state behind Publisher.
struct PublisherState {
  BusCore* bus = nullptr;
  std::uint64_t next_id = 0;
  std::uint64_t end_id = 0;
};

class BusCore : public std::enable_shared_from_this<BusCore> {
 public:
  explicit BusCore(const BusOptions& options);
  ~BusCore();

  Status start();
  Result<TopicImpl*> create(std::string_view name, bool is_queue, const TopicOptions& options);
  Result<Consumer*> attach(TopicImpl* topic, std::string_view group, Handler handler, const GroupOptions& options);
  Status detach(Consumer* c) noexcept;
  Status shutdown(ShutdownMode mode, std::chrono::milliseconds timeout);
  BusStats stats() const;
  TopicImpl* find(std::string_view name) const;

  /// Make sure `gl` is (or will be) run by a worker.
  void schedule(GroupLane* gl) noexcept;

  std::uint64_t take_ids(std::uint64_t n) noexcept { return next_id_.fetch_add(n, std::memory_order_relaxed); }
  bool closing() const noexcept { return closing_.load(std::memory_order_seq_cst); }

  const BusOptions options;

 private:
  void worker_main(std::size_t index);
  void run_lane(GroupLane* gl);
  Consumer* pin_consumer(GroupImpl* g) noexcept;
  void release_remaining() noexcept;
  std::int64_t slots_in_use() const;

  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<TopicImpl>, std::less<>> topics_ GUARDED_BY(mu_);
  std::vector<std::thread> workers_;
  RunQueue<GroupLane*> runq_;
  std::atomic<bool> closing_{false};
  std::atomic<bool> abandon_{false};
  std::atomic<bool> stopped_{false};
  Mutex shutdown_mu_;
  std::atomic<std::uint64_t> next_id_{1};
  std::atomic<std::uint64_t> runq_fallbacks_{0};
};

}  // namespace lanebus::detail
