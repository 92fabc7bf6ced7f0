// lanebus — MIT License.
// The dead-letter queue (doc/dlq.md) on the durable store's `dlq` / `dlq_audit`
// tables: entry and audit encodings, arrivals, review, retention, quota,
// automatic transient replay and the persisted counters.
//
// Invariants (each holds after every committed transaction):
// 1. "e"+id exists for every entry; "p"+id exists iff that entry is Pending.
// 2. The stats record's pending/replayed/archived/entries/bytes equal what a
//    full scan of the "e" records would give (every writer updates both in
//    the same transaction).
// 3. Entry ids and audit seqs only grow (next_id / next_seq live in the stats
//    record, written under LMDB's single-writer lock).
#include "dlq.hpp"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <map>

#include "coding.hpp"
#include "header_block.hpp"
#include "names.hpp"
#include "quote.hpp"

namespace lanebus {

const char* to_string(ErrorClass c) noexcept {
  switch (c) {
    case ErrorClass::Transient: return "transient";
    case ErrorClass::Permanent: return "permanent";
    case ErrorClass::Poison: return "poison";
    case ErrorClass::Expired: return "expired";
  }
  return "unknown";
}

const char* to_string(DlqState s) noexcept {
  switch (s) {
    case DlqState::Pending: return "pending";
    case DlqState::Replayed: return "replayed";
    case DlqState::Archived: return "archived";
  }
  return "unknown";
}

const char* to_string(DlqAction a) noexcept {
  switch (a) {
    case DlqAction::Replay: return "replay";
    case DlqAction::Archive: return "archive";
    case DlqAction::Purge: return "purge";
    case DlqAction::AutoReplay: return "auto-replay";
    case DlqAction::Expire: return "expire";
  }
  return "unknown";
}

std::optional<ErrorClass> parse_error_class(std::string_view t) noexcept {
  if (t == "transient") return ErrorClass::Transient;
  if (t == "permanent") return ErrorClass::Permanent;
  if (t == "poison") return ErrorClass::Poison;
  if (t == "expired") return ErrorClass::Expired;
  return std::nullopt;
}

std::optional<DlqState> parse_dlq_state(std::string_view t) noexcept {
  if (t == "pending") return DlqState::Pending;
  if (t == "replayed") return DlqState::Replayed;
  if (t == "archived") return DlqState::Archived;
  return std::nullopt;
}

ErrorClass classify_failure(Outcome::Kind last, std::uint32_t attempts, std::uint32_t attempts_with_outcome,
                            bool timed_out, std::uint32_t poison_after_crashes) noexcept {
  assert(last != Outcome::Kind::Ack);
  (void)timed_out;  // a timed-out attempt is a retry budget spent on an unavailable dependency: transient
  const std::uint32_t crashes = attempts > attempts_with_outcome ? attempts - attempts_with_outcome : 0;
  if (poison_after_crashes > 0 && crashes >= poison_after_crashes) return ErrorClass::Poison;
  if (last == Outcome::Kind::Reject) return ErrorClass::Permanent;
  return ErrorClass::Transient;
}

}  // namespace lanebus

