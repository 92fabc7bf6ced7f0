// lanebus — MIT License.
// The LMDB wrapper: environment open/registry/resizing, transactions, cursors,
// and the mapping of every MDB_* code and errno to a lanebus Code.
#include "lmdb_store.hpp"

#include <lmdb.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>
#include <utility>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "quote.hpp"

namespace lanebus::detail {
namespace {

// The process-wide registry of open environments (LMDB: a file is opened once per process).
// A global is unavoidable here: LMDB's rule is per process, not per Bus.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::set<std::pair<dev_t, ino_t>>& registry() {  // GUARDED_BY(registry_mutex())
  static std::set<std::pair<dev_t, ino_t>> r;
  return r;
}

const char* mdb_code_name(int rc) {
  switch (rc) {
    case MDB_KEYEXIST: return "MDB_KEYEXIST";
    case MDB_NOTFOUND: return "MDB_NOTFOUND";
    case MDB_PAGE_NOTFOUND: return "MDB_PAGE_NOTFOUND";
    case MDB_CORRUPTED: return "MDB_CORRUPTED";
    case MDB_PANIC: return "MDB_PANIC";
    case MDB_VERSION_MISMATCH: return "MDB_VERSION_MISMATCH";
    case MDB_INVALID: return "MDB_INVALID";
    case MDB_MAP_FULL: return "MDB_MAP_FULL";
    case MDB_DBS_FULL: return "MDB_DBS_FULL";
    case MDB_READERS_FULL: return "MDB_READERS_FULL";
    case MDB_TLS_FULL: return "MDB_TLS_FULL";
    case MDB_TXN_FULL: return "MDB_TXN_FULL";
    case MDB_CURSOR_FULL: return "MDB_CURSOR_FULL";
    case MDB_PAGE_FULL: return "MDB_PAGE_FULL";
    case MDB_MAP_RESIZED: return "MDB_MAP_RESIZED";
    case MDB_INCOMPATIBLE: return "MDB_INCOMPATIBLE";
    case MDB_BAD_RSLOT: return "MDB_BAD_RSLOT";
    case MDB_BAD_TXN: return "MDB_BAD_TXN";
    case MDB_BAD_VALSIZE: return "MDB_BAD_VALSIZE";
    case MDB_BAD_DBI: return "MDB_BAD_DBI";
  }
  return nullptr;
}

const char* errno_name(int e) {
  switch (e) {
    case ENOSPC: return "ENOSPC";
    case EFBIG: return "EFBIG";
    case EDQUOT: return "EDQUOT";
    case EACCES: return "EACCES";
    case EPERM: return "EPERM";
    case EROFS: return "EROFS";
    case ENOENT: return "ENOENT";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EIO: return "EIO";
    case ENOMEM: return "ENOMEM";
    case EAGAIN: return "EAGAIN";
    case EBUSY: return "EBUSY";
    case EINVAL: return "EINVAL";
    case EMFILE: return "EMFILE";
    case ENFILE: return "ENFILE";
  }
  return "errno";
}

Code code_for(int rc) {
  switch (rc) {
    case MDB_MAP_FULL: return Code::MapFull;
    case MDB_READERS_FULL:
    case MDB_TLS_FULL: return Code::Busy;
    case MDB_NOTFOUND: return Code::NotFound;
    case MDB_KEYEXIST: return Code::Conflict;
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND:
    case MDB_INVALID:
    case MDB_INCOMPATIBLE:
    case MDB_CURSOR_FULL:
    case MDB_PAGE_FULL: return Code::Corruption;
    case MDB_VERSION_MISMATCH: return Code::VersionTooNew;
    case MDB_BAD_VALSIZE:
    case MDB_TXN_FULL: return Code::InvalidArgument;
    case MDB_PANIC: return Code::IOError;
    case MDB_DBS_FULL:
    case MDB_MAP_RESIZED:
    case MDB_BAD_RSLOT:
    case MDB_BAD_TXN:
    case MDB_BAD_DBI: return Code::Internal;
    case ENOSPC:
    case EFBIG:
    case EDQUOT: return Code::DiskFull;
    case EACCES:
    case EPERM:
    case EROFS: return Code::PermissionDenied;
    case ENOENT: return Code::NotFound;
    case ENOTDIR: return Code::InvalidArgument;
    case EAGAIN:
    case EBUSY: return Code::Busy;
  }
  return Code::IOError;
}

const char* hint_for(int rc) {
  switch (rc) {
    case MDB_MAP_FULL: return "raise StoreOptions::map_size_max";
    case MDB_READERS_FULL: return "raise StoreOptions::max_readers (shared by all processes)";
    case MDB_INVALID: return "not an LMDB file (garbage or a foreign file)";
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND: return "the store is damaged; restore it from a copy";
    case MDB_VERSION_MISMATCH: return "written by an incompatible LMDB release";
    case MDB_PANIC: return "close and reopen the store";
    case MDB_TXN_FULL: return "too many changes in one transaction; lower StoreOptions::max_batch";
    case ENOSPC:
    case EDQUOT: return "free disk space";
    case EFBIG: return "the file-size limit (RLIMIT_FSIZE) or the file system's maximum was reached";
    case EACCES:
    case EPERM: return "check the owner and mode of the directory and its files";
    case EROFS: return "the file system is read-only";
    case EIO: return "the disk failed a write or an fsync; nothing written since the last successful commit is durable";
  }
  return nullptr;
}

}  // namespace

// A read-only transaction is refused with MDB_BAD_TXN only after LMDB met a
// damaged page in it (mdb_page_get marks the transaction failed) and that
// error did not reach us as such: report the damage, not an internal error.
Status damaged_read_txn(std::string_view what, std::string_view path) {
  return Status(Code::Corruption, std::string(what) + " " + quoted(path) +
                                      ": MDB_BAD_TXN: LMDB met a damaged page in this read transaction; the store is "
                                      "damaged; run `lanebus verify` and restore it from a copy");
}

Status lmdb_error(int rc, std::string_view what, std::string_view path) {
  std::string msg(what);
  msg += ' ';
  msg += quoted(path);
  msg += ": ";
  if (const char* name = mdb_code_name(rc)) {
    msg += name;
  } else {
    msg += errno_name(rc);
  }
  msg += ": ";
  msg += mdb_strerror(rc);  // LMDB's text for MDB_* codes, strerror for errno values
  if (const char* hint = hint_for(rc)) {
    msg += "; ";
    msg += hint;
  }
  return Status(code_for(rc), msg);
}

