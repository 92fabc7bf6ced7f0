// lanebus — MIT License.
// Idempotency tables: claim / complete / status / release over two tiers.
//
// Durable record, table `idem`:
//   key   = u16 BE scope length | scope | key bytes
//   value = u8 state | i64 LE written_at_ns | tail
//     state 1 (in progress): tail = the owner, ProcessIdentity::encode()
//       (37 bytes: u8 format 1 | u32 LE pid | u64 LE start time (field 22 of
//       /proc/<pid>/stat) | u64 LE pid namespace inode | 16 bytes boot id).
//       An empty tail is a record written before owners were recorded
//       (9 bytes); it, or a tail of an unknown format, has no known owner
//       and is only taken over after claim_timeout.
//     state 2 (done): tail = complete()'s result bytes.
// Age index, table `idem_age` (for durable_retention of done records):
//   key   = u16 BE scope length | scope | i64 BE written_at_ns | key bytes, value empty
//   Written by complete when durable_retention > 0 (done records completed
//   while retention was 0 have no entry and are kept for ever); consumed in
//   written_at order by expire().
//
// Who may take over an in-progress claim (claim_in):
//   - its owner is certainly dead (process_is_dead: an earlier boot, no such
//     pid, a reused pid, a zombie): at once, so a crash never stalls a key;
//   - otherwise (owner alive, this very process, or unknown): only after
//     claim_timeout, as before owners were recorded.
#include "idempotency.hpp"

#include <cstring>
#include <string>
#include <vector>

#include "coding.hpp"
#include "process_identity.hpp"

