// lanebus — MIT License.
// LeaseTable: leases with fencing tokens in a shared-memory segment used by every
// process on the machine (doc/leases.md). LeaseOwner, Lease, LeaseInfo, LeaseGuard.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

namespace detail {
struct Access;
class LeaseTableImpl;
}  // namespace detail

// ============================================================================
// What a lease is, and what it is not
// ============================================================================
//
// A lease says "owner O holds name N until time X on the table's clock". It is
// NOT a lock: a holder frozen by SIGSTOP, swapping, a debugger or a VM pause
// outlives X and keeps running. Safety therefore never comes from the lease
// alone. Every acquisition returns a *fencing token*; the resource the lease
// protects must remember the highest token it accepted and refuse anything
// lower (a "fenced sink"). TTLs give liveness; tokens give safety.
//
// Guarantees of the table:
// - Tokens are unique, never reused, strictly increasing across all
//   acquisitions of all names (so the acquisitions of one name rise in
//   takeover order) and never lower after a process restart, a deleted and
//   recreated segment, or a reboot. The high 24 bits of a token are the table's
//   incarnation epoch; the epoch is persisted with fsync in a sidecar file
//   (LeaseTableOptions::epoch_path) before any token of it is handed out.
//   Nothing is fsynced on the acquire path.
// - Expiry is decided only by the table's clock: CLOCK_BOOTTIME, read by the
//   process doing the operation. CLOCK_BOOTTIME is machine-wide within one time
//   namespace and keeps counting during suspend, so a TTL is real elapsed time.
//   The table records its time namespace and refuses participants from another
//   one (their clock has a different offset). A lease is valid while
//   now < expires_at.
// - A reboot (new /proc/sys/kernel/random/boot_id) expires every lease and
//   advances the epoch; the token high-water survives.
// - acquire, renew and release are each one atomic step under the segment's
//   robust process-shared mutex. A process killed inside an operation leaves a
//   one-entry undo record; the next process to lock repairs the entry, marks
//   the mutex consistent and carries on. No operation ever waits longer than
//   LeaseTableOptions::lock_timeout (a SIGSTOPped process inside an operation
//   stalls others only up to that bound, then they get Busy).
//
// Names follow the naming rule of doc/topics.md with '/' also allowed as a separator: segments of
// [a-z0-9_-], separated by '.' or '/', at most kMaxLeaseNameBytes bytes.

/// Longest lease name, in bytes.
inline constexpr std::size_t kMaxLeaseNameBytes = 200;

/// Identifies one process instance (pid + its start time from /proc/self/stat
/// field 22 + a random part), so a recycled pid can never renew or release the
/// lease of a dead process. Compare with ==; all fields matter.
///
/// Thread safety: a plain value.
struct LANEBUS_API LeaseOwner {
  std::uint32_t pid = 0;
  /// Start time of the process in clock ticks since boot.
  std::uint64_t start_time = 0;
  /// Random, from getrandom(2).
  std::uint64_t nonce = 0;

  /// A fresh owner id for the calling process: the current pid and start time
  /// plus a new random part (two calls give two distinct owners).
  /// Errors: IOError when /proc/self/stat or getrandom(2) cannot be read.
  [[nodiscard]] static Result<LeaseOwner> generate();

  /// "pid:start_time:nonce-in-hex".
  std::string to_string() const;

  friend bool operator==(const LeaseOwner&, const LeaseOwner&) = default;
};

/// A successful acquisition (or renewal). Times are on the table's clock
/// (LeaseTable::now(), nanoseconds of CLOCK_BOOTTIME).
struct Lease {
  std::string name{};
  LeaseOwner owner;
  /// The fencing token: pass it with every write to a fenced resource.
  std::uint64_t token = 0;
  std::int64_t granted_at_ns = 0;
  std::int64_t expires_at_ns = 0;
};