namespace lanebus::detail {
namespace {

// Entry format 1; format 2 (an entry with headers) appends them as a str32
// after the group. An entry without headers is written as format 1, byte for
// byte as before, so older readers refuse only entries they could not read.
constexpr std::uint8_t kEntryVersion = 1;
constexpr std::uint8_t kEntryVersionHeaders = 2;
constexpr std::uint8_t kAuditVersion = 1;
constexpr std::uint64_t kStatsVersion = 1;
constexpr std::size_t kMaxKeyBytes = 65535;
constexpr std::size_t kMaxTextBytes = 64 * 1024;
constexpr std::uint64_t kMaxPayload = 1ull << 30;
// Byte offset of dead_at_ns in an encoded entry (after version, class, state,
// reserved and id): counters() reads it without decoding the payload.
constexpr std::size_t kDeadAtOffset = 12;


// Records: ByteWriter / ByteReader (coding.hpp).

std::string entry_key(std::uint64_t id) {
  std::string k = "e";
  put_be64(k, id);
  return k;
}
std::string pending_key(std::uint64_t id) {
  std::string k = "p";
  put_be64(k, id);
  return k;
}
std::string audit_key(std::uint64_t seq) {
  std::string k;
  put_be64(k, seq);
  return k;
}
std::string outcome_key(const GroupRef& g, std::uint32_t lane, std::uint64_t offset) {
  std::string k = "o";
  put_be32(k, g.topic_id);
  put_be32(k, g.group_id);
  put_be32(k, lane);
  put_be64(k, offset);
  return k;
}
constexpr std::string_view kStatsKey = "s";

std::string encode_audit(const DlqAuditRecord& r) {
  ByteWriter w;
  w.u8(kAuditVersion);
  w.u8(static_cast<std::uint8_t>(r.action));
  w.i64(r.at_ns);
  w.str32(r.operator_name);
  w.u32(static_cast<std::uint32_t>(r.ids.size()));
  for (std::uint64_t id : r.ids) w.u64(id);
  return w.take();
}

Result<DlqAuditRecord> decode_audit(std::string_view key, std::string_view v) {
  ByteReader r(v);
  DlqAuditRecord a;
  std::uint8_t ver = r.u8();
  std::uint8_t act = r.u8();
  a.at_ns = r.i64();
  a.operator_name = r.str32();
  std::uint32_t n = r.u32();
  if (r.ok() && n <= v.size() / 8) {
    a.ids.reserve(n);
    for (std::uint32_t i = 0; i < n; ++i) a.ids.push_back(r.u64());
  }
  if (key.size() != 8 || !r.done() || ver != kAuditVersion || act > static_cast<std::uint8_t>(DlqAction::Expire) ||
      a.ids.size() != n) {
    return Status(Code::Corruption, "dlq audit record is malformed (foreign data or a newer layout)");
  }
  a.action = static_cast<DlqAction>(act);
  a.seq = get_be64(key.data());
  return a;
}

bool matches(const DlqEntry& e, const DlqFilter& f, std::int64_t now) {
  if (f.topic && e.topic != *f.topic) return false;
  if (f.group && e.group != *f.group) return false;
  if (f.error_class && e.error_class != *f.error_class) return false;
  if (f.state && e.state != *f.state) return false;
  if (f.older_than) {
    const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(*f.older_than).count();
    if (e.dead_at_ns > now - ns) return false;
  }
  if (f.newer_than) {
    const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(*f.newer_than).count();
    if (e.dead_at_ns < now - ns) return false;
  }
  return true;
}

Status check_ids(std::span<const std::uint64_t> ids, std::string_view op, std::string_view what,
                 std::vector<std::uint64_t>* out) {
  if (op.empty()) {
    return Status(Code::InvalidArgument, "dlq " + std::string(what) + ": an operator name is required (audit: who)");
  }
  if (ids.empty()) return Status(Code::InvalidArgument, "dlq " + std::string(what) + ": no entry ids given");
  out->assign(ids.begin(), ids.end());
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
  return Status();
}

std::string state_note(const DlqEntry& e) {
  std::string s = std::string("already ") + to_string(e.state);
  if (!e.state_changed_by.empty()) s += " by " + quoted(e.state_changed_by);
  return s;
}

}  // namespace

// ======================================================================
// encodings

std::string encode_dlq_entry(const DlqEntry& e) {
  ByteWriter w;
  w.reserve(160 + e.key.size() + e.idempotency_key.size() + e.payload.size() + e.reason.size() +
            e.error_text.size() + e.topic.size() + e.group.size() + e.state_changed_by.size() + e.headers.size());
  w.u8(e.headers.empty() ? kEntryVersion : kEntryVersionHeaders);
  w.u8(static_cast<std::uint8_t>(e.error_class));
  w.u8(static_cast<std::uint8_t>(e.state));
  w.u8(0);
  w.u64(e.id);
  w.i64(e.dead_at_ns);  // at kDeadAtOffset
  w.i64(e.state_changed_at_ns);
  w.u64(e.replay_offset);
  w.u64(e.header.id);
  w.i64(e.header.created_at_ns);
  w.u64(e.header.correlation_id);
  w.u64(e.header.fencing_token);
  w.u32(e.header.attempt);
  w.u16(e.header.content_type);
  w.u16(e.header.schema_version);
  w.u32(e.attempts);
  w.i64(e.first_failure_ns);
  w.i64(e.last_failure_ns);
  w.u32(e.topic_id);
  w.u32(e.lane);
  w.u64(e.offset);
  w.str32(e.state_changed_by);
  w.str32(e.key);
  w.str32(e.idempotency_key);
  w.str32(e.payload);
  w.str32(e.reason);
  w.str32(e.error_text);
  w.str32(e.topic);
  w.str32(e.group);
  if (!e.headers.empty()) w.str32(e.headers);
  return w.take();
}

Result<DlqEntry> decode_dlq_entry(std::string_view bytes) {
  ByteReader r(bytes);
  DlqEntry e;
  std::uint8_t ver = r.u8();
  std::uint8_t cls = r.u8();
  std::uint8_t st = r.u8();
  (void)r.u8();
  e.id = r.u64();
  e.dead_at_ns = r.i64();
  e.state_changed_at_ns = r.i64();
  e.replay_offset = r.u64();
  e.header.id = r.u64();
  e.header.created_at_ns = r.i64();
  e.header.correlation_id = r.u64();
  e.header.fencing_token = r.u64();
  e.header.attempt = r.u32();
  e.header.content_type = r.u16();
  e.header.schema_version = r.u16();
  e.attempts = r.u32();
  e.first_failure_ns = r.i64();
  e.last_failure_ns = r.i64();
  e.topic_id = r.u32();
  e.lane = r.u32();
  e.offset = r.u64();
  e.state_changed_by = r.str32();
  e.key = r.str32();
  e.idempotency_key = r.str32();
  e.payload = r.str32();
  e.reason = r.str32();
  e.error_text = r.str32();
  e.topic = r.str32();
  e.group = r.str32();
  if (ver == kEntryVersionHeaders) e.headers = r.str32();
  const bool known = ver == kEntryVersion || (ver == kEntryVersionHeaders && !e.headers.empty() &&
                                              valid_header_block(e.headers));
  if (!r.done() || !known || cls > 3 || st > 2) {
    return Status(Code::Corruption, "dlq entry record is malformed (" + std::to_string(bytes.size()) +
                                        " bytes; foreign data or a newer layout)");
  }
  e.error_class = static_cast<ErrorClass>(cls);
  e.state = static_cast<DlqState>(st);
  return e;
}

// ======================================================================
// the stats record

struct DlqStore::Stats {
  std::uint64_t next_id = 1, next_seq = 1;
  std::uint64_t pending = 0, replayed = 0, archived = 0, entries = 0, bytes = 0;
  std::uint64_t arrivals[4] = {0, 0, 0, 0};
  std::uint64_t replays = 0, auto_replays = 0, purged = 0, expired = 0, dropped = 0;