namespace lanebus::detail {

namespace {

constexpr std::uint8_t kInProgress = 1;
constexpr std::uint8_t kDone = 2;

// `tail`: the owner (in progress) or the result (done); see the top of the file.
std::string encode(std::uint8_t state, std::int64_t written_at, std::string_view tail) {
  std::string v(9 + tail.size(), '\0');
  v[0] = static_cast<char>(state);
  std::memcpy(v.data() + 1, &written_at, 8);
  if (!tail.empty()) std::memcpy(v.data() + 9, tail.data(), tail.size());
  return v;
}

struct Record {
  std::uint8_t state = 0;
  std::int64_t written_at = 0;
  std::string_view result;  // the tail: the result (done) or the owner (in progress)
};

// The owner of an in-progress record, if it names one in a known format.
bool owner_of(const Record& r, ProcessIdentity* owner) {
  return r.state == kInProgress && ProcessIdentity::decode(r.result, owner);
}

bool decode(std::string_view v, Record* r) {
  if (v.size() < 9) return false;
  r->state = static_cast<std::uint8_t>(v[0]);
  std::memcpy(&r->written_at, v.data() + 1, 8);
  r->result = v.substr(9);
  return r->state == kInProgress || r->state == kDone;
}

std::int64_t ms_to_ns(std::chrono::milliseconds ms) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count();
}

std::int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

IdempotencyImpl::IdempotencyImpl(DurableStore* store, std::string scope, const IdempotencyOptions& options)
    : store_(store),
      scope_(std::move(scope)),
      options_(options),
      hot_(options.hot_capacity, options.max_key_bytes, ms_to_ns(options.hot_ttl)) {}

Status IdempotencyImpl::check_key(std::string_view key) const {
  if (key.empty())
    return Status(Code::InvalidArgument, "idempotency scope \"" + scope_ + "\": the key is empty");
  if (key.size() > options_.max_key_bytes)
    return Status(Code::PayloadTooLarge, "idempotency scope \"" + scope_ + "\": key of " + std::to_string(key.size()) +
                                             " bytes exceeds max_key_bytes (" +
                                             std::to_string(options_.max_key_bytes) + ")");
  return Status();
}

std::string IdempotencyImpl::record_key(std::string_view key) const {
  std::string k;
  k.reserve(2 + scope_.size() + key.size());
  k.push_back(static_cast<char>((scope_.size() >> 8) & 0xff));
  k.push_back(static_cast<char>(scope_.size() & 0xff));
  k += scope_;
  k += key;
  return k;
}

std::string IdempotencyImpl::age_key(std::int64_t written_at, std::string_view key) const {
  std::string k;
  k.push_back(static_cast<char>((scope_.size() >> 8) & 0xff));
  k.push_back(static_cast<char>(scope_.size() & 0xff));
  k += scope_;
  put_be64(k, static_cast<std::uint64_t>(written_at));
  k += key;
  return k;
}

// A claim of a dead process taken over (claim_in; the writer's transaction,
// so the line may name a takeover whose transaction then fails: rare).
void IdempotencyImpl::log_takeover(std::string_view key, const ProcessIdentity& owner) noexcept {
  const Logger* log = store_ != nullptr ? store_->logger() : nullptr;
  if (log == nullptr || !log->enabled()) return;
  char shown[65];  // the key's first 64 bytes, unprintable ones as '.'
  std::size_t n = 0;
  for (; n < key.size() && n + 1 < sizeof shown; ++n) {
    const auto c = static_cast<unsigned char>(key[n]);
    shown[n] = (c >= 0x20 && c < 0x7f) ? static_cast<char>(c) : '.';
  }
  shown[n] = '\0';
  log->limited(takeover_log_, LogLevel::Warn,
               "idempotency scope \"%s\": key \"%s%s\" was in progress in process %u, which is dead: claim "
               "taken over",
               scope_.c_str(), shown, key.size() > n ? "..." : "", owner.pid);
}

Result<ClaimResult> IdempotencyImpl::claim_in(StoreTxn& txn, std::string_view key, bool want_result) {
  if (Status s = check_key(key); !s.ok()) return s;
  const StoreTable idem = StoreTable::Idempotency;
  const std::string rk = record_key(key);
  const ProcessIdentity self = self_identity();
  auto cur = txn.get(idem, rk);
  ClaimResult out;
  if (cur.ok()) {
    Record r;
    if (!decode(*cur, &r))
      return Status(Code::Corruption, "idempotency scope \"" + scope_ + "\": a damaged record for key \"" +
                                          std::string(key.substr(0, 64)) + "\"");
    if (r.state == kDone) {
      out.state = ClaimState::Done;
      out.written_at_ns = r.written_at;
      if (want_result) out.result.assign(r.result);
      return out;
    }
    // A claim whose owner is certainly dead is void at once. Our own claims
    // (another thread's) and live or unknown owners hold until claim_timeout.
    ProcessIdentity owner;
    const bool owner_dead = owner_of(r, &owner) && !(owner == self) && process_is_dead(owner);
    if (!owner_dead && txn.now_ns() - r.written_at <= ms_to_ns(options_.claim_timeout)) {
      out.state = ClaimState::InProgress;
      out.written_at_ns = r.written_at;
      return out;
    }
    // An abandoned claim (its owner died, or presumably died): take it over.
    if (owner_dead) log_takeover(key, owner);
  } else if (cur.code() != Code::NotFound) {
    return cur.status();
  }
  char owner_bytes[ProcessIdentity::kEncodedBytes];
  self.encode_to(owner_bytes);
  if (Status s = txn.put(idem, rk, encode(kInProgress, txn.now_ns(), {owner_bytes, sizeof owner_bytes})); !s.ok())
    return s;
  out.state = ClaimState::Claimed;
  out.written_at_ns = txn.now_ns();
  return out;
}

Status IdempotencyImpl::complete_in(StoreTxn& txn, std::string_view key, std::string_view result,
                                    bool must_be_claimed) {
  if (Status s = check_key(key); !s.ok()) return s;
  if (result.size() > options_.max_result_bytes)
    return Status(Code::PayloadTooLarge, "idempotency scope \"" + scope_ + "\": result of " +
                                             std::to_string(result.size()) + " bytes exceeds max_result_bytes");
  const StoreTable idem = StoreTable::Idempotency;
  const std::string rk = record_key(key);
  auto cur = txn.get(idem, rk);
  if (!cur.ok()) {
    if (cur.code() != Code::NotFound) return cur.status();
    if (must_be_claimed)
      return Status(Code::NotFound, "idempotency scope \"" + scope_ + "\": complete of key \"" +
                                        std::string(key.substr(0, 64)) + "\", which is not claimed");
  } else {
    Record r;
    if (!decode(*cur, &r) && must_be_claimed)
      return Status(Code::Corruption, "idempotency scope \"" + scope_ + "\": a damaged record");
    if (r.state == kDone) return Status();
  }
  if (Status s = txn.put(idem, rk, encode(kDone, txn.now_ns(), result)); !s.ok()) return s;
  if (options_.durable_retention.count() > 0)
    return txn.put(StoreTable::IdempotencyAge, age_key(txn.now_ns(), key), {});
  return Status();
}

void IdempotencyImpl::remember_done(std::string_view key, std::int64_t written_at) {
  hot_.put(key, HotTier::State::Done, written_at, wall_now_ns());
}

Result<ClaimResult> IdempotencyImpl::claim(std::string_view key, bool want_result) {
  if (Status s = check_key(key); !s.ok()) return s;
  std::int64_t written_at = 0;
  const std::int64_t now = wall_now_ns();
  if (!want_result && hot_.get(key, now, &written_at) == HotTier::State::Done) {
    ClaimResult out;
    out.state = ClaimState::Done;
    out.written_at_ns = written_at;
    return out;
  }
  ClaimResult out;
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    auto r = claim_in(txn, key, want_result);
    if (!r.ok()) return r.status();
    out = std::move(*r);
    return Status();
  });
  if (!s.ok()) return s;
  if (out.state == ClaimState::Done) hot_.put(key, HotTier::State::Done, out.written_at_ns, wall_now_ns());
  return out;
}

