// lanebus — MIT License.
// The durable delayed index (delayed_index.hpp).
#include "delayed_index.hpp"

#include <algorithm>
#include "header_block.hpp"

#include <cstring>
#include <utility>
#include <vector>

#include "coding.hpp"
#include "crc32c.hpp"

namespace lanebus::detail {

namespace {
constexpr std::size_t kFixed = 4 + 4 + 4 + 4 + 8 * 4 + 4 + 2 + 2 + 8 + 2 + 2 + 4;  // before the strings
}  // namespace

namespace {
void fill_delayed_key(char* k, std::int64_t due_ns, std::int64_t created_ns, std::uint32_t topic_id,
                      std::uint32_t tiebreak) noexcept {
  put_be64(k, static_cast<std::uint64_t>(due_ns));
  put_be64(k + 8, static_cast<std::uint64_t>(created_ns));
  put_be32(k + 16, topic_id);
  put_be32(k + 20, tiebreak);
}

std::size_t delayed_size(const AppendRequest& r) noexcept {
  // Format 2 (message headers, doc/tracing.md): le16 length and the stored
  // header block after the three strings. Without headers: format 1, unchanged.
  const std::size_t hext = r.headers.empty() ? 0 : 2 + r.headers.size();
  return kFixed + r.key.size() + r.idempotency_key.size() + r.payload.size() + hext + 4;
}

/// encode_delayed into `size` (delayed_size) bytes at `p`.
void encode_delayed_into(const AppendRequest& r, char* p, std::size_t size) noexcept {
  std::memset(p, 0, kFixed);
  put_le32(p, r.headers.empty() ? 1 : 2);
  put_le32(p + 4, r.topic_id);
  put_le32(p + 8, r.lane);
  put_le64(p + 16, r.header.id);
  put_le64(p + 24, static_cast<std::uint64_t>(r.header.created_at_ns));
  put_le64(p + 32, r.header.correlation_id);
  put_le64(p + 40, r.header.fencing_token);
  put_le32(p + 48, r.header.attempt);
  put_le16(p + 52, r.header.content_type);
  put_le16(p + 54, r.header.schema_version);
  put_le64(p + 56, static_cast<std::uint64_t>(r.expires_ns));
  put_le16(p + 64, static_cast<std::uint16_t>(r.key.size()));
  put_le16(p + 66, static_cast<std::uint16_t>(r.idempotency_key.size()));
  put_le32(p + 68, static_cast<std::uint32_t>(r.payload.size()));
  char* d = p + kFixed;
  std::memcpy(d, r.key.data(), r.key.size());
  d += r.key.size();
  std::memcpy(d, r.idempotency_key.data(), r.idempotency_key.size());
  d += r.idempotency_key.size();
  std::memcpy(d, r.payload.data(), r.payload.size());
  if (!r.headers.empty()) {
    d += r.payload.size();
    put_le16(d, static_cast<std::uint16_t>(r.headers.size()));
    std::memcpy(d + 2, r.headers.data(), r.headers.size());
  }
  put_le32(p + size - 4, crc32c(p, size - 4));
}
}  // namespace

std::string encode_delayed(const AppendRequest& r) {
  std::string v(delayed_size(r), '\0');
  encode_delayed_into(r, v.data(), v.size());
  return v;
}

Status decode_delayed(std::string_view key, std::string_view v, AppendRequest* out) {
  auto bad = [](const char* why) { return Status(Code::Corruption, std::string("delayed entry: ") + why); };
  if (key.size() != kDelayedKeyBytes) return bad("key is not 24 bytes");
  if (v.size() < kFixed + 4) return bad("value shorter than its header");
  const char* p = v.data();
  const std::uint32_t format = get_le32(p);
  if (format != 1 && format != 2) return bad("unknown format");
  const std::size_t klen = get_le16(p + 64), ilen = get_le16(p + 66), plen = get_le32(p + 68);
  std::size_t hlen = 0;
  if (format == 2) {
    if (v.size() < kFixed + klen + ilen + plen + 2 + 4) return bad("lengths do not add up");
    hlen = get_le16(p + kFixed + klen + ilen + plen);
    if (kFixed + klen + ilen + plen + 2 + hlen + 4 != v.size()) return bad("lengths do not add up");
  } else if (kFixed + klen + ilen + plen + 4 != v.size()) {
    return bad("lengths do not add up");
  }
  if (crc32c(p, v.size() - 4) != get_le32(p + v.size() - 4)) return bad("checksum mismatch");
  out->topic_id = get_le32(p + 4);
  out->lane = get_le32(p + 8);
  out->header.id = get_le64(p + 16);
  out->header.created_at_ns = static_cast<std::int64_t>(get_le64(p + 24));
  out->header.correlation_id = get_le64(p + 32);
  out->header.fencing_token = get_le64(p + 40);
  out->header.attempt = get_le32(p + 48);
  out->header.content_type = get_le16(p + 52);
  out->header.schema_version = get_le16(p + 54);
  out->expires_ns = static_cast<std::int64_t>(get_le64(p + 56));
  out->due_ns = static_cast<std::int64_t>(get_be64(key.data()));
  const char* d = p + kFixed;
  out->key.assign(d, klen);
  out->idempotency_key.assign(d + klen, ilen);
  out->payload.assign(d + klen + ilen, plen);
  out->headers.clear();
  if (format == 2) {
    const std::string_view block(d + klen + ilen + plen + 2, hlen);
    if (block.empty() || !valid_header_block(block)) return bad("headers are malformed");
    out->headers.assign(block);
  }
  return Status();
}

Status put_delayed(StoreTxn& t, const AppendRequest& r, std::uint32_t tiebreak) {
  // Encoded in place (MDB_RESERVE) under a key no entry holds: the first try
  // appends (MDB_APPEND: due times mostly grow, so the key sorts last and
  // LMDB skips the search), the second inserts, later ones bump the tie-break.
  char k[kDelayedKeyBytes];
  fill_delayed_key(k, r.due_ns, r.header.created_at_ns, r.topic_id, tiebreak);
  const std::size_t size = delayed_size(r);
  for (int tries = 0;; ++tries) {
    auto at = t.reserve_new(StoreTable::Delayed, std::string_view(k, sizeof k), size, tries == 0);
    if (at.ok()) {
      encode_delayed_into(r, *at, size);
      return Status();
    }
    if (at.code() != Code::Conflict) return at.status();
    if (tries == 64) return Status(Code::Internal, "delayed entry: no free key after 64 tie-breaks");
    if (tries > 0) put_be32(k + 20, ++tiebreak);  // taken (the first try only found it not last)
  }
}

Status store_delayed(StoreTxn& t, const AppendRequest& r, std::uint32_t tiebreak, bool* appended) {
  *appended = false;
  if (r.due_ns <= t.now_ns()) {
    bool earlier_waiting = false;
    Status s = t.scan(StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view) {
      earlier_waiting = k.size() < 8 || static_cast<std::int64_t>(get_be64(k.data())) <= r.due_ns;
      return false;  // the first key only
    });
    if (!s.ok()) return s;
    if (!earlier_waiting) {
      auto a = t.append(r);  // a copy: a write function may run again (DurableStore::write)
      if (!a.ok()) return a.status();
      *appended = true;
      return Status();
    }
  }
  return put_delayed(t, r, tiebreak);
}

