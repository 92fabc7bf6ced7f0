// lanebus — MIT License.
// ProcessIdentity: who a process is, in a form that survives pid reuse and
// reboots (pid, start time, boot id, pid namespace), and whether such a
// process is dead. The one copy of /proc parsing shared by leases and
// idempotency claims.
//
// Design notes
// - A pid alone is not an identity: pids are reused. The start time (field 22
//   of /proc/<pid>/stat, clock ticks since boot) tells a reused pid apart, and
//   the boot id (/proc/sys/kernel/random/boot_id) tells a previous boot apart.
// - process_is_dead() only answers "dead" when it is sure. Anything it cannot
//   read or compare (no /proc, another pid namespace, an unknown field) counts
//   as alive, so callers fall back to their timeout: a false "dead" would let
//   two processes do the same work, a false "alive" only costs time.
// - The identity of the calling process is computed once and cached; a
//   forked child sees a different getpid() and recomputes its own.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace lanebus::detail {

struct ProcessIdentity {
  std::uint32_t pid = 0;
  /// Field 22 of /proc/<pid>/stat (clock ticks after boot); 0 = unknown.
  std::uint64_t start_time = 0;
  /// Inode of /proc/<pid>/ns/pid; 0 = unknown. Pids are only comparable
  /// inside one pid namespace.
  std::uint64_t pid_ns = 0;
  /// The boot id as 16 bytes (parsed from the UUID text); all zero = unknown.
  std::array<std::uint8_t, 16> boot_id{};

  bool boot_known() const noexcept;
  bool operator==(const ProcessIdentity&) const = default;

  /// Bytes written by encode(): u8 format (1) | u32 LE pid | u64 LE
  /// start_time | u64 LE pid_ns | 16 bytes boot id.
  static constexpr std::size_t kEncodedBytes = 37;
  static constexpr std::uint8_t kFormat = 1;
  std::string encode() const;
  void encode_to(char* out) const noexcept;  // kEncodedBytes bytes
  /// False (and *out untouched) unless `bytes` is exactly an encode() of a
  /// known format.
  static bool decode(std::string_view bytes, ProcessIdentity* out) noexcept;

  /// "pid 1234 (start 56789)", for messages.
  std::string to_string() const;
};

/// The identity of the calling process (cached; recomputed after fork()).
/// Fields that cannot be read are 0 (unknown). Thread-safe.
ProcessIdentity self_identity();

/// The current boot id as text (/proc/sys/kernel/random/boot_id without the
/// newline), read once; "" when unreadable.
const std::string& current_boot_id_text();

/// Field 22 of /proc/<pid>/stat (start time in clock ticks after boot), and
/// the process state (field 3) in *state if given. 0 when unreadable.
std::uint64_t read_start_time(pid_t pid, char* state = nullptr);

/// True only when the process `id` names is certainly gone: it ran in an
/// earlier boot, or its pid does not exist (kill(pid, 0) gives ESRCH), or the
/// pid now belongs to a process with another start time, or it is a zombie
/// (killed, not yet reaped). False when it is alive or when anything needed to
/// decide is unknown (unknown fields, unreadable /proc, another pid
/// namespace). Costs a kill(2) and a read of /proc/<pid>/stat.
bool process_is_dead(const ProcessIdentity& id);

}  // namespace lanebus::detail