// mdb_env_open failed with ENOMEM: LMDB maps max(our map size, the newest
// meta page's mm_mapsize), so a damaged meta page that claims an absurd map
// size or last page number (a flipped high byte) fails the mmap. Read the
// meta pages of data.mdb (MDB_meta after the 16-byte page header: magic u32,
// version u32, address, mapsize, 2 x 48-byte MDB_db, last_pg, txnid) and
// name it (corruption_test found one: last_pg 149,533,581,377,588).
Status open_enomem(std::string_view what, std::string_view path) {
  const std::string file = std::string(path) + "/data.mdb";
  FILE* f = std::fopen(file.c_str(), "rb");
  std::uint64_t best_txn = 0, best_map = 0;
  bool found = false;
  if (f != nullptr) {
    unsigned char page[160];
    for (long off : {0L, 4096L, 8192L, 16384L, 32768L, 65536L}) {
      if (std::fseek(f, off, SEEK_SET) != 0 || std::fread(page, 1, sizeof page, f) != sizeof page) break;
      std::uint32_t magic = 0, psize = 0;
      std::uint64_t map = 0, txn = 0, last_pg = 0;
      std::memcpy(&magic, page + 16, 4);
      std::memcpy(&map, page + 32, 8);
      std::memcpy(&psize, page + 40, 4);  // mm_dbs[FREE_DBI].md_pad holds the page size
      std::memcpy(&last_pg, page + 16 + 4 + 4 + 8 + 8 + 96, 8);
      std::memcpy(&txn, page + 16 + 4 + 4 + 8 + 8 + 96 + 8, 8);
      if (magic != 0xBEEFC0DEu) continue;
      // LMDB maps at least (last_pg + 1) pages.
      if (psize == 0) psize = 4096;
      const std::uint64_t pages_limit = (1ull << 46) / psize;
      if (last_pg >= pages_limit) map = std::max<std::uint64_t>(map, 1ull << 46);
      if (!found || txn > best_txn) {
        best_txn = txn;
        best_map = map;
        found = true;
      }
    }
    std::fclose(f);
  }
  if (found && best_map >= (1ull << 46)) {
    return Status(Code::Corruption, std::string(what) + " " + quoted(path) + ": the newest meta page claims a map of at least " +
                                        std::to_string(best_map) + " bytes (a damaged size or last page number): the store is damaged");
  }
  return lmdb_error(ENOMEM, what, path);
}

// mdb_env_open failed with EINVAL on an existing data.mdb. The flags, map
// size and paths we pass are the same for every store, so the cause is the
// file: a damaged meta page whose page size, map size or last page makes the
// mapping invalid (corruption_test found one with random flips in page 0).
Status open_einval(std::string_view what, std::string_view path) {
  struct stat st {};
  const std::string file = std::string(path) + "/data.mdb";
  if (::stat(file.c_str(), &st) == 0 && st.st_size > 0) {
    return Status(Code::Corruption, std::string(what) + " " + quoted(path) +
                                        ": LMDB refused the meta pages of data.mdb (EINVAL: a damaged page size, map "
                                        "size or last page number): the store is damaged");
  }
  return lmdb_error(EINVAL, what, path);
}


// ---------------------------------------------------------------- LmdbTxn

LmdbTxn::LmdbTxn(LmdbTxn&& other) noexcept
    : env_(other.env_), txn_(std::exchange(other.txn_, nullptr)), lock_(std::move(other.lock_)),
      write_(other.write_), writer_locked_(std::exchange(other.writer_locked_, false)), slot_(other.slot_),
      held_(std::exchange(other.held_, false)) {}

LmdbTxn& LmdbTxn::operator=(LmdbTxn&& other) noexcept {
  if (this != &other) {
    abort();
    env_ = other.env_;
    txn_ = std::exchange(other.txn_, nullptr);
    lock_ = std::move(other.lock_);
    write_ = other.write_;
    writer_locked_ = std::exchange(other.writer_locked_, false);
    slot_ = other.slot_;
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

LmdbTxn::~LmdbTxn() { abort(); }

void LmdbTxn::hold() noexcept {
  if (txn_ == nullptr || write_ || held_) return;
  env_->held_reads_.fetch_add(1, std::memory_order_seq_cst);  // under the map lock: a resize sees it
  held_ = true;
  if (lock_.owns_lock()) lock_.unlock();
}

void LmdbTxn::abort() noexcept {
  if (txn_ != nullptr) {
    if (write_) {
      mdb_txn_abort(txn_);
    } else {
      env_->end_read(txn_, slot_);
    }
    txn_ = nullptr;
  }
  if (held_) {
    env_->held_reads_.fetch_sub(1, std::memory_order_seq_cst);
    held_ = false;
  }
  release_writer();
  if (lock_.owns_lock()) lock_.unlock();
}

void LmdbTxn::release_writer() noexcept {
  if (writer_locked_) {
    writer_locked_ = false;
    env_->unlock_writer();
  }
}

Result<std::string_view> LmdbTxn::get(LmdbDbi dbi, std::string_view key) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{0, nullptr};
  int rc = mdb_get(txn_, dbi, &k, &v);
  if (rc == MDB_NOTFOUND) return Status(Code::NotFound);  // hot path: no message
  if (rc == MDB_BAD_TXN && !write_) return damaged_read_txn("get in", env_->path());
  if (rc != 0) return lmdb_error(rc, "get in", env_->path());
  return std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
}

Status LmdbTxn::put(LmdbDbi dbi, std::string_view key, std::string_view value) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  int rc = mdb_put(txn_, dbi, &k, &v, 0);
  if (rc != 0) return lmdb_error(rc, "write to", env_->path());
  return Status();
}

Status LmdbTxn::put_append(LmdbDbi dbi, std::string_view key, std::string_view value) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{value.size(), const_cast<char*>(value.data())};
  int rc = mdb_put(txn_, dbi, &k, &v, MDB_APPEND);
  if (rc != 0) return lmdb_error(rc, "append to", env_->path());
  return Status();
}

Result<char*> LmdbTxn::reserve_new(LmdbDbi dbi, std::string_view key, std::size_t size, bool append) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{size, nullptr};
  int rc = mdb_put(txn_, dbi, &k, &v, MDB_RESERVE | MDB_NOOVERWRITE | (append ? MDB_APPEND : 0u));
  if (rc == MDB_KEYEXIST) return Status(Code::Conflict, "the key exists or does not sort last");
  if (rc != 0) return lmdb_error(rc, "write to", env_->path());
  return static_cast<char*>(v.mv_data);
}

const char* lmdb_version_string() noexcept { return mdb_version(nullptr, nullptr, nullptr); }

Result<char*> LmdbTxn::reserve(LmdbDbi dbi, std::string_view key, std::size_t size) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{size, nullptr};
  int rc = mdb_put(txn_, dbi, &k, &v, MDB_RESERVE);
  if (rc != 0) return lmdb_error(rc, "write to", env_->path());
  return static_cast<char*>(v.mv_data);
}

Status LmdbTxn::del(LmdbDbi dbi, std::string_view key) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  int rc = mdb_del(txn_, dbi, &k, nullptr);
  if (rc == MDB_NOTFOUND) return Status(Code::NotFound);
  if (rc != 0) return lmdb_error(rc, "delete in", env_->path());
  return Status();
}

