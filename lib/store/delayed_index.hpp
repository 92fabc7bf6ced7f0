// lanebus — MIT License.
// The durable delayed index (doc/delays.md, doc/storage-format.md): durable
// messages published with a due time wait in the `delayed` table, keyed by
// due time, until a bus appends them to their lane's log.
//
// Design notes
// - Key: be64 due ns, be64 created ns, be32 topic id, be32 tie-break (24
//   bytes): LMDB's key order is due-time order, publish order among equal due
//   times (created ns, then the tie-break of one process). Finding what is due
//   reads the table's first keys; a restart finds the earliest due time with
//   one cursor read, without scanning any topic.
// - Value: le32 format (1), le32 topic id, le32 lane, le32 0, the message
//   header (le64 id, created, correlation, fencing token; le32 attempt; le16
//   content type, schema version), le64 expiry ns, le16 key length, le16
//   idempotency key length, le32 payload length, the three strings, le32
//   CRC-32C of everything before it. Format 2 (a message with headers,
//   doc/tracing.md) puts le16 length and the stored header block between the
//   strings and the CRC.
// - Moving is one write transaction: each due entry is appended to its lane
//   (StoreTxn::append, the same append as a publish) and deleted. A crash
//   before the commit leaves it waiting; after, it is in the log: delivered
//   exactly like a message published at its due time, never twice. Retention
//   cannot delete a waiting message: it is not in any log yet.
// - Any bus with the store open may move any due entry; LMDB's writer lock
//   serialises them, and an entry moved by one is gone for the next.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "durable_store.hpp"

namespace lanebus::detail {

inline constexpr std::size_t kDelayedKeyBytes = 24;

std::string encode_delayed(const AppendRequest& r);
/// Corruption when the value is not one encode_delayed wrote (size, format, CRC).
Status decode_delayed(std::string_view key, std::string_view value, AppendRequest* out);

/// Store `r` (r.due_ns set) in the delayed table inside `t`, under a key no
/// other entry holds (`tiebreak` is bumped past a taken one).
Status put_delayed(StoreTxn& t, const AppendRequest& r, std::uint32_t tiebreak);

/// A delayed publish inside `t`: put_delayed, unless `r` is due already at
/// t.now_ns() (the transaction ran after its due time: a delay shorter than
/// the writer's queue) and no entry of the table is due at or before it. Then
/// it is appended to its lane at once (*appended = true), as the mover would
/// append it at its next run: no entry that should precede it (an earlier due
/// time, same key or not) is still waiting, so the due-time order holds, and
/// it saves the index's put and delete. Errors: put_delayed's, or append's
/// (a topic that refuses it: nothing was written).
Status store_delayed(StoreTxn& t, const AppendRequest& r, std::uint32_t tiebreak, bool* appended);

struct MoveResult {
  std::uint32_t moved = 0;    // appended to their lanes
  std::uint32_t dropped = 0;  // refused by their topic (gone, fenced, corrupt entry): deleted
  std::int64_t next_due = 0;  // the earliest entry left (0 = none)
};
/// Append up to `max` entries due at t.now_ns() to their lanes' logs and
/// delete them, inside `t` (a write transaction). Re-runnable (resets *out).
/// Only entries of topics for which `open(topic id)` is true are moved (a
/// process appends only to topics it has open; the others wait for a bus
/// that opens them); at most 4 × max entries are looked at. A storage error
/// aborts (nothing moved); an entry its topic refuses is deleted and
/// counted in `dropped`. next_due: the earliest entry not yet due, or now
/// when due entries of open topics are left (the caller moves again).
Status move_due_delayed(StoreTxn& t, std::uint32_t max, const std::function<bool(std::uint32_t)>& open,
                        MoveResult* out);

/// The earliest due time in the table (0 = empty), in a read transaction.
Result<std::int64_t> earliest_delayed(DurableStore& store);
/// Entries waiting in the table for topic `topic_id` (0 = all), for stats and tests.
Result<std::uint64_t> count_delayed(DurableStore& store, std::uint32_t topic_id);

}  // namespace lanebus::detail
