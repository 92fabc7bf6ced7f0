// lanebus — MIT License.
// Durable lane runners, both driving the delivery core (delivery.hpp):
// - topics read a batch at the group's position, deliver it in order and
//   commit offsets; with poison detection a delivery mark (DlqStore::TopicMark)
//   is committed before each batch, and after a crash the lane is delivered
//   one message at a time until the message that crashed is found;
// - queues claim a batch per commit (consumer-side group commit), deliver it,
//   and settle every message of the batch — acks, dead letters, releases,
//   transactional effects — in one asynchronous write that shares its commit
//   with other lanes and workers.
// DurableRunner (bus_impl.hpp) holds both; its transactional commit is in
// txconsume.cpp.
#include <algorithm>
#include <memory>
#include <set>
#include <string>

#include "bus_impl.hpp"

namespace lanebus::detail {

namespace {

// Errors a settle step may meet that only concern its message (returned by
// the store before writing anything); anything else aborts the whole commit.
bool message_level(Code c) noexcept {
  return c == Code::NotFound || c == Code::StaleToken || c == Code::Conflict || c == Code::QuotaExceeded ||
         c == Code::InvalidArgument || c == Code::PayloadTooLarge;
}

// A stored message whose expiry has passed (doc/delays.md).
bool stored_expired(const StoredMessage& m) noexcept { return m.expires_ns != 0 && now_ns() >= m.expires_ns; }

// The longest a durable topic lane's offset commit waits for the run that
// uses up its read buffer (topic_run_end).
constexpr std::int64_t kTopicCommitDelayNs = 20'000'000;

bool poison_on(const DlqStore* dlq) noexcept { return dlq != nullptr && dlq->options().poison_after_crashes > 0; }

// Claims ahead are pipelined (claim_ahead.hpp) unless one crash makes a
// message poison: a message claimed behind another is charged that one's
// crash too.
bool pipelined_claims(const DlqStore* dlq) noexcept { return !poison_on(dlq) || dlq->options().poison_after_crashes > 1; }

}  // namespace

void DurableRunner::run_durable_lane(GroupLane* gl) {
  GroupImpl* g = gl->group;
  const bool abandon = bus_.sched_.abandoning();
  Consumer* c = abandon ? nullptr : bus_.pin_consumer(g);
  bool more = false;
  if (c != nullptr) {
    more = g->topic->is_queue ? run_durable_queue_batch(gl, c) : run_durable_topic_batch(gl, c);
    c->calls.fetch_sub(1, std::memory_order_release);
  }
  gl->parked_count.store(gl->parked.size(), std::memory_order_relaxed);
  if (more && !bus_.sched_.abandoning()) {
    const std::int64_t delay = gl->retry_delay_ns;
    gl->retry_delay_ns = 0;
    bus_.requeue(gl, delay);
    return;
  }
  if (c != nullptr && !gl->parked.empty() && !abandon) {
    bus_.lanes_.park_lane(gl);
    return;
  }
  // A topic lane whose consumer left while a run's commit waited (topic_run_end): commit it now.
  if (c == nullptr && !abandon && !g->topic->is_queue && gl->done_pos > gl->committed_sent)
    commit_topic_position(gl);
  // Owner-only state must be read before the lane is released to others.
  const std::uint64_t read_pos = gl->read_pos;
  bus_.sched_.unschedule(gl);
  if (abandon) return;
  if (c == nullptr) {
    // No consumer right now: messages stay in the store. attach() schedules
    // the lanes again; re-check in case it raced with us (Dekker, seq_cst).
    if (g->consumer_count.load(std::memory_order_seq_cst) > 0) bus_.sched_.schedule(gl);
    return;
  }
  // (`more` was false, so nothing is left in the buffer.) An append that came
  // while the lane was running found it scheduled and did not queue it: look
  // again (Dekker with wake_durable_group: seq_cst on both sides). Queues
  // keep in read_pos the end they had seen when they claimed.
  // Likewise claims handed over to the lane's mailbox while it ran.
  if (gl->known_end.load(std::memory_order_seq_cst) > read_pos || (gl->claim_ahead && gl->claim_ahead->has_ready()))
    bus_.sched_.schedule(gl);
}

// ---------------------------------------------------------------- durable topics

// First run, or a seek happened: load the committed offset, and the delivery
// mark to learn whether the process died while delivering (poison detection).
bool DurableRunner::position_durable_topic(GroupLane* gl) {
  GroupImpl* g = gl->group;
  MutexLock l(&g->commit_mu);  // waits for a seek that is still being written
  auto info = bus_.store_->group_info(g->store_group);
  if (!info.ok() || info->size() <= gl->lane) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  const std::uint64_t committed = (*info)[gl->lane].committed;
  gl->read_pos = gl->done_pos = gl->committed_sent = committed;
  gl->buffer.clear();
  gl->buffer_index = 0;
  gl->attempts = 0;
  gl->first_failure_ns = 0;
  gl->parked.clear();
  gl->careful_to = 0;
  gl->head_crashes = 0;
  gl->marked_to = 0;  // the stored mark may cover offsets from before a seek
  if (poison_on(bus_.dlq_.get())) {
    std::optional<DlqStore::TopicMark> mark;
    Status s = bus_.store_->read([&](StoreTxn& t) -> Status {
      auto m = bus_.dlq_->topic_mark_in(t, g->store_group, gl->lane);
      if (!m.ok()) return m.status();
      mark = *m;
      return Status();
    });
    if (!s.ok()) gl->errors.fetch_add(1, std::memory_order_relaxed);
    if (mark && committed >= mark->from && committed < std::max(mark->to, mark->careful_to)) {
      // The process died while delivering [from, to): find the message.
      gl->careful_to = std::max(mark->to, mark->careful_to);
      gl->head_crashes = mark->from == committed ? mark->crashes + 1 : 1;
    }
  }
  gl->seen_seek_gen = g->seek_gen.load(std::memory_order_acquire);
  gl->positioned = true;
  return true;
}

// run_durable_topic_batch's state between its steps: the group's settings,
// what the run handled, how far it consumed, and the message it is on (a
// parked one, pi >= 0, or the buffer's head).
struct DurableRunner::TopicRun {
  GroupLane* gl;
  GroupImpl* g;
  Consumer* c;
  bool poison;
  std::uint32_t poison_after;
  bool kp;  // key_parallel_retry
  std::size_t limit;
  AdmitMode mode;
  bool spans = false;  // a batch handler gets spans (topic_deliver_span)
  std::uint32_t limit_span = 0;  // messages a run handles: the fairness batch, or batch_max if larger
  std::uint32_t handled = 0;
  bool retry_pending = false;
  bool more_in_lane = false;  // the last read in place stopped before the lane's end
  std::uint64_t consumed_pos;
  std::ptrdiff_t pi = -1;
  StoredMessage* mp = nullptr;
  std::uint32_t* attempts = nullptr;
  std::int64_t* first_failure = nullptr;

