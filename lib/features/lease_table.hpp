// lanebus — MIT License.
// LeaseTableImpl and the shared-memory layout of a lease table segment.
// Everything in the segment is plain integers: no pointers, fixed offsets.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/lease.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

// ---------------------------------------------------------------------------
// Segment layout (version 1)
//
// [LeaseTableHeader, padded to kHeaderBytes][Entry x capacity]
//
// Invariants (checked by LeaseTableImpl::check_consistency):
//  1. Every field except `ready` is read and written only with `mutex` held.
//  2. header.next_token > every token stored in any entry, and
//     (next_token >> kSeqBits) <= header.epoch + 1; a token is handed out
//     only when its epoch bits are <= header.epoch, which is durable.
//  3. An entry with name_hash == 0 was never named; named entries hold a
//     valid name whose hash is name_hash.
//  4. history[0] == token for a named entry that was granted, and history is
//     strictly decreasing among its non-zero values.
//  5. undo_valid == 1 only inside a mutating operation; then undo_entry is
//     the pre-image of entries[undo_index]. A locker that gets EOWNERDEAD
//     copies it back (roll back), then calls pthread_mutex_consistent.
// ---------------------------------------------------------------------------

inline constexpr std::uint64_t kLeaseMagic = 0x3153455341454c42ULL;  // "BLEASES1" little-endian
inline constexpr std::uint32_t kLeaseLayoutVersion = 1;
inline constexpr int kSeqBits = 40;
inline constexpr std::uint64_t kMaxEpoch = (std::uint64_t{1} << (64 - kSeqBits)) - 1;
inline constexpr std::size_t kHeaderBytes = 4096;
inline constexpr std::size_t kNameCapacity = 208;
inline constexpr std::size_t kGrantHistory = 4;
inline constexpr std::uint32_t kMaxCapacity = 65536;
inline constexpr std::uint32_t kReady = 0x52454459;  // "READY"

struct OwnerRecord {
  std::uint32_t pid;
  std::uint32_t reserved;
  std::uint64_t start_time;
  std::uint64_t nonce;
};

struct Entry {
  std::uint64_t name_hash;  // 0 = never named
  std::uint32_t name_len;
  std::uint32_t reserved;
  char name[kNameCapacity];
  std::uint64_t token;      // last granted token (0 = none)
  std::int64_t granted_at;  // table clock, ns
  std::int64_t expires_at;  // table clock, ns; 0 = released (or expired by a reboot)
  std::int64_t ttl_ns;
  OwnerRecord owner;
  std::uint64_t history[kGrantHistory];  // last grants, newest first
  std::uint64_t grants;
};
static_assert(sizeof(OwnerRecord) == 24);
static_assert(offsetof(Entry, name) == 16);
static_assert(offsetof(Entry, token) == 224);
static_assert(offsetof(Entry, owner) == 256);
static_assert(offsetof(Entry, history) == 280);
static_assert(sizeof(Entry) == 320);

struct LeaseTableHeader {
  std::uint64_t magic;
  std::uint32_t layout_version;
  std::uint32_t header_bytes;
  std::uint64_t abi_tag;
  std::uint32_t entry_bytes;
  std::uint32_t capacity;
  std::uint64_t total_bytes;
  std::atomic<std::uint32_t> ready;  // kReady once initialised (release store)
  std::uint32_t creator_uid;
  std::uint64_t time_ns_inode;  // 0 = unknown
  std::uint64_t pid_ns_inode;   // informational
  char boot_id[40];
  std::uint64_t epoch;       // durable incarnation epoch (in the epoch file)
  std::uint64_t next_token;  // next token to hand out
  std::uint32_t used;        // named entries
  std::uint32_t undo_valid;
  std::uint32_t undo_index;
  std::uint32_t reserved;
  std::uint64_t repairs;     // EOWNERDEAD recoveries (statistics)
  Entry undo_entry;
  alignas(64) pthread_mutex_t mutex;
};
static_assert(std::atomic<std::uint32_t>::is_always_lock_free,
              "shm atomics must be address-free (lock-free)");