bool IdempotencyImpl::is_done(std::string_view key) {
  if (!check_key(key).ok()) return false;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
  std::int64_t written_at = 0;
  if (hot_.get(key, now, &written_at) == HotTier::State::Done) return true;
  auto st = status(key);
  if (!st.ok() || st->state != ClaimState::Done) return false;
  hot_.put(key, HotTier::State::Done, st->written_at_ns, wall_now_ns());
  return true;
}

Status IdempotencyImpl::complete(std::string_view key, std::string_view result) {
  std::int64_t at = 0;
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    at = txn.now_ns();
    return complete_in(txn, key, result);
  });
  if (s.ok()) hot_.put(key, HotTier::State::Done, at, wall_now_ns());
  return s;
}

Result<KeyStatus> IdempotencyImpl::status_in(StoreTxn& txn, std::string_view key) {
  if (Status s = check_key(key); !s.ok()) return s;
  KeyStatus out;
  auto cur = txn.get(StoreTable::Idempotency, record_key(key));
  if (!cur.ok()) {
    if (cur.code() == Code::NotFound)
      return Status(Code::NotFound, "idempotency scope \"" + scope_ + "\": no record of key \"" +
                                        std::string(key.substr(0, 64)) + "\"");
    return cur.status();
  }
  Record r;
  if (!decode(*cur, &r)) return Status(Code::Corruption, "idempotency scope \"" + scope_ + "\": a damaged record");
  out.state = r.state == kDone ? ClaimState::Done : ClaimState::InProgress;
  out.written_at_ns = r.written_at;
  if (r.state == kDone) out.result.assign(r.result);
  ProcessIdentity owner;
  if (owner_of(r, &owner)) {
    out.owner_pid = owner.pid;
    out.owner_dead = !(owner == self_identity()) && process_is_dead(owner);
  }
  return out;
}

Result<KeyStatus> IdempotencyImpl::status(std::string_view key) {
  if (Status s = check_key(key); !s.ok()) return s;
  KeyStatus out;
  Status s = store_->read([&](StoreTxn& txn) -> Status {
    auto r = status_in(txn, key);
    if (!r.ok()) return r.status();
    out = std::move(*r);
    return Status();
  });
  if (!s.ok()) return s;
  return out;
}