Status LmdbTxn::commit() {
  if (txn_ == nullptr) return Status(Code::Internal, "commit of an ended transaction");
  int rc = mdb_txn_commit(txn_);  // frees the txn whatever the outcome
  txn_ = nullptr;
  release_writer();
  if (lock_.owns_lock()) lock_.unlock();
  // A read txn's commit (only to keep the dbi handles it opened) also freed
  // its reserved reader slot: claim a replacement under the slot lock.
  if (!write_) env_->replace_read_slot(slot_);
  if (rc == 0) return Status();
  if (rc == EIO && write_) {
    // LMDB reports a short pwrite as EIO. At a file-size limit (RLIMIT_FSIZE)
    // or on a full file system that is a disk-full condition hit while
    // flushing pages, before any fsync or meta write: the previous commit is
    // intact, so it is not fatal.
    Status full = env_->short_write_cause();
    if (!full.ok()) return full;
  }
  Status s = lmdb_error(rc, "commit to", env_->path());
  // MapFull and DiskFull leave the previous commit intact and the environment
  // usable (the failed pages were never referenced by a meta page). Anything
  // else may come from the fdatasync or the meta write: the kernel may have
  // dropped the dirty pages, so a retry could "succeed" without the data on
  // disk (fsyncgate). Mark the environment fatal; never retry-then-ack.
  if (write_ && s.code() != Code::MapFull && s.code() != Code::DiskFull) env_->set_fatal(s);
  return s;
}

// ---------------------------------------------------------------- LmdbCursor

Result<LmdbCursor> LmdbCursor::open(LmdbTxn& txn, LmdbDbi dbi, std::string_view path) {
  MDB_cursor* c = nullptr;
  int rc = mdb_cursor_open(txn.raw(), dbi, &c);
  if (rc != 0) return lmdb_error(rc, "open cursor in", path);
  LmdbCursor out(c, path);
  out.read_txn_ = !txn.write_;
  return out;
}

LmdbCursor::LmdbCursor(LmdbCursor&& other) noexcept
    : cursor_(std::exchange(other.cursor_, nullptr)), path_(other.path_), key_(other.key_),
      value_(other.value_), read_txn_(other.read_txn_) {}

LmdbCursor& LmdbCursor::operator=(LmdbCursor&& other) noexcept {
  if (this != &other) {
    if (cursor_ != nullptr) mdb_cursor_close(cursor_);
    cursor_ = std::exchange(other.cursor_, nullptr);
    path_ = other.path_;
    key_ = other.key_;
    value_ = other.value_;
    read_txn_ = other.read_txn_;
  }
  return *this;
}

LmdbCursor::~LmdbCursor() {
  if (cursor_ != nullptr) mdb_cursor_close(cursor_);
}

Result<bool> LmdbCursor::move(int op, std::string_view key) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{0, nullptr};
  int rc = mdb_cursor_get(cursor_, &k, &v, static_cast<MDB_cursor_op>(op));
  if (rc == MDB_NOTFOUND) {
    key_ = {};
    value_ = {};
    return false;
  }
  if (rc == MDB_BAD_TXN && read_txn_) return damaged_read_txn("read from", path_);
  if (rc != 0) return lmdb_error(rc, "read from", path_);
  key_ = std::string_view(static_cast<const char*>(k.mv_data), k.mv_size);
  value_ = std::string_view(static_cast<const char*>(v.mv_data), v.mv_size);
  return true;
}

Result<bool> LmdbCursor::seek(std::string_view key) { return move(MDB_SET_RANGE, key); }
Result<bool> LmdbCursor::first() { return move(MDB_FIRST, {}); }
Result<bool> LmdbCursor::last() { return move(MDB_LAST, {}); }
Result<bool> LmdbCursor::next() { return move(MDB_NEXT, {}); }
Result<bool> LmdbCursor::prev() { return move(MDB_PREV, {}); }

Result<char*> LmdbCursor::reserve(std::string_view key, std::size_t size) {
  MDB_val k{key.size(), const_cast<char*>(key.data())};
  MDB_val v{size, nullptr};
  int rc = mdb_cursor_put(cursor_, &k, &v, MDB_RESERVE);
  if (rc != 0) return lmdb_error(rc, "write to", path_);
  return static_cast<char*>(v.mv_data);
}

Status LmdbCursor::del() {
  int rc = mdb_cursor_del(cursor_, 0);
  if (rc != 0) return lmdb_error(rc, "delete in", path_);
  return Status();
}

// ---------------------------------------------------------------- LmdbEnv

LmdbEnv::LmdbEnv(const Config& config, MDB_env* env, dev_t dev, ino_t ino) noexcept
    : config_(config), env_(env), dev_(dev), ino_(ino) {}

namespace {

// F_SETLKW on byte `at` of `fd` (EINTR and the kernel's thread-blind EDEADLK retried).
int lock_byte(int fd, off_t at) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  while (::fcntl(fd, F_SETLKW, &fl) != 0) {
    const int e = errno;
    if (e == EINTR) continue;
    if (e == EDEADLK) {  // no lock cycle is possible here; the kernel's check can be wrong across threads
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    return e;
  }
  return 0;
}

void unlock_byte(int fd, off_t at) noexcept {
  struct flock fl {};
  fl.l_type = F_UNLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = at;
  fl.l_len = 1;
  ::fcntl(fd, F_SETLK, &fl);
}

constexpr off_t kWriterByte = 0;
constexpr off_t kSlotByte = 1;

}  // namespace

Status LmdbEnv::lock_slots() {
  slot_mutex_.lock();
  if (writer_fd_ < 0) return Status();
  if (int e = lock_byte(writer_fd_, kSlotByte); e != 0) {
    slot_mutex_.unlock();
    return Status(Code::IOError, "reserve reader slots of " + quoted(config_.path) +
                                     ": fcntl(F_SETLKW) on writer.lock: " + std::strerror(e));
  }
  return Status();
}

void LmdbEnv::unlock_slots() noexcept {
  if (writer_fd_ >= 0) unlock_byte(writer_fd_, kSlotByte);
  slot_mutex_.unlock();
}

Result<MDB_txn*> LmdbEnv::claim_slot(bool may_adopt) {
  bool checked = false;
  for (int attempt = 0; attempt < 8; ++attempt) {
    MDB_txn* txn = nullptr;
    int rc = 0;
    {
      // The map lock before the slot lock, as a thread holding a read (the
      // map lock) and asking for a nested one takes them.
      std::shared_lock<std::shared_mutex> map(map_mutex_);
      if (Status s = lock_slots(); !s.ok()) return s;
      rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
      if (rc == MDB_READERS_FULL && !checked) {
        checked = true;
        int dead = 0;
        mdb_reader_check(env_, &dead);  // under the slot lock
        rc = mdb_txn_begin(env_, nullptr, MDB_RDONLY, &txn);
      }
      unlock_slots();
    }
    if (rc == 0) {
      mdb_txn_reset(txn);  // keeps the slot, pins no pages
      return txn;
    }
    // Adopting another process's map size takes the map lock exclusively:
    // not while this thread holds a read (a nested claim reports it instead).
    if (rc == MDB_MAP_RESIZED && may_adopt) {
      if (Status s = adopt_map_size(); !s.ok()) return s;
      continue;
    }
    return lmdb_error(rc, "reserve a reader slot of", config_.path);
  }
  return Status(Code::Corruption, "reserve a reader slot of " + quoted(config_.path) +
                                      ": MDB_MAP_RESIZED on every retry: the meta pages disagree about the pages in "
                                      "use; the store is damaged; restore it from a copy");
}