  // Field 16 (arrivals of class `expired`) was appended later: a record of
  // kOldFields (written before) reads it as 0.
  static constexpr int kOldFields = 16;
  static constexpr int kFields = 17;
  std::uint64_t* field(int i) {
    std::uint64_t* f[kFields] = {nullptr,      &next_id,     &next_seq,    &pending,      &replayed, &archived,
                                 &entries,     &bytes,       &arrivals[0], &arrivals[1],  &arrivals[2],
                                 &replays,     &auto_replays, &purged,     &expired,      &dropped,
                                 &arrivals[3]};
    return f[i];
  }

  static Result<Stats> load(StoreTxn& txn) {
    Stats s;
    auto v = txn.get(StoreTable::Dlq, kStatsKey);
    if (!v.ok()) {
      if (v.code() == Code::NotFound) return s;
      return v.status();
    }
    ByteReader r(*v);
    std::uint64_t ver = r.u64();
    for (int i = 1; i < kOldFields; ++i) *s.field(i) = r.u64();
    if (!r.done()) *s.field(kOldFields) = r.u64();
    if (!r.done() || ver != kStatsVersion) {
      return Status(Code::Corruption, "dlq stats record is malformed (foreign data or a newer layout)");
    }
    return s;
  }
  Status save(StoreTxn& txn) {
    ByteWriter w;
    w.u64(kStatsVersion);
    for (int i = 1; i < kFields; ++i) w.u64(*field(i));
    std::string b = w.take();
    return txn.put(StoreTable::Dlq, kStatsKey, b);
  }
  std::uint64_t& count_of(DlqState st) {
    return st == DlqState::Pending ? pending : st == DlqState::Replayed ? replayed : archived;
  }
};

namespace {

// Remove entry `e` (encoded size `size`) and its pending index; update stats.
template <typename StatsT>
Status delete_entry(StoreTxn& txn, StatsT& stats, const DlqEntry& e, std::size_t size) {
  Status s = txn.del(StoreTable::Dlq, entry_key(e.id));
  if (!s.ok()) return s;
  if (e.state == DlqState::Pending) {
    s = txn.del(StoreTable::Dlq, pending_key(e.id));
    if (!s.ok() && s.code() != Code::NotFound) return s;
  }
  stats.count_of(e.state) -= 1;
  stats.entries -= 1;
  stats.bytes -= std::min<std::uint64_t>(stats.bytes, size);
  return Status();
}

// Write new entry `e` (encoded `enc`, id = stats.next_id) with its pending
// index, count it and save the stats: the inverse of delete_entry.
template <typename StatsT>
Status insert_entry(StoreTxn& txn, StatsT& stats, const DlqEntry& e, std::string_view enc) {
  Status s = txn.put(StoreTable::Dlq, entry_key(e.id), enc);
  if (!s.ok()) return s;
  if (e.state == DlqState::Pending) {
    s = txn.put(StoreTable::Dlq, pending_key(e.id), std::string_view());
    if (!s.ok()) return s;
  }
  stats.next_id += 1;
  stats.count_of(e.state) += 1;
  stats.entries += 1;
  stats.bytes += enc.size();
  stats.arrivals[static_cast<int>(e.error_class)] += 1;
  return stats.save(txn);
}

// Rewrite entry `e` (old encoded size `old_size`) in state `to`.
template <typename StatsT>
Status change_state(StoreTxn& txn, StatsT& stats, DlqEntry e, std::size_t old_size, DlqState to,
                    std::string_view by, std::int64_t at, std::uint64_t replay_offset) {
  const DlqState from = e.state;
  e.state = to;
  e.state_changed_by = std::string(by);
  e.state_changed_at_ns = at;
  if (to == DlqState::Replayed) e.replay_offset = replay_offset;
  std::string enc = encode_dlq_entry(e);
  Status s = txn.put(StoreTable::Dlq, entry_key(e.id), enc);
  if (!s.ok()) return s;
  if (from == DlqState::Pending) {
    s = txn.del(StoreTable::Dlq, pending_key(e.id));
    if (!s.ok() && s.code() != Code::NotFound) return s;
  }
  stats.count_of(from) -= 1;
  stats.count_of(to) += 1;
  stats.bytes = stats.bytes - std::min<std::uint64_t>(stats.bytes, old_size) + enc.size();
  return Status();
}

template <typename StatsT>
Status append_audit(StoreTxn& txn, StatsT& stats, DlqAction action, std::string_view op, std::int64_t at,
                    std::vector<std::uint64_t> ids) {
  DlqAuditRecord r;
  r.action = action;
  r.operator_name = std::string(op);
  r.at_ns = at;
  r.ids = std::move(ids);
  std::string v = encode_audit(r);
  return txn.put(StoreTable::DlqAudit, audit_key(stats.next_seq++), v);
}

// An entry read inside a transaction, with its encoded size.
struct Loaded {
  DlqEntry entry;
  std::size_t size = 0;
};

Result<std::optional<Loaded>> load_entry(StoreTxn& txn, std::uint64_t id) {
  auto v = txn.get(StoreTable::Dlq, entry_key(id));
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return std::optional<Loaded>();
    return v.status();
  }
  auto e = decode_dlq_entry(*v);
  if (!e.ok()) return Status(Code::Corruption, "dlq entry " + std::to_string(id) + ": " + std::string(e.status().message()));
  return std::optional<Loaded>(Loaded{std::move(*e), v->size()});
}

// Visit every entry (by id) from `after_id` + 1 on, decoded; stop when `visit` returns false.
Status scan_entries(StoreTxn& txn, std::uint64_t after_id,
                    const std::function<bool(const DlqEntry&, std::size_t)>& visit) {
  Status err;
  Status s = txn.scan(StoreTable::Dlq, entry_key(after_id + 1), "e", [&](std::string_view, std::string_view v) {
    auto e = decode_dlq_entry(v);
    if (!e.ok()) {
      err = e.status();
      return false;
    }
    return visit(*e, v.size());
  });
  if (!s.ok()) return s;
  return err;
}

// ---- replay

// The origin topics of the entries a replay resolved before its write (nullopt: not found).
using ReplayTopics = std::map<std::string, std::optional<TopicRef>>;

// Phase 1 of a replay (read): the ids that exist now (a missing one is
// NotFound unless `lenient`), and their durable origin topics, looked up so
// that the write cannot fail on them after its first write.
Status resolve_replay(DurableStore& store, const std::vector<std::uint64_t>& ids, bool lenient,
                      std::vector<std::uint64_t>* candidates, ReplayTopics* topics) {
  Status s = store.read([&](StoreTxn& txn) -> Status {
    candidates->clear();
    for (std::uint64_t id : ids) {
      auto l = load_entry(txn, id);
      if (!l.ok()) return l.status();
      if (!l->has_value()) {
        if (lenient) continue;
        return Status(Code::NotFound, "dlq replay: entry " + std::to_string(id) + " not found; nothing replayed");
      }
      const DlqEntry& e = (*l)->entry;
      if (e.topic_id != 0) topics->emplace(e.topic, std::nullopt);
      candidates->push_back(id);
    }
    return Status();
  });
  if (!s.ok()) return s;
  for (auto& [name, ref] : *topics) {
    auto t = store.find_topic(name);
    if (t.ok()) {
      ref = *t;
    } else if (t.code() != Code::NotFound) {
      return t.status();
    }
  }
  return Status();
}

// Why entry `entry_id` (`e`) cannot be replayed now (OK when it can): not pending, from an
// ephemeral topic with no republish hook, or its origin topic gone, fenced or
// with fewer lanes. The message ends with "nothing replayed".
Status replay_refusal(std::uint64_t entry_id, const DlqEntry& e, const ReplayTopics& topics, bool can_republish) {
  const std::string id = std::to_string(entry_id);
  if (e.state != DlqState::Pending) {
    return Status(Code::Conflict, "dlq replay: entry " + id + " is " + state_note(e) + "; nothing replayed");
  }
  if (e.topic_id == 0) {
    if (can_republish) return Status();
    return Status(Code::InvalidArgument, "dlq replay: entry " + id + " comes from ephemeral topic " + quoted(e.topic) +
                                             "; replay it through the Bus; nothing replayed");
  }
  auto it = topics.find(e.topic);
  if (it == topics.end() || !it->second) {
    return Status(Code::NotFound, "dlq replay: origin topic " + quoted(e.topic) + " of entry " + id +
                                      " not found; nothing replayed");
  }
  const TopicRef& ref = *it->second;
  if (!ref.fence.empty()) {
    // A fenced topic accepts appends only under the current lease
    // generation's token (doc/leases.md); an operator's replay holds none.
    return Status(Code::InvalidArgument, "dlq replay: origin topic " + quoted(e.topic) + " of entry " + id +
                                             " is fenced by lease " + quoted(ref.fence) +
                                             "; replay it through the lease holder; nothing replayed");
  }
  if (e.lane >= ref.lanes) {
    return Status(Code::InvalidArgument, "dlq replay: entry " + id + " lane " + std::to_string(e.lane) +
                                             " is out of range for topic " + quoted(e.topic) + "; nothing replayed");
  }
  return Status();
}

// Append a replayed entry to its origin topic, as a new message.
Result<AppendResult> append_replayed(StoreTxn& txn, const DlqEntry& e, std::uint32_t topic_id) {
  AppendRequest req;
  req.topic_id = topic_id;
  req.lane = e.lane;
  req.header = e.header;
  req.header.attempt = 0;
  req.header.created_at_ns = 0;  // the replay time: topic age retention must not drop it at once
  req.key = e.key;
  req.idempotency_key = e.idempotency_key;
  req.payload = e.payload;
  req.headers = e.headers;  // its trace context too (doc/tracing.md)
  return txn.append(std::move(req));
}

}  // namespace