  TopicRun(GroupLane* lane, Consumer* consumer, const DlqStore* dlq)
      : gl(lane),
        g(lane->group),
        c(consumer),
        poison(poison_on(dlq)),
        poison_after(poison ? dlq->options().poison_after_crashes : 0),
        kp(g->options.key_parallel_retry),
        limit(g->options.key_parallel_limit),
        mode(consumer->tx_handler ? AdmitMode::Check : AdmitMode::Claim) {
    if (kp && gl->parked.capacity() < limit) gl->parked.reserve(limit);  // owner-only, once
    consumed_to_head();
  }
  /// Consumed up to the buffer's head (or the read position when it is used up).
  void consumed_to_head() {
    consumed_pos = gl->buffer_index < gl->buffer.size() ? gl->buffer[gl->buffer_index].offset : gl->read_pos;
  }
  /// The offset every message before has been settled up to: never past a parked message.
  std::uint64_t done_upto() const {
    return gl->parked.empty() ? consumed_pos : std::min(consumed_pos, gl->parked.front().stored.offset);
  }
  /// Where a dead letter of `m` may commit the offset: past it, but never
  /// past a parked message (nor, for a parked one, past the buffer's head).
  std::uint64_t dead_letter_commit_to(const StoredMessage& m) const {
    std::uint64_t commit_to = m.offset + 1;
    for (std::size_t i = 0; i < gl->parked.size(); ++i)
      if (static_cast<std::ptrdiff_t>(i) != pi) commit_to = std::min(commit_to, gl->parked[i].stored.offset);
    if (pi >= 0) commit_to = std::min(commit_to, consumed_pos);
    return commit_to;
  }
};

// The next read into an empty buffer. Got: the buffer holds messages. With
// poison detection the delivery mark, with the offset commit of what is
// done, is committed before the first handler call of the batch.
DurableRunner::TopicStep DurableRunner::topic_refill(TopicRun& run) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  const bool careful = gl->read_pos < gl->careful_to || run.poison_after == 1;
  ReadLimits limits;
  // Larger reads than the fairness batch: fewer read transactions, and
  // with poison detection one delivery mark (a commit) per read.
  limits.max_messages = careful ? 1 : std::max({g->options.batch, g->options.batch_max, run.poison ? 1024u : 256u});
  limits.max_bytes = 1u << 20;
  ReadBatch rb;
  rb.messages.swap(gl->buffer);  // reuse the strings' storage
  rb.spare.swap(gl->buffer_spare);
  Status rs = bus_.store_->read_into(g->topic->store_topic, gl->lane, gl->read_pos, limits, &rb);
  rb.spare.swap(gl->buffer_spare);
  if (!rs.ok()) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    gl->buffer_index = 0;
    return TopicStep::Stop;
  }
  note_read(run, rb.first_offset, rb.skipped, rb.end_offset);
  if (rb.messages.empty()) {
    gl->read_pos = rb.next_offset;
    gl->buffer.swap(rb.messages);
    gl->buffer_index = 0;
    return TopicStep::Stop;
  }
  if (run.poison) {
    const TopicStep m = topic_mark(run, rb.messages.front().offset, rb.messages.back().offset + 1);
    if (m == TopicStep::Stop) {
      gl->buffer.clear();  // read again after the hold
      gl->buffer_index = 0;
    }
    if (m != TopicStep::Got) return m;
  }
  gl->buffer.swap(rb.messages);
  gl->buffer_index = 0;
  gl->read_pos = rb.next_offset;
  run.consumed_pos = gl->buffer.front().offset;
  return TopicStep::Got;
}

void DurableRunner::note_read(TopicRun& run, std::uint64_t first, std::uint64_t skipped, std::uint64_t end) {
  GroupLane* gl = run.gl;
  if (skipped > 0) {
    gl->skipped.fetch_add(skipped, std::memory_order_relaxed);
    if (run.consumed_pos < first) run.consumed_pos = first;
    if (gl->read_pos < gl->careful_to && first > gl->read_pos) gl->head_crashes = 1;
  }
  std::uint64_t k = gl->known_end.load(std::memory_order_relaxed);
  while (end > k && !gl->known_end.compare_exchange_weak(k, end)) {
  }
}

DurableRunner::TopicStep DurableRunner::topic_mark(TopicRun& run, std::uint64_t from, std::uint64_t to) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  DlqStore::TopicMark mark;
  mark.from = from;
  mark.to = to;
  mark.careful_to = gl->careful_to;
  mark.crashes = mark.from < gl->careful_to ? gl->head_crashes : 0;
  const std::uint64_t commit_to = run.done_upto();
  Status ms;
  {
    MutexLock l(&g->commit_mu);
    if (g->seek_gen.load(std::memory_order_acquire) != gl->seen_seek_gen) return TopicStep::Reposition;
    ms = bus_.store_->write([&](StoreTxn& txn) -> Status {
      if (commit_to > gl->committed_sent) {
        Status cs = txn.commit_offset(g->store_group, gl->lane, commit_to);
        if (!cs.ok()) return cs;
      }
      return bus_.dlq_->set_topic_mark_in(txn, g->store_group, gl->lane, mark);
    });
  }
  if (!ms.ok()) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    gl->retry_delay_ns = kHoldBusyKeyNs;
    run.retry_pending = true;
    return TopicStep::Stop;
  }
  if (commit_to > gl->committed_sent) gl->committed_sent = commit_to;
  gl->marked_to = to;
  return TopicStep::Got;
}

// The message to deliver next: a parked one whose backoff is over
// (key_parallel_retry), else the buffer's head (read when used up). Settles
// without a call what crashed the process poison_after_crashes times (a
// dead letter: Next) and sets aside a message behind a parked one of its key
// (Next).
DurableRunner::TopicStep DurableRunner::topic_pick(TopicRun& run) {
  GroupLane* gl = run.gl;
  run.pi = run.kp && !gl->parked.empty() ? due_parked(gl, RetryTimer::now_ns()) : -1;
  if (run.pi >= 0) {
    Parked& pk = gl->parked[static_cast<std::size_t>(run.pi)];
    run.mp = &pk.stored;
    run.attempts = &pk.attempts;
    run.first_failure = &pk.first_failure_ns;
    return TopicStep::Got;
  }
  run.attempts = &gl->attempts;
  run.first_failure = &gl->first_failure_ns;
  if (gl->buffer_index == gl->buffer.size()) {
    if (const TopicStep s = topic_refill(run); s != TopicStep::Got) return s;
  }
  StoredMessage* mp = run.mp = &gl->buffer[gl->buffer_index];
  if (gl->attempts == 0 && run.poison && mp->offset < gl->careful_to && gl->head_crashes >= run.poison_after) {
    // It crashed the process poison_after_crashes times: dead-letter it.
    GroupImpl* g = run.g;
    const std::uint64_t commit_to = gl->parked.empty() ? mp->offset + 1 : run.done_upto();
    const DlqEntry e = poison_entry(gl, *mp, gl->head_crashes);
    Status ds = bus_.store_->write([&](StoreTxn& txn) -> Status {
      return bus_.dlq_->add_in(txn, e, [&]() -> Status { return txn.commit_offset(g->store_group, gl->lane, commit_to); })
          .status();
    });
    if (!ds.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      gl->retry_delay_ns = kHoldDlqFullNs;
      run.retry_pending = true;
      return TopicStep::Stop;
    }
    bump(gl->failed);
    if (commit_to > gl->committed_sent) gl->committed_sent = commit_to;
    run.consumed_pos = mp->offset + 1;
    gl->head_crashes = run.consumed_pos < gl->careful_to ? 1 : 0;
    ++gl->buffer_index;
    ++run.handled;
    return TopicStep::Next;
  }
  if (run.kp && key_parked(gl, mp->key)) {
    // Behind an earlier message of its key: set it aside, in order.
    if (gl->parked.size() < run.limit) {
      gl->parked.push_back(Parked{nullptr, std::move(*mp), 0, 0, 0});
      ++gl->buffer_index;
      run.consumed_to_head();
      return TopicStep::Next;
    }
    gl->retry_delay_ns = wait_for_parked(gl);  // the limit: wait for the earliest parked message
    run.retry_pending = true;
    return TopicStep::Stop;
  }
  return TopicStep::Got;
}

// A transactional handler's ack: its effects, the dedup record and the
// offset commit in one transaction. Returns the wait before the message's
// next attempt (-1: settled), or Reposition through *reposition.
std::int64_t DurableRunner::topic_commit_tx(TopicRun& run, TxnState& tx, bool* reposition) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  const StoredMessage& m = *run.mp;
  Status cs;
  bool duplicate = false;
  {
    MutexLock l(&g->commit_mu);
    if (g->seek_gen.load(std::memory_order_acquire) != gl->seen_seek_gen) {
      *reposition = true;
      return -1;
    }
    cs = bus_.store_->write([&](StoreTxn& txn) -> Status { return apply_tx(txn, gl, tx, m, *run.attempts, &duplicate); });
  }
  if (!cs.ok()) {
    bump(gl->retried);
    if (cs.code() == Code::Conflict) {
      --*run.attempts;  // an optimistic-concurrency retry does not use an attempt
      return 0;
    }
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return kHoldBusyKeyNs;  // storage trouble: keep trying
  }
  if (g->idempotency != nullptr && !m.idempotency_key.empty()) g->idempotency->remember_done(m.idempotency_key, now_ns());
  if (!duplicate) count_outbox(tx);
  bump(duplicate ? gl->duplicates_skipped : gl->acked);
  if (bus_.options.metrics) bus_.delivery_.record_latency(gl, m.header.created_at_ns);
  *run.first_failure = 0;
  if (g->options.outage.enabled) bus_.outages_.on_ack(gl);
  return -1;
}