Status LmdbEnv::reserve_read_slots(std::size_t want) {
  // Stale slots of dead processes pin old pages (the file grows) and fill the table.
  if (auto dead = reader_check(); !dead.ok()) return dead.status();
  Status failure;
  std::size_t got = 0;
  for (; got < want; ++got) {
    auto txn = claim_slot(true);
    if (!txn.ok()) {
      failure = txn.status();
      break;
    }
    std::lock_guard<std::mutex> lock(read_pool_mutex_);
    read_slots_[read_slot_count_++].txn = *txn;
  }
  // A full table still leaves this process the slots it got (its reads wait
  // for each other); with none it cannot read at all.
  if (got == 0) return failure;
  if (!failure.ok() && failure.code() != Code::Busy) return failure;
  return Status();
}

Result<std::size_t> LmdbEnv::acquire_read_slot() {
  const std::thread::id me = std::this_thread::get_id();
  std::unique_lock<std::mutex> lock(read_pool_mutex_);
  for (;;) {
    bool nested = false;
    bool busy = false;
    for (std::size_t i = 0; i < read_slot_count_; ++i) {
      ReadSlot& r = read_slots_[i];
      if (!r.busy && r.txn != nullptr) {
        r.busy = true;
        r.owner = me;
        return i;
      }
      busy = busy || r.busy;
      if (r.busy && r.owner == me) nested = true;
    }
    // Waiting would wait for this thread itself, or for nothing at all.
    if (nested || !busy) break;
    read_pool_cv_.wait(lock);
  }
  // A new slot for a thread that already holds a read: claimed under the slot lock.
  if (read_slot_count_ >= kMaxReadSlots) {
    return Status(Code::Busy, "begin read transaction on " + quoted(config_.path) + ": " +
                                  std::to_string(kMaxReadSlots) +
                                  " reads open at once in this process, nested on one thread");
  }
  lock.unlock();
  auto txn = claim_slot(false);  // this thread holds a read: no map resize here
  if (!txn.ok()) return txn.status();
  lock.lock();
  std::size_t i = 0;
  while (i < read_slot_count_ && (read_slots_[i].busy || read_slots_[i].txn != nullptr)) ++i;  // an emptied entry
  if (i == kMaxReadSlots) {
    lock.unlock();
    mdb_txn_abort(*txn);
    return Status(Code::Busy, "begin read transaction on " + quoted(config_.path) + ": " +
                                  std::to_string(kMaxReadSlots) + " reads open at once in this process");
  }
  if (i == read_slot_count_) ++read_slot_count_;
  read_slots_[i].txn = *txn;
  read_slots_[i].busy = true;
  read_slots_[i].owner = me;
  return i;
}

void LmdbEnv::end_read(MDB_txn* txn, std::size_t slot) noexcept {
  mdb_txn_reset(txn);  // keeps the reader slot
  {
    std::lock_guard<std::mutex> lock(read_pool_mutex_);
    read_slots_[slot].busy = false;
    read_slots_[slot].owner = std::thread::id();
  }
  read_pool_cv_.notify_one();
}

void LmdbEnv::replace_read_slot(std::size_t slot) noexcept {
  MDB_txn* txn = nullptr;
  if (auto claimed = claim_slot(true); claimed.ok()) txn = *claimed;
  {
    std::lock_guard<std::mutex> lock(read_pool_mutex_);
    read_slots_[slot].txn = txn;  // nullptr: the entry stays unused (fewer slots)
    read_slots_[slot].busy = false;
    read_slots_[slot].owner = std::thread::id();
  }
  read_pool_cv_.notify_all();
}

void LmdbEnv::free_read_slots() noexcept {
  std::lock_guard<std::mutex> lock(read_pool_mutex_);
  for (std::size_t i = 0; i < read_slot_count_; ++i) {
    if (read_slots_[i].txn != nullptr) mdb_txn_abort(read_slots_[i].txn);  // frees the slot, no lock
    read_slots_[i] = ReadSlot{};
  }
  read_slot_count_ = 0;
}

std::size_t LmdbEnv::read_slots_reserved() {
  std::lock_guard<std::mutex> lock(read_pool_mutex_);
  std::size_t n = 0;
  for (std::size_t i = 0; i < read_slot_count_; ++i) n += read_slots_[i].txn != nullptr ? 1 : 0;
  return n;
}

LmdbEnv::~LmdbEnv() {
  free_read_slots();
  mdb_env_close(env_);
  if (writer_fd_ >= 0) ::close(writer_fd_);
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry().erase({dev_, ino_});
}

namespace {

// The store directory of `config`, created when missing (unless read-only):
// a local directory this process may use. `data` is its data.mdb, when
// `*have_data`.
Status check_store_dir(const LmdbEnv::Config& config, struct stat* st, struct stat* data, bool* have_data) {
  const std::string& path = config.path;
  if (path.empty()) return Status(Code::InvalidArgument, "open store: StoreOptions::directory is empty");
  if (config.map_size_max < config.map_size_initial) {
    return Status(Code::InvalidArgument,
                  "open " + quoted(path) + ": map_size_max is smaller than map_size_initial");
  }
  if (::stat(path.c_str(), st) != 0) {
    int e = errno;
    if (e == ENOENT && config.read_only) {
      return Status(Code::NotFound, "open " + quoted(path) + ": ENOENT: no such directory; not a lanebus store");
    }
    if (e != ENOENT) return lmdb_error(e, "open", path);
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) return lmdb_error(errno, "create directory", path);
    if (::stat(path.c_str(), st) != 0) return lmdb_error(errno, "open", path);
  }
  if (!S_ISDIR(st->st_mode)) {
    return Status(Code::InvalidArgument,
                  "open " + quoted(path) + ": ENOTDIR: a file exists where the store directory should be");
  }
  const std::string data_file = path + "/data.mdb";
  *have_data = ::stat(data_file.c_str(), data) == 0;
  if (config.read_only && !*have_data) {
    return Status(Code::NotFound, "open " + quoted(path) + ": no data.mdb: not a lanebus store");
  }
  if (*have_data && !S_ISREG(data->st_mode)) {
    return Status(Code::Corruption, "open " + quoted(path) + ": data.mdb is not a regular file");
  }
  if (::access(path.c_str(), config.read_only ? (R_OK | X_OK) : (R_OK | W_OK | X_OK)) != 0) {
    return lmdb_error(errno, "open", path);
  }
  // LMDB's locks and mmap coherence do not work on network file systems.
  struct statfs fs {};
  if (::statfs(path.c_str(), &fs) == 0) {
    const auto type = static_cast<unsigned long>(fs.f_type);
    if (type == 0x6969ul /*NFS*/ || type == 0x517Bul /*SMB*/ || type == 0xFF534D42ul /*CIFS*/ ||
        type == 0xFE534D42ul /*SMB2*/) {
      return Status(Code::InvalidArgument,
                    "open " + quoted(path) + ": network file system: LMDB needs a local file system");
    }
  }
  return Status();
}

// The map the environment opens with: `reserve` (Config::reserve_map) the
// whole of map_size_max, else map_size_initial; never less than the data file
// uses, so reopening a grown store does not shrink its map below what is used.
std::uint64_t initial_map_size(const LmdbEnv::Config& config, bool have_data, const struct stat& data, bool reserve) {
  std::uint64_t map = reserve ? config.map_size_max : config.map_size_initial;
  if (have_data && static_cast<std::uint64_t>(data.st_size) > map) {
    map = std::min<std::uint64_t>(static_cast<std::uint64_t>(data.st_size) * 2, config.map_size_max);
    if (map < static_cast<std::uint64_t>(data.st_size)) map = static_cast<std::uint64_t>(data.st_size);
  }
  return map;
}