// ======================================================================
// DlqStore

DlqStore::DlqStore(DurableStore& store, DlqOptions options, std::function<std::int64_t()> clock)
    : store_(store), options_(options), clock_(std::move(clock)) {
  if (options_.expire_batch == 0) options_.expire_batch = 1;
}

std::int64_t DlqStore::now(const StoreTxn& txn) const { return clock_ ? clock_() : txn.now_ns(); }

Status DlqStore::validate(const DlqEntry& e) {
  if (e.payload.empty()) return Status(Code::InvalidArgument, "dlq add: the payload is empty");
  Status s = check_name(e.topic, "topic");
  if (!s.ok()) return Status(s.code(), "dlq add: origin " + std::string(s.message()));
  if (e.group.empty()) return Status(Code::InvalidArgument, "dlq add: the consumer group is empty");
  if (e.group.size() > kMaxNameBytes) return Status(Code::InvalidName, "dlq add: the group name is longer than 200 bytes");
  if (e.key.size() > kMaxKeyBytes || e.idempotency_key.size() > kMaxKeyBytes) {
    return Status(Code::PayloadTooLarge, "dlq add: key and idempotency key are limited to 65535 bytes");
  }
  if (e.payload.size() > kMaxPayload) return Status(Code::PayloadTooLarge, "dlq add: payload is over 1 GiB");
  if (e.reason.size() > kMaxTextBytes || e.error_text.size() > kMaxTextBytes) {
    return Status(Code::PayloadTooLarge, "dlq add: reason and error text are limited to 64 KiB each");
  }
  if (static_cast<std::uint8_t>(e.error_class) > 3) return Status(Code::InvalidArgument, "dlq add: unknown error class");
  if (!valid_header_block(e.headers)) {
    return Status(Code::InvalidArgument, "dlq add: the headers are not a stored header block (HeadersView)");
  }
  return Status();
}

