// lanebus — MIT License.
// EpochFile: the durable incarnation epoch behind lease tokens (a small sidecar file,
// two checksummed copies updated in place, fsynced before any token of a new epoch exists).
#pragma once

#include <cstdint>
#include <string>

#include "lanebus/status.hpp"

namespace lanebus::detail {

/// Design notes:
/// - The file holds two 32-byte records (magic, epoch, checksum). An update
///   overwrites the record holding the *lower* epoch and fsyncs, so a torn
///   write can only damage the copy being replaced: the other still holds the
///   previous epoch, under which no token above it was issued yet.
/// - Read-modify-write is serialised across processes by flock(2) on the file
///   (released by the kernel if the holder dies).
/// - A missing or empty file reads as epoch 0.
class EpochFile {
 public:
  /// Atomically (across processes) set the stored epoch to
  /// max(stored + 1, at_least) and fsync it; returns the new epoch.
  /// Errors: Corruption (both copies unreadable), PermissionDenied (symlink,
  /// other owner), InvalidArgument (tmpfs and !allow_volatile), IOError.
  [[nodiscard]] static Result<std::uint64_t> advance(const std::string& path, std::uint64_t at_least,
                                                     bool allow_volatile);

  /// Make sure the stored epoch is at least `epoch` (fsync only if it was
  /// lower, e.g. the file was deleted while the segment lived). Errors: as advance.
  [[nodiscard]] static Status ensure_at_least(const std::string& path, std::uint64_t epoch,
                                              bool allow_volatile);

  /// The stored epoch (0 when the file is missing). Errors: as advance.
  [[nodiscard]] static Result<std::uint64_t> read(const std::string& path);
};

}  // namespace lanebus::detail
