// lanebus — MIT License.
// Moving a namespace from one store to another, offline (`lanebus namespace
// move`; manual: doc/tenancy.md "Moving a namespace").
//
// Design notes
// - Both stores are opened by this process alone (check_store_not_open
//   refuses a store another process has open: a live bus, a tool).
// - Three write transactions carry the data, each atomic in its store:
//     1. SRC: move record "m/NS" = copying (names DST);
//     2. DST: every record of the namespace (topic and group ids remapped to
//        DST's counters, DLQ entries renumbered) + move record = copied;
//     then a verify (counts and order-independent checksums per table, of
//     the records with ids replaced by names, SRC against DST), and
//     3. SRC: every record of the namespace deleted + move record = done;
//     4. DST: move record = done.
//   A kill between any two leaves the data whole in SRC, or whole in both
//   (DST's copy marked copied: a rerun verifies and deletes), or whole in DST
//   (SRC marked done): never in neither, never half. Rerunning the same
//   command finishes the move; rerunning it after it finished reports so.
// - The namespace's policy (`tenancy` "n/NS") is copied and kept in SRC:
//   the bus that opens SRC keeps enforcing it. Credentials are not moved.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "lanebus/status.hpp"

namespace lanebus::detail {

class DurableStore;

/// The tables a move counts and verifies (logical tables: ids replaced by names).
enum class MoveTable : std::uint8_t {
  Topics, Lanes, Log, Groups, Cursors, Inflight, DlqEntries, DlqMarks, Idempotency, IdempotencyAge,
  User, Fence, Schema, Usage, Policy,
  Delayed,  ///< delayed messages of the namespace's topics waiting for their due time (doc/delays.md)
};
inline constexpr int kMoveTables = 16;
/// "topics", "log", "dlq", ... (as printed by the tool).
const char* move_table_name(MoveTable t) noexcept;

struct MoveTableSum {
  std::uint64_t count = 0;
  std::uint64_t checksum = 0;  ///< sum of a 64-bit hash per record (order-independent)
  bool operator==(const MoveTableSum&) const = default;
};
using MoveSums = std::array<MoveTableSum, kMoveTables>;

struct NamespaceMoveOptions {
  std::string src_dir;
  std::string dst_dir;
  std::string name;  ///< the namespace (a valid name)
  /// One line per step ("copying ...", "verified ..."), without newline.
  std::function<void(const std::string&)> progress;
  /// Called at named points between and inside the steps (tests kill the
  /// process there): "start", "src-marked", "copying", "copied", "verified",
  /// "deleting", "src-deleted", "done".
  std::function<void(std::string_view point)> at_point;
};

struct NamespaceMoveResult {
  MoveSums sums{};            ///< what was moved (verified equal in both stores)
  bool already_done = false;  ///< an earlier run had finished the move
  bool resumed = false;       ///< an earlier run had been interrupted
};

/// Move namespace `name` from SRC to DST (creating DST's store if needed).
/// Errors: InvalidName; InvalidArgument (SRC == DST, SRC is no store);
/// NotFound (SRC has no store, or nothing of the namespace); Busy (a store
/// is open by another process); Conflict (DST already holds records of the
/// namespace outside a move, another move of the namespace is under way to
/// another DST, or the verify found a difference — nothing is deleted then);
/// storage codes.
Result<NamespaceMoveResult> move_namespace(const NamespaceMoveOptions& options);

/// What `store` holds of namespace `name` (the policy included), per table:
/// the numbers the move verifies (tests compare them before and after).
Result<MoveSums> namespace_sums(DurableStore& store, std::string_view name);

/// OK unless `store` records that the namespace holding `name` was moved
/// out of it, or is half-way through a move into or out of it: then
/// Conflict naming the other store. The bus checks it before it creates a
/// durable topic, queue or idempotency scope, so a namespace's data never
/// grows again in the store it left.
Status check_not_moved(DurableStore& store, std::string_view name);

/// OK when no process has the store in `dir` open (LMDB holds a shared
/// lock on lock.mdb while it is open); Busy naming the process otherwise.
/// Must be called before this process opens that store (closing the
/// descriptor it uses would drop this process's own LMDB locks).
Status check_store_not_open(const std::string& dir);

}  // namespace lanebus::detail