// An environment handle for `config`, configured and opened with a map of
// `map` bytes.
Result<MDB_env*> open_env_handle(const LmdbEnv::Config& config, std::uint64_t map, bool* enomem = nullptr) {
  const std::string& path = config.path;
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc != 0) return lmdb_error(rc, "create environment for", path);
  if ((rc = mdb_env_set_maxreaders(env, config.max_readers)) != 0 ||
      (rc = mdb_env_set_maxdbs(env, config.max_dbs)) != 0 ||
      (rc = mdb_env_set_mapsize(env, static_cast<std::size_t>(map))) != 0) {
    mdb_env_close(env);
    return lmdb_error(rc, "configure", path);
  }
  unsigned flags = MDB_NOTLS;
  if (config.read_only) flags |= MDB_RDONLY;
  if (config.no_sync) flags |= MDB_NOSYNC;
  if (config.no_meta_sync) flags |= MDB_NOMETASYNC;
  // Opening can fail transiently while another process opens or closes the
  // same environment (an LMDB caveat): bounded retry.
  for (int attempt = 0;; ++attempt) {
    rc = mdb_env_open(env, path.c_str(), flags, 0600);
    if (rc == 0) return env;
    if ((rc == EAGAIN || rc == EBUSY) && attempt < 20) {
      mdb_env_close(env);
      env = nullptr;
      std::this_thread::sleep_for(std::chrono::milliseconds(5 * (attempt + 1)));
      if (mdb_env_create(&env) != 0 || mdb_env_set_maxreaders(env, config.max_readers) != 0 ||
          mdb_env_set_maxdbs(env, config.max_dbs) != 0 || mdb_env_set_mapsize(env, map) != 0) {
        if (env != nullptr) mdb_env_close(env);
        return Status(Code::IOError, "open " + quoted(path) + ": could not recreate environment handle");
      }
      continue;
    }
    mdb_env_close(env);
    if (rc == ENOMEM && enomem != nullptr) *enomem = true;
    if (rc == ENOMEM) return open_enomem("open", path);
    if (rc == EINVAL) return open_einval("open", path);
    return lmdb_error(rc, "open", path);
  }
}

}  // namespace

Result<std::unique_ptr<LmdbEnv>> LmdbEnv::open(const Config& config) {
  const std::string& path = config.path;
  struct stat st {};
  struct stat dst {};
  bool have_data = false;
  if (Status s = check_store_dir(config, &st, &dst, &have_data); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (!registry().insert({st.st_dev, st.st_ino}).second) {
      return Status(Code::Busy, "open " + quoted(path) +
                                    ": the store is already open in this process (one LMDB environment per "
                                    "process; share the open store)");
    }
  }
  // The reserved map costs address space only (LMDB extends the file as it
  // writes, never to the map's size without MDB_WRITEMAP). Where the OS
  // refuses that much (RLIMIT_AS, a 32-bit process), open with the initial
  // size and grow as before.
  bool enomem = false;
  auto env = open_env_handle(config, initial_map_size(config, have_data, dst, config.reserve_map), &enomem);
  if (!env.ok() && config.reserve_map && enomem && env.code() != Code::Corruption) {
    env = open_env_handle(config, initial_map_size(config, have_data, dst, false));
  }
  if (!env.ok()) {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry().erase({st.st_dev, st.st_ino});
    return env.status();
  }
  auto out = std::unique_ptr<LmdbEnv>(new LmdbEnv(config, *env, st.st_dev, st.st_ino));
  MDB_envinfo info{};
  mdb_env_info(*env, &info);
  out->map_size_.store(info.me_mapsize, std::memory_order_relaxed);
  // The cross-process writer queue and slot lock (see the class comment).
  // Without the file (EACCES, EROFS; a read-only open of a store that never
  // had one) writers still exclude each other through LMDB's mutex, and
  // readers claim slots under LMDB's reader mutex alone.
  out->writer_fd_ = ::open((path + "/writer.lock").c_str(),
                           config.read_only ? O_RDWR | O_CLOEXEC : O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  unsigned maxreaders = config.max_readers;
  mdb_env_get_maxreaders(*env, &maxreaders);  // the lock file's, when another process set it
  std::size_t want = config.read_slots != 0 ? config.read_slots : std::min(8u, std::max(1u, maxreaders / 16));
  want = std::min<std::size_t>(want, kMaxReadSlots);
  if (Status s = out->reserve_read_slots(want); !s.ok()) return s;  // ~LmdbEnv closes it
  return out;
}

void LmdbEnv::set_fatal(const Status& cause) {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  if (!fatal_.load()) {
    fatal_cause_ = cause.to_string();
    fatal_.store(true);
  }
}

Status LmdbEnv::fatal_status() const {
  std::lock_guard<std::mutex> lock(fatal_mutex_);
  return Status(Code::IOError, "store " + quoted(config_.path) + " is unusable after a failed write (" +
                                   fatal_cause_ + "); close and reopen it");
}

Status LmdbEnv::adopt_map_size() {
  std::unique_lock<std::shared_mutex> lock(map_mutex_);
  if (Status s = refuse_resize_if_held("adopt the larger map another process set"); !s.ok()) return s;
  int rc = mdb_env_set_mapsize(env_, 0);  // adopt the size another process set
  if (rc != 0) return lmdb_error(rc, "resize map of", config_.path);
  MDB_envinfo info{};
  mdb_env_info(env_, &info);
  map_size_.store(info.me_mapsize, std::memory_order_relaxed);
  return Status();
}

Status LmdbEnv::lock_writer() {
  writer_mutex_.lock();
  if (writer_fd_ < 0) return Status();
  if (int e = lock_byte(writer_fd_, kWriterByte); e != 0) {
    writer_mutex_.unlock();
    return Status(Code::IOError, "begin write transaction on " + quoted(config_.path) +
                                     ": fcntl(F_SETLKW) on writer.lock: " + std::strerror(e));
  }
  return Status();
}

void LmdbEnv::unlock_writer() noexcept {
  if (writer_fd_ >= 0) unlock_byte(writer_fd_, kWriterByte);
  writer_mutex_.unlock();
}

Result<LmdbTxn> LmdbEnv::begin_read() {
  if (fatal_.load()) return fatal_status();
  auto slot = acquire_read_slot();
  if (!slot.ok()) return slot.status();
  MDB_txn* txn = nullptr;
  {
    std::lock_guard<std::mutex> lock(read_pool_mutex_);
    txn = read_slots_[*slot].txn;
  }
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::shared_lock<std::shared_mutex> lock(map_mutex_);
    const int rc = mdb_txn_renew(txn);  // the kept slot: no lock in lock.mdb
    if (rc == 0) return LmdbTxn(this, txn, std::move(lock), false, *slot);
    lock.unlock();
    // A failed renew leaves the txn reset, on its slot (LMDB frees a slot only
    // when the same call claimed it).
    if (rc == MDB_MAP_RESIZED) {
      Status s = adopt_map_size();
      if (s.ok()) s = check_meta_fits();
      if (!s.ok()) {
        end_read(txn, *slot);
        return s;
      }
      continue;
    }
    end_read(txn, *slot);
    Status s = lmdb_error(rc, "begin read transaction on", config_.path);
    if (rc == MDB_PANIC) set_fatal(s);
    return s;
  }
  end_read(txn, *slot);
  return Status(Code::Corruption, "begin transaction on " + quoted(config_.path) +
                                      ": MDB_MAP_RESIZED on every retry: the meta pages disagree about the pages in "
                                      "use; the store is damaged; restore it from a copy");
}