Result<std::uint64_t> DlqStore::add_in(StoreTxn& txn, const DlqEntry& entry, const std::function<Status()>& before_write) {
  return add_impl(txn, entry, before_write);
}

Result<std::uint64_t> DlqStore::add(const DlqEntry& entry) {
  std::uint64_t id = 0;
  Status s = store_.write([&](StoreTxn& txn) -> Status {
    id = 0;
    auto r = add_impl(txn, entry, {});
    if (!r.ok()) return r.status();
    id = *r;
    return Status();
  });
  if (!s.ok()) return s;
  return id;
}

Result<std::uint64_t> DlqStore::add_impl(StoreTxn& txn, const DlqEntry& entry,
                                         const std::function<Status()>& before_write) {
  if (!txn.writable()) return Status(Code::InvalidArgument, "dlq add: needs a write transaction");
  Status s = validate(entry);
  if (!s.ok()) return s;
  auto st = Stats::load(txn);
  if (!st.ok()) return st.status();
  Stats stats = *st;
  const std::int64_t at = now(txn);

  DlqEntry e = entry;
  e.id = stats.next_id;
  e.state = DlqState::Pending;
  e.dead_at_ns = at;
  e.state_changed_at_ns = 0;
  e.state_changed_by.clear();
  e.replay_offset = 0;
  std::string enc = encode_dlq_entry(e);

  // Quota (R13): decide everything before the first write.
  std::vector<Loaded> drop;
  const bool count_over = options_.max_entries != 0 && stats.entries + 1 > options_.max_entries;
  const bool bytes_over = options_.max_bytes != 0 && stats.bytes + enc.size() > options_.max_bytes;
  if (count_over || bytes_over) {
    std::string why = count_over ? "max_entries " + std::to_string(options_.max_entries) + " reached"
                                 : "max_bytes " + std::to_string(options_.max_bytes) + " reached";
    const bool never_fits = options_.max_bytes != 0 && enc.size() > options_.max_bytes;
    if (options_.overflow == DlqOverflow::RejectNew || never_fits) {
      rejected_.fetch_add(1, std::memory_order_relaxed);
      if (never_fits) why = "the entry alone (" + std::to_string(enc.size()) + " bytes) exceeds max_bytes";
      return Status(Code::QuotaExceeded, "dlq add (topic " + quoted(e.topic) + ", group " + quoted(e.group) + "): " + why +
                                             "; raise DlqOptions quota or review the DLQ");
    }
    std::uint64_t entries = stats.entries, bytes = stats.bytes;
    s = scan_entries(txn, 0, [&](const DlqEntry& old, std::size_t size) {
      drop.push_back(Loaded{old, size});
      entries -= 1;
      bytes -= std::min<std::uint64_t>(bytes, size);
      const bool c = options_.max_entries != 0 && entries + 1 > options_.max_entries;
      const bool b = options_.max_bytes != 0 && bytes + enc.size() > options_.max_bytes;
      return c || b;
    });
    if (!s.ok()) return s;
  }

  if (before_write) {
    s = before_write();
    if (!s.ok()) return s;
  }

  if (!drop.empty()) {
    std::vector<std::uint64_t> ids;
    for (const Loaded& d : drop) {
      s = delete_entry(txn, stats, d.entry, d.size);
      if (!s.ok()) return s;
      ids.push_back(d.entry.id);
      stats.dropped += 1;
    }
    s = append_audit(txn, stats, DlqAction::Expire, "quota", at, std::move(ids));
    if (!s.ok()) return s;
  }
  s = insert_entry(txn, stats, e, enc);
  if (!s.ok()) return s;
  return e.id;
}

// ---------------------------------------------------------------- namespace move

Result<std::uint64_t> DlqStore::import_in(StoreTxn& txn, DlqEntry e) {
  if (!txn.writable()) return Status(Code::InvalidArgument, "dlq import: needs a write transaction");
  auto st = Stats::load(txn);
  if (!st.ok()) return st.status();
  Stats stats = *st;
  e.id = stats.next_id;
  const std::string enc = encode_dlq_entry(e);
  Status s = insert_entry(txn, stats, e, enc);
  if (!s.ok()) return s;
  return e.id;
}

Status DlqStore::remove_in(StoreTxn& txn, std::uint64_t id) {
  if (!txn.writable()) return Status(Code::InvalidArgument, "dlq remove: needs a write transaction");
  auto st = Stats::load(txn);
  if (!st.ok()) return st.status();
  Stats stats = *st;
  auto loaded = load_entry(txn, id);
  if (!loaded.ok()) return loaded.status();
  if (!loaded->has_value()) return Status(Code::NotFound, "dlq entry " + std::to_string(id) + " not found");
  Status s = delete_entry(txn, stats, (*loaded)->entry, (*loaded)->size);
  if (!s.ok()) return s;
  return stats.save(txn);
}

// ---------------------------------------------------------------- review

Result<std::vector<DlqEntry>> DlqStore::list(const DlqFilter& filter) {
  std::vector<DlqEntry> out;
  Status s = store_.read([&](StoreTxn& txn) -> Status {
    const std::int64_t t = now(txn);
    return scan_entries(txn, filter.after_id, [&](const DlqEntry& e, std::size_t) {
      if (matches(e, filter, t)) out.push_back(e);
      return filter.limit == 0 || out.size() < filter.limit;
    });
  });
  if (!s.ok()) return s;
  return out;
}

