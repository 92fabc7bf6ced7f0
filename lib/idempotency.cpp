// lanebus — MIT License.
// Idempotency tables: claim / complete / status / release over two tiers.
//
// Durable record, table `idem`:
//   key   = u16 BE scope length | scope | key bytes
//   value = u8 state (1 in progress, 2 done) | i64 LE written_at_ns | result bytes
// Age index, table `idem_age` (for durable_retention of done records):
//   key   = u16 BE scope length | scope | i64 BE written_at_ns | key bytes, value empty
#include "idempotency.hpp"

#include <cstring>

namespace lanebus::detail {

namespace {

constexpr std::uint8_t kInProgress = 1;
constexpr std::uint8_t kDone = 2;

std::string encode(std::uint8_t state, std::int64_t written_at, std::string_view result) {
  std::string v(9 + result.size(), '\0');
  v[0] = static_cast<char>(state);
  std::memcpy(v.data() + 1, &written_at, 8);
  if (!result.empty()) std::memcpy(v.data() + 9, result.data(), result.size());
  return v;
}

struct Record {
  std::uint8_t state = 0;
  std::int64_t written_at = 0;
  std::string_view result;
};

bool decode(std::string_view v, Record* r) {
  if (v.size() < 9) return false;
  r->state = static_cast<std::uint8_t>(v[0]);
  std::memcpy(&r->written_at, v.data() + 1, 8);
  r->result = v.substr(9);
  return r->state == kInProgress || r->state == kDone;
}

void put_be64(std::string& s, std::uint64_t v) {
  for (int i = 7; i >= 0; --i) s.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::int64_t ms_to_ns(std::chrono::milliseconds ms) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(ms).count();
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

Result<ClaimResult> IdempotencyImpl::claim_in(StoreTxn& txn, std::string_view key, bool want_result) {
  if (Status s = check_key(key); !s.ok()) return s;
  const StoreTable idem = StoreTable::Idempotency;
  const std::string rk = record_key(key);
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
    if (txn.now_ns() - r.written_at <= ms_to_ns(options_.claim_timeout)) {
      out.state = ClaimState::InProgress;
      out.written_at_ns = r.written_at;
      return out;
    }
    // An abandoned claim (its owner presumably died): take it over.
  } else if (cur.code() != Code::NotFound) {
    return cur.status();
  }
  if (Status s = txn.put(idem, rk, encode(kInProgress, txn.now_ns(), {})); !s.ok()) return s;
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
  hot_.put(key, HotTier::State::Done, written_at);
}

Result<ClaimResult> IdempotencyImpl::claim(std::string_view key, bool want_result) {
  if (Status s = check_key(key); !s.ok()) return s;
  std::int64_t written_at = 0;
  const std::int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
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
  if (out.state == ClaimState::Done) hot_.put(key, HotTier::State::Done, out.written_at_ns);
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
  hot_.put(key, HotTier::State::Done, st->written_at_ns);
  return true;
}

Status IdempotencyImpl::complete(std::string_view key, std::string_view result) {
  std::int64_t at = 0;
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    at = txn.now_ns();
    return complete_in(txn, key, result);
  });
  if (s.ok()) hot_.put(key, HotTier::State::Done, at);
  return s;
}

Result<KeyStatus> IdempotencyImpl::status(std::string_view key) {
  if (Status s = check_key(key); !s.ok()) return s;
  KeyStatus out;
  Status s = store_->read([&](StoreTxn& txn) -> Status {
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
    out.result.assign(r.result);
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
  if (s.ok()) hot_.put(key, HotTier::State::Unknown, 0);
  return s;
}

Result<std::uint64_t> IdempotencyImpl::expire(std::uint32_t max_records) {
  if (options_.durable_retention.count() <= 0) return std::uint64_t{0};
  std::uint64_t removed = 0;
  Status s = store_->write([&](StoreTxn& txn) -> Status {
    removed = 0;
    const std::int64_t cutoff = txn.now_ns() - ms_to_ns(options_.durable_retention);
    std::string prefix = record_key({});
    std::vector<std::string> doomed;
    Status ss = txn.scan(StoreTable::IdempotencyAge, prefix, prefix,
                         [&](std::string_view k, std::string_view) {
                           if (k.size() < prefix.size() + 8) return true;
                           std::uint64_t at = 0;
                           for (int i = 0; i < 8; ++i)
                             at = (at << 8) | static_cast<unsigned char>(k[prefix.size() + i]);
                           if (static_cast<std::int64_t>(at) >= cutoff || doomed.size() >= max_records) return false;
                           doomed.emplace_back(k);
                           return true;
                         });
    if (!ss.ok()) return ss;
    for (const std::string& k : doomed) {
      std::string_view user_key = std::string_view(k).substr(prefix.size() + 8);
      std::uint64_t at = 0;
      for (int i = 0; i < 8; ++i) at = (at << 8) | static_cast<unsigned char>(k[prefix.size() + i]);
      const StoreTable idem = StoreTable::Idempotency;
      auto cur = txn.get(idem, record_key(user_key));
      Record r;
      // Only delete if the record is still the done record this index entry describes.
      if (cur.ok() && decode(*cur, &r) && r.state == kDone && r.written_at == static_cast<std::int64_t>(at)) {
        if (Status d = txn.del(idem, record_key(user_key)); !d.ok() && d.code() != Code::NotFound) return d;
        ++removed;
      }
      if (Status d = txn.del(StoreTable::IdempotencyAge, k); !d.ok() && d.code() != Code::NotFound)
        return d;
    }
    return Status();
  });
  if (!s.ok()) return s;
  return removed;
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