// The picked message's admission and handler call, and its settle. Returns
// the wait before its next attempt (-1: settled), or Reposition through
// *reposition.
std::int64_t DurableRunner::topic_deliver(TopicRun& run, bool* reposition) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  const StoredMessage& m = *run.mp;
  const Parcel p{&m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset, *run.attempts + 1, m.headers};
  // A message whose TTL ended is never delivered (doc/delays.md); one branch without an expiry.
  const Admission a = m.expires_ns != 0 && stored_expired(m) ? Admission::Expired : bus_.delivery_.admit(gl, p, run.mode);
  if (a == Admission::Later) return kHoldBusyKeyNs;
  if (a == Admission::Expired) [[unlikely]] {
    ++run.handled;
    if (g->options.dead_letter_expired && bus_.dlq_ &&
        !bus_.delivery_.dead_letter_topic(gl, m, Outcome::reject("expired: its ttl ended before a handler call started"),
                           *run.attempts, ErrorClass::Expired, *run.first_failure, run.dead_letter_commit_to(m)))
      return kHoldDlqFullNs;
    gl->expired.fetch_add(1, std::memory_order_relaxed);
    return -1;
  }
  if (a == Admission::Skip) {
    bump(gl->duplicates_skipped);
    ++run.handled;
    return -1;
  }
  ++*run.attempts;
  TxnState tx;
  TxnState* txp = nullptr;
  if (run.c->tx_handler) {
    tx.store = bus_.store_.get();
    tx.bus = &bus_;
    txp = &tx;
  }
  const Invocation inv = bus_.delivery_.invoke(run.c, gl, p, txp);
  ++run.handled;
  if (txp != nullptr && inv.outcome.kind() == Outcome::Kind::Ack) return topic_commit_tx(run, tx, reposition);
  return topic_settle(run, p, inv);
}

// The picked message's outcome: the wait before its next attempt, or -1
// (settled: acked, or dead-lettered with the offset commit past it).
std::int64_t DurableRunner::topic_settle(TopicRun& run, const Parcel& p, const Invocation& inv) {
  GroupLane* gl = run.gl;
  const StoredMessage& m = *run.mp;
  // Crashes are counted by the delivery mark; every in-memory attempt came back.
  const Settlement st = bus_.delivery_.settle(gl, p, inv, run.mode, false, *run.attempts, run.first_failure);
  if (st.uncounted) --*run.attempts;  // paused: the attempt is given back
  if (st.next == Settlement::Next::Retry) return st.delay_ns;
  if (st.next == Settlement::Next::DeadLetter &&
      !bus_.delivery_.dead_letter_topic(gl, m, inv.outcome, *run.attempts, st.error_class, *run.first_failure,
                         run.dead_letter_commit_to(m))) {
    --*run.attempts;
    return kHoldDlqFullNs;  // the DLQ refused it (quota): keep it, try again later
  }
  return -1;
}

// A message of the buffer, or read in place, as a batch handler sees it
// (attempt and headers set).
template <class Message>
void DurableRunner::stored_view(const GroupLane* gl, const Message& m, std::uint32_t attempt, MessageView* out) {
  new (out) MessageView(m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset);
  Access::set_attempt(*out, attempt);
  Access::set_headers(*out, m.headers);
}

// A batch handler's call on the buffer's head and the messages behind it (up
// to batch_max, none past the run's limit): the head at its attempt, the
// others at their first. A message in the poison search (before careful_to)
// or past its TTL ends the span; at the head either one goes the one-message
// way (topic_deliver). The acked prefix is settled as acks of one call
// (latency stamped once); the message the handler stopped at is settled as
// topic_deliver settles one, and the rest stay in the buffer, unattempted,
// for the next call (BatchOutcome). Next: go on; Stop: the lane waits.
DurableRunner::TopicStep DurableRunner::topic_deliver_span(TopicRun& run, MessageView* views) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  const std::size_t room = std::min<std::size_t>(g->options.batch_max, run.limit_span - run.handled);
  const std::size_t head = gl->buffer_index;
  std::size_t n = 0;
  while (n < room && head + n < gl->buffer.size()) {
    const StoredMessage& m = gl->buffer[head + n];
    if ((run.poison && m.offset < gl->careful_to) || (m.expires_ns != 0 && stored_expired(m))) break;
    stored_view(gl, m, n == 0 ? gl->attempts + 1 : 1, &views[n]);
    ++n;
  }
  if (n == 0) return TopicStep::Got;  // the head goes the one-message way
  ++gl->attempts;
  const std::span<const MessageView> span(views, n);
  const BatchOutcome result = bus_.delivery_.invoke_span(run.c, gl, span);
  std::size_t acked = 0;
  bus_.delivery_.span_settled(gl, result, span, &acked);
  if (acked > 0) {
    gl->acked.store(gl->acked.load(std::memory_order_relaxed) + acked, std::memory_order_relaxed);
    for (std::size_t i = 0; i < acked; ++i) (void)topic_after(run, -1);  // each leaves the buffer
    run.handled += static_cast<std::uint32_t>(acked);
  }
  if (acked == n) return TopicStep::Next;
  // The handler stopped at message `acked`: its own attempt now (the head's was counted above).
  if (acked > 0) gl->attempts = 1;
  return topic_settle_stop(run, result);
}

// The message a batch handler stopped at (the buffer's head), settled with
// the call's outcome for it as a one-message call's would be.
DurableRunner::TopicStep DurableRunner::topic_settle_stop(TopicRun& run, const BatchOutcome& result) {
  GroupLane* gl = run.gl;
  run.mp = &gl->buffer[gl->buffer_index];
  const StoredMessage& m = *run.mp;
  const Parcel p{&m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset, gl->attempts, m.headers};
  ++run.handled;
  return topic_after(run, topic_settle(run, p, Invocation{result.next(), false}));
}

// A span read in place needs the lane at rest (no message read and not yet
// handled, no attempt under way, not in the poison search) and a map that
// never moves while the read is held (a handler that publishes could
// otherwise wait for a writer waiting for the handler's read to end).
bool DurableRunner::in_place_ok(const TopicRun& run) const {
  const GroupLane* gl = run.gl;
  return run.spans && gl->buffer_index == gl->buffer.size() && gl->attempts == 0 &&
         gl->read_pos >= gl->careful_to && run.poison_after != 1 && bus_.store_->map_at_max();
}

