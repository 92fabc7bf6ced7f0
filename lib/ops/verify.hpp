// lanebus — MIT License.
// The verify walk: read every page and record of a durable store and
// check it against doc/storage-format.md. Used by `lanebus verify` and
// StoreOptions::verify_on_open.
#pragma once

#include <cstdint>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/status.hpp"

namespace lanebus::detail {

/// How a walk reports.
struct VerifyOptions {
  /// Called with one line of progress ("log: 20000 records checked", per
  /// database page counts, ...). May be empty. In verify_store_in_child it runs
  /// in the calling process, as the child's lines arrive.
  std::function<void(std::string_view line)> progress;
  /// A progress line every this many records of a database (0 = only per database).
  std::uint64_t progress_every = 50000;
  /// Problems kept in VerifyReport::problems (all are counted). In
  /// verify_store_in_child also the problems passed to `progress`: the child
  /// sends only these many over its pipe, the summary counts the rest.
  std::size_t max_problems_listed = 100;
  /// verify_store_in_child only: a child that sends no line (progress, a
  /// problem, its summary) for this long is killed and the walk reported as
  /// died. A damaged branch page can make LMDB's cursor loop for ever
  /// (store_open_fuzz found one); an intact walk reports at least every
  /// `progress_every` records, far more often. 0 = wait for ever.
  std::chrono::milliseconds stall_timeout{30000};
  /// verify_store_in_child only: kill the child after this long in all, even
  /// while it still sends lines (a loop over a damaged page that keeps
  /// reporting the same problem). 0 = no limit (the default: a healthy walk of
  /// a large store takes as long as it takes).
  std::chrono::milliseconds time_limit{0};
};

/// What a walk found.
struct VerifyReport {
  std::uint64_t databases = 0;      ///< Named databases walked.
  std::uint64_t records = 0;        ///< Entries visited, every database.
  std::uint64_t log_records = 0;    ///< Message records whose CRC-32C was checked.
  std::uint64_t pages = 0;          ///< Pages in use (branch + leaf + overflow, every database).
  std::uint64_t free_pages = 0;     ///< Pages on LMDB's free list.
  std::uint64_t file_pages = 0;     ///< Pages of the snapshot (0 = not known: a writer committed meanwhile).
  std::uint64_t page_size = 0;
  std::uint64_t problem_count = 0;  ///< Damage found (0 = the store is intact).
  std::vector<std::string> problems;  ///< The first VerifyOptions::max_problems_listed, in walk order.
  bool walk_died = false;           ///< verify_store_in_child: the child died (LMDB could not read a page).
  bool ok() const noexcept { return problem_count == 0; }
  /// One line: "OK: ..." or "DAMAGED: N problem(s) ...".
  std::string summary() const;
};

/// Walk the store in `directory` in this process: every LMDB database (the
/// free list and the main database included), every entry, with lanebus's
/// decoders and cross-checks (lane bounds against log keys, counts and bytes,
/// record CRCs, group cursors, in-flight claims, DLQ entries and audit,
/// idempotency records) and LMDB's page accounting.
///
/// A damaged B-tree page can make LMDB read outside the map and crash this
/// process: call it only where that is acceptable (verify_store_in_child).
/// Damage is reported in the report (problem_count), not as an error.
/// Errors: NotFound (no store there), PermissionDenied, IOError: the walk
/// could not start.
/// Thread safety: thread-safe; the store must not be open through LmdbEnv in
/// this process (see LmdbWalk).
[[nodiscard]] Result<VerifyReport> verify_store(const std::string& directory, const VerifyOptions& options = {});

/// As verify_store, in a forked child process, so that a structure LMDB
/// cannot read kills the child and not the caller: that is reported as a
/// problem (walk_died, naming the signal and the database being walked). The
/// child runs only the walk (LMDB reads, memory allocation, writes to a pipe)
/// and leaves with _exit. Blocks until the child has finished (no timeout).
/// Errors: as verify_store, plus IOError (pipe or fork failed).
/// Thread safety: thread-safe.
[[nodiscard]] Result<VerifyReport> verify_store_in_child(const std::string& directory,
                                                         const VerifyOptions& options = {});

}  // namespace lanebus::detail
