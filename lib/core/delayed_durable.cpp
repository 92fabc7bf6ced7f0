// lanebus — MIT License.
// Delayed delivery and expiry on durable topics and queues (doc/delays.md):
// the timed publish (refused, stored in the delayed index, or appended with
// its expiry), the mover that appends due messages to their lanes
// (lib/store/delayed_index.hpp) on the bus's timer, and the expiry of
// stored messages on delivery.
#include <atomic>
#include <memory>
#include <random>

#include "bus_impl.hpp"
#include "delayed_index.hpp"

namespace lanebus::detail {

namespace {
// Tie-break of delayed keys published in the same nanosecond: per process,
// starting at a random point (another process's equal key is found and skipped by put_delayed).
std::atomic<std::uint32_t> g_tiebreak{static_cast<std::uint32_t>(std::random_device{}())};
// A move that failed (a storage error) is tried again after this long.
constexpr std::int64_t kMoveRetryNs = 100'000'000;
// Entries moved per transaction. One move runs at a time and its commit is
// shared with the publishes of the same batch (group commit), so a move
// must be able to carry as many messages as a batch of publishes brings in
// (sync_4p: 4 x 512 in flight), or the index grows faster than it drains.
constexpr std::uint32_t kMoveBatch = 4096;
}  // namespace

Status TopicDelays::publish_durable(const OutgoingMessage& m, AppendRequest& req, NamespaceState* nsp,
                                        std::size_t need, PublishCallback& done, bool* handled) {
  *handled = false;
  MessageTimes times;
  Status st = resolve_times(m, t_.default_ttl_ns, req.header.created_at_ns, &times);
  if (st.ok() && times.due_ns > req.header.created_at_ns && !t_.options.fence.empty())
    st = Status::from_literal(Code::InvalidArgument,
                              "publish: delayed delivery is not available on fenced topics (the lease generation "
                              "may change before the message is due)");
  if (!st.ok()) {
    nsp->unadmit_publish(need);
    t_.refused.fetch_add(1, std::memory_order_relaxed);
    return st;
  }
  req.expires_ns = times.expires_ns;
  if (times.due_ns <= req.header.created_at_ns) return Status();  // not delayed: the normal append
  req.due_ns = times.due_ns;
  // It enters its lane at its due time, as if published then: created_at (the
  // lane's time index for seek and age retention, the latency start) is the due time.
  req.header.created_at_ns = times.due_ns;
  *handled = true;
  const std::int64_t due = times.due_ns;
  const std::uint32_t lane = req.lane;
  const std::uint32_t tiebreak = g_tiebreak.fetch_add(1, std::memory_order_relaxed);
  // Stored in the index, or appended at once when it is due by the time the
  // writer runs it (store_delayed: a delay shorter than the writer's queue).
  if (!done) {
    auto put = [&req, tiebreak](StoreTxn& t) -> Status {
      bool appended = false;
      return store_delayed(t, req, tiebreak, &appended);
    };
    Status ws = t_.bus->store()->write(put);
    if (!ws.ok()) {
      nsp->unadmit_publish(need);
      t_.refused.fetch_add(1, std::memory_order_relaxed);
      return ws;
    }
    t_.lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
    t_.bus->durable_delays().arm(due);
    return Status();
  }
  Status ws = t_.bus->store()->delayed_async(
      std::move(req), tiebreak, [this, lane, nsp, need, due, done = std::move(done)](const Status& s) {
        if (s.ok()) {
          t_.lane_load[lane].published.fetch_add(1, std::memory_order_relaxed);
          t_.bus->durable_delays().arm(due);
        } else {
          nsp->unadmit_publish(need);
          t_.refused.fetch_add(1, std::memory_order_relaxed);
        }
        done(s, 0);  // no offset yet: the message enters its lane when due
      });
  if (!ws.ok()) {
    nsp->unadmit_publish(need);
    t_.refused.fetch_add(1, std::memory_order_relaxed);
  }
  return ws;
}

void DurableDelays::arm(std::int64_t due_wall_ns) noexcept {
  if (due_wall_ns == 0) return;
  std::int64_t armed = armed_.load(std::memory_order_seq_cst);
  while (due_wall_ns < armed) {
    if (armed_.compare_exchange_weak(armed, due_wall_ns, std::memory_order_seq_cst)) {
      bus_.arm_delayed(&entry_, due_wall_ns);
      return;
    }
  }
}

void DurableDelays::refresh() noexcept {
  if (!bus_.store_ || bus_.store_->read_only()) return;
  auto first = earliest_delayed(*bus_.store_);
  if (first.ok() && *first != 0) arm(*first);
}

void DurableDelays::move() noexcept {
  // The timer fired (and unlinked the entry): the next arm goes through.
  armed_.store(INT64_MAX, std::memory_order_seq_cst);
  if (!bus_.store_ || bus_.store_->read_only() || bus_.closing()) return;
  // One move at a time. again_ before moving_ (seq_cst both, as the
  // completion's store and load): either this call moves, or the running
  // move's completion sees again_ and moves again.
  again_.store(true, std::memory_order_seq_cst);
  if (moving_.exchange(true, std::memory_order_seq_cst)) return;
  again_.store(false, std::memory_order_relaxed);
  try {
    auto result = std::make_shared<MoveResult>();
    Status s = bus_.store_->write_async(
        [this, result](StoreTxn& t) -> Status {
          return move_due_delayed(
              t, kMoveBatch,
              [this](std::uint32_t topic_id) {
                MutexLock l(&bus_.durable_mu_);
                return bus_.durable_topics_.count(topic_id) > 0;
              },
              result.get());
        },
        [this, result](const Status& st) {
          moving_.store(false, std::memory_order_seq_cst);
          if (again_.load(std::memory_order_seq_cst)) arm(now_ns());
          if (!st.ok()) {
            arm(now_ns() + kMoveRetryNs);
            return;
          }
          if (result->dropped > 0)
            bus_.logger.log(LogLevel::Warn,
                       "delayed delivery: %u due message(s) refused by their topic (gone, or fenced) were dropped",
                       result->dropped);
          if (result->next_due != 0) arm(result->next_due);
        });
    if (!s.ok()) {
      moving_.store(false, std::memory_order_release);
      if (s.code() != Code::ShutDown) arm(now_ns() + kMoveRetryNs);
    }
  } catch (...) {
    moving_.store(false, std::memory_order_release);
    arm(now_ns() + kMoveRetryNs);
  }
}


}  // namespace lanebus::detail
