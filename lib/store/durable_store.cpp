// lanebus — MIT License.
// DurableStore: open (layout and tables), close, counters, health, the
// extension calls, and the public calls of its parts (durable_store_impl.hpp
// lists them; each has its own file).
#include "durable_store.hpp"

#include <memory>
#include <mutex>
#include <utility>

#include "coding.hpp"
#include "durable_store_impl.hpp"
#include "quote.hpp"
#include "verify.hpp"

namespace lanebus::detail {

// ======================================================================
// open / close

DurableStore::DurableStore(const StoreOptions& options)
    : options_(options),
      writer_(std::make_unique<StoreWriter>(*this)),
      log_(std::make_unique<TopicLog>(*this)),
      groups_(std::make_unique<GroupOffsets>(*this)),
      claims_(std::make_unique<QueueClaims>(*this)),
      retention_(std::make_unique<LogRetention>(*this)) {}

DurableStore::~DurableStore() { (void)close(); }

Result<std::unique_ptr<DurableStore>> DurableStore::open(const StoreOptions& options) {
  if (options.max_batch == 0 || options.max_pending == 0 || options.retention_batch == 0) {
    return Status(Code::InvalidArgument, "open store " + quoted(options.directory) +
                                             ": max_batch, max_pending and retention_batch must be > 0");
  }
  if (options.verify_on_open) {  // the walk in a child that may die (lib/ops/verify.hpp)
    auto report = verify_store_in_child(options.directory);
    if (!report.ok() && report.code() != Code::NotFound) return report.status();
    if (report.ok() && !report->ok()) {
      return Status(Code::Corruption, "open " + quoted(options.directory) + ": verify_on_open found " +
                                          std::to_string(report->problem_count) + " problem(s), the first: " +
                                          (report->problems.empty() ? std::string("?") : report->problems.front()) +
                                          "; run `lanebus verify " + options.directory + "` for all of them");
    }
  }
  LmdbEnv::Config cfg;
  cfg.path = options.directory;
  cfg.map_size_initial = options.map_size_initial;
  cfg.map_size_max = options.map_size_max;
  cfg.max_readers = options.max_readers;
  cfg.max_dbs = 32;  // 7 core databases + extension tables (StoreTable) + room to grow
  cfg.read_only = options.read_only;
  cfg.no_sync = options.durability == Durability::Async;
  auto env = LmdbEnv::open(cfg);
  if (!env.ok()) return env.status();
  std::unique_ptr<DurableStore> store(new DurableStore(options));
  store->env_ = std::move(*env);
  Status s = store->init_layout();
  if (!s.ok()) return s;
  if (!options.read_only && options.wake_on_commit) {
    // Best effort: without it other processes' appends arrive by the poll.
    auto wake = CommitWake::open(options.directory);
    if (wake.ok()) {
      store->wake_ = std::move(*wake);
      if (!store->wake_->has_slot()) {
        store->wake_status_ = Status(Code::Busy, "wake table " + quoted(options.directory + "/" + CommitWake::kFileName) +
                                                     " is full: this process's consumers rely on the poll");
      }
    } else {
      store->wake_status_ = wake.status();
    }
  }
  if (!options.read_only) {
    store->writer_->start();
  }
  return store;
}

Status DurableStore::init_layout() {
  const std::string& path = options_.directory;
  auto txn = options_.read_only ? env_->begin_read() : env_->begin_write();
  if (!txn.ok()) return txn.status();
  auto meta = env_->open_dbi(*txn, "meta", false);
  if (!meta.ok()) {
    if (meta.code() != Code::NotFound) return meta.status();
    // No lanebus metadata: a fresh environment, or someone else's.
    auto main_dbi = env_->open_dbi(*txn, nullptr, false);
    if (!main_dbi.ok()) return main_dbi.status();
    bool any_key = false;
    {
      // A write txn's cursors are freed by its commit: close this one first.
      auto c = LmdbCursor::open(*txn, *main_dbi, path);
      if (!c.ok()) return c.status();
      auto any = c->first();
      if (!any.ok()) return any.status();
      any_key = *any;
    }
    if (any_key) {
      return Status(Code::Corruption, "open " + quoted(path) +
                                          ": a foreign LMDB environment (no lanebus layout record); "
                                          "not a lanebus store");
    }
    if (options_.read_only) {
      return Status(Code::NotFound, "open " + quoted(path) + ": empty environment: not a lanebus store");
    }
    const char* names[] = {"meta", "topics", "lanes", "log", "groups", "cursors", "inflight"};
    LmdbDbi* slots[] = {&dbi_meta_, &dbi_topics_, &dbi_lanes_, &dbi_log_, &dbi_groups_, &dbi_cursors_, &dbi_inflight_};
    for (int i = 0; i < 7; ++i) {
      auto d = env_->open_dbi(*txn, names[i], true);
      if (!d.ok()) return d.status();
      *slots[i] = *d;
    }
    Status s = txn->put(dbi_meta_, "layout", encode_layout_record(kLayoutVersion));
    if (!s.ok()) return s;
    s = open_extension_tables(*txn);
    if (!s.ok()) return s;
    return txn->commit();
  }
  dbi_meta_ = *meta;
  auto layout = txn->get(dbi_meta_, "layout");
  if (!layout.ok()) {
    if (layout.code() == Code::NotFound) {
      return Status(Code::Corruption, "open " + quoted(path) + ": no layout record: not a lanebus store");
    }
    return layout.status();
  }
  if (layout->size() != 12 || std::memcmp(layout->data(), kLayoutMagic, 8) != 0) {
    return Status(Code::Corruption, "open " + quoted(path) + ": the layout record is not lanebus's (foreign data)");
  }
  std::uint32_t version = get_le32(layout->data() + 8);
  if (version > kLayoutVersion) {
    return Status(Code::VersionTooNew, "open " + quoted(path) + ": layout version " + std::to_string(version) +
                                           " was written by a newer lanebus; this release reads up to version " +
                                           std::to_string(kLayoutVersion));
  }
  if (version == 0) return Status(Code::Corruption, "open " + quoted(path) + ": layout version 0 is invalid");
  if (version < kLayoutVersion && !options_.read_only) {
    // Layout 2 adds record batches to the log (doc/storage-format.md); a layout-1
    // store needs no copy, only the new number, so that older releases refuse it.
    if (Status s = txn->put(dbi_meta_, "layout", encode_layout_record(kLayoutVersion)); !s.ok()) return s;
  }
  const char* names[] = {"topics", "lanes", "log", "groups", "cursors", "inflight"};
  LmdbDbi* slots[] = {&dbi_topics_, &dbi_lanes_, &dbi_log_, &dbi_groups_, &dbi_cursors_, &dbi_inflight_};
  for (int i = 0; i < 6; ++i) {
    auto d = env_->open_dbi(*txn, names[i], false);
    if (!d.ok()) {
      if (d.code() == Code::NotFound) {
        return Status(Code::Corruption, "open " + quoted(path) + ": database \"" + names[i] + "\" is missing");
      }
      return d.status();
    }
    *slots[i] = *d;
  }
  if (Status es = open_extension_tables(*txn); !es.ok()) return es;
  return txn->commit();  // keeps the dbi handles (also for a read-only txn)
}

Status DurableStore::open_extension_tables(LmdbTxn& txn) {
  static const char* const kNames[kStoreTables] = {"idem", "idem_age", "dlq", "dlq_audit", "fence", "user",
                                                    "tenancy", "schema", "delayed"};
  for (int i = 0; i < kStoreTables; ++i) {
    auto d = env_->open_dbi(txn, kNames[i], !options_.read_only);
    if (!d.ok()) {
      if (d.code() == Code::NotFound && options_.read_only) continue;  // never written: reads as empty
      return d.status();
    }
    dbi_ext_[i] = *d;
    ext_present_[i] = true;
  }
  return Status();
}

Status DurableStore::health() const {
  if (env_ && env_->fatal()) return env_->fatal_status();
  return Status();
}

Status DurableStore::close() {
  if (writer_->running() && writer_->on_writer_thread()) {
    return Status(Code::Busy, "close store " + quoted(options_.directory) + ": called from a completion callback");
  }
  writer_->stop();
  std::unique_lock<std::shared_mutex> life(life_mutex_);
  if (closed_.load()) return Status();
  // An InPlaceBatch still holding its read (it holds no lock): wait for its release.
  while (env_ && env_->held_reads() > 0) {
    life.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    life.lock();
    if (closed_.load()) return Status();
  }
  Status s;
  if (options_.durability == Durability::Async && !options_.read_only && env_ && !env_->fatal()) {
    s = env_->sync();
  }
  closed_.store(true);
  env_.reset();
  return s;
}

Status DurableStore::check_open() const {
  if (closed_.load()) return Status(Code::ShutDown, "store " + quoted(options_.directory) + " is closed");
  return Status();
}

Result<DurableStore::ReadView> DurableStore::begin_read() const {
  ReadView view{std::shared_lock<std::shared_mutex>(life_mutex_), LmdbTxn()};
  if (Status s = check_open(); !s.ok()) return s;
  auto txn = env_->begin_read();
  if (!txn.ok()) return txn.status();
  view.txn = std::move(*txn);
  return view;
}

Status DurableStore::check_writable() const {
  if (options_.read_only) {
    return Status(Code::InvalidArgument, "store " + quoted(options_.directory) + " is open read-only");
  }
  return check_open();
}

std::uint64_t DurableStore::map_size() const noexcept {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  return env_ ? env_->map_size() : 0;
}

StoreCounters DurableStore::counters() const noexcept {
  StoreCounters c;
  auto ld = [](const std::atomic<std::uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  c.appends = ld(counters_.appends);
  c.append_failures = ld(counters_.append_failures);
  c.commits = ld(counters_.commits);
  // The call's part first, with acquire: a commit's call time is added after
  // its whole time (release, count_commit), so commit_call_ns <= commit_ns in
  // every snapshot.
  c.commit_call_ns = counters_.commit_call_ns.load(std::memory_order_acquire);
  c.commit_ns = ld(counters_.commit_ns);
  c.fsyncs = ld(counters_.fsyncs);
  c.batched_ops = ld(counters_.batched_ops);
  c.max_batch = ld(counters_.max_batch);
  c.skipped_by_retention = ld(counters_.skipped_by_retention);
  c.retention_deleted = ld(counters_.retention_deleted);
  c.claims = ld(counters_.claims);
  c.redeliveries = ld(counters_.redeliveries);
  c.claims_ahead = ld(counters_.claims_ahead);
  c.claims_passed = ld(counters_.claims_passed);
  c.acks = ld(counters_.acks);
  c.stale_readers_cleared = ld(counters_.stale_readers_cleared);
  c.max_write_lock_wait_ns = ld(counters_.max_write_lock_wait_ns);
  if (wake_) {
    c.commit_wakes_sent = wake_->wakes_sent();
    c.commit_wakes_received = wake_->woken();
  }
  {
    std::shared_lock<std::shared_mutex> life(life_mutex_);
    c.map_growths = env_ ? env_->map_growths() : 0;
  }
  return c;
}

std::uint32_t DurableStore::commit_wake_seq() const noexcept { return wake_ ? wake_->seq() : 0; }

bool DurableStore::wait_for_commit(std::uint32_t seen, std::chrono::nanoseconds timeout) noexcept {
  return wake_ ? wake_->wait(seen, timeout) : false;
}

void DurableStore::interrupt_commit_wait() noexcept {
  if (wake_) wake_->interrupt();
}

bool DurableStore::has_commit_wake() const noexcept { return wake_ && wake_->has_slot(); }

void DurableStore::set_append_listener(
    std::function<void(std::uint32_t, std::uint32_t, std::uint64_t)> listener) {
  writer_->set_listener(std::move(listener));
}

void DurableStore::log_failure(const char* what, const Status& st) noexcept {
  const Logger* log = logger_.load(std::memory_order_acquire);
  if (log == nullptr || !log->enabled()) return;
  log->limited(failure_log_, LogLevel::Error, "store \"%s\": %s failed: %s", options_.directory.c_str(), what,
               st.to_string().c_str());
}

Status DurableStore::sync() {
  std::shared_lock<std::shared_mutex> life(life_mutex_);
  Status s = check_writable();
  if (!s.ok()) return s;
  if (options_.durability == Durability::Sync) return Status();
  s = env_->sync();
  if (s.ok()) counters_.fsyncs.fetch_add(1, std::memory_order_relaxed);  // relaxed: statistic
  if (!s.ok()) log_failure("sync", s);
  return s;
}

// ======================================================================
// extensions: StoreTxn over the writer's transaction, or a read transaction

Status DurableStore::write(const std::function<Status(StoreTxn&)>& fn) {
  return writer_->run_write(
      [this, &fn](WriteCtx& ctx) -> Status {
        StoreTxn t(this, &ctx, ctx.txn, ctx.now_ns);
        return fn(t);
      },
      false);
}

Status DurableStore::read(const std::function<Status(StoreTxn&)>& fn) {
  auto view = begin_read();
  if (!view.ok()) return view.status();
  StoreTxn t(this, nullptr, &view->txn, WallClock::realtime_ns());
  return fn(t);
}

Status DurableStore::write_async(std::function<Status(StoreTxn&)> fn, StatusCallback done) {
  Status s = check_writable();
  if (!s.ok()) return s;
  WriteOp op;
  op.done = std::move(done);
  op.apply = [this, fn = std::move(fn)](WriteCtx& ctx) -> Status {
    StoreTxn t(this, &ctx, ctx.txn, ctx.now_ns);
    return fn(t);
  };
  return writer_->enqueue(std::move(op), true);
}

Status DurableStore::delayed_async(AppendRequest request, std::uint32_t tiebreak, StatusCallback done) {
  Status s = check_writable();
  if (!s.ok()) return s;
  WriteOp op;
  op.is_delayed = true;
  op.request = std::move(request);
  op.delayed_tiebreak = tiebreak;
  op.done = std::move(done);
  return writer_->enqueue(std::move(op), true);
}

// ======================================================================
// the parts' public calls

Result<TopicRef> DurableStore::open_topic(std::string_view name, const TopicSpec& spec) {
  return log_->open_topic(name, spec);
}
Result<TopicRef> DurableStore::find_topic(std::string_view name) { return log_->find_topic(name); }
Result<std::vector<TopicRef>> DurableStore::list_topics() { return log_->list_topics(); }
Result<AppendResult> DurableStore::append(AppendRequest request) { return log_->append(std::move(request)); }
Status DurableStore::append_async(AppendRequest request, AppendCallback done) {
  return log_->append_async(std::move(request), std::move(done));
}
DurableStore::AppendBatchResult DurableStore::append_batch(std::span<AppendRequest> requests) {
  return log_->append_batch(requests);
}
Result<std::uint64_t> DurableStore::reserve_ids(std::uint64_t count) { return log_->reserve_ids(count); }
Result<ReadBatch> DurableStore::read(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                     const ReadLimits& limits) {
  return log_->read(topic, lane, from, limits);
}
Status DurableStore::read_into(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                               const ReadLimits& limits, ReadBatch* out) {
  return log_->read_into(topic, lane, from, limits, out);
}
Status DurableStore::read_in_place(const TopicRef& topic, std::uint32_t lane, std::uint64_t from,
                                   const ReadLimits& limits, InPlaceBatch* out) {
  return log_->read_in_place(topic, lane, from, limits, out);
}
bool DurableStore::map_at_max() const noexcept { return env_ != nullptr && env_->map_at_max(); }
bool DurableStore::in_map(const void* p) const noexcept { return env_ != nullptr && env_->in_map(p); }
Result<std::uint64_t> DurableStore::end_offset(const TopicRef& topic, std::uint32_t lane) {
  return log_->end_offset(topic, lane);
}
Status DurableStore::end_offsets(const TopicRef& topic, std::uint64_t* ends) { return log_->end_offsets(topic, ends); }
Result<LaneInfo> DurableStore::lane_info(const TopicRef& topic, std::uint32_t lane) {
  return log_->lane_info(topic, lane);
}
Result<std::uint64_t> DurableStore::offset_for_time(const TopicRef& topic, std::uint32_t lane, std::int64_t ts_ns) {
  return log_->offset_for_time(topic, lane, ts_ns);
}

Result<GroupRef> DurableStore::open_group(const TopicRef& topic, std::string_view name, StartPosition start) {
  return groups_->open_group(topic, name, start);
}
Result<GroupRef> DurableStore::find_group(const TopicRef& topic, std::string_view name) {
  return groups_->find_group(topic, name);
}
Result<std::vector<GroupRef>> DurableStore::list_groups(const TopicRef& topic) { return groups_->list_groups(topic); }
Result<std::vector<GroupLaneInfo>> DurableStore::group_info(const GroupRef& group) {
  return groups_->group_info(group);
}
Status DurableStore::commit_offset(const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  return groups_->commit_offset(group, lane, offset);
}
Status DurableStore::commit_offset_async(const GroupRef& group, std::uint32_t lane, std::uint64_t offset,
                                         StatusCallback done) {
  return groups_->commit_offset_async(group, lane, offset, std::move(done));
}
Status DurableStore::seek(const GroupRef& group, const StartPosition& start) { return groups_->seek(group, start); }

Result<std::optional<ClaimedMessage>> DurableStore::claim(const GroupRef& group, std::uint32_t lane,
                                                          const ClaimOptions& options) {
  return claims_->claim(group, lane, options);
}
Result<std::vector<ClaimedMessage>> DurableStore::claim_batch(const GroupRef& group, std::uint32_t lane,
                                                              std::uint32_t max, const ClaimOptions& options) {
  return claims_->claim_batch(group, lane, max, options);
}
Status DurableStore::ack(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt) {
  return claims_->ack(group, lane, offset, attempt);
}
Status DurableStore::release(const GroupRef& group, std::uint32_t lane, std::uint64_t offset, std::uint32_t attempt,
                             std::chrono::milliseconds delay) {
  return claims_->release(group, lane, offset, attempt, delay);
}
void DurableStore::watch_claims(ClaimAhead* box) { claims_->watch(box); }
void DurableStore::unwatch_claims(ClaimAhead* box) { claims_->unwatch(box); }
Status DurableStore::request_claims(ClaimAhead* box) {
  if (Status s = check_writable(); !s.ok()) return s;
  return claims_->request(box);
}
Status DurableStore::give_back_claims(std::span<const ClaimedMessage> claims, const GroupRef& group,
                                      std::uint32_t lane) {
  if (Status s = check_writable(); !s.ok()) return s;
  return claims_->give_back(claims, group, lane);
}
Status DurableStore::give_back_claims_async(std::vector<ClaimedMessage> claims, const GroupRef& group,
                                            std::uint32_t lane) {
  if (Status s = check_writable(); !s.ok()) return s;
  return claims_->give_back_later(std::move(claims), group, lane, true);
}

Status DurableStore::run_retention() { return retention_->run(); }

}  // namespace lanebus::detail
