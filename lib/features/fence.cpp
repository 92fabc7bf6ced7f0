// lanebus — MIT License.
// Fenced sinks (doc/leases.md): fenced durable lanes (LaneFences, used by
// TopicLog::apply_append) and FencedResource, both keeping their
// high-water marks in the store's `fence` table.
#include "lanebus/fence.hpp"

#include <optional>
#include <utility>
#include <vector>

#include "bus_impl.hpp"
#include "coding.hpp"
#include "durable_store.hpp"
#include "fence_lane.hpp"
#include "fence_resource.hpp"
#include "hash.hpp"
#include "lanebus/lease.hpp"
#include "lease_table.hpp"
#include "names.hpp"
#include "quote.hpp"

// Design notes
//
// `fence` table keys (values little-endian):
//   'L' be32(topic) be32(scope)                    -> u64 HWM      (lane fence;
//        scope = lane, or kTopicScope when one HWM covers every lane)
//   'D' be32(topic) be32(scope) be64(token) 'K' idempotency key
//                                                  -> u64 offset, u64 id
//   'D' ... be64(token) 'H' be64(fnv1a(key))       -> u64 offset, u64 id, key
//        (keys longer than kRawIdemBytes, to stay under LMDB's 511-byte key limit)
//   'R' resource                                   -> u64 HWM, lease name
//
// Invariants:
//  1. A lane HWM only moves up, and only in the transaction that appends the
//     barrier message carrying that token; so after any crash the HWM equals
//     the highest token in the fenced log (nothing is ever appended above it).
//  2. Dedupe records exist only for the current generation of a fence: the
//     barrier deletes the older ones in its transaction.
//  3. Every decision (stale, duplicate, violation) is taken before any write
//     of its op; writes happen only after the op is known to be accepted.
//  4. The confirm hook never runs under a lanebus lock. For DurableStore
//     appends it runs on the caller's thread before enqueueing (a grant is a
//     fact about the past, so confirming early is exact); only StoreTxn::append
//     (already inside a transaction) confirms inline.

namespace lanebus::detail {
namespace {

constexpr std::size_t kRawIdemBytes = 256;


std::string dedupe_prefix(std::string_view fence_key) {
  std::string k(fence_key);
  k[0] = 'D';
  return k;
}

// A barrier the confirm function did not confirm. Transient answers keep
// their code (nothing changed; retry), everything else is FenceViolation.
Status refused(const std::string& what, std::string_view lease, std::uint64_t token, std::uint64_t hwm,
               const Status& answer) {
  const std::string head = what + ": token " + std::to_string(token) + " is above the high-water " +
                           std::to_string(hwm) + " (a generation barrier) and ";
  if (answer.code() == Code::Busy || answer.code() == Code::IOError || answer.code() == Code::ShutDown) {
    return Status(answer.code(), head + "the lease table could not confirm it now (" + answer.to_string() +
                                     "); the fence is unchanged");
  }
  return Status(Code::FenceViolation, head + "was not confirmed as a grant of lease " + quoted(lease) + " (" +
                                          answer.to_string() + "); the fence is unchanged");
}

Result<std::uint64_t> read_hwm(StoreTxn& txn, std::string_view key, const std::string& what) {
  auto v = txn.get(StoreTable::Fence, key);
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return std::uint64_t{0};
    return v.status();
  }
  if (v->size() < 8) return Status(Code::Corruption, what + ": the fence record is malformed");
  return get_le64(v->data());
}

Status call_confirm(const FenceConfirm& fn, std::string_view lease, std::uint64_t token) {
  if (!fn) return Status(Code::FenceViolation, "no lease confirmation hook is set");
  return fn(lease, token);
}

}  // namespace

// ---------------------------------------------------------------- keys

std::string lane_fence_key(std::uint32_t topic_id, std::uint32_t scope) {
  std::string k(1, 'L');
  put_be32(k, topic_id);
  put_be32(k, scope);
  return k;
}

std::string resource_fence_key(std::string_view resource) { return "R" + std::string(resource); }

