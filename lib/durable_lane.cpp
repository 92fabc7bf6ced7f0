// lanebus — MIT License.
// Durable lane runners (topics: read at the group's position and commit
// offsets; queues: claim and ack), the append listener and the poller.
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

// ---------------------------------------------------------------- durable lanes

void BusCore::run_durable_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  const bool abandon = abandon_.load(std::memory_order_acquire);
  Consumer* c = abandon ? nullptr : pin_consumer(g);
  bool more = false;
  if (c != nullptr) {
    more = g->topic->is_queue ? run_durable_queue_batch(gl, c) : run_durable_topic_batch(gl, c);
    c->calls.fetch_sub(1, std::memory_order_release);
  }
  if (more && !abandon_.load(std::memory_order_acquire)) {
    requeue(gl);
    return;
  }
  // Owner-only state must be read before the lane is released to others.
  const std::uint64_t read_pos = gl->read_pos;
  gl->scheduled.store(false, std::memory_order_seq_cst);
  if (abandon) return;
  if (c == nullptr) {
    // No consumer right now: messages stay in the store. attach() schedules
    // the lanes again; re-check in case it raced with us (Dekker, seq_cst).
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0) schedule(gl);
    return;
  }
  // (`more` was false, so nothing is left in the buffer.)
  if (!g->topic->is_queue && gl->known_end.load(std::memory_order_seq_cst) > read_pos) schedule(gl);
}