static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
static_assert(offsetof(LeaseTableHeader, magic) == 0);
static_assert(offsetof(LeaseTableHeader, layout_version) == 8);
static_assert(offsetof(LeaseTableHeader, abi_tag) == 16);
static_assert(offsetof(LeaseTableHeader, ready) == 40);
static_assert(offsetof(LeaseTableHeader, boot_id) == 64);
static_assert(offsetof(LeaseTableHeader, epoch) == 104);
static_assert(offsetof(LeaseTableHeader, next_token) == 112);
static_assert(offsetof(LeaseTableHeader, undo_entry) == 144);
static_assert(sizeof(LeaseTableHeader) <= kHeaderBytes);

/// Test seams (never set in production): crash points inside the critical
/// section, switching the EOWNERDEAD repair off (negative control), and a boot
/// id to use instead of /proc/sys/kernel/random/boot_id (to simulate a reboot;
/// "" = the real one).
struct LeaseTableHooks {
  void (*crash_point)(int point, void* arg) = nullptr;
  void* arg = nullptr;
  bool skip_repair = false;
  std::string boot_id_override{};
};

/// Crash points, in the order a mutating operation reaches them.
enum CrashPoint : int {
  kAfterLock = 1,
  kAfterUndo = 2,
  kMidUpdate = 3,     // acquire: token written, the rest not yet; renew/release: after the store
  kBeforeUndoClear = 4,
  kBeforeUnlock = 5,
};

/// FNV-1a 64, never 0 (0 marks an unnamed entry).
std::uint64_t lease_name_hash(std::string_view name) noexcept;
/// OK or InvalidName with the reason.
Status validate_lease_name(std::string_view name);
/// The ABI tag this build writes and expects.
std::uint64_t lease_abi_tag() noexcept;

class LeaseTableImpl {
 public:
  static Result<std::unique_ptr<LeaseTable>> open(const std::string& path,
                                                  const LeaseTableOptions& options,
                                                  const LeaseTableHooks& hooks);
  ~LeaseTableImpl();

  Result<Lease> acquire(std::string_view name, const LeaseOwner& owner, std::int64_t ttl_ns);
  Result<Lease> renew(std::string_view name, const LeaseOwner& owner, std::uint64_t token);
  Status release(std::string_view name, const LeaseOwner& owner, std::uint64_t token);
  Status confirm_grant(std::string_view name, std::uint64_t token);
  Result<LeaseInfo> inspect(std::string_view name);
  Result<std::vector<LeaseInfo>> list();

  /// Checks invariants 2-5; Corruption naming the first broken one.
  Status check_consistency();
  /// Hand-out counter and repairs so far (for tests).
  std::uint64_t next_token_for_test();
  std::uint64_t repairs_for_test();

  std::uint64_t epoch() const noexcept;
  std::uint32_t capacity() const noexcept { return capacity_; }
  const std::string& path() const noexcept { return path_; }
  LeaseTableHeader* header() noexcept { return header_; }

 private:
  friend class LockedTable;
  LeaseTableImpl() = default;

  Status attach(int fd, std::size_t size);
  Status lock();
  void unlock();
  void repair();
  void crash_point(int p) {
    if (hooks_.crash_point != nullptr) hooks_.crash_point(p, hooks_.arg);
  }
  Entry* entry(std::uint32_t i) noexcept { return entries_ + i; }
  // REQUIRES: locked.
  std::int64_t find(std::string_view name, std::uint64_t hash);
  std::int64_t place(std::string_view name, std::uint64_t hash, std::int64_t now);
  void begin_update(std::uint32_t index);
  void end_update();
  Result<std::uint64_t> next_token_locked();
  Status handle_boot_change(const std::string& boot_id);
  LeaseInfo info_of(const Entry& e, std::int64_t now) const;

  std::string path_;
  std::string epoch_path_;
  LeaseTableOptions options_;
  LeaseTableHooks hooks_;
  void* map_ = nullptr;
  std::size_t map_bytes_ = 0;
  LeaseTableHeader* header_ = nullptr;
  Entry* entries_ = nullptr;
  std::uint32_t capacity_ = 0;
};

/// Opens with test hooks (crash points, repair switch).
Result<std::unique_ptr<LeaseTable>> open_lease_table_with_hooks(const std::string& path,
                                                                const LeaseTableOptions& options,
                                                                const LeaseTableHooks& hooks);

}  // namespace lanebus::detail