// A batch handler's span without a copy: up to batch_max messages read in
// place (with poison detection: the delivery mark written, before the read,
// for the next kInPlaceMarkAhead offsets up to the lane's known end, and the
// span kept inside it), and the handler called while the read is held. An acked span leaves nothing behind
// (Next). Where the handler stopped, that message and the ones after it are
// copied into the buffer before the read ends, and settled and delivered
// from there as topic_deliver_span does. A message past its TTL in the span:
// Got, nothing delivered (the buffer's way handles it).
DurableRunner::TopicStep DurableRunner::topic_span_in_place(TopicRun& run, MessageView* views) {
  GroupLane* gl = run.gl;
  GroupImpl* g = run.g;
  InPlaceBatch& ib = gl->in_place;
  run.pi = -1;
  run.attempts = &gl->attempts;
  run.first_failure = &gl->first_failure_ns;
  ReadLimits limits;
  limits.max_messages = std::min(g->options.batch_max, run.limit_span - run.handled);
  limits.max_bytes = 1u << 20;
  if (run.poison) {
    // Marked before the read, never while it is held (the mark takes the
    // group's commit mutex, which a repositioning worker holds while it reads).
    if (gl->read_pos >= gl->marked_to) {
      const std::uint64_t end = std::max(gl->known_end.load(std::memory_order_relaxed), gl->read_pos + 1);
      const TopicStep m = topic_mark(run, gl->read_pos, std::min(gl->read_pos + kInPlaceMarkAhead, end));
      if (m != TopicStep::Got) return m;
    }
    limits.max_messages = static_cast<std::uint32_t>(std::min<std::uint64_t>(limits.max_messages, gl->marked_to - gl->read_pos));
  }
  if (!bus_.store_->read_in_place(g->topic->store_topic, gl->lane, gl->read_pos, limits, &ib).ok()) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    return TopicStep::Stop;
  }
  note_read(run, ib.first_offset, ib.skipped, ib.end_offset);
  run.more_in_lane = ib.next_offset < ib.end_offset;
  const std::size_t n = ib.messages.size();
  if (n == 0) {
    gl->read_pos = ib.next_offset;
    return TopicStep::Stop;
  }
  const std::int64_t now = now_ns();
  for (const MessageRef& m : ib.messages) {
    if (m.expires_ns != 0 && now >= m.expires_ns) {
      ib.release();
      return TopicStep::Got;
    }
  }
  for (std::size_t i = 0; i < n; ++i) stored_view(gl, ib.messages[i], 1, &views[i]);
  gl->read_pos = ib.next_offset;
  const std::span<const MessageView> span(views, n);
  const BatchOutcome result = bus_.delivery_.invoke_span(run.c, gl, span);
  std::size_t acked = 0;
  bus_.delivery_.span_settled(gl, result, span, &acked);
  gl->acked.store(gl->acked.load(std::memory_order_relaxed) + acked, std::memory_order_relaxed);
  run.handled += static_cast<std::uint32_t>(acked);
  if (acked == n) {
    ib.release();
    run.consumed_pos = gl->read_pos;
    return TopicStep::Next;
  }
  keep_in_buffer(gl, acked);  // the message the handler stopped at, and the rest
  gl->attempts = 1;
  run.consumed_pos = gl->buffer.front().offset;
  return topic_settle_stop(run, result);
}

// The in-place read's messages from `from` on, copied into the empty buffer
// (its old entries' storage reused); then the read ends.
void DurableRunner::keep_in_buffer(GroupLane* gl, std::size_t from) {
  InPlaceBatch& ib = gl->in_place;
  for (StoredMessage& m : gl->buffer) gl->buffer_spare.push_back(std::move(m));
  gl->buffer.clear();
  for (std::size_t i = from; i < ib.messages.size(); ++i) {
    if (gl->buffer_spare.empty()) {
      gl->buffer.emplace_back();
    } else {
      gl->buffer.push_back(std::move(gl->buffer_spare.back()));
      gl->buffer_spare.pop_back();
    }
    copy_message(ib.messages[i], &gl->buffer.back());
  }
  gl->buffer_index = 0;
  ib.release();
}

// After the delivery: a message to try again waits parked (a parked one, or
// the head with key_parallel_retry while there is room: Next) or at the
// head of its lane (Stop); a settled one leaves the run's view (Next).
DurableRunner::TopicStep DurableRunner::topic_after(TopicRun& run, std::int64_t wait_ns) {
  GroupLane* gl = run.gl;
  if (wait_ns >= 0) {
    const std::int64_t due = RetryTimer::now_ns() + std::max<std::int64_t>(wait_ns, 1);
    if (run.pi >= 0) {
      gl->parked[static_cast<std::size_t>(run.pi)].due_ns = due;
      return TopicStep::Next;
    }
    if (run.kp && gl->parked.size() < run.limit) {
      gl->parked.push_back(
          Parked{nullptr, std::move(gl->buffer[gl->buffer_index]), gl->attempts, due, gl->first_failure_ns});
      gl->attempts = 0;
      gl->first_failure_ns = 0;
      ++gl->buffer_index;
      run.consumed_to_head();
      return TopicStep::Next;
    }
    gl->retry_delay_ns = wait_ns;  // the message stays at the head of its lane
    run.retry_pending = true;
    return TopicStep::Stop;
  }
  if (run.pi >= 0) {
    gl->parked.erase(gl->parked.begin() + run.pi);
    return TopicStep::Next;
  }
  gl->attempts = 0;
  gl->first_failure_ns = 0;
  ++gl->buffer_index;
  run.consumed_to_head();
  if (gl->read_pos <= gl->careful_to || run.consumed_pos < gl->careful_to)
    gl->head_crashes = run.consumed_pos < gl->careful_to ? 1 : 0;
  return TopicStep::Next;
}

// The run's end: one asynchronous offset commit of what is done, the lag,
// and whether the lane should run again at once. A run that leaves read
// messages in the buffer and runs again at once may leave its commit to the
// run that uses the buffer up (one commit per read instead of one per run:
// replay through the Bus at batch 64 spent more on the commits than on the
// reads), but never for longer than kTopicCommitDelayNs: a crash redelivers
// at most the rest of one read or that long of work.
bool DurableRunner::topic_run_end(TopicRun& run) {
  GroupLane* gl = run.gl;
  gl->done_pos = run.done_upto();
  // Never while the consumer is being closed or the bus shut down: no later run may come to commit it.
  // In place a run reads no further than its limit: more in the lane after a
  // run that used its limit means the next run comes at once too.
  const bool buffered = gl->buffer_index < gl->buffer.size();
  const bool comes_back = buffered || (run.more_in_lane && run.handled >= run.limit_span);
  const bool holds_more = comes_back && !run.retry_pending && run.c->enabled.load(std::memory_order_seq_cst) &&
                          !bus_.closing();
  if (gl->done_pos > gl->committed_sent &&
      (!holds_more || RetryTimer::now_ns() - gl->committed_sent_ns >= kTopicCommitDelayNs))
    commit_topic_position(gl);
  const std::uint64_t end = gl->known_end.load(std::memory_order_relaxed);
  gl->lag.store(end > gl->done_pos ? end - gl->done_pos : 0, std::memory_order_relaxed);
  if (run.retry_pending) return true;
  if (gl->buffer_index < gl->buffer.size() || run.handled >= run.limit_span) return true;
  if (run.kp && !gl->parked.empty() && due_parked(gl, RetryTimer::now_ns()) >= 0) return true;
  return false;
}

// Queue one asynchronous commit of the lane's done position (unless a seek
// moved the group meanwhile).
void DurableRunner::commit_topic_position(GroupLane* gl) {
  GroupImpl* g = gl->group;
  MutexLock l(&g->commit_mu);
  if (g->seek_gen.load(std::memory_order_acquire) != gl->seen_seek_gen) return;
  GroupLane* lane = gl;
  Status s = bus_.store_->commit_offset_async(g->store_group, gl->lane, gl->done_pos, [lane](const Status& st) {
    if (!st.ok()) lane->errors.fetch_add(1, std::memory_order_relaxed);
  });
  if (s.ok()) {
    gl->committed_sent = gl->done_pos;
    gl->committed_sent_ns = RetryTimer::now_ns();
  } else {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  }
}

// Durable topic group: read a batch at the lane's position, deliver in order,
// then queue one offset commit. True if the lane should run again at once
// (gl->retry_delay_ns: after that long).
bool DurableRunner::run_durable_topic_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  const std::uint64_t gen = g->seek_gen.load(std::memory_order_acquire);
  if ((!gl->positioned || gen != gl->seen_seek_gen) && !position_durable_topic(gl)) return false;
  TopicRun run(gl, c, bus_.dlq_.get());
  // Spans for a batch handler where each message would otherwise go through
  // only the handler call and its settle: no idempotency scope (claims per
  // message), key_parallel_retry (parking), attempt_timeout (a watchdog per
  // call), outage breaker or tracer (a span per message).
  run.spans = c->batch_handler && g->options.batch_max > 1 && !run.kp && g->idempotency == nullptr &&
              g->options.attempt_timeout.count() == 0 && !g->options.outage.enabled && bus_.options.tracer == nullptr;
  run.limit_span = std::max(g->options.batch, run.spans ? g->options.batch_max : 1u);
  alignas(MessageView) unsigned char view_bytes[kMaxBatch * sizeof(MessageView)];  // the span's views
  while (run.handled < run.limit_span) {
    if (in_place_ok(run)) {
      const TopicStep s = topic_span_in_place(run, reinterpret_cast<MessageView*>(view_bytes));
      if (s == TopicStep::Next) continue;
      if (s == TopicStep::Stop) break;
      if (s == TopicStep::Reposition) return true;
      // Got: the buffer's way.
    }
    const TopicStep step = topic_pick(run);
    if (step == TopicStep::Next) continue;
    if (step == TopicStep::Stop) break;
    if (step == TopicStep::Reposition) return true;
    if (run.spans && run.pi < 0) {
      const TopicStep span = topic_deliver_span(run, reinterpret_cast<MessageView*>(view_bytes));
      if (span == TopicStep::Next) continue;
      if (span == TopicStep::Stop) break;
    }
    run.retry_pending = bus_.outages_.held(gl, run.pi);  // paused: the lane waits for the next probe (not an attempt)
    if (run.retry_pending) break;
    bool reposition = false;
    const std::int64_t wait_ns = topic_deliver(run, &reposition);
    if (reposition) return true;
    if (gl->probing) bus_.outages_.end_probe(gl);  // a probe that was skipped or held
    if (topic_after(run, wait_ns) == TopicStep::Stop) break;
  }
  return topic_run_end(run);
}