Status IdempotencyImpl::release(std::string_view key) {
  if (Status s = check_key(key); !s.ok()) return s;
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    const StoreTable idem = StoreTable::Idempotency;
    const std::string rk = record_key(key);
    auto cur = txn.get(idem, rk);
    Record r;
    if (!cur.ok() || !decode(*cur, &r) || r.state != kInProgress) {
      if (!cur.ok() && cur.code() != Code::NotFound) return cur.status();
      return Status(Code::NotFound, "idempotency scope \"" + scope_ + "\": release of key \"" +
                                        std::string(key.substr(0, 64)) +
                                        "\", which is not in progress (unknown, or done: done keys are never released)");
    }
    return txn.del(idem, rk);
  });
  if (s.ok()) hot_.forget(key);
  return s;
}

Result<std::uint64_t> IdempotencyImpl::expire(std::uint32_t max_records) {
  if (options_.durable_retention.count() <= 0 || max_records == 0) return std::uint64_t{0};
  std::uint64_t consumed = 0;
  std::vector<std::string> forgotten;  // user keys deleted, to drop from the hot tier after the commit
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    // This function may run more than once (a retried batch): reset first.
    consumed = 0;
    forgotten.clear();
    const std::int64_t cutoff = txn.now_ns() - ms_to_ns(options_.durable_retention);
    const std::string prefix = record_key({});
    // Age entries sort by written_at inside the scope: the due ones are a
    // prefix of the scan, so it stops at the first young entry or at the bound.
    std::vector<std::string> doomed;
    Status ss = txn.scan(StoreTable::IdempotencyAge, prefix, prefix,
                         [&](std::string_view k, std::string_view) {
                           if (doomed.size() >= max_records) return false;
                           if (k.size() >= prefix.size() + 8) {
                             std::uint64_t at = 0;
                             for (int i = 0; i < 8; ++i)
                               at = (at << 8) | static_cast<unsigned char>(k[prefix.size() + i]);
                             if (static_cast<std::int64_t>(at) >= cutoff) return false;
                           }
                           doomed.emplace_back(k);  // due, or too short to be ours (dropped)
                           return true;
                         });
    if (!ss.ok()) return ss;
    const StoreTable idem = StoreTable::Idempotency;
    for (const std::string& k : doomed) {
      if (k.size() >= prefix.size() + 8) {
        std::string_view user_key = std::string_view(k).substr(prefix.size() + 8);
        std::uint64_t at = 0;
        for (int i = 0; i < 8; ++i) at = (at << 8) | static_cast<unsigned char>(k[prefix.size() + i]);
        const std::string rk = record_key(user_key);
        auto cur = txn.get(idem, rk);
        if (!cur.ok() && cur.code() != Code::NotFound) return cur.status();
        Record r;
        // Only delete the done record this entry describes (never a newer
        // claim or completion of the same key).
        if (cur.ok() && decode(*cur, &r) && r.state == kDone && r.written_at == static_cast<std::int64_t>(at)) {
          if (Status d = txn.del(idem, rk); !d.ok() && d.code() != Code::NotFound) return d;
          forgotten.emplace_back(user_key);
        }
      }
      if (Status d = txn.del(StoreTable::IdempotencyAge, k); !d.ok() && d.code() != Code::NotFound) return d;
      ++consumed;
    }
    return Status();
  });
  if (!s.ok()) return s;
  // The hot tier must not answer Done for a key the durable tier forgot.
  for (const std::string& k : forgotten) hot_.forget(k);
  return consumed;
}

}  // namespace lanebus::detail

// ---------------------------------------------------------------- public API

namespace lanebus {

IdempotencyTable::IdempotencyTable(std::unique_ptr<detail::IdempotencyImpl> impl) noexcept : impl_(std::move(impl)) {}
IdempotencyTable::~IdempotencyTable() = default;

Result<ClaimResult> IdempotencyTable::claim(std::string_view key, bool want_result) {
  return impl_->claim(key, want_result);
}
Status IdempotencyTable::complete(std::string_view key, std::string_view result) {
  return impl_->complete(key, result);
}
Result<KeyStatus> IdempotencyTable::status(std::string_view key) { return impl_->status(key); }
Status IdempotencyTable::release(std::string_view key) { return impl_->release(key); }
std::string_view IdempotencyTable::scope() const noexcept { return impl_->scope(); }

}  // namespace lanebus