Result<DlqEntry> DlqStore::show(std::uint64_t id) {
  std::optional<DlqEntry> out;
  Status s = store_.read([&](StoreTxn& txn) -> Status {
    auto l = load_entry(txn, id);
    if (!l.ok()) return l.status();
    if (l->has_value()) out = std::move((*l)->entry);
    return Status();
  });
  if (!s.ok()) return s;
  if (!out) return Status(Code::NotFound, "dlq entry " + std::to_string(id) + " not found");
  return std::move(*out);
}

Result<std::vector<DlqReplayed>> DlqStore::replay(std::span<const std::uint64_t> ids, std::string_view operator_name,
                                                  const DlqRepublish& republish) {
  std::vector<std::uint64_t> sorted;
  Status s = check_ids(ids, operator_name, "replay", &sorted);
  if (!s.ok()) return s;
  return replay_impl(std::move(sorted), operator_name, DlqAction::Replay, republish);
}

Result<std::vector<DlqReplayed>> DlqStore::replay_impl(std::vector<std::uint64_t> ids, std::string_view op,
                                                       DlqAction action, const DlqRepublish& republish) {
  // Automatic replay skips what it cannot do; an operator's replay refuses the batch.
  const bool lenient = action == DlqAction::AutoReplay;
  ReplayTopics topics;
  std::vector<std::uint64_t> candidates;
  Status s = resolve_replay(store_, ids, lenient, &candidates, &topics);
  if (!s.ok()) return s;

  // Phase 2 (write): re-check every entry, then append + mark + audit.
  std::vector<DlqReplayed> done;
  std::vector<DlqEntry> to_republish;
  s = store_.write([&](StoreTxn& txn) -> Status {
    done.clear();
    to_republish.clear();
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    Stats stats = *st;
    const std::int64_t at = now(txn);
    std::vector<Loaded> work;
    for (std::uint64_t id : candidates) {
      auto l = load_entry(txn, id);
      if (!l.ok()) return l.status();
      if (!l->has_value()) {
        if (lenient) continue;
        return Status(Code::NotFound, "dlq replay: entry " + std::to_string(id) + " not found; nothing replayed");
      }
      if (Status refused = replay_refusal(id, (*l)->entry, topics, static_cast<bool>(republish)); !refused.ok()) {
        if (lenient) continue;
        return refused;
      }
      work.push_back(std::move(**l));
    }
    if (work.empty()) return Status();  // lenient and nothing left: no write at all
    // From here on: writes only (storage errors abort the batch).
    std::vector<std::uint64_t> audited;
    for (Loaded& w : work) {
      DlqEntry& e = w.entry;
      DlqReplayed r{e.id, e.topic, e.lane, 0, e.topic_id == 0,
                    e.key.size() + e.idempotency_key.size() + e.payload.size()};
      if (e.topic_id != 0) {
        auto a = append_replayed(txn, e, topics[e.topic]->id);
        if (!a.ok()) return a.status();
        r.offset = a->offset;
      }
      s = change_state(txn, stats, e, w.size, DlqState::Replayed, op, at, r.offset);
      if (!s.ok()) return s;
      if (action == DlqAction::AutoReplay) {
        stats.auto_replays += 1;
      } else {
        stats.replays += 1;
      }
      if (e.topic_id == 0) {
        e.state = DlqState::Replayed;
        to_republish.push_back(e);
      }
      audited.push_back(e.id);
      done.push_back(std::move(r));
    }
    s = append_audit(txn, stats, action, op, at, std::move(audited));
    if (!s.ok()) return s;
    return stats.save(txn);
  });
  if (!s.ok()) return s;
  if (replay_listener_) {
    for (const DlqReplayed& r : done)
      if (!r.republished) replay_listener_(r.topic, r.bytes);
  }
  for (const DlqEntry& e : to_republish) {
    Status rs = republish(e);
    if (!rs.ok() && s.ok()) s = rs;
  }
  if (!s.ok()) return s;
  return done;
}

Status DlqStore::archive(std::span<const std::uint64_t> ids, std::string_view op) {
  std::vector<std::uint64_t> sorted;
  Status s = check_ids(ids, op, "archive", &sorted);
  if (!s.ok()) return s;
  return store_.write([&](StoreTxn& txn) -> Status {
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    Stats stats = *st;
    std::vector<Loaded> work;
    for (std::uint64_t id : sorted) {
      auto l = load_entry(txn, id);
      if (!l.ok()) return l.status();
      if (!l->has_value()) {
        return Status(Code::NotFound, "dlq archive: entry " + std::to_string(id) + " not found; nothing archived");
      }
      if ((*l)->entry.state == DlqState::Archived) {
        return Status(Code::Conflict, "dlq archive: entry " + std::to_string(id) + " is " + state_note((*l)->entry) +
                                          "; nothing archived");
      }
      work.push_back(std::move(**l));
    }
    const std::int64_t at = now(txn);
    for (const Loaded& w : work) {
      Status cs = change_state(txn, stats, w.entry, w.size, DlqState::Archived, op, at, 0);
      if (!cs.ok()) return cs;
    }
    Status as = append_audit(txn, stats, DlqAction::Archive, op, at, sorted);
    if (!as.ok()) return as;
    return stats.save(txn);
  });
}