Status LmdbEnv::check_meta_fits() {
  // A meta page that claims more pages than even the adopted map holds was
  // damaged (a writer never commits past its map): Corruption, not a retry.
  MDB_envinfo info{};
  MDB_stat st{};
  if (mdb_env_info(env_, &info) == 0 && mdb_env_stat(env_, &st) == 0 &&
      (static_cast<std::uint64_t>(info.me_last_pgno) + 1) * st.ms_psize > info.me_mapsize) {
    return Status(Code::Corruption, "begin transaction on " + quoted(config_.path) + ": the meta page says " +
                                        std::to_string(info.me_last_pgno + 1) + " pages are in use, more than its map of " +
                                        std::to_string(info.me_mapsize) + " bytes holds: the store is damaged; "
                                        "restore it from a copy");
  }
  return Status();
}

Result<LmdbTxn> LmdbEnv::begin_write_txn() {
  if (Status s = lock_writer(); !s.ok()) return s;
  // Released on every return below but the one that hands it to the txn.
  struct WriterHold {
    LmdbEnv* env;
    ~WriterHold() {
      if (env != nullptr) env->unlock_writer();
    }
  } hold{this};
  for (int attempt = 0; attempt < 8; ++attempt) {
    if (fatal_.load()) return fatal_status();
    std::shared_lock<std::shared_mutex> lock(map_mutex_);
    MDB_txn* txn = nullptr;
    int rc = mdb_txn_begin(env_, nullptr, 0, &txn);
    if (rc == 0) {
      LmdbTxn out(this, txn, std::move(lock), true);
      out.writer_locked_ = true;
      hold.env = nullptr;
      return out;
    }
    lock.unlock();
    if (rc == MDB_MAP_RESIZED) {
      Status s = adopt_map_size();
      if (s.ok()) s = check_meta_fits();
      if (!s.ok()) return s;
      continue;
    }
    Status s = lmdb_error(rc, "begin write transaction on", config_.path);
    if (rc == MDB_PANIC) set_fatal(s);
    return s;
  }
  // Every retry found the map too small for the meta page LMDB reads (the two
  // meta pages disagree): a damaged meta page, not a racing writer.
  return Status(Code::Corruption, "begin transaction on " + quoted(config_.path) +
                                      ": MDB_MAP_RESIZED on every retry: the meta pages disagree about the pages in "
                                      "use; the store is damaged; restore it from a copy");
}

Result<LmdbTxn> LmdbEnv::begin_write() {
  if (config_.read_only) {
    return Status(Code::InvalidArgument, "write to " + quoted(config_.path) + ": the store is open read-only");
  }
  return begin_write_txn();
}

Result<LmdbDbi> LmdbEnv::open_dbi(LmdbTxn& txn, const char* name, bool create) {
  MDB_dbi dbi = 0;
  int rc = mdb_dbi_open(txn.raw(), name, create ? MDB_CREATE : 0, &dbi);
  const std::string shown = name != nullptr ? name : "(main)";
  if (rc == MDB_NOTFOUND) return Status(Code::NotFound, "database " + shown + " not found");
  if (rc != 0) return lmdb_error(rc, "open database " + shown + " in", config_.path);
  return static_cast<LmdbDbi>(dbi);
}

Status LmdbEnv::grow_map() {
  auto at_max = [this](std::uint64_t current) {
    return Status(Code::MapFull, "write to " + quoted(config_.path) + ": MDB_MAP_FULL: map size " +
                                     std::to_string(current >> 20) +
                                     " MiB reached its maximum; raise StoreOptions::map_size_max");
  };
  // At the maximum (always, once the map is reserved) without the exclusive
  // lock: a read held across a handler call (in-place delivery) must never
  // hold up the writer's answer.
  if (const std::uint64_t current = map_size(); current >= config_.map_size_max) return at_max(current);
  std::unique_lock<std::shared_mutex> lock(map_mutex_);  // no txn of ours is open now
  if (Status s = refuse_resize_if_held("grow the map"); !s.ok()) return s;
  MDB_envinfo info{};
  mdb_env_info(env_, &info);
  std::uint64_t current = info.me_mapsize;
  if (current >= config_.map_size_max) return at_max(current);
  std::uint64_t next = std::min<std::uint64_t>(current * 2, config_.map_size_max);
  int rc = mdb_env_set_mapsize(env_, static_cast<std::size_t>(next));
  if (rc != 0) return lmdb_error(rc, "grow map of", config_.path);
  mdb_env_info(env_, &info);
  map_size_.store(info.me_mapsize, std::memory_order_relaxed);
  map_growths_.fetch_add(1, std::memory_order_relaxed);
  return Status();
}

Status LmdbEnv::refuse_resize_if_held(const char* what) const {
  const std::uint32_t held = held_reads_.load(std::memory_order_seq_cst);
  if (held == 0) return Status();
  return Status(Code::MapFull, "write to " + quoted(config_.path) + ": cannot " + what + " of " +
                                   std::to_string(map_size() >> 20) + " MiB while " + std::to_string(held) +
                                   " read(s) of this process hold views into it (a batch handler's call); give "
                                   "every process that opens the store the same StoreOptions::map_size_max");
}

bool LmdbEnv::in_map(const void* p) const noexcept {
  // LMDB does not tell where it mapped the file (me_mapaddr is only set with
  // MDB_FIXEDMAP): find the mapping of data.mdb's inode in /proc/self/maps.
  struct stat data {};
  if (::stat((config_.path + "/data.mdb").c_str(), &data) != 0) return false;
  FILE* f = std::fopen("/proc/self/maps", "r");
  if (f == nullptr) return false;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  bool found = false;
  char line[512];
  while (!found && std::fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0, ino = 0;
    if (std::sscanf(line, "%lx-%lx %*s %*s %*s %lu", &lo, &hi, &ino) == 3 && ino == data.st_ino)
      found = a >= lo && a < hi;
  }
  std::fclose(f);
  return found;
}

Result<int> LmdbEnv::reader_check() {
  if (Status s = lock_slots(); !s.ok()) return s;
  int dead = 0;
  int rc = mdb_reader_check(env_, &dead);
  unlock_slots();
  if (rc != 0) return lmdb_error(rc, "check readers of", config_.path);
  return dead;
}

unsigned LmdbEnv::reader_slots_held() {
  struct Count {
    long pid;
    unsigned n;
  } count{static_cast<long>(::getpid()), 0};
  // One line a slot: "%10d %zx %llu" (or "-" for a reset transaction's txnid).
  mdb_reader_list(
      env_,
      [](const char* line, void* ctx) -> int {
        auto* c = static_cast<Count*>(ctx);
        char* end = nullptr;
        const long pid = std::strtol(line, &end, 10);
        if (end != line && pid == c->pid) ++c->n;
        return 0;
      },
      &count);
  return count.n;
}