// ---------------------------------------------------------------- durable queues

// One message's part of a queue lane's batch commit.
struct QueueSettle {
  enum class Kind : std::uint8_t { Ack, Duplicate, DeadLetter, Release, Unclaim };
  Kind kind = Kind::Ack;
  std::size_t index = 0;            // into QueueBatch::claims
  std::int64_t delay_ns = 0;        // Release
  bool complete_key = false;        // Ack: mark the idempotency key done in the same transaction
  bool expired = false;             // Ack of an expired message (counted as expired, not acked)
  std::unique_ptr<TxnState> tx;     // Ack of a transactional handler: its effects
  std::unique_ptr<DlqEntry> entry;  // DeadLetter
};

enum class SettleResult : std::uint8_t {
  Pending, Acked, Duplicate, DeadLettered, Released, Unclaimed, GivenBack, Conflict, Lost, DlqFull
};

namespace {
// The message could not be settled as decided and stays (or went to another
// consumer): nothing claimed behind it may be acked past it.
bool settle_failed(SettleResult r) noexcept {
  return r == SettleResult::Conflict || r == SettleResult::Lost || r == SettleResult::DlqFull ||
         r == SettleResult::GivenBack;
}
}  // namespace

// A claimed batch of one queue lane and what its delivery decided. Shared
// between the worker (which builds it) and the writer thread (which commits
// it and runs the completion).
struct QueueBatch {
  GroupLane* gl = nullptr;
  // The group's scope while the batch was delivered (a queue's options change
  // when a new first consumer attaches; the writer must not read them).
  IdempotencyImpl* idem = nullptr;
  bool ordered = true;            // !key_parallel_retry (the cross-batch give-back applies)
  std::int64_t visibility_ns = 0;  // GroupOptions::visibility
  std::vector<ClaimedMessage> claims;
  std::vector<QueueSettle> ops;
  std::vector<SettleResult> results;
  std::map<std::string, std::optional<std::string>> overlay;  // transactional writes of earlier messages
  std::int64_t committed_at = 0;
};

namespace {
// The DeadLetter settle of a queue message: the DLQ entry and the ack in one
// step; a DLQ over its quota keeps the message (released for kHoldDlqFullNs).
Status settle_dead_letter(StoreTxn& t, DlqStore* dlq, const GroupRef& group, std::uint32_t lane,
                          const ClaimedMessage& cm, const DlqEntry& entry, SettleResult* res) {
  const std::uint64_t offset = cm.message.offset;
  auto added = dlq->add_in(t, entry, [&]() -> Status {
    Status as = t.ack(group, lane, offset, cm.attempt);
    if (!as.ok()) return as;
    Status fs = dlq->forget_outcomes_in(t, group, lane, offset);
    return (fs.ok() || fs.code() == Code::NotFound) ? Status() : fs;
  });
  if (added.ok()) {
    *res = SettleResult::DeadLettered;
    return Status();
  }
  if (!message_level(added.code())) return added.status();
  if (added.code() != Code::QuotaExceeded) {
    *res = SettleResult::Lost;
    return Status();
  }
  // The DLQ refused it (quota): keep the message, try again later.
  Status rs = t.release(group, lane, offset, cm.attempt, kHoldDlqFullNs);
  if (!rs.ok() && !message_level(rs.code())) return rs;
  if (rs.ok()) {
    auto n = dlq->note_outcome_in(t, group, lane, offset);
    if (!n.ok() && !message_level(n.code())) return n.status();
  }
  *res = SettleResult::DlqFull;
  return Status();
}
}  // namespace

// Settle one message of a claimed queue batch inside the writer's transaction.
// Ops of a batch are applied in order (the writer runs them FIFO); once one
// of them could not settle its message (a conflict, a lost claim, a full
// DLQ), every later op of the batch gives its message back instead, so
// nothing is acked past a message that stays.
Status DurableRunner::apply_queue_settle(StoreTxn& t, QueueBatch& batch, std::size_t k) {
  const Status s = settle_queue_op(t, batch, k);
  const SettleResult r = batch.results[k];
  GroupLane* gl = batch.gl;
  if (settle_failed(r)) {
    // The message stays (or went elsewhere): claims of the lane made before
    // now behind it go back when they settle, whatever batch they are in.
    const std::int64_t now = t.now_ns();
    if (now - gl->settle_break_ns > batch.visibility_ns) gl->settle_break_offset = ~std::uint64_t{0};  // those expired
    gl->settle_break_offset = std::min(gl->settle_break_offset, batch.claims[batch.ops[k].index].message.offset);
    gl->settle_break_ns = now;
  }
  return s;
}

// One settle op of apply_queue_settle.
Status DurableRunner::settle_queue_op(StoreTxn& t, QueueBatch& batch, std::size_t k) {
  GroupLane* gl = batch.gl;
  GroupImpl* g = gl->group;
  const GroupRef& group = g->store_group;
  IdempotencyImpl* idem = batch.idem;  // as when the batch was claimed (a later consumer may change it)
  DlqStore* dlq = bus_.dlq_.get();
  QueueSettle& op = batch.ops[k];
  const ClaimedMessage& cm = batch.claims[op.index];
  const StoredMessage& m = cm.message;
  SettleResult& res = batch.results[k];
  res = SettleResult::Pending;
  batch.committed_at = t.now_ns();
  bool broken = false;
  for (std::size_t j = 0; j < k; ++j)
    if (settle_failed(batch.results[j])) broken = true;
  // Across batches too: a claim made behind a message of the lane before
  // that one failed to settle (pipelined claims, claim_ahead.hpp). Ordered
  // groups only; with key_parallel_retry keys do not wait for each other.
  if (batch.ordered && m.offset > gl->settle_break_offset && cm.claimed_ns < gl->settle_break_ns)
    broken = true;
  auto give_back = [&](SettleResult as) -> Status {
    Status us = t.unclaim(group, gl->lane, m.offset, cm.attempt);
    if (!us.ok() && !message_level(us.code())) return us;
    res = as;
    return Status();
  };
  if (broken) return give_back(SettleResult::GivenBack);
  switch (op.kind) {
    case QueueSettle::Kind::Unclaim:
      return give_back(SettleResult::Unclaimed);
    case QueueSettle::Kind::Ack:
    case QueueSettle::Kind::Duplicate: {
      bool duplicate = op.kind == QueueSettle::Kind::Duplicate;
      if (op.tx) {
        Status vs = validate_reads(t, *op.tx, g->topic->name);
        if (!vs.ok()) {
          if (!message_level(vs.code())) return vs;
          // A value it read changed: this message and the rest go back (a
          // conflict does not use an attempt).
          return give_back(SettleResult::Conflict);
        }
        if (op.complete_key && idem != nullptr) {
          // Exactly-once effects: the key decides inside this transaction.
          auto rec = idem->status_in(t, m.idempotency_key);
          if (!rec.ok() && !message_level(rec.code())) return rec.status();
          if (rec.ok() && rec->state == ClaimState::Done) duplicate = true;
        }
      }
      Status as = t.ack(group, gl->lane, m.offset, cm.attempt);
      if (!as.ok()) {
        if (!message_level(as.code())) return as;
        res = SettleResult::Lost;  // redelivered elsewhere (its claim expired)
        return Status();
      }
      if (dlq != nullptr && cm.attempt > 1) {
        Status fs = dlq->forget_outcomes_in(t, group, gl->lane, m.offset);
        if (!fs.ok() && fs.code() != Code::NotFound) return fs;
      }
      if (!duplicate) {
        if (op.complete_key) {
          Status cs = idem->complete_in(t, m.idempotency_key, {}, false);
          if (!cs.ok() && !message_level(cs.code())) return cs;
        }
        if (op.tx) {
          if (Status ws = write_effects(t, *op.tx); !ws.ok()) return ws;
        }
      }
      res = duplicate ? SettleResult::Duplicate : SettleResult::Acked;
      return Status();
    }
    case QueueSettle::Kind::DeadLetter:
      return settle_dead_letter(t, dlq, group, gl->lane, cm, *op.entry, &res);
    case QueueSettle::Kind::Release: {
      Status rs = t.release(group, gl->lane, m.offset, cm.attempt, op.delay_ns);
      if (!rs.ok()) {
        if (!message_level(rs.code())) return rs;
        res = SettleResult::Lost;
        return Status();
      }
      if (dlq != nullptr) {
        // A deliberate release is an attempt that came back with an outcome:
        // poison detection counts only real crashes.
        auto n = dlq->note_outcome_in(t, group, gl->lane, m.offset);
        if (!n.ok() && !message_level(n.code())) return n.status();
      }
      res = SettleResult::Released;
      return Status();
    }
  }
  return Status();
}