Status validate_topic_fence(std::string_view topic, std::string_view fence, bool per_lane, std::uint32_t lanes) {
  if (fence.size() > kMaxFenceNameBytes) {
    return Status(Code::InvalidName, "topic " + quoted(topic) + ": fence name is " + std::to_string(fence.size()) +
                                         " bytes; at most " + std::to_string(kMaxFenceNameBytes));
  }
  Status s = validate_lease_name(fence);
  if (!s.ok()) return Status(Code::InvalidName, "topic " + quoted(topic) + ": fence: " + std::string(s.message()));
  (void)per_lane;
  (void)lanes;  // "<fence>/slot-<lane>" fits: lanes <= 4096 and the name leaves room.
  return Status();
}

Result<std::uint64_t> lane_fence_high_water(DurableStore& store, const TopicRef& topic, std::uint32_t lane) {
  if (topic.fence.empty()) return std::uint64_t{0};
  std::uint64_t out = 0;
  Status s = store.read([&](StoreTxn& txn) -> Status {
    auto h = read_hwm(txn, lane_fence_key(topic.id, topic.fence_per_lane ? lane : kTopicScope),
                      "topic " + quoted(topic.name));
    if (!h.ok()) return h.status();
    out = *h;
    return Status();
  });
  if (!s.ok()) return s;
  return out;
}

// ---------------------------------------------------------------- LaneFences

void LaneFences::set_confirm(FenceConfirmFn fn) {
  auto p = fn ? std::make_shared<const FenceConfirmFn>(std::move(fn)) : nullptr;
  MutexLock l(&mutex_);
  confirm_ = std::move(p);
  confirmed_.clear();  // another table may answer differently
}

std::string LaneFences::lease_for(const TopicRef& topic, std::uint32_t lane) {
  if (!topic.fence_per_lane) return topic.fence;
  return topic.fence + "/slot-" + std::to_string(lane);
}

Status LaneFences::confirm(std::string_view lease, std::uint64_t token) {
  std::shared_ptr<const FenceConfirmFn> fn;
  {
    MutexLock l(&mutex_);
    auto it = confirmed_.find(std::string(lease));
    if (it != confirmed_.end() && it->second == token) return Status();
    fn = confirm_;
  }
  if (!fn) return Status(Code::FenceViolation, "no lease confirmation hook is set on the store");
  Status s = (*fn)(lease, token);  // no lock held (invariant 4)
  if (s.ok()) {
    MutexLock l(&mutex_);
    auto& best = confirmed_[std::string(lease)];
    if (token > best) best = token;
  }
  return s;
}

FencePreconfirm LaneFences::preconfirm(const TopicRef& topic, std::uint32_t lane, std::uint64_t token) {
  FencePreconfirm p;
  p.status = confirm(lease_for(topic, lane), token);
  p.done = true;
  return p;
}

Status LaneFences::check(StoreTxn& txn, const TopicRef& topic, const AppendRequest& r, const FencePreconfirm& pre,
                         FencePlan* plan) {
  *plan = FencePlan();
  if (!check_enabled()) return Status();
  const std::uint64_t token = r.header.fencing_token;
  const std::string what = "append to " + quoted(topic.name) + " lane " + std::to_string(r.lane);
  if (token == 0) {
    return Status(Code::InvalidArgument, what + ": the topic is fenced by lease " + quoted(topic.fence) +
                                             " and the message has no fencing token");
  }
  plan->fenced = true;
  plan->token = token;
  plan->fence_key = lane_fence_key(topic.id, topic.fence_per_lane ? r.lane : kTopicScope);
  auto hwm = read_hwm(txn, plan->fence_key, what);
  if (!hwm.ok()) return hwm.status();
  const std::string lease = lease_for(topic, r.lane);
  if (token < *hwm) {
    return Status(Code::StaleToken, what + ": fencing token " + std::to_string(token) +
                                        " is below the high-water " + std::to_string(*hwm) + " of lease " + quoted(lease) +
                                        ": a newer lease generation has written (this writer's lease was lost)");
  }
  if (token > *hwm) {
    Status answer = pre.done ? pre.status : confirm(lease, token);
    if (!answer.ok()) return refused(what, lease, token, *hwm, answer);
    plan->advance = true;
  }
  if (!r.idempotency_key.empty()) {
    std::string k = dedupe_prefix(plan->fence_key);
    put_be64(k, token);
    const bool raw = r.idempotency_key.size() <= kRawIdemBytes;
    k.push_back(raw ? 'K' : 'H');
    if (raw) {
      k.append(r.idempotency_key);
    } else {
      put_be64(k, fnv1a64(r.idempotency_key));
    }
    plan->dedupe_key = std::move(k);
    if (!plan->advance) {  // a barrier starts a generation: nothing to find
      auto v = txn.get(StoreTable::Fence, plan->dedupe_key);
      if (v.ok()) {
        if (v->size() < 16) return Status(Code::Corruption, what + ": a dedupe record is malformed");
        // A hashed key counts only if the full key matches (else the record is replaced).
        if (raw || v->substr(16) == r.idempotency_key) {
          plan->duplicate = true;
          plan->dup_offset = get_le64(v->data());
          plan->dup_id = get_le64(v->data() + 8);
        }
      } else if (v.code() != Code::NotFound) {
        return v.status();
      }
    }
  }
  return Status();
}