/// A snapshot of one name's entry, from inspect() or list().
struct LeaseInfo {
  std::string name{};
  /// The last owner granted (still recorded after release or expiry).
  LeaseOwner owner;
  /// The last token granted for this name (0 only if it was never granted).
  std::uint64_t token = 0;
  std::int64_t granted_at_ns = 0;
  /// 0 after release; otherwise the end of validity.
  std::int64_t expires_at_ns = 0;
  /// True when a lease is valid at `now_ns`.
  bool held = false;
  /// The table's clock when the snapshot was taken.
  std::int64_t now_ns = 0;
  /// Successful acquisitions of this name in this segment's lifetime.
  std::uint64_t grants = 0;

  /// expires_at_ns - now_ns when held, else 0.
  std::chrono::nanoseconds time_left() const {
    return std::chrono::nanoseconds(held ? expires_at_ns - now_ns : 0);
  }
};

/// Options for LeaseTable::open.
struct LeaseTableOptions {
  // ---- behaviour ----
  /// Distinct names the table can hold, fixed when the segment is created
  /// (ignored when attaching). 1..65536. Default 1024. A name keeps its entry
  /// (its token record) until the table is full; then an entry whose lease is
  /// released or expired is given to the new name.
  std::uint32_t capacity = 1024;
  /// Create the segment if it does not exist. Default true. When false, a
  /// missing segment is NotFound.
  bool create_if_missing = true;
  /// The durable incarnation-epoch file. Default "" = path + ".epoch". It must
  /// live on persistent storage or tokens could go backwards after a reboot;
  /// open refuses a tmpfs location (e.g. /dev/shm) unless
  /// allow_volatile_epoch is set.
  std::string epoch_path{};
  /// Accept an epoch file on tmpfs (tests, or machines that never reboot with
  /// live fenced resources). Default false.
  bool allow_volatile_epoch = false;
  /// Longest any table call waits for the segment's mutex (a holder might be
  /// SIGSTOPped inside an operation). Default 2 s.
  std::chrono::milliseconds lock_timeout{2000};
};

/// A table of named leases in a file-backed shared-memory segment.
///
/// The segment is an ordinary file (typically under /dev/shm) mapped by every
/// participating process. It is created with mode 0600 by exclusive create,
/// fully initialised under a temporary name and then linked into place, so no
/// process ever sees a half-built segment. Attaching checks, before mapping
/// anything: not a symlink, a regular file owned by the caller's euid and not
/// group/world writable, and the exact expected size; then the magic number,
/// layout version, ABI tag (arch, libc, struct sizes) and time namespace.
///
/// Lifetime: the object unmaps the segment on destruction; the segment file
/// itself stays until someone removes it (tokens stay monotonic even then,
/// thanks to the epoch file).
///
/// Thread safety: thread-safe. Many processes and threads may use one segment.
class LANEBUS_API LeaseTable {
 public:
  /// Attach to the segment at `path`, creating it if missing.
  ///
  /// Creating or meeting a segment from an earlier boot advances the epoch and
  /// fsyncs the epoch file (the only fsync in the table's life cycle).
  /// Blocks: for file I/O, and up to options.lock_timeout for the mutex.
  /// Errors:
  /// - InvalidArgument: capacity out of range; an epoch file on tmpfs without
  ///   allow_volatile_epoch; the segment belongs to another time namespace.
  /// - NotFound: missing segment and !create_if_missing.
  /// - PermissionDenied: a symlink, not a regular file, another owner, group or
  ///   world writable, or the OS refused access (the message names which).
  /// - Corruption: wrong size, bad magic (a foreign file), ABI tag mismatch,
  ///   an inconsistent header or epoch file.
  /// - VersionTooNew: written by a newer layout version.
  /// - Busy: the mutex stayed held for lock_timeout.
  /// - IOError: any other system call failure (the message names it).
  [[nodiscard]] static Result<std::unique_ptr<LeaseTable>> open(const std::string& path,
                                                                const LeaseTableOptions& options = {});

  ~LeaseTable();
  LeaseTable(const LeaseTable&) = delete;
  LeaseTable& operator=(const LeaseTable&) = delete;

