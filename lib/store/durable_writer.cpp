// lanebus — MIT License.
// StoreWriter: the store's write queue, the writer thread and group commit.
#include "durable_store.hpp"

#include <algorithm>
#include <exception>
#include <iterator>
#include <map>
#include <utility>

#include "delayed_index.hpp"
#include "durable_store_impl.hpp"
#include "quote.hpp"

namespace lanebus::detail {

void StoreWriter::start() {
  thread_ = std::thread([this] { writer_main(); });
  thread_id_ = thread_.get_id();
}

void StoreWriter::stop() {
  {
    MutexLock l(&queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  space_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StoreWriter::set_listener(std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener) {
  MutexLock l(&queue_mutex_);  // the writer reads it after taking a batch under this mutex
  listener_ = std::move(listener);
}

Status StoreWriter::enqueue(WriteOp&& op, bool may_block) {
  {
    MutexLock l(&queue_mutex_);
    while (!stopping_ && queue_.size() >= s_.options_.max_pending) {
      if (!may_block) return Status(Code::WouldBlock);
      space_cv_.wait(queue_mutex_);
    }
    if (stopping_) return Status(Code::ShutDown, "store " + quoted(s_.options_.directory) + " is closing");
    queue_.push_back(std::move(op));
  }
  queue_cv_.notify_one();
  return Status();
}

std::size_t StoreWriter::enqueue_all(std::span<WriteOp> ops, Status* status) {
  std::size_t queued = 0;
  while (queued < ops.size()) {
    {
      MutexLock l(&queue_mutex_);
      while (!stopping_ && queue_.size() >= s_.options_.max_pending) space_cv_.wait(queue_mutex_);
      if (stopping_) {
        *status = Status(Code::ShutDown, "store " + quoted(s_.options_.directory) + " is closing");
        return queued;
      }
      // Room first, so a chunk is queued whole or not at all (the caller
      // waits for exactly the queued ones).
      const std::size_t n = std::min(ops.size() - queued, s_.options_.max_pending - queue_.size());
      try {
        queue_.reserve(queue_.size() + n);
      } catch (const std::exception&) {
        *status = Status::from_literal(Code::Internal, "append: out of memory queueing the batch");
        return queued;
      }
      for (std::size_t k = 0; k < n; ++k) queue_.push_back(std::move(ops[queued++]));
    }
    queue_cv_.notify_one();
  }
  return queued;
}

Status StoreWriter::run_write(std::function<Status(WriteCtx&)> apply, bool bookkeeping) {
  Status s = s_.check_writable();
  if (!s.ok()) return s;
  if (on_writer_thread()) {
    return Status(Code::Busy, "blocking store call from a completion callback (writer thread)");
  }
  Waiter w;
  WriteOp op;
  op.apply = std::move(apply);
  op.bookkeeping = bookkeeping;
  op.done = [&w](const Status& st) { w.finish(st, {}); };
  s = enqueue(std::move(op), true);
  if (!s.ok()) return s;
  w.wait();
  return w.status;
}

void StoreWriter::writer_main() {
  using clock = std::chrono::steady_clock;
  auto next_maint = clock::now() + s_.options_.maintenance_interval;
  auto next_flush = clock::now() + s_.options_.async_flush_interval;
  const bool async = s_.options_.durability == Durability::Async;
  bool retention_more = false;
  std::vector<WriteOp> batch;
  std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener;
  for (;;) {
    bool stop = false, force = false;
    batch.clear();
    {
      MutexLock l(&queue_mutex_);
      for (;;) {
        auto now = clock::now();
        if (!queue_.empty() || stopping_ || force_retention_ || retention_more || now >= next_maint ||
            (async && now >= next_flush)) {
          break;
        }
        auto until = async ? std::min(next_maint, next_flush) : next_maint;
        queue_cv_.wait_until(queue_mutex_, until);
      }
      // The whole queue when it fits one batch: a swap, so both vectors keep
      // their capacity and a steady stream of appends allocates nothing here.
      if (queue_.size() <= s_.options_.max_batch) {
        batch.swap(queue_);
      } else {
        const auto n = static_cast<std::ptrdiff_t>(s_.options_.max_batch);
        batch.assign(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.begin() + n));
        queue_.erase(queue_.begin(), queue_.begin() + n);
      }
      stop = stopping_ && queue_.empty();
      force = force_retention_;
      force_retention_ = false;
      listener = listener_;
    }
    space_cv_.notify_all();
    if (!batch.empty()) process_batch(batch);
    wake_other_processes(batch);
    if (batch.size() > 0) complete(batch, listener);
    if (stop) break;
    auto now = clock::now();
    if (now >= next_maint || force) {
      if (s_.wake_) (void)s_.wake_->reclaim_dead();  // wake slots of dead processes
      auto dead = s_.env_->reader_check();
      if (dead.ok() && *dead > 0) {
        s_.counters_.stale_readers_cleared.fetch_add(static_cast<std::uint64_t>(*dead), std::memory_order_relaxed);
      }
      retention_more = true;
      next_maint = now + s_.options_.maintenance_interval;
    }
    if (retention_more && !s_.env_->fatal()) {
      // One bounded step; queued operations get their turn before the next.
      std::vector<WriteOp> step(1);
      bool more = false;
      step[0].apply = [this, &more](WriteCtx& ctx) {
        return s_.retention_->apply(ctx, s_.options_.retention_batch, &more);
      };
      step[0].bookkeeping = true;
      process_batch(step);
      retention_more = step[0].status.ok() && more;
    } else {
      retention_more = false;
    }
    if (async && clock::now() >= next_flush) {
      if (!s_.env_->fatal()) {
        Status ss = s_.env_->sync();
        if (ss.ok()) {
          s_.counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);
        } else {
          s_.log_failure("the async flush (fsync)", ss);
        }
      }
      next_flush = clock::now() + s_.options_.async_flush_interval;
    }
  }
}

// After a commit: the operations' completions, then the append listener for
// every lane that grew (and every lane with claims handed to its mailbox),
// outside any transaction and lock.
void StoreWriter::complete(std::vector<WriteOp>& batch,
                           const std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)>& listener) {
  for (WriteOp& op : batch) {
    if (op.is_append) {
      // Relaxed: a statistic.
      if (!op.status.ok()) s_.counters_.append_failures.fetch_add(1, std::memory_order_relaxed);
      if (op.append_done) op.append_done(op.status, op.result);
    } else if (op.done) {
      op.done(op.status);
    }
  }
  if (!listener) {
    s_.claims_->take_woken(nullptr);
    return;
  }
  std::map<std::uint64_t, std::uint64_t> ends;
  for (const WriteOp& op : batch) {
    if (op.is_append && op.status.ok() && !op.result.duplicate) {
      auto k = (static_cast<std::uint64_t>(op.request.topic_id) << 32) | op.request.lane;
      ends[k] = std::max(ends[k], op.result.offset + 1);
    }
  }
  s_.claims_->take_woken(&ends);  // lanes with claims made for them (claim_ahead.hpp)
  for (auto& [k, end] : ends) listener(static_cast<std::uint32_t>(k >> 32), static_cast<std::uint32_t>(k), end);
}

// After a commit, before its completions: other processes' consumers first
// (a few atomic adds, a FUTEX_WAKE per sleeping process), so they read while
// our completions run. Only a commit that appended wakes anyone.
void StoreWriter::wake_other_processes(const std::vector<WriteOp>& batch) noexcept {
  if (!s_.wake_) return;
  for (const WriteOp& op : batch) {
    if (op.is_append && op.status.ok() && !op.result.duplicate) {
      s_.wake_->notify_others();
      return;
    }
  }
}

// The counters of a committed batch: its appends, the commit's time (from
// begin; `call` is LMDB's commit call alone), its size and what it carried.
void StoreWriter::count_commit(const std::vector<WriteOp>& ops, const WriteCtx& ctx, std::size_t applied,
                               std::chrono::steady_clock::duration build, std::chrono::steady_clock::duration call) {
  std::uint64_t appends = 0;
  for (const WriteOp& op : ops) {
    if (op.is_append && !op.excluded && op.status.ok() && !op.result.duplicate) appends += 1;
  }
  auto ns = [](std::chrono::steady_clock::duration d) {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  };
  // Relaxed: independent statistics, except the call's part of the commit's
  // time: added after the whole with release, so a reader that loads it first
  // (acquire, DurableStore::counters) never sees the part exceed the whole.
  s_.counters_.appends.fetch_add(appends, std::memory_order_relaxed);
  s_.counters_.commits.fetch_add(1, std::memory_order_relaxed);
  s_.counters_.commit_ns.fetch_add(ns(build + call), std::memory_order_relaxed);
  s_.counters_.commit_call_ns.fetch_add(ns(call), std::memory_order_release);
  if (s_.options_.durability == Durability::Sync) s_.counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);
  s_.counters_.batched_ops.fetch_add(applied, std::memory_order_relaxed);
  std::uint64_t mb = s_.counters_.max_batch.load(std::memory_order_relaxed);
  while (applied > mb && !s_.counters_.max_batch.compare_exchange_weak(mb, applied, std::memory_order_relaxed)) {
  }
  s_.counters_.retention_deleted.fetch_add(ctx.retention_deleted, std::memory_order_relaxed);
  s_.counters_.claims.fetch_add(ctx.claims, std::memory_order_relaxed);
  s_.counters_.redeliveries.fetch_add(ctx.redeliveries, std::memory_order_relaxed);
  s_.counters_.acks.fetch_add(ctx.acks, std::memory_order_relaxed);
  s_.counters_.claims_passed.fetch_add(ctx.claims_passed, std::memory_order_relaxed);
}