Status LaneFences::record(StoreTxn& txn, const FencePlan& plan, const AppendRequest& r, const AppendResult& res) {
  if (plan.advance) {
    std::string v;
    put_le64(v, plan.token);
    Status s = txn.put(StoreTable::Fence, plan.fence_key, v);
    if (!s.ok()) return s;
    // Invariant 2: drop the older generations' dedupe records.
    const std::string prefix = dedupe_prefix(plan.fence_key);
    std::vector<std::string> old;
    s = txn.scan(StoreTable::Fence, prefix, prefix, [&](std::string_view k, std::string_view) {
      old.emplace_back(k);
      return true;
    });
    if (!s.ok()) return s;
    for (const std::string& k : old) {  // all older: records exist only for tokens <= the old HWM
      s = txn.del(StoreTable::Fence, k);
      if (!s.ok() && s.code() != Code::NotFound) return s;
    }
  }
  if (!plan.dedupe_key.empty()) {
    std::string v;
    put_le64(v, res.offset);
    put_le64(v, res.id);
    if (r.idempotency_key.size() > kRawIdemBytes) {  // hashed key: keep the full key to compare
      v.append(r.idempotency_key);
    }
    Status s = txn.put(StoreTable::Fence, plan.dedupe_key, v);
    if (!s.ok()) return s;
  }
  return Status();
}

}  // namespace lanebus::detail

// ======================================================================
// FencedResource: one decision (decide) on the parsed `R` record, used by the
// StoreTxn-level check (fence_check, fence_write: lib/ and tests) and by
// Transaction::fence (buffered, validated again at commit: txconsume.cpp).