// Durable topic group: read a batch at the lane's position, deliver in order,
// then queue one offset commit. True if the lane should run again at once.
bool BusCore::run_durable_topic_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  TopicImpl* t = g->topic;
  const std::uint64_t gen = g->seek_gen.load(std::memory_order_acquire);
  if (!gl->positioned || gen != gl->seen_seek_gen) {
    // First run, or a seek happened: load the committed offset. commit_mu
    // makes us wait for a seek that is still being written.
    MutexLock l(&g->commit_mu);
    auto info = store_->group_info(g->store_group);
    if (!info.ok() || info->size() <= gl->lane) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    const std::uint64_t committed = (*info)[gl->lane].committed;
    gl->read_pos = gl->done_pos = gl->committed_sent = committed;
    gl->buffer.clear();
    gl->buffer_index = 0;
    gl->attempts = 0;
    gl->seen_seek_gen = g->seek_gen.load(std::memory_order_acquire);
    gl->positioned = true;
  }
  std::uint32_t handled = 0;
  bool retry_pending = false;
  while (handled < g->options.batch) {
    if (gl->buffer_index == gl->buffer.size()) {
      ReadLimits limits;
      limits.max_messages = g->options.batch;
      auto r = store_->read(t->store_topic, gl->lane, gl->read_pos, limits);
      if (!r.ok()) {
        gl->errors.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      if (r->skipped > 0) {
        gl->skipped.fetch_add(r->skipped, std::memory_order_relaxed);
        if (gl->done_pos < r->first_offset) gl->done_pos = r->first_offset;
      }
      gl->buffer = std::move(r->messages);
      gl->buffer_index = 0;
      gl->read_pos = r->next_offset;
      std::uint64_t k = gl->known_end.load(std::memory_order_relaxed);
      while (r->end_offset > k && !gl->known_end.compare_exchange_weak(k, r->end_offset)) {
      }
      if (gl->buffer.empty()) break;
    }
    const StoredMessage& m = gl->buffer[gl->buffer_index];
    const bool guarded = g->idempotency != nullptr && !m.idempotency_key.empty();
    if (guarded) {
      Dedup d = dedup_claim(gl, m.idempotency_key);
      if (d == Dedup::Later) {
        gl->retry_delay_ns = kDedupBusyDelayNs;
        retry_pending = true;
        break;
      }
      if (d == Dedup::Skip) {
        bump(gl->duplicates_skipped);
        ++handled;
        gl->attempts = 0;
        gl->done_pos = m.offset + 1;
        ++gl->buffer_index;
        continue;
      }
    }
    ++gl->attempts;
    bump(gl->delivered);
    MessageView view(m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset);
    view.set_attempt(gl->attempts);
    TxnState tx;
    TxnState* txp = nullptr;
    if (c->tx_handler) {
      tx.store = store_.get();
      tx.bus = this;
      txp = &tx;
    }
    Outcome out = call_handler(c, view, gl, txp);
    ++handled;
    if (txp != nullptr && out.kind() == Outcome::Kind::Ack) {
      // Effects, dedup record and offset commit in one transaction.
      Status cs = commit_tx(gl, tx, m, gl->attempts);
      if (!cs.ok()) {
        if (guarded) dedup_finish(gl, m.idempotency_key, false);
        bump(gl->retried);
        if (cs.code() == Code::Conflict) {
          --gl->attempts;  // an optimistic-concurrency retry does not use an attempt
          gl->retry_delay_ns = 0;
        } else {
          gl->errors.fetch_add(1, std::memory_order_relaxed);
          if (!plan_retry(gl, gl->attempts)) gl->retry_delay_ns = kDedupBusyDelayNs;  // storage trouble: keep trying
        }
        retry_pending = true;
        break;
      }
      gl->committed_sent = m.offset + 1;
    } else if (guarded) {
      dedup_finish(gl, m.idempotency_key, out.kind() == Outcome::Kind::Ack);
    }
    if (out.kind() != Outcome::Kind::Ack && gl->first_failure_ns == 0) gl->first_failure_ns = now_ns();
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->retried);
      if (plan_retry(gl, gl->attempts)) {
        retry_pending = true;  // the message stays at the head of its lane
        break;
      }
    }
    if (out.kind() != Outcome::Kind::Ack && dlq_) {
      // Dead-letter it and commit the offset past it in one transaction.
      const ErrorClass cls = classify_failure(out.kind(), gl->attempts, gl->attempts, false, 0);
      if (!dead_letter_durable(gl, m, out, gl->attempts, cls)) {
        --gl->attempts;
        gl->retry_delay_ns = 1'000'000'000;  // the DLQ refused it (quota): keep it, try again later
        retry_pending = true;
        break;
      }
      if (m.offset + 1 > gl->committed_sent) gl->committed_sent = m.offset + 1;
    }
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->failed);
    } else if (out.kind() == Outcome::Kind::Reject) {
      bump(gl->rejected);
    } else {
      bump(gl->acked);
    }
    gl->first_failure_ns = 0;
    gl->attempts = 0;
    gl->done_pos = m.offset + 1;
    if (options.metrics) record_latency(gl, m.header.created_at_ns);
    ++gl->buffer_index;
  }
  if (gl->done_pos > gl->committed_sent) {
    MutexLock l(&g->commit_mu);
    if (g->seek_gen.load(std::memory_order_acquire) == gl->seen_seek_gen) {
      GroupLane* lane = gl;
      Status s = store_->commit_offset_async(g->store_group, gl->lane, gl->done_pos, [lane](const Status& st) {
        if (!st.ok()) lane->errors.fetch_add(1, std::memory_order_relaxed);
      });
      if (s.ok()) {
        gl->committed_sent = gl->done_pos;
      } else {
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  gl->lag.store(gl->known_end.load(std::memory_order_relaxed) > gl->done_pos
                    ? gl->known_end.load(std::memory_order_relaxed) - gl->done_pos
                    : 0,
                std::memory_order_relaxed);
  return retry_pending || gl->buffer_index < gl->buffer.size() || handled == g->options.batch;
}

// Durable queue: claim (attempt persisted before delivery), deliver, ack or
// release. True if the lane should run again at once.
bool BusCore::run_durable_queue_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  ClaimOptions claim_options;
  claim_options.visibility = g->options.visibility;
  claim_options.ordered = true;
  std::uint32_t handled = 0;
  while (handled < g->options.batch) {
    auto r = store_->claim(g->store_group, gl->lane, claim_options);
    if (!r.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (!r->has_value()) return false;  // nothing deliverable now
    const ClaimedMessage& cm = **r;
    if (dlq_ && cm.attempt > 1 && dlq_->options().poison_after_crashes > 0) {
      // Poison: earlier attempts were claimed (persisted) but never came back
      // with an outcome — the consumer process died with it in flight.
      std::uint32_t outcomes = 0;
      Status rs = store_->read([&](StoreTxn& t) -> Status {
        auto o = dlq_->outcomes_in(t, g->store_group, gl->lane, cm.message.offset);
        if (!o.ok()) return o.status();
        outcomes = *o;
        return Status();
      });
      if (rs.ok() && classify_failure(Outcome::Kind::Retry, cm.attempt - 1, outcomes, false,
                                      dlq_->options().poison_after_crashes) == ErrorClass::Poison) {
        Outcome poison = Outcome::reject("poison: the consumer died with it in flight");
        if (dead_letter_durable(gl, cm.message, poison, cm.attempt - 1, ErrorClass::Poison)) {
          bump(gl->failed);
          ++handled;
          continue;
        }
      }
    }
    const bool guarded = g->idempotency != nullptr && !cm.message.idempotency_key.empty();
    if (guarded) {
      Dedup d = dedup_claim(gl, cm.message.idempotency_key);
      if (d != Dedup::Proceed) {
        Status s;
        if (d == Dedup::Skip) {
          bump(gl->duplicates_skipped);
          s = store_->ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
        } else {
          s = release_claim(gl, cm.message, cm.attempt, std::chrono::milliseconds(kDedupBusyDelayNs / 1'000'000));
        }
        if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
        ++handled;
        if (d == Dedup::Later) return false;
        continue;
      }
    }
    bump(gl->delivered);
    MessageView view(cm.message.header, cm.message.key, cm.message.idempotency_key, cm.message.payload, gl->lane,
                     cm.message.offset);
    view.set_attempt(cm.attempt);
    TxnState tx;
    TxnState* txp = nullptr;
    if (c->tx_handler) {
      tx.store = store_.get();
      tx.bus = this;
      txp = &tx;
    }
    Outcome out = call_handler(c, view, gl, txp);
    ++handled;
    if (txp != nullptr && out.kind() == Outcome::Kind::Ack) {
      Status cs = commit_tx(gl, tx, cm.message, cm.attempt);
      if (cs.ok()) {
        bump(gl->acked);
        if (options.metrics) record_latency(gl, cm.message.header.created_at_ns);
        continue;
      }
      if (guarded) dedup_finish(gl, cm.message.idempotency_key, false);
      bump(gl->retried);
      if (cs.code() != Code::Conflict && cs.code() != Code::StaleToken)
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      // Nothing was written; hand the message back for another delivery.
      Status rs = release_claim(gl, cm.message, cm.attempt, std::chrono::milliseconds(0));
      if (!rs.ok() && rs.code() != Code::StaleToken && rs.code() != Code::NotFound)
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
    Status s;
    const bool acked = out.kind() == Outcome::Kind::Ack;
    if (guarded && !acked) dedup_finish(gl, cm.message.idempotency_key, false);
    if (out.kind() == Outcome::Kind::Retry && plan_retry(gl, cm.attempt)) {
      bump(gl->retried);
      // The store keeps the message claimed until the backoff ends (the
      // claim, not this process, holds the delay: it survives a crash).
      auto delay = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(gl->retry_delay_ns));
      gl->retry_delay_ns = 0;
      s = release_claim(gl, cm.message, cm.attempt, delay);
      if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
      return delay.count() == 0;  // at once: run again after other lanes; else the poller wakes it
    }
    if (!acked && dlq_) {
      std::uint32_t outcomes = 1;
      (void)store_->read([&](StoreTxn& t) -> Status {
        auto o = dlq_->outcomes_in(t, g->store_group, gl->lane, cm.message.offset);
        if (o.ok()) outcomes = *o + 1;
        return Status();
      });
      const bool late = g->options.attempt_timeout.count() > 0 && view.deadline_ns() != 0 && now_ns() > view.deadline_ns();
      const ErrorClass cls =
          classify_failure(out.kind(), cm.attempt, outcomes, late, dlq_->options().poison_after_crashes);
      if (!dead_letter_durable(gl, cm.message, out, cm.attempt, cls)) {
        // The DLQ refused it (quota): keep the message, try again later.
        Status rs = release_claim(gl, cm.message, cm.attempt, std::chrono::seconds(1));
        if (!rs.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
        return false;
      }
      if (out.kind() == Outcome::Kind::Retry) {
        bump(gl->retried);
        bump(gl->failed);
      } else {
        bump(gl->rejected);
      }
      continue;
    }
    if (out.kind() == Outcome::Kind::Retry) {
      bump(gl->retried);
      bump(gl->failed);
    } else if (out.kind() == Outcome::Kind::Reject) {
      bump(gl->rejected);
    } else {
      bump(gl->acked);
    }
    if (acked && dlq_ && cm.attempt > 1 && !guarded) {
      // The ack and dropping the message's outcome record, together.
      s = store_->write([&](StoreTxn& t) -> Status {
        Status as = t.ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
        return as.ok() ? dlq_->forget_outcomes_in(t, g->store_group, gl->lane, cm.message.offset) : as;
      });
    } else if (guarded && acked) {
      // The dedup record and the ack commit in one transaction.
      IdempotencyImpl* idem = g->idempotency;
      const std::string_view key = cm.message.idempotency_key;
      std::int64_t at = 0;
      s = store_->write([&](StoreTxn& txn) -> Status {
        at = txn.now_ns();
        Status cs = idem->complete_in(txn, key, {});
        if (!cs.ok() && cs.code() != Code::NotFound) return cs;
        return txn.ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
      });
      if (s.ok()) idem->remember_done(key, at);
    } else {
      s = store_->ack(g->store_group, gl->lane, cm.message.offset, cm.attempt);
    }
    if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
    if (options.metrics) record_latency(gl, cm.message.header.created_at_ns);
  }
  return true;
}

void BusCore::wake_durable_group(GroupImpl* g, std::uint32_t lane, std::uint64_t end) noexcept {
  GroupLane* gl = g->lanes[lane].get();
  std::uint64_t k = gl->known_end.load(std::memory_order_relaxed);
  bool grew = false;
  while (end > k) {
    if (gl->known_end.compare_exchange_weak(k, end, std::memory_order_seq_cst)) {
      grew = true;
      break;
    }
  }
  if ((grew || g->topic->is_queue) && g->consumer_count.load(std::memory_order_seq_cst) > 0) schedule(gl);
}

void BusCore::on_append(std::uint32_t topic_id, std::uint32_t lane, std::uint64_t end) noexcept {
  TopicImpl* t = nullptr;
  {
    MutexLock l(&durable_mu_);
    auto it = durable_topics_.find(topic_id);
    if (it != durable_topics_.end()) t = it->second;
  }
  if (t == nullptr || lane >= t->options.lanes) return;
  const std::uint32_t ng = t->group_count.load(std::memory_order_acquire);
  for (std::uint32_t i = 0; i < ng; ++i) {
    GroupImpl* g = t->groups[i].load(std::memory_order_acquire);
    if (g != nullptr) wake_durable_group(g, lane, end);
  }
}

// Finds appends made by other processes and expired queue claims.
void BusCore::poller_main() {
  std::vector<TopicImpl*> topics;
  std::int64_t polls = 0;
  for (;;) {
    {
      std::unique_lock l(poller_mu_);
      if (poller_cv_.wait_for(l, options.durable_poll, [&] { return poller_stop_; })) return;
    }
    if (++polls % std::max<std::int64_t>(1, 1000 / std::max<std::int64_t>(1, options.durable_poll.count())) == 0)
      dlq_maintenance();
    topics.clear();
    {
      MutexLock l(&durable_mu_);
      for (auto& [id, t] : durable_topics_) topics.push_back(t);
    }
    for (TopicImpl* t : topics) {
      for (std::uint32_t lane = 0; lane < t->options.lanes; ++lane) {
        auto end = store_->end_offset(t->store_topic, lane);
        if (!end.ok()) continue;
        const std::uint32_t ng = t->group_count.load(std::memory_order_acquire);
        for (std::uint32_t i = 0; i < ng; ++i) {
          GroupImpl* g = t->groups[i].load(std::memory_order_acquire);
          if (g != nullptr) wake_durable_group(g, lane, *end);
        }
      }
    }
  }
}

}  // namespace lanebus::detail