Result<std::uint64_t> DlqStore::purge(std::span<const std::uint64_t> ids, std::string_view op) {
  std::vector<std::uint64_t> sorted;
  Status s = check_ids(ids, op, "purge", &sorted);
  if (!s.ok()) return s;
  s = store_.write([&](StoreTxn& txn) -> Status {
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    Stats stats = *st;
    std::vector<Loaded> work;
    for (std::uint64_t id : sorted) {
      auto l = load_entry(txn, id);
      if (!l.ok()) return l.status();
      if (!l->has_value()) {
        return Status(Code::NotFound, "dlq purge: entry " + std::to_string(id) + " not found; nothing purged");
      }
      work.push_back(std::move(**l));
    }
    for (const Loaded& w : work) {
      Status ds = delete_entry(txn, stats, w.entry, w.size);
      if (!ds.ok()) return ds;
      stats.purged += 1;
    }
    Status as = append_audit(txn, stats, DlqAction::Purge, op, now(txn), sorted);
    if (!as.ok()) return as;
    return stats.save(txn);
  });
  if (!s.ok()) return s;
  return static_cast<std::uint64_t>(sorted.size());
}

Result<std::uint64_t> DlqStore::purge(const DlqFilter& filter, std::string_view op) {
  if (op.empty()) return Status(Code::InvalidArgument, "dlq purge: an operator name is required (audit: who)");
  std::uint64_t n = 0;
  Status s = store_.write([&](StoreTxn& txn) -> Status {
    n = 0;
    const std::int64_t at = now(txn);
    std::vector<Loaded> work;
    Status ss = scan_entries(txn, filter.after_id, [&](const DlqEntry& e, std::size_t size) {
      if (matches(e, filter, at)) work.push_back(Loaded{e, size});
      return true;
    });
    if (!ss.ok()) return ss;
    if (work.empty()) return Status();
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    Stats stats = *st;
    std::vector<std::uint64_t> ids;
    for (const Loaded& w : work) {
      Status ds = delete_entry(txn, stats, w.entry, w.size);
      if (!ds.ok()) return ds;
      stats.purged += 1;
      ids.push_back(w.entry.id);
    }
    n = ids.size();
    Status as = append_audit(txn, stats, DlqAction::Purge, op, at, std::move(ids));
    if (!as.ok()) return as;
    return stats.save(txn);
  });
  if (!s.ok()) return s;
  return n;
}

Result<std::vector<DlqAuditRecord>> DlqStore::audit(std::uint64_t after_seq, std::uint32_t limit) {
  std::vector<DlqAuditRecord> out;
  Status s = store_.read([&](StoreTxn& txn) -> Status {
    Status err;
    Status ss = txn.scan(StoreTable::DlqAudit, audit_key(after_seq + 1), "", [&](std::string_view k, std::string_view v) {
      auto r = decode_audit(k, v);
      if (!r.ok()) {
        err = r.status();
        return false;
      }
      out.push_back(std::move(*r));
      return limit == 0 || out.size() < limit;
    });
    if (!ss.ok()) return ss;
    return err;
  });
  if (!s.ok()) return s;
  return out;
}

// ---------------------------------------------------------------- periodic

Result<std::uint64_t> DlqStore::expire() {
  if (options_.retention_max_age.count() <= 0 && options_.retention_max_count == 0) return std::uint64_t{0};
  std::uint64_t n = 0;
  Status s = store_.write([&](StoreTxn& txn) -> Status {
    n = 0;
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    Stats stats = *st;
    const std::int64_t at = now(txn);
    const std::int64_t age_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(options_.retention_max_age).count();
    std::uint64_t remaining = stats.entries;
    std::vector<Loaded> work;
    // Oldest first (ids grow with arrival): stop at the first entry no limit selects.
    Status ss = scan_entries(txn, 0, [&](const DlqEntry& e, std::size_t size) {
      const bool too_old = age_ns > 0 && e.dead_at_ns <= at - age_ns;
      const bool too_many = options_.retention_max_count != 0 && remaining > options_.retention_max_count;
      if (!too_old && !too_many) return false;
      work.push_back(Loaded{e, size});
      remaining -= 1;
      return work.size() < options_.expire_batch;
    });
    if (!ss.ok()) return ss;
    if (work.empty()) return Status();
    std::vector<std::uint64_t> ids;
    for (const Loaded& w : work) {
      Status ds = delete_entry(txn, stats, w.entry, w.size);
      if (!ds.ok()) return ds;
      stats.expired += 1;
      ids.push_back(w.entry.id);
    }
    n = ids.size();
    Status as = append_audit(txn, stats, DlqAction::Expire, "retention", at, std::move(ids));
    if (!as.ok()) return as;
    return stats.save(txn);
  });
  if (!s.ok()) return s;
  return n;
}

Result<std::uint64_t> DlqStore::replay_due_transient(std::chrono::milliseconds cooldown, std::string_view op,
                                                     const DlqRepublish& republish) {
  if (op.empty()) return Status(Code::InvalidArgument, "dlq auto-replay: an operator name is required (audit: who)");
  std::vector<std::uint64_t> due;
  Status s = store_.read([&](StoreTxn& txn) -> Status {
    due.clear();
    const std::int64_t limit_ns = now(txn) - std::chrono::duration_cast<std::chrono::nanoseconds>(cooldown).count();
    // Walk the pending index only: archived and replayed entries are never visited.
    std::vector<std::uint64_t> pending;
    Status ss = txn.scan(StoreTable::Dlq, "p", "p", [&](std::string_view k, std::string_view) {
      if (k.size() == 9) pending.push_back(get_be64(k.data() + 1));
      return true;
    });
    if (!ss.ok()) return ss;
    for (std::uint64_t id : pending) {
      auto l = load_entry(txn, id);
      if (!l.ok()) return l.status();
      if (!l->has_value()) continue;
      const DlqEntry& e = (*l)->entry;
      if (e.error_class != ErrorClass::Transient || e.dead_at_ns > limit_ns) continue;
      if (e.topic_id == 0 && !republish) continue;
      due.push_back(id);
      if (due.size() >= options_.expire_batch) break;
    }
    return Status();
  });
  if (!s.ok()) return s;
  if (due.empty()) return std::uint64_t{0};
  auto r = replay_impl(std::move(due), op, DlqAction::AutoReplay, republish);
  if (!r.ok()) return r.status();
  return static_cast<std::uint64_t>(r->size());
}