namespace lanebus {

using detail::Access;
using detail::DurableStore;
using detail::StoreTable;
using detail::StoreTxn;

namespace {

/// How many times FencedResource::write runs fence + fn when the commit finds
/// a value it read changed (Conflict) before giving up with Conflict.
constexpr int kMaxWriteRuns = 16;

struct ResourceState {
  std::uint64_t hwm = 0;
  std::string lease;  // "" = never written
};

std::string what_of(std::string_view resource) { return "fenced resource " + detail::quoted(resource); }

/// The `R` record's value, or nullopt when the resource was never written.
Result<std::optional<std::string>> read_record(StoreTxn& txn, std::string_view resource) {
  auto v = txn.get(StoreTable::Fence, detail::resource_fence_key(resource));
  if (!v.ok()) {
    if (v.code() == Code::NotFound) return std::optional<std::string>();
    return v.status();
  }
  return std::optional<std::string>(std::string(*v));
}

Result<ResourceState> parse_record(const std::optional<std::string>& raw, std::string_view resource) {
  ResourceState st;
  if (!raw) return st;
  if (raw->size() < 9) return Status(Code::Corruption, what_of(resource) + ": the fence record is malformed");
  st.hwm = detail::get_le64(raw->data());
  st.lease.assign(raw->data() + 8, raw->size() - 8);
  return st;
}

std::string record_of(std::string_view lease, std::uint64_t token) {
  std::string v;
  detail::put_le64(v, token);
  v.append(lease);
  return v;
}

Status validate(std::string_view resource, std::string_view lease, std::uint64_t token) {
  Status s = detail::check_name(resource, "fenced resource");
  if (!s.ok()) return s;
  s = detail::validate_lease_name(lease);
  if (!s.ok()) return Status(Code::InvalidName, what_of(resource) + ": " + std::string(s.message()));
  if (token == 0) {
    return Status(Code::InvalidArgument, what_of(resource) + ": fencing token 0 (a write needs its lease's token)");
  }
  return Status();
}

// The decision, without writing: OK (advance says whether the HWM must move).
// `pre` is a confirmation obtained outside the transaction for this token, if any.
Status decide(const ResourceState& st, const FenceConfirm& confirm, std::string_view resource,
              std::string_view lease, std::uint64_t token, const Status* pre, bool* advance) {
  *advance = false;
  if (!st.lease.empty() && st.lease != lease) {
    return Status(Code::FenceViolation, what_of(resource) + " is bound to lease " + detail::quoted(st.lease) + ", not " +
                                            detail::quoted(lease) + ": a token of another lease cannot pass its fence");
  }
  if (token < st.hwm) {
    return Status(Code::StaleToken, what_of(resource) + ": fencing token " + std::to_string(token) +
                                        " is below the high-water " + std::to_string(st.hwm) + " of lease " +
                                        detail::quoted(lease) + ": a newer lease generation has written");
  }
  if (token == st.hwm) return Status();
  Status answer = pre != nullptr ? *pre : detail::call_confirm(confirm, lease, token);
  if (!answer.ok()) return detail::refused(what_of(resource), lease, token, st.hwm, answer);
  *advance = true;
  return Status();
}

Status decide_in(StoreTxn& txn, const FenceConfirm& confirm, std::string_view resource, std::string_view lease,
                 std::uint64_t token, const Status* pre, bool* advance) {
  auto raw = read_record(txn, resource);
  if (!raw.ok()) return raw.status();
  auto st = parse_record(*raw, resource);
  if (!st.ok()) return st.status();
  return decide(*st, confirm, resource, lease, token, pre, advance);
}

detail::BusCore* core_with_store(const Bus& bus) {
  detail::BusCore* core = Access::core(bus);
  return core != nullptr && core->store() != nullptr ? core : nullptr;
}

Status no_store(std::string_view resource, const char* call) {
  return Status(Code::InvalidArgument, std::string(call) + " " + what_of(resource) +
                                           ": the bus has no store (set BusOptions::store.directory)");
}

}  // namespace

// ---------------------------------------------------------------- StoreTxn level (internal)

namespace detail {

Status fence_check(const FencedResource& fence, StoreTxn& txn, std::string_view resource, std::string_view lease,
                   std::uint64_t token) {
  if (!txn.writable()) {
    return Status(Code::InvalidArgument, what_of(resource) + ": check needs a write transaction");
  }
  Status s = validate(resource, lease, token);
  if (!s.ok() || !Access::check_enabled(fence)) return s;
  bool advance = false;
  s = decide_in(txn, Access::confirm(fence), resource, lease, token, nullptr, &advance);
  if (!s.ok() || !advance) return s;
  return txn.put(StoreTable::Fence, resource_fence_key(resource), record_of(lease, token));
}

Status fence_write(const FencedResource& fence, DurableStore& store, std::string_view resource,
                   std::string_view lease, std::uint64_t token, const std::function<Status(StoreTxn&)>& fn) {
  Status s = validate(resource, lease, token);
  if (!s.ok()) return s;
  if (!Access::check_enabled(fence)) return store.write(fn);
  // Confirm a barrier before the transaction (the HWM only rises, so a token
  // above it inside the transaction was above it here too).
  auto hwm = resource_high_water(store, resource);
  if (!hwm.ok()) return hwm.status();
  Status pre;
  const bool have_pre = token > *hwm;
  if (have_pre) pre = call_confirm(Access::confirm(fence), lease, token);
  return store.write([&](StoreTxn& txn) -> Status {
    bool advance = false;
    Status d = decide_in(txn, Access::confirm(fence), resource, lease, token, have_pre ? &pre : nullptr, &advance);
    if (!d.ok()) return d;
    d = fn(txn);
    if (!d.ok() || !advance) return d;
    return txn.put(StoreTable::Fence, resource_fence_key(resource), record_of(lease, token));
  });
}

Result<std::uint64_t> resource_high_water(DurableStore& store, std::string_view resource) {
  Status s = check_name(resource, "fenced resource");
  if (!s.ok()) return s;
  std::uint64_t out = 0;
  s = store.read([&](StoreTxn& txn) -> Status {
    auto raw = read_record(txn, resource);
    if (!raw.ok()) return raw.status();
    auto st = parse_record(*raw, resource);
    if (!st.ok()) return st.status();
    out = st->hwm;
    return Status();
  });
  if (!s.ok()) return s;
  return out;
}

}  // namespace detail

// ---------------------------------------------------------------- public API

FencedResource::FencedResource(FenceConfirm confirm) : confirm_(std::move(confirm)) {}

FencedResource::FencedResource(LeaseTable& table)
    : confirm_([&table](std::string_view lease, std::uint64_t token) { return table.confirm_grant(lease, token); }) {}

Status Transaction::fence(const FencedResource& resource_fence, std::string_view resource, std::string_view lease,
                          std::uint64_t token) {
  detail::TxnState& tx = *state_;
  if (tx.is_void()) return tx.refused;
  // A refusal voids the transaction: drop what it buffered, refuse the rest.
  auto refuse = [&tx](Status s) {
    tx.reads.clear();
    tx.writes.clear();
    tx.outbox.clear();
    tx.fences.clear();
    tx.refused = s;
    return s;
  };
  Status s = validate(resource, lease, token);
  if (!s.ok()) return refuse(s);
  if (!Access::check_enabled(resource_fence)) return Status();
  const std::string key = detail::resource_fence_key(resource);
  // The record as this transaction sees it: its own earlier fence of the same
  // resource (which already validates the stored record), else the store.
  detail::TxnState::Fence* mine = nullptr;
  for (detail::TxnState::Fence& f : tx.fences)
    if (f.key == key) mine = &f;
  std::optional<std::string> raw;
  if (mine != nullptr) {
    if (mine->advance) {
      raw = *mine->advance;
    } else if (mine->found) {
      raw = mine->seen;
    }
  } else {
    s = tx.store->read([&](StoreTxn& txn) -> Status {
      auto r = read_record(txn, resource);
      if (!r.ok()) return r.status();
      raw = std::move(*r);
      return Status();
    });
    if (!s.ok()) return refuse(s);
  }
  auto st = parse_record(raw, resource);
  if (!st.ok()) return refuse(st.status());
  bool advance = false;
  // The confirm function runs here, on the caller's thread, outside any
  // transaction and with no lanebus lock held.
  s = decide(*st, Access::confirm(resource_fence), resource, lease, token, nullptr, &advance);
  if (!s.ok()) return refuse(s);
  if (mine == nullptr) {
    detail::TxnState::Fence f;
    f.key = key;
    f.found = raw.has_value();
    if (raw) f.seen = *raw;
    tx.fences.push_back(std::move(f));
    mine = &tx.fences.back();
  }
  if (advance) mine->advance = record_of(lease, token);
  return Status();
}

Status FencedResource::write(Bus& bus, std::string_view resource, std::string_view lease, std::uint64_t token,
                             const std::function<Status(Transaction&)>& fn) const {
  detail::BusCore* core = core_with_store(bus);
  if (core == nullptr) return no_store(resource, "write");
  if (!fn) return Status(Code::InvalidArgument, "write " + what_of(resource) + ": the write function is empty");
  Status s;
  for (int run = 1; run <= kMaxWriteRuns; ++run) {
    detail::TxnState state;
    state.store = core->store();
    state.bus = core;
    Transaction tx = Access::transaction(&state);
    s = tx.fence(*this, resource, lease, token);
    if (!s.ok()) return s;
    s = fn(tx);
    if (!s.ok()) return s;
    if (state.is_void()) return state.refused;  // fn fenced something else that refused
    s = core->store()->write([&](StoreTxn& txn) -> Status {
      Status v = detail::validate_reads(txn, state, resource);
      if (!v.ok()) return v;
      return detail::write_effects(txn, state);
    });
    if (s.ok()) detail::count_outbox(state);
    if (s.code() != Code::Conflict) return s;
  }
  return Status(Code::Conflict, "write " + what_of(resource) + ": what it read kept changing (" +
                                    std::to_string(kMaxWriteRuns) + " runs); " + s.to_string());
}

Result<std::uint64_t> FencedResource::high_water(const Bus& bus, std::string_view resource) {
  detail::BusCore* core = core_with_store(bus);
  if (core == nullptr) return no_store(resource, "high_water");
  return detail::resource_high_water(*core->store(), resource);
}

}  // namespace lanebus