Status LmdbEnv::sync() {
  if (fatal_.load()) return fatal_status();
  int rc = mdb_env_sync(env_, 1);
  if (rc != 0) {
    Status s = lmdb_error(rc, "sync", config_.path);
    set_fatal(s);  // fsyncgate: after a failed fsync nothing written before it can be trusted
    return s;
  }
  return Status();
}

Status LmdbEnv::short_write_cause() const {
  struct stat st {};
  const std::string data = config_.path + "/data.mdb";
  if (::stat(data.c_str(), &st) != 0) return Status();
  const auto size = static_cast<std::uint64_t>(st.st_size);
  const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && size + page > rl.rlim_cur) {
    return Status(Code::DiskFull, "commit to " + quoted(config_.path) + ": EFBIG: data.mdb reached the file-size limit (RLIMIT_FSIZE " +
                                      std::to_string(rl.rlim_cur) + " bytes); raise the limit or free space");
  }
  struct statvfs vfs {};
  if (::statvfs(config_.path.c_str(), &vfs) == 0 && vfs.f_bavail == 0) {
    return Status(Code::DiskFull, "commit to " + quoted(config_.path) + ": ENOSPC: short write, the file system is full; free disk space");
  }
  return Status();
}

Result<std::uint64_t> LmdbEnv::used_bytes() {
  MDB_envinfo info{};
  MDB_stat st{};
  int rc = mdb_env_info(env_, &info);
  if (rc == 0) rc = mdb_env_stat(env_, &st);
  if (rc != 0) return lmdb_error(rc, "stat", config_.path);
  return static_cast<std::uint64_t>(info.me_last_pgno + 1) * st.ms_psize;
}

}  // namespace lanebus::detail

// ---------------------------------------------------------------- LmdbWalk
// (the verify walk; see lib/ops/verify.cpp)

namespace lanebus::detail {

Result<std::unique_ptr<LmdbWalk>> LmdbWalk::open(const std::string& path) {
  const std::string data_file = path + "/data.mdb";
  struct stat dst {};
  if (::stat(data_file.c_str(), &dst) != 0) return lmdb_error(errno, "verify", path);
  if (!S_ISREG(dst.st_mode)) return Status(Code::Corruption, "verify " + quoted(path) + ": data.mdb is not a regular file");
  MDB_env* env = nullptr;
  int rc = mdb_env_create(&env);
  if (rc != 0) return lmdb_error(rc, "verify", path);
  std::unique_ptr<LmdbWalk> w(new LmdbWalk(path, env));
  // Map exactly the file: a page number past its end is then refused by LMDB
  // (MDB_PAGE_NOTFOUND) instead of touching memory past EOF (SIGBUS). LMDB
  // raises it when the meta page says more pages are in use.
  const auto size = static_cast<std::size_t>(dst.st_size);
  if ((rc = mdb_env_set_maxdbs(w->env_, 64)) != 0 ||
      (rc = mdb_env_set_mapsize(w->env_, std::max<std::size_t>(size, 1u << 16))) != 0) {
    return lmdb_error(rc, "verify", path);
  }
  rc = mdb_env_open(w->env_, path.c_str(), MDB_RDONLY | MDB_NOTLS, 0600);
  if (rc == ENOMEM) return open_enomem("verify: open", path);
  if (rc == EINVAL) return open_einval("verify: open", path);
  if (rc != 0) return lmdb_error(rc, "verify: open", path);
  {
    // Claiming the walk's reader slot takes LMDB's reader mutex: under the
    // slot lock like every other lanebus process (LmdbEnv's class comment).
    // The descriptor is closed right after, which drops only this process's
    // locks on writer.lock (the walk runs where the store is not open).
    const int fd = ::open((path + "/writer.lock").c_str(), O_RDWR | O_CLOEXEC);
    const bool locked = fd >= 0 && lock_byte(fd, kSlotByte) == 0;
    rc = mdb_txn_begin(w->env_, nullptr, MDB_RDONLY, &w->txn_);
    if (locked) unlock_byte(fd, kSlotByte);
    if (fd >= 0) ::close(fd);
  }
  if (rc == MDB_MAP_RESIZED) {
    // The newest meta page claims more pages than the file (the map) has.
    return Status(Code::Corruption, "verify " + quoted(path) + ": the meta page claims more pages than data.mdb has (" +
                                        std::to_string(size) + " bytes): the store is damaged");
  }
  if (rc != 0) return lmdb_error(rc, "verify: begin read transaction in", path);
  MDB_envinfo info{};
  MDB_stat st{};
  if ((rc = mdb_env_info(w->env_, &info)) != 0 || (rc = mdb_env_stat(w->env_, &st)) != 0) {
    return lmdb_error(rc, "verify: stat", path);
  }
  w->page_size_ = st.ms_psize;
  // Where LMDB mapped data.mdb (mdb_env_info names the address only for
  // MDB_FIXEDMAP): the mapping of this inode in /proc/self/maps.
  if (FILE* maps = std::fopen("/proc/self/maps", "re"); maps != nullptr) {
    char line[4096];
    while (std::fgets(line, sizeof line, maps) != nullptr) {
      unsigned long long lo = 0, hi = 0, off = 0, ino = 0;
      char perms[8] = {}, dev[16] = {};
      if (std::sscanf(line, "%llx-%llx %7s %llx %15s %llu", &lo, &hi, perms, &off, dev, &ino) == 6 && off == 0 &&
          ino == static_cast<unsigned long long>(dst.st_ino) && hi > lo &&
          std::strstr(line, "/data.mdb") != nullptr) {
        w->map_begin_ = reinterpret_cast<const char*>(static_cast<std::uintptr_t>(lo));
        w->map_end_ = w->map_begin_ + std::min<unsigned long long>(hi - lo, size);
        break;
      }
    }
    std::fclose(maps);
  }
  if (info.me_last_txnid == mdb_txn_id(w->txn_)) w->snapshot_pages_ = info.me_last_pgno + 1;
  return w;
}

bool LmdbWalk::inside_map(const void* data, std::size_t size) const noexcept {
  const auto* p = static_cast<const char*>(data);
  if (size == 0) return true;
  if (map_begin_ == nullptr) return true;  // mapping not found: no check (never seen on Linux)
  return p >= map_begin_ && p < map_end_ &&
         size <= static_cast<std::size_t>(map_end_ - p);
}

LmdbWalk::~LmdbWalk() {
  if (txn_ != nullptr) mdb_txn_abort(txn_);
  if (env_ != nullptr) mdb_env_close(env_);
}

namespace {
LmdbDbStat to_stat(const MDB_stat& s) {
  LmdbDbStat o;
  o.entries = s.ms_entries;
  o.depth = s.ms_depth;
  o.branch_pages = s.ms_branch_pages;
  o.leaf_pages = s.ms_leaf_pages;
  o.overflow_pages = s.ms_overflow_pages;
  return o;
}
}  // namespace

Result<LmdbDbStat> LmdbWalk::free_stat() {
  MDB_stat s{};
  int rc = mdb_stat(txn_, 0 /* FREE_DBI */, &s);
  if (rc != 0) return lmdb_error(rc, "verify: stat of the free-page database in", path_);
  return to_stat(s);
}

Result<LmdbDbStat> LmdbWalk::main_stat() {
  MDB_dbi dbi = 0;
  int rc = mdb_dbi_open(txn_, nullptr, 0, &dbi);
  MDB_stat s{};
  if (rc == 0) rc = mdb_stat(txn_, dbi, &s);
  if (rc != 0) return lmdb_error(rc, "verify: stat of the main database in", path_);
  return to_stat(s);
}

Status LmdbWalk::scan_freelist(const std::function<void(std::uint64_t, std::uint64_t, bool)>& visit) {
  MDB_cursor* c = nullptr;
  int rc = mdb_cursor_open(txn_, 0 /* FREE_DBI */, &c);
  if (rc != 0) return lmdb_error(rc, "verify: walk the free-page database in", path_);
  MDB_val k{}, v{};
  rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
  std::uint64_t prev_txnid = 0;
  bool first = true;
  while (rc == 0) {
    // Keys are transaction ids (size_t) in ascending order. A key of another
    // size, or one out of order, means a damaged page, on which the cursor may
    // revisit the same entries for ever: stop the scan there.
    if (k.mv_size != sizeof(std::size_t)) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: the free-page database of " + path_ + " has a key of " +
                                           std::to_string(k.mv_size) + " bytes after transaction " +
                                           std::to_string(prev_txnid) + " (a damaged page)");
    }
    if (!inside_map(k.mv_data, k.mv_size) || !inside_map(v.mv_data, v.mv_size)) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: the free-page database of " + path_ +
                                           " has an entry that points outside data.mdb (a damaged page)");
    }
    std::uint64_t txnid = 0;
    std::memcpy(&txnid, k.mv_data, sizeof(std::size_t));
    if (!first && txnid <= prev_txnid) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: the free-page database of " + path_ + " lists transaction " +
                                           std::to_string(txnid) + " after " + std::to_string(prev_txnid) +
                                           " (keys out of order: a damaged page)");
    }
    prev_txnid = txnid;
    first = false;
    // The value is an ID list: a count, then that many page numbers (size_t each).
    bool bad = v.mv_size < sizeof(std::size_t) || v.mv_size % sizeof(std::size_t) != 0;
    std::uint64_t n = 0;
    if (!bad) {
      std::size_t count = 0;
      std::memcpy(&count, v.mv_data, sizeof count);
      bad = count != v.mv_size / sizeof(std::size_t) - 1;
      if (!bad) {
        n = count;
        const auto* base = static_cast<const char*>(v.mv_data) + sizeof(std::size_t);
        for (std::size_t i = 0; i < count && !bad; ++i) {
          std::size_t pg = 0;
          std::memcpy(&pg, base + i * sizeof pg, sizeof pg);
          bad = pg < 2 || (snapshot_pages_ != 0 && pg >= snapshot_pages_);
        }
      }
    }
    visit(txnid, n, bad);
    rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(c);
  if (rc != MDB_NOTFOUND) return lmdb_error(rc, "verify: walk the free-page database in", path_);
  return Status();
}