Result<DlqCounters> DlqStore::counters() {
  DlqCounters c;
  Status s = store_.read([&](StoreTxn& txn) -> Status {
    auto st = Stats::load(txn);
    if (!st.ok()) return st.status();
    const Stats& x = *st;
    c.pending = x.pending;
    c.replayed = x.replayed;
    c.archived = x.archived;
    c.entries = x.entries;
    c.bytes = x.bytes;
    for (int i = 0; i < 4; ++i) c.arrivals[i] = x.arrivals[i];
    c.replays = x.replays;
    c.auto_replays = x.auto_replays;
    c.purged = x.purged;
    c.expired = x.expired;
    c.dropped = x.dropped;
    std::optional<std::uint64_t> oldest;
    Status ss = txn.scan(StoreTable::Dlq, "p", "p", [&](std::string_view k, std::string_view) {
      if (k.size() == 9) oldest = get_be64(k.data() + 1);
      return false;
    });
    if (!ss.ok()) return ss;
    if (oldest) {
      auto v = txn.get(StoreTable::Dlq, entry_key(*oldest));
      if (!v.ok()) {
        return Status(v.code() == Code::NotFound ? Code::Corruption : v.code(),
                      "dlq: pending index names entry " + std::to_string(*oldest) + " which cannot be read");
      }
      if (v->size() < kDeadAtOffset + 8) return Status(Code::Corruption, "dlq entry record is malformed");
      ByteReader r(v->substr(kDeadAtOffset, 8));
      c.oldest_pending_at_ns = r.i64();
      const std::int64_t t = now(txn);
      c.oldest_pending_age_ns = t > c.oldest_pending_at_ns ? t - c.oldest_pending_at_ns : 0;
    }
    return Status();
  });
  if (!s.ok()) return s;
  c.rejected = rejected_.load(std::memory_order_relaxed);
  return c;
}

// ---------------------------------------------------------------- poison bookkeeping

Result<std::uint32_t> DlqStore::note_outcome_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                                std::uint64_t offset) {
  if (!txn.writable()) return Status(Code::InvalidArgument, "dlq note_outcome: needs a write transaction");
  auto n = outcomes_in(txn, group, lane, offset);
  if (!n.ok()) return n.status();
  const std::uint32_t next = *n + 1;
  ByteWriter w;
  w.u32(next);
  std::string v = w.take();
  Status s = txn.put(StoreTable::Dlq, outcome_key(group, lane, offset), v);
  if (!s.ok()) return s;
  return next;
}

Result<std::uint32_t> DlqStore::outcomes_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane,
                                            std::uint64_t offset) {
  auto v = txn.get(StoreTable::Dlq, outcome_key(group, lane, offset));
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return std::uint32_t{0};
    return v.status();
  }
  ByteReader r(*v);
  std::uint32_t n = r.u32();
  if (!r.done()) return Status(Code::Corruption, "dlq outcome record is malformed");
  return n;
}

Result<std::optional<DlqStore::TopicMark>> DlqStore::topic_mark_in(StoreTxn& txn, const GroupRef& group,
                                                                   std::uint32_t lane) {
  std::string k = "m";
  put_be32(k, group.topic_id);
  put_be32(k, group.group_id);
  put_be32(k, lane);
  auto v = txn.get(StoreTable::Dlq, k);
  std::optional<TopicMark> out;
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return out;
    return v.status();
  }
  if (v->size() != 28)
    return Status(Code::Corruption, "dlq: the delivery mark of group " + quoted(group.name) + " lane " +
                                        std::to_string(lane) + " is malformed");
  TopicMark m;
  std::memcpy(&m.from, v->data(), 8);
  std::memcpy(&m.to, v->data() + 8, 8);
  std::memcpy(&m.careful_to, v->data() + 16, 8);
  std::memcpy(&m.crashes, v->data() + 24, 4);
  out = m;
  return out;
}

Status DlqStore::set_topic_mark_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane, const TopicMark& m) {
  std::string k = "m";
  put_be32(k, group.topic_id);
  put_be32(k, group.group_id);
  put_be32(k, lane);
  char b[28];
  std::memcpy(b, &m.from, 8);
  std::memcpy(b + 8, &m.to, 8);
  std::memcpy(b + 16, &m.careful_to, 8);
  std::memcpy(b + 24, &m.crashes, 4);
  return txn.put(StoreTable::Dlq, k, std::string_view(b, sizeof(b)));
}

Status DlqStore::forget_outcomes_in(StoreTxn& txn, const GroupRef& group, std::uint32_t lane, std::uint64_t offset) {
  Status s = txn.del(StoreTable::Dlq, outcome_key(group, lane, offset));
  if (!s.ok() && s.code() != Code::NotFound) return s;
  return Status();
}

Status check_dlq_audit_record(std::string_view key, std::string_view value) {
  return decode_audit(key, value).status();
}

}  // namespace lanebus::detail