// After the commit of one settle op (Sync: its fsync), on the writer thread.
void DurableRunner::settled_queue_message(QueueBatch& batch, std::size_t k, const Status& st) noexcept {
  GroupLane* gl = batch.gl;
  IdempotencyImpl* idem = batch.idem;
  const QueueSettle& op = batch.ops[k];
  bool wake_lane = false;
  if (!st.ok()) {
    // Nothing of it was committed: its claim expires after `visibility`. The
    // batch's later settles (applied after this callback) give theirs back.
    batch.results[k] = SettleResult::Lost;
    gl->errors.fetch_add(1, std::memory_order_relaxed);
  } else {
    switch (batch.results[k]) {
      case SettleResult::Acked:
        if (op.expired) break;  // counted as expired when it was found (delayed_durable.cpp)
        gl->acked.fetch_add(1, std::memory_order_relaxed);  // only now is it acked
        if (op.tx) count_outbox(*op.tx);
        if (op.complete_key && idem != nullptr)
          idem->remember_done(batch.claims[op.index].message.idempotency_key, batch.committed_at);
        break;
      case SettleResult::Duplicate:
        gl->duplicates_skipped.fetch_add(1, std::memory_order_relaxed);
        if (op.complete_key && idem != nullptr)
          idem->remember_done(batch.claims[op.index].message.idempotency_key, batch.committed_at);
        break;
      case SettleResult::Conflict:
        gl->retried.fetch_add(1, std::memory_order_relaxed);
        wake_lane = true;
        break;
      case SettleResult::Lost:
      case SettleResult::DlqFull:
        gl->errors.fetch_add(1, std::memory_order_relaxed);
        wake_lane = true;
        break;
      case SettleResult::GivenBack:
      case SettleResult::Unclaimed:
        wake_lane = true;
        break;
      default:
        break;
    }
  }
  if (wake_lane && gl->group->consumer_count.load(std::memory_order_seq_cst) > 0) bus_.sched_.schedule(gl);
}

// Durable queues with key_parallel_retry: a head whose backoff is over by
// the steady clock but not yet by the store's wall clock is looked at again
// shortly rather than spun on. A head that never comes back (its release was
// not committed, or another process took it) stops holding its key after
// visibility.
void DurableRunner::recheck_released_heads(GroupLane* gl) noexcept {
  const std::int64_t now = RetryTimer::now_ns();
  const std::int64_t give_up_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(gl->group->options.visibility).count() + 1'000'000'000;
  for (std::size_t j = 0; j < gl->parked.size();) {
    Parked& pk = gl->parked[j];
    if (pk.released && pk.due_ns <= now) {
      if (pk.first_failure_ns == 0) pk.first_failure_ns = now;  // overdue since
      if (now - pk.first_failure_ns > give_up_ns) {
        gl->parked.erase(gl->parked.begin() + static_cast<std::ptrdiff_t>(j));
        continue;
      }
      pk.due_ns = now + 5'000'000;
    }
    ++j;
  }
}

Result<std::uint32_t> DurableRunner::queue_outcomes(GroupLane* gl, std::uint64_t offset) {
  std::uint32_t noted = 0;
  Status rs = bus_.store_->read([&](StoreTxn& t) -> Status {
    auto o = bus_.dlq_->outcomes_in(t, gl->group->store_group, gl->lane, offset);
    if (!o.ok()) return o.status();
    noted = *o;
    return Status();
  });
  if (!rs.ok()) return rs;
  return noted;
}

DlqEntry DurableRunner::poison_entry(GroupLane* gl, const StoredMessage& m, std::uint32_t crashes) const {
  return bus_.delivery_.dlq_entry(gl, m, Outcome::reject("poison: the consumer process died while handling it"), crashes,
                   ErrorClass::Poison, now_ns());
}

// Durable queue: claim a batch (attempts persisted before delivery), deliver
// it in order, and settle each message with an asynchronous write as soon as
// its outcome is known (the writer shares one commit among all of them, and
// with other lanes and workers; a handler that blocks does not hold back the
// acks of the messages before it). True if the lane should run again at once.
// One run over a durable queue lane's claimed batch: the settles it submits
// (each committed on its own, in claim order) and whether the run goes on.
struct DurableRunner::QueueRun {
  DurableRunner& runner;
  GroupLane* gl;
  std::shared_ptr<QueueBatch> batch;
  bool broken = false;  // the rest of the batch goes back unhandled
  bool again = false;   // run the lane again at once

  QueueSettle& submit(QueueSettle::Kind kind, std::size_t i) {
    QueueSettle op;
    op.kind = kind;
    op.index = i;
    batch->ops.push_back(std::move(op));
    return batch->ops.back();
  }
  void commit() {
    const std::size_t k = batch->ops.size() - 1;
    DurableRunner* b = &runner;
    Status s = runner.bus_.store_->write_async([batch = batch, k, b](StoreTxn& t) { return b->apply_queue_settle(t, *batch, k); },
                                       [batch = batch, k, b](const Status& st) { b->settled_queue_message(*batch, k, st); });
    if (!s.ok()) {
      gl->errors.fetch_add(1, std::memory_order_relaxed);
      broken = true;  // refused up front (shutting down): the claims expire
      again = false;
    }
  }
  // Paused: back uncounted, the rest with it.
  void hold_back(std::size_t i, std::int64_t wait) {
    submit(QueueSettle::Kind::Unclaim, i);
    commit();
    broken = again = true;
    gl->retry_delay_ns = std::max<std::int64_t>(wait, 1'000'000);
  }
  // Set a key's head aside while it waits in the store (key_parallel_retry).
  void park_key(const StoredMessage& m, std::int64_t delay_ns) {
    Parked pk;
    pk.stored.key = m.key;
    pk.stored.offset = m.offset;
    pk.released = true;
    pk.due_ns = RetryTimer::now_ns() + std::max<std::int64_t>(delay_ns, 1);
    gl->parked.push_back(std::move(pk));
  }
};

