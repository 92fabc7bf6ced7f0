// lanebus — MIT License.
// The ephemeral lane runner: take slots from the lane ring and deliver them.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

void BusCore::run_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  if (g->topic->durable) {
    run_durable_lane(gl);
    return;
  }
  MessagePool& pool = g->topic->pool;
  const bool abandon = abandon_.load(std::memory_order_acquire);
  Consumer* c = abandon ? nullptr : pin_consumer(g);

  if (c == nullptr && g->persistent && !abandon) {
    // A queue with no consumer: messages wait. Unschedule; attach() reschedules
    // lanes once a consumer exists (Dekker on enabled / scheduled).
    const bool holding = gl->current != nullptr;  // owner-only: read before releasing the lane
    gl->scheduled.store(false, std::memory_order_seq_cst);
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0 && (holding || gl->ring.ready())) schedule(gl);
    return;
  }

  // Topics without DropOldest have one dequeuer per lane ring (its owner).
  const bool single = g->topic->options.backpressure != Backpressure::DropOldest;
  auto take = [&](std::uint32_t& idx) { return single ? gl->ring.try_dequeue_single(idx) : gl->ring.try_dequeue(idx); };
  FreeChain frees(pool);
  const bool metrics = options.metrics;
  std::uint32_t handled = 0;
  bool yield_for_retry = false;
  while (handled < g->options.batch) {
    if (gl->current == nullptr) {
      std::uint32_t idx;
      if (!take(idx)) {
        // The lane is empty. If no other lane waits, linger briefly: a
        // producer in a burst is likely to publish again within the spin,
        // which saves a trip through the run queue per message.
        if (c == nullptr || runq_.size_approx() != 0) break;
        frees.flush();
        bool got = false;
        for (int spin = 0; spin < 64 && !got; ++spin) {
          cpu_relax();
          got = take(idx);
        }
        if (!got) break;
      }
      gl->current = pool.at(idx);
      gl->attempts = 0;
      if (metrics) gl->oldest_ns.store(gl->current->header.created_at_ns, std::memory_order_relaxed);
    }
    Slot* s = gl->current;
    if (c == nullptr) {
      // No consumer (the group was left, or shutdown abandons): discard.
      gl->dropped.fetch_add(1, std::memory_order_relaxed);
      gl->current = nullptr;
      frees.release(s);
      continue;
    }
    if (g->idempotency != nullptr && s->idem_len != 0) {
      Dedup d = dedup_claim(gl, s->idempotency_key());
      if (d == Dedup::Later) {
        gl->retry_delay_ns = kDedupBusyDelayNs;  // not an attempt: the key is busy elsewhere
        yield_for_retry = true;
        break;
      }
      if (d == Dedup::Skip) {
        bump(gl->duplicates_skipped);
        ++handled;
        gl->current = nullptr;
        frees.release(s);
        continue;
      }
    }
    ++gl->attempts;
    bump(gl->delivered);
    MessageView view(s->header, s->key(), s->idempotency_key(), s->payload(), s->lane);
    view.set_attempt(gl->attempts);
    Outcome out = call_handler(c, view, gl);
    ++handled;
    if (g->idempotency != nullptr && s->idem_len != 0)
      dedup_finish(gl, s->idempotency_key(), out.kind() == Outcome::Kind::Ack);
    if (out.kind() != Outcome::Kind::Ack && gl->first_failure_ns == 0) gl->first_failure_ns = now_ns();
    switch (out.kind()) {
      case Outcome::Kind::Ack:
        bump(gl->acked);
        break;
      case Outcome::Kind::Reject:
        bump(gl->rejected);
        dead_letter_ephemeral(gl, s, out);
        break;
      case Outcome::Kind::Retry:
        bump(gl->retried);
        if (plan_retry(gl, gl->attempts)) {
          // Keep the message at the head of its lane (later messages of the
          // lane must not overtake it) and let other lanes run first.
          yield_for_retry = true;
        } else {
          bump(gl->failed);
          dead_letter_ephemeral(gl, s, out);
        }
        break;
    }
    if (yield_for_retry) break;
    gl->first_failure_ns = 0;
    if (metrics) record_latency(gl, s->header.created_at_ns);
    gl->current = nullptr;
    frees.release(s);
  }
  frees.flush();
  if (metrics && gl->current == nullptr && !gl->ring.ready()) gl->oldest_ns.store(0, std::memory_order_relaxed);
  if (c) c->calls.fetch_sub(1, std::memory_order_release);  // release: handler's effects before close() returns

  if (gl->current != nullptr) {
    // A retry is pending: stay scheduled; run again after the backoff, or at
    // the back of the run queue.
    requeue(gl);
    return;
  }
  gl->scheduled.store(false, std::memory_order_seq_cst);
  if (gl->ring.ready()) schedule(gl);
}

}  // namespace lanebus::detail