void StoreWriter::process_batch(std::vector<WriteOp>& ops) {
  bool bookkeeping_only = false;  // the map is at its maximum: retry small writes alone
  for (WriteOp& op : ops) op.excluded = false;
  // Claims in the append's transaction (claim_ahead.hpp): held from the
  // claims to their hand-over after the commit, so unwatch waits for both.
  std::unique_lock<std::mutex> ahead;
  for (;;) {
    auto t0 = std::chrono::steady_clock::now();
    auto txn = s_.env_->begin_write();
    auto waited = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    // Relaxed: a statistic (watchdog of the LMDB writer-lock wait).
    std::uint64_t prev = s_.counters_.max_write_lock_wait_ns.load(std::memory_order_relaxed);
    while (waited > prev &&
           !s_.counters_.max_write_lock_wait_ns.compare_exchange_weak(prev, waited, std::memory_order_relaxed)) {
    }
    if (!txn.ok()) {
      for (WriteOp& op : ops) {
        if (!op.excluded) op.status = txn.status();
      }
      s_.log_failure("beginning a write transaction", txn.status());
      break;
    }
    WriteCtx ctx{.store = &s_, .txn = &*txn, .now_ns = WallClock::realtime_ns()};
    std::size_t applied = 0;
    for (WriteOp& op : ops) {
      if (op.excluded) continue;
      if (op.is_append) {
        ctx.stage_appends = true;
        op.status = s_.log_->apply_append(ctx, op);
        ctx.stage_appends = false;
      } else {
        // Every other op may read the log: the staged appends go in first.
        Status fs = ctx.flush_log_batches();
        op.status = fs.ok() ? (op.is_delayed ? apply_delayed(ctx, op) : op.apply(ctx)) : fs;
      }
      ++applied;
      if (!ctx.dead.ok()) break;
    }
    if (ctx.dead.ok()) (void)ctx.flush_log_batches();  // a failure marks ctx.dead
    if (ctx.dead.ok() && (!ctx.dirty.empty() || !ctx.ahead_requests.empty())) {
      if (!ahead.owns_lock()) ahead = s_.claims_->lock_ahead();
      if (ahead.owns_lock()) s_.claims_->claim_ahead_in(ctx);
    }
    ctx.close_log_cursors();  // before the commit or abort below
    Status batch = ctx.dead;
    if (batch.ok()) batch = ctx.flush();
    const auto t_commit = std::chrono::steady_clock::now();
    if (batch.ok()) batch = txn->commit();
    if (batch.ok()) {
      count_commit(ops, ctx, applied, t_commit - t0, std::chrono::steady_clock::now() - t_commit);
      if (ahead.owns_lock()) s_.claims_->hand_over(true);
      break;
    }
    txn->abort();
    if (ahead.owns_lock()) s_.claims_->hand_over(false);
    if (batch.code() == Code::MapFull && !s_.env_->fatal()) {
      Status grown = s_.env_->grow_map();
      if (grown.ok()) continue;  // retry the whole batch in the bigger map
      if (!bookkeeping_only) {
        // At the maximum: fail the appends (nothing of them was committed) and
        // give acks / offset commits / retention, which are small and free
        // space, one more try alone (headroom for acks).
        bool any = false;
        for (WriteOp& op : ops) {
          if (op.excluded) continue;
          if (op.bookkeeping) {
            any = true;
          } else {
            op.status = grown;
            op.excluded = true;
          }
        }
        bookkeeping_only = true;
        s_.log_failure("appending (the map is at map_size_max; acks and offsets still commit)", grown);
        if (any) continue;
        break;
      }
      batch = grown;
    }
    for (WriteOp& op : ops) {
      if (!op.excluded) op.status = batch;
    }
    s_.log_failure("committing a batch", batch);
    break;
  }
}

Status StoreWriter::apply_delayed(WriteCtx& ctx, WriteOp& op) {
  StoreTxn t(&s_, &ctx, ctx.txn, ctx.now_ns);
  bool appended = false;
  return store_delayed(t, op.request, op.delayed_tiebreak, &appended);  // may run again: `request` stays
}

}  // namespace lanebus::detail