bool DurableRunner::claim_queue_batch(GroupLane* gl, std::uint32_t claim_max, QueueBatch& batch, bool* full,
                                      bool ahead) {
  GroupImpl* g = gl->group;
  const bool kp = g->options.key_parallel_retry;
  ClaimOptions claim_options;
  claim_options.visibility = g->options.visibility;
  // key_parallel_retry claims past the lane's messages in backoff (they are
  // in flight); this process keeps per-key order with its parked messages.
  claim_options.ordered = !kp;
  if (kp) {
    // Parked messages whose key's head is done go first (they hold claims).
    for (std::ptrdiff_t i; (i = due_parked(gl, RetryTimer::now_ns())) >= 0;) {
      Parked& pk = gl->parked[static_cast<std::size_t>(i)];
      ClaimedMessage cm;
      cm.message = std::move(pk.stored);
      cm.attempt = pk.attempts;
      batch.claims.push_back(std::move(cm));
      gl->parked.erase(gl->parked.begin() + i);
    }
  }
  if (ahead) {
    // Claimed by the writer in the commit that appended them, or that
    // answered our request (claim_ahead.hpp): on disk, the handler may run.
    ClaimAhead& box = *gl->claim_ahead;
    if (const std::uint64_t e = box.take_errors(); e > 0) gl->errors.fetch_add(e, std::memory_order_relaxed);
    if (box.take(&batch.claims)) {
      *full = batch.claims.size() >= claim_max;
      return true;
    }
    // None: ask for a claim in the writer's next commit and do not wait for
    // it; its hand-over schedules the lane.
    if (box.request(claim_max, g->options.visibility, pipelined_claims(bus_.dlq_.get()))) {
      if (Status s = bus_.store_->request_claims(&box); !s.ok()) {
        (void)box.answered();
        gl->errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
    return false;
  }
  auto r = bus_.store_->claim_batch(g->store_group, gl->lane, claim_max, claim_options);
  if (!r.ok()) {
    gl->errors.fetch_add(1, std::memory_order_relaxed);
    if (batch.claims.empty()) return false;
  } else {
    for (ClaimedMessage& cm : *r) {
      bool keep = true;
      for (std::size_t j = 0; j < gl->parked.size(); ++j) {
        Parked& pk = gl->parked[j];
        if (pk.stored.offset != cm.message.offset) continue;
        if (pk.released) {
          gl->parked.erase(gl->parked.begin() + static_cast<std::ptrdiff_t>(j));  // its key's head is back
        } else {
          pk.attempts = cm.attempt;  // its claim expired while parked: it holds the new one
          keep = false;
        }
        break;
      }
      if (keep) batch.claims.push_back(std::move(cm));
    }
  }
  if (kp) recheck_released_heads(gl);
  // A full batch suggests more is waiting: run again at once (after other
  // lanes); a short one means the lane is drained for now.
  *full = r.ok() && r->size() == claim_max;
  return !batch.claims.empty();  // else nothing deliverable now
}

bool DurableRunner::queue_before_call(QueueRun& run, std::size_t i, std::uint32_t poison_after, std::uint32_t* outcomes) {
  GroupLane* gl = run.gl;
  const ClaimedMessage& cm = run.batch->claims[i];
  const StoredMessage& m = cm.message;
  if (gl->group->options.key_parallel_retry && key_parked(gl, m.key)) {
    // Behind an earlier message of its key: keep it claimed, set aside in order.
    if (gl->parked.size() < gl->group->options.key_parallel_limit) {
      Parked pk;
      pk.stored = m;
      pk.attempts = cm.attempt;
      gl->parked.push_back(std::move(pk));
    } else {
      run.submit(QueueSettle::Kind::Unclaim, i);  // the limit: it goes back to the store
      run.commit();
      run.again = false;
    }
    return true;
  }
  *outcomes = cm.attempt;  // attempts that came back with an outcome (incl. this one)
  if (cm.attempt > 1 && bus_.dlq_) {
    // A redelivery (claimed alone): earlier attempts that never came back
    // with an outcome were consumer crashes.
    Result<std::uint32_t> noted = queue_outcomes(gl, m.offset);
    *outcomes = (noted.ok() ? *noted : 0) + 1;
    if (noted.ok() && poison_after != 0 &&
        classify_failure(Outcome::Kind::Retry, cm.attempt - 1, *noted, false, poison_after) == ErrorClass::Poison) {
      run.submit(QueueSettle::Kind::DeadLetter, i).entry = std::make_unique<DlqEntry>(poison_entry(gl, m, cm.attempt - 1));
      bump(gl->failed);
      run.commit();
      return true;
    }
  }
  if (m.expires_ns != 0 && stored_expired(m)) [[unlikely]] {
    // Its TTL ended (doc/delays.md): never delivered; acked uncounted, or dead-lettered as `expired`.
    gl->expired.fetch_add(1, std::memory_order_relaxed);
    if (gl->group->options.dead_letter_expired && bus_.dlq_) {
      run.submit(QueueSettle::Kind::DeadLetter, i).entry = std::make_unique<DlqEntry>(
          bus_.delivery_.dlq_entry(gl, m, Outcome::reject("expired: its ttl ended before a handler call started"), cm.attempt,
                    ErrorClass::Expired, 0));
    } else {
      run.submit(QueueSettle::Kind::Ack, i).expired = true;
    }
    run.commit();
    return true;
  }
  if (const std::int64_t gate = bus_.outages_.wait(gl, -1); gate >= 0) {
    run.hold_back(i, gate);
    return true;
  }
  return false;
}

void DurableRunner::queue_call(QueueRun& run, std::size_t i, Consumer* c, std::uint32_t outcomes,
                         std::set<std::string_view>& keys_done) {
  GroupLane* gl = run.gl;
  const bool kp = gl->group->options.key_parallel_retry;
  const std::size_t limit = gl->group->options.key_parallel_limit;
  const AdmitMode mode = c->tx_handler ? AdmitMode::Check : AdmitMode::Claim;
  const ClaimedMessage& cm = run.batch->claims[i];
  const StoredMessage& m = cm.message;
  const Parcel p{&m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset, cm.attempt, m.headers};
  Admission a = Admission::Proceed;
  if (mode == AdmitMode::Check && !m.idempotency_key.empty() && keys_done.count(m.idempotency_key) > 0) {
    a = Admission::Skip;  // a duplicate of a message acked earlier in this batch
  } else {
    a = bus_.delivery_.admit(gl, p, mode);
  }
  if (a == Admission::Later) {
    // The key is busy elsewhere: not a crash and not a failure; the lane
    // (or with key_parallel_retry its key) waits for it (a deliberate
    // release records an outcome).
    run.submit(QueueSettle::Kind::Release, i).delay_ns = kHoldBusyKeyNs;
    run.commit();
    if (kp && gl->parked.size() < limit) {
      run.park_key(m, kHoldBusyKeyNs);
      return;
    }
    run.broken = true;
    run.again = false;
    return;
  }
  if (a == Admission::Skip) {
    run.submit(QueueSettle::Kind::Duplicate, i);
    run.commit();
    return;
  }
  std::unique_ptr<TxnState> tx;
  if (c->tx_handler) {
    tx = std::make_unique<TxnState>();
    tx->store = bus_.store_.get();
    tx->bus = &bus_;
    tx->overlay = &run.batch->overlay;
  }
  // If the call overran attempt_timeout, the watchdog ended its claim: its
  // settle still commits if nobody took the message meanwhile (the claim's
  // attempt is unchanged), else it finds the claim gone (Lost) and the rest
  // of the batch goes back.
  const Invocation inv = bus_.delivery_.invoke(c, gl, p, tx.get());
  queue_settle(run, i, p, inv, mode, outcomes, std::move(tx), keys_done);
}

// Message i's outcome (queue_call, queue_call_span): an ack, a release for
// its retry (parked with key_parallel_retry, else the rest of the batch goes
// back), a dead letter, or an uncounted hold (paused).
void DurableRunner::queue_settle(QueueRun& run, std::size_t i, const Parcel& p, const Invocation& inv, AdmitMode mode,
                                 std::uint32_t outcomes, std::unique_ptr<TxnState> tx,
                                 std::set<std::string_view>& keys_done) {
  GroupLane* gl = run.gl;
  const bool kp = gl->group->options.key_parallel_retry;
  const std::size_t limit = gl->group->options.key_parallel_limit;
  const ClaimedMessage& cm = run.batch->claims[i];
  const StoredMessage& m = cm.message;
  std::int64_t first_failure = 0;
  const Settlement st = bus_.delivery_.settle(gl, p, inv, mode, true, outcomes, &first_failure);
  if (st.uncounted) {
    run.hold_back(i, st.delay_ns);
    return;
  }
  if (st.next == Settlement::Next::Retry) {
    // The store keeps the message claimed until the backoff ends (the
    // claim, not this process, holds the delay: it survives a crash).
    run.submit(QueueSettle::Kind::Release, i).delay_ns = st.delay_ns;
    run.commit();
    if (kp && gl->parked.size() < limit) {
      run.park_key(m, st.delay_ns);
      return;
    }
    run.broken = true;
    run.again = st.delay_ns == 0;
    return;
  }
  if (st.next == Settlement::Next::DeadLetter) {
    QueueSettle& op = run.submit(QueueSettle::Kind::DeadLetter, i);
    op.entry = std::make_unique<DlqEntry>(bus_.delivery_.dlq_entry(gl, m, inv.outcome, cm.attempt, st.error_class, first_failure));
    run.commit();
    return;
  }
  QueueSettle& op = run.submit(QueueSettle::Kind::Ack, i);
  if (st.acked) {
    op.complete_key = run.batch->idem != nullptr && !m.idempotency_key.empty();
    if (tx) {
      for (const auto& [k, v] : tx->writes) run.batch->overlay[k] = v;
      op.tx = std::move(tx);
    }
    if (op.complete_key) keys_done.insert(m.idempotency_key);
  }
  run.commit();
}

// A batch handler's call on claims [i, i + n) of the batch: claim i passed
// queue_before_call (`outcomes`); the others are first deliveries, not
// expired (what queue_before_call would settle ends the span before it).
// The acked prefix is settled as acks (one settle each, committed in claim
// order), the claim the handler stopped at as queue_call settles one, and
// the claims after it come again in the next call of this run (or go back
// with the rest of the batch if that one's retry breaks the run).
// Returns the claims settled.
std::size_t DurableRunner::queue_call_span(QueueRun& run, std::size_t i, Consumer* c, std::uint32_t outcomes,
                                           std::set<std::string_view>& keys_done, MessageView* views) {
  GroupLane* gl = run.gl;
  const std::vector<ClaimedMessage>& claims = run.batch->claims;
  const std::size_t room = std::min<std::size_t>(gl->group->options.batch_max, claims.size() - i);
  std::size_t n = 0;
  for (; n < room; ++n) {
    const ClaimedMessage& cm = claims[i + n];
    if (n > 0 && (cm.attempt > 1 || (cm.message.expires_ns != 0 && stored_expired(cm.message)))) break;
    stored_view(gl, cm.message, cm.attempt, &views[n]);
  }
  const std::span<const MessageView> span(views, n);
  const BatchOutcome result = bus_.delivery_.invoke_span(c, gl, span);
  std::size_t acked = 0;
  const std::size_t settled = bus_.delivery_.span_settled(gl, result, span, &acked);
  for (std::size_t k = 0; k < acked; ++k) {
    run.submit(QueueSettle::Kind::Ack, i + k);
    run.commit();
  }
  if (acked == n) return n;
  const std::size_t f = i + acked;
  const ClaimedMessage& cm = claims[f];
  const StoredMessage& m = cm.message;
  const Parcel p{&m.header, m.key, m.idempotency_key, m.payload, gl->lane, m.offset, cm.attempt, m.headers};
  queue_settle(run, f, p, Invocation{result.next(), false}, AdmitMode::Claim, acked == 0 ? outcomes : cm.attempt,
               nullptr, keys_done);
  return settled;
}

// The group paused (outage breaker): its lanes stop asking the writer for
// claims, and what the writer claimed for this one goes back uncounted (it
// would wait out its visibility behind the pause).
void DurableRunner::give_back_claims_ahead(GroupLane* gl) {
  if (!gl->claim_ahead) return;
  std::vector<ClaimedMessage> back;
  gl->claim_ahead->disarm(&back);
  if (back.empty()) return;
  if (!bus_.store_->give_back_claims(back, gl->group->store_group, gl->lane).ok())
    gl->errors.fetch_add(1, std::memory_order_relaxed);  // they expire after their visibility
}

// A run broke off (a retry, a hold): what the writer claimed behind it goes
// back uncounted without waiting for the commit, after the run's own
// settles (the writer applies them in order), and the mailbox's new
// generation refuses the claims of a commit under way (claim_ahead.hpp,
// invariant 4). Its next run requests claims again.
void DurableRunner::break_claims_ahead(GroupLane* gl) {
  std::vector<ClaimedMessage> back;
  gl->claim_ahead->disarm(&back);
  if (back.empty()) return;
  if (!bus_.store_->give_back_claims_async(std::move(back), gl->group->store_group, gl->lane).ok())
    gl->errors.fetch_add(1, std::memory_order_relaxed);  // they expire after their visibility
}

bool DurableRunner::run_durable_queue_batch(GroupLane* gl, Consumer* c) {
  GroupImpl* g = gl->group;
  // The end offset this claim will see (at least): appends after it wake the
  // lane again when it is released (run_durable_lane).
  gl->read_pos = gl->known_end.load(std::memory_order_seq_cst);
  const bool poison = poison_on(bus_.dlq_.get());
  const std::uint32_t poison_after = poison ? bus_.dlq_->options().poison_after_crashes : 0;
  if (g->options.key_parallel_retry && gl->parked.capacity() < g->options.key_parallel_limit)
    gl->parked.reserve(g->options.key_parallel_limit);  // owner-only, once
  const std::uint32_t max = poison_after == 1 ? 1 : g->options.batch;
  const bool paused = g->outage.paused();
  if (paused) give_back_claims_ahead(gl);  // a probe claims one message for itself
  if (bus_.outages_.claim_later(gl)) return true;  // paused: claim nothing until a probe may go, then one message
  const std::uint32_t claim_max = paused ? 1 : max;
  QueueRun run{*this, gl, std::make_shared<QueueBatch>()};
  QueueBatch& batch = *run.batch;
  batch.gl = gl;
  batch.idem = g->idempotency;
  batch.ordered = !g->options.key_parallel_retry;
  batch.visibility_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(g->options.visibility).count();
  bool full = false;
  // The writer claims for this lane (claim_ahead.hpp): in the commit that
  // appends its next messages (one fsynced commit before the handler instead
  // of two), or in its next commit on request; the worker never waits for a
  // claim. Not with key_parallel_retry (unordered claims and parked keys) nor
  // while paused (one probe at a time): those claim for themselves.
  const bool ahead = gl->claim_ahead && !g->options.key_parallel_retry && !paused;
  if (!claim_queue_batch(gl, claim_max, batch, &full, ahead)) return false;
  // Sized once: the writer reads earlier entries while the worker appends.
  batch.ops.reserve(batch.claims.size());
  batch.results.assign(batch.claims.size(), SettleResult::Pending);
  std::set<std::string_view> keys_done;  // idempotency keys acked earlier in this batch
  // An ordered claim takes a redelivery alone: what waits behind it is
  // claimed when the lane looks again, not by the next append only.
  const bool redelivery = !g->options.key_parallel_retry && batch.claims.back().attempt > 1;
  run.again = full || g->options.key_parallel_retry || redelivery;
  // A batch handler gets spans of the claims where each would otherwise go
  // through only the handler call and its settle (as topic spans, plus no
  // transactional handler).
  const bool spans = c->batch_handler && g->options.batch_max > 1 && !g->options.key_parallel_retry &&
                     g->idempotency == nullptr && g->options.attempt_timeout.count() == 0 &&
                     !g->options.outage.enabled && bus_.options.tracer == nullptr;
  alignas(MessageView) unsigned char view_bytes[kMaxBatch * sizeof(MessageView)];  // a span's views
  for (std::size_t i = 0; i < batch.claims.size(); ++i) {
    if (gl->probing) bus_.outages_.end_probe(gl);  // the previous message was a probe that was skipped or held
    if (run.broken || bus_.sched_.abandoning()) {
      run.submit(QueueSettle::Kind::Unclaim, i);
      run.commit();
      continue;
    }
    std::uint32_t outcomes = 0;
    if (queue_before_call(run, i, poison_after, &outcomes)) continue;
    if (spans) {
      i += queue_call_span(run, i, c, outcomes, keys_done, reinterpret_cast<MessageView*>(view_bytes)) - 1;
      continue;
    }
    queue_call(run, i, c, outcomes, keys_done);
  }
  if (gl->probing) bus_.outages_.end_probe(gl);
  if (ahead) {
    if (run.broken) {
      break_claims_ahead(gl);
    } else if (!run.again) {
      gl->claim_ahead->arm(max, g->options.visibility, pipelined_claims(bus_.dlq_.get()));
    }
  }
  return run.again;
}

}  // namespace lanebus::detail