Status move_due_delayed(StoreTxn& t, std::uint32_t max, const std::function<bool(std::uint32_t)>& open,
                        MoveResult* out) {
  *out = MoveResult{};
  const std::int64_t now = t.now_ns();
  // One pass of a cursor over the table's first keys: each due entry is
  // decoded (a copy: the append below writes to the log's pages), appended
  // and deleted under the cursor (no search per key). The request is the
  // writer thread's own and keeps its strings' capacity: no allocation per
  // message once they have grown to the largest one.
  thread_local AppendRequest r;
  std::uint32_t taken = 0, looked = 0;
  std::uint32_t last_topic = 0;  // open() of the last topic id asked (entries come in runs of a topic)
  bool last_open = false, asked = false;
  Status failed;
  Status s = t.sweep(StoreTable::Delayed, [&](std::string_view k, std::string_view v) -> StoreTxn::Sweep {
    const std::int64_t at = k.size() >= 8 ? static_cast<std::int64_t>(get_be64(k.data())) : 0;
    if (at > now) {
      out->next_due = at;
      return StoreTxn::Sweep::Stop;
    }
    if (taken >= max || ++looked > 4 * max) {
      if (taken > 0) out->next_due = now;  // more may be due: move again
      return StoreTxn::Sweep::Stop;
    }
    // A malformed key is taken (and dropped below); another process's topic waits.
    if (k.size() == kDelayedKeyBytes) {
      const std::uint32_t topic = get_be32(k.data() + 16);
      if (!asked || topic != last_topic) {
        last_open = open(topic);
        last_topic = topic;
        asked = true;
      }
      if (!last_open) return StoreTxn::Sweep::Next;
    }
    ++taken;
    if (!decode_delayed(k, v, &r).ok()) {
      ++out->dropped;  // corrupt: it could never be delivered
      return StoreTxn::Sweep::Delete;
    }
    // The log record keeps the expiry (and the due time it waited for).
    auto a = t.append_borrowed(r);
    if (a.ok()) {
      ++out->moved;
      return StoreTxn::Sweep::Delete;
    }
    const Code c = a.code();
    // Its topic refuses it (gone, a lane it no longer has, a fence): nothing was written for it.
    if (c != Code::InvalidArgument && c != Code::NotFound && c != Code::StaleToken && c != Code::FenceViolation &&
        c != Code::PayloadTooLarge) {
      failed = a.status();
      return StoreTxn::Sweep::Stop;
    }
    ++out->dropped;
    return StoreTxn::Sweep::Delete;
  });
  if (!failed.ok()) return failed;
  return s;
}

Result<std::int64_t> earliest_delayed(DurableStore& store) {
  std::int64_t first = 0;
  Status s = store.read([&](StoreTxn& t) -> Status {
    first = 0;
    return t.scan(StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view) {
      if (k.size() >= 8) first = static_cast<std::int64_t>(get_be64(k.data()));
      return false;
    });
  });
  if (!s.ok()) return s;
  return first;
}

Result<std::uint64_t> count_delayed(DurableStore& store, std::uint32_t topic_id) {
  std::uint64_t n = 0;
  Status s = store.read([&](StoreTxn& t) -> Status {
    n = 0;
    return t.scan(StoreTable::Delayed, {}, {}, [&](std::string_view k, std::string_view) {
      if (topic_id == 0 || (k.size() == kDelayedKeyBytes && get_be32(k.data() + 16) == topic_id)) ++n;
      return true;
    });
  });
  if (!s.ok()) return s;
  return n;
}

}  // namespace lanebus::detail