  /// Acquire `name` for `owner` for `ttl`, if it is free, released or expired:
  /// one atomic step that stamps owner, a new token and expiry = now + ttl.
  /// The same owner acquiring a name it still holds is Busy too (renew instead).
  /// Blocks: up to lock_timeout for the mutex; never fsyncs (except once per
  /// 2^40 tokens, when the epoch advances).
  /// Errors:
  /// - InvalidName: the name breaks the naming rule.
  /// - InvalidArgument: ttl <= 0 or longer than a year.
  /// - Busy: the lease is held by someone (the message names the owner and
  ///   time left), or the mutex stayed held for lock_timeout ("stalled").
  /// - QuotaExceeded: the table is full (capacity names, none reusable).
  /// - IOError: persisting a new epoch failed.
  [[nodiscard]] Result<Lease> acquire(std::string_view name, const LeaseOwner& owner,
                                      std::chrono::milliseconds ttl);

  /// Acquire one free slot of `task`: tries task/slot-0 .. task/slot-(n-1)
  /// (starting at an owner-dependent slot, to spread contention) and returns
  /// the first acquired. Each slot is an ordinary lease, fenced on its own.
  /// Errors: as acquire, plus InvalidArgument when n is 0 or above 4096, and
  /// Busy when every slot is held.
  [[nodiscard]] Result<Lease> acquire_any_slot(std::string_view task, std::uint32_t n,
                                               const LeaseOwner& owner,
                                               std::chrono::milliseconds ttl);

  /// Extend the lease to now + its ttl, only if owner AND token match the
  /// current grant AND it has not expired. An expired lease is never
  /// resurrected, even if nobody took it. Returns the renewed lease.
  /// Errors:
  /// - InvalidName; NotFound: the name was never granted here.
  /// - StaleToken: the lease expired, was released, was taken over (a newer
  ///   token), or the owner does not match.
  /// - FenceViolation: the token is above anything granted for this name.
  /// - Busy: the mutex stayed held for lock_timeout.
  [[nodiscard]] Result<Lease> renew(std::string_view name, const LeaseOwner& owner,
                                    std::uint64_t token);

  /// Release the lease if owner AND token match the current grant. Releasing a
  /// lease that already expired (but was not taken over) or was already
  /// released is OK. The token record stays, so tokens never go back.
  /// Errors: as renew, except that expiry alone is not an error.
  [[nodiscard]] Status release(std::string_view name, const LeaseOwner& owner, std::uint64_t token);

  /// Did this table grant `token` for `name`? The check a fenced resource uses
  /// before letting a token above its high-water mark advance the fence (a
  /// generation barrier). The table remembers the last 4 tokens granted per
  /// name for the segment's lifetime.
  /// OK: the token is one of them (it may be superseded or expired already:
  /// this confirms authenticity, not current ownership).
  /// Errors:
  /// - InvalidName; NotFound: the name was never granted by this segment.
  /// - FenceViolation: the token is above the last grant for this name, or
  ///   within the remembered range but not a grant of this name (forged, or a
  ///   token of another name).
  /// - StaleToken: below the remembered range; too old to confirm.
  /// - Busy: the mutex stayed held for lock_timeout.
  [[nodiscard]] Status confirm_grant(std::string_view name, std::uint64_t token);

  /// A snapshot of one name. Errors: InvalidName, NotFound, Busy.
  [[nodiscard]] Result<LeaseInfo> inspect(std::string_view name);

  /// A snapshot of every named entry, in table order. Errors: Busy.
  [[nodiscard]] Result<std::vector<LeaseInfo>> list();

  /// The table's clock: CLOCK_BOOTTIME in nanoseconds. Never fails.
  static std::int64_t now() noexcept;

  /// The current incarnation epoch (high 24 bits of new tokens).
  std::uint64_t epoch() const noexcept;
  /// The fixed capacity of the segment.
  std::uint32_t capacity() const noexcept;
  const std::string& path() const noexcept;