Result<std::vector<std::string>> LmdbWalk::main_keys() {
  MDB_dbi dbi = 0;
  int rc = mdb_dbi_open(txn_, nullptr, 0, &dbi);
  if (rc != 0) return lmdb_error(rc, "verify: open the main database in", path_);
  MDB_cursor* c = nullptr;
  rc = mdb_cursor_open(txn_, dbi, &c);
  if (rc != 0) return lmdb_error(rc, "verify: walk the main database in", path_);
  std::vector<std::string> keys;
  MDB_val k{}, v{};
  // The main database holds one key per named database (a few dozen). A key
  // longer than LMDB's maximum or an endless run of keys means a damaged
  // page: refuse it before copying (store_open_fuzz found a key size that
  // asked for gigabytes).
  const std::size_t max_key = static_cast<std::size_t>(mdb_env_get_maxkeysize(env_));
  constexpr std::size_t kMaxNamedDatabases = 1u << 16;
  rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
  while (rc == 0) {
    if (k.mv_size > max_key || keys.size() >= kMaxNamedDatabases || !inside_map(k.mv_data, k.mv_size)) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: the main database of " + path_ +
                                          " holds a key longer than LMDB allows or too many keys (damaged page)");
    }
    if (!keys.empty()) {
      MDB_val prev{keys.back().size(), keys.back().data()};
      if (mdb_cmp(txn_, dbi, &prev, &k) >= 0) {
        mdb_cursor_close(c);
        return Status(Code::Corruption, "verify: the main database of " + path_ +
                                            " lists its keys out of order (damaged page)");
      }
    }
    keys.emplace_back(static_cast<const char*>(k.mv_data), k.mv_size);
    rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(c);
  if (rc != MDB_NOTFOUND) return lmdb_error(rc, "verify: walk the main database in", path_);
  return keys;
}

Result<LmdbDbStat> LmdbWalk::stat(const std::string& name) {
  MDB_dbi dbi = 0;
  int rc = mdb_dbi_open(txn_, name.c_str(), 0, &dbi);
  MDB_stat s{};
  if (rc == 0) rc = mdb_stat(txn_, dbi, &s);
  if (rc != 0) return lmdb_error(rc, "verify: open database " + quoted(name) + " in", path_);
  return to_stat(s);
}

Status LmdbWalk::scan(const std::string& name, const std::function<bool(std::string_view, std::string_view)>& visit) {
  MDB_dbi dbi = 0;
  int rc = mdb_dbi_open(txn_, name.c_str(), 0, &dbi);
  if (rc != 0) return lmdb_error(rc, "verify: open database " + quoted(name) + " in", path_);
  MDB_cursor* c = nullptr;
  rc = mdb_cursor_open(txn_, dbi, &c);
  if (rc != 0) return lmdb_error(rc, "verify: walk database " + quoted(name) + " in", path_);
  MDB_val k{}, v{};
  // Keys come in ascending order; one that does not means a damaged page on
  // which the cursor may revisit the same entries for ever: stop there.
  std::string prev;
  bool first = true;
  rc = mdb_cursor_get(c, &k, &v, MDB_FIRST);
  while (rc == 0) {
    if (!inside_map(k.mv_data, k.mv_size) || !inside_map(v.mv_data, v.mv_size)) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: database " + quoted(name) + " of " + path_ +
                                          " has a record that points outside data.mdb (damaged page)");
    }
    MDB_val pv{prev.size(), prev.data()};
    if (!first && mdb_cmp(txn_, dbi, &pv, &k) >= 0) {
      mdb_cursor_close(c);
      return Status(Code::Corruption, "verify: database " + quoted(name) + " of " + path_ +
                                          " lists its keys out of order (damaged page)");
    }
    prev.assign(static_cast<const char*>(k.mv_data), k.mv_size);
    first = false;
    if (!visit(std::string_view(static_cast<const char*>(k.mv_data), k.mv_size),
               std::string_view(static_cast<const char*>(v.mv_data), v.mv_size))) {
      break;
    }
    rc = mdb_cursor_get(c, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(c);
  if (rc != 0 && rc != MDB_NOTFOUND) return lmdb_error(rc, "verify: walk database " + quoted(name) + " in", path_);
  return Status();
}

}  // namespace lanebus::detail