 private:
  explicit LeaseTable(std::unique_ptr<detail::LeaseTableImpl> impl);
  friend struct detail::Access;
  friend class detail::LeaseTableImpl;
  std::unique_ptr<detail::LeaseTableImpl> impl_;
};

/// Why a LeaseGuard stopped holding its lease (the revocation callback's argument).
enum class LeaseLoss : std::uint8_t {
  /// A renewal failed (expired, taken over, or the table refused).
  RenewFailed,
  /// The local safety margin was reached without a successful renewal.
  DeadlineReached,
};

/// Options for LeaseGuard.
struct LeaseGuardOptions {
  /// Time-to-live asked for at every (re)acquisition. Default 5 s.
  std::chrono::milliseconds ttl{5000};
  /// valid() turns false this long before the lease's expiry (fail closed).
  /// Must be below ttl. Default ttl / 5 when 0.
  std::chrono::milliseconds safety_margin{0};
  /// Renew from a background thread every this often. 0 = ttl / 3. Set
  /// background_renewal = false to renew explicitly with renew().
  std::chrono::milliseconds renew_interval{0};
  bool background_renewal = true;
  /// Best-effort notice that the lease was lost. NOT a safety mechanism: a
  /// frozen or slow process cannot act on it in time, and it may arrive after
  /// a new holder already wrote. Only the fencing token protects a resource.
  /// Runs at most once per guard, on the renewal thread (or the thread calling
  /// renew()/valid()), with no lanebus lock held; it may call valid(),
  /// deadline() and token() but must not destroy the guard.
  std::function<void(const Lease&, LeaseLoss)> on_lost;
};

/// RAII holder of one lease: acquired by LeaseGuard::acquire, renewed in the
/// background (or by renew()), released on destruction.
///
/// valid() is the gate for side effects: it is true only while the local
/// clock is more than safety_margin before the last confirmed expiry, and it
/// never comes back once false (fail closed). Still pass token() to every
/// fenced write: valid() can be true when the process is then frozen.
///
/// Lifetime: the LeaseTable must outlive the guard. Destruction stops the
/// renewal thread (waiting for a running renewal, up to lock_timeout) and
/// releases the lease if it was not lost.
///
/// Thread safety: thread-safe, except that move and destruction need external
/// synchronization.
class LANEBUS_API LeaseGuard {
 public:
  /// Acquire `name` and start renewing it. Errors: as LeaseTable::acquire,
  /// plus InvalidArgument when safety_margin >= ttl.
  [[nodiscard]] static Result<std::unique_ptr<LeaseGuard>> acquire(
      LeaseTable& table, std::string_view name, const LeaseOwner& owner,
      LeaseGuardOptions options = {});

  ~LeaseGuard();
  LeaseGuard(const LeaseGuard&) = delete;
  LeaseGuard& operator=(const LeaseGuard&) = delete;

  /// True while the lease is held with more than safety_margin left (by the
  /// table's clock at the last confirmed grant or renewal). Never blocks.
  bool valid() const noexcept;
  /// The expiry confirmed by the last successful grant or renewal (table clock, ns).
  std::int64_t deadline() const noexcept;
  /// The fencing token of this lease.
  std::uint64_t token() const noexcept;
  const Lease& lease() const noexcept { return lease_; }

  /// Renew now. Errors: as LeaseTable::renew; after a failure the guard stays
  /// lost (valid() false) and on_lost has run. Blocks up to lock_timeout.
  [[nodiscard]] Status renew();

  /// Release now (the destructor then does nothing). Errors: as LeaseTable::release.
  [[nodiscard]] Status release();

 private:
  LeaseGuard(LeaseTable& table, Lease lease, LeaseGuardOptions options);
  void mark_lost(LeaseLoss why);
  void renew_loop();

  struct State;
  LeaseTable& table_;
  Lease lease_;
  LeaseGuardOptions options_;
  std::unique_ptr<State> state_;
};

}  // namespace lanebus
