// lanebus — MIT License.
// Test side of the faultfs shim (tests/support/faultfs.cpp): the control
// functions of a preloaded shim, and the power cut — reading the undo journal
// and turning data.mdb into "the image as of the last fsync plus a random
// subset of the writes since" (see doc/power-loss.md for the model).
#pragma once

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace lanebus::test::faultfs {

/// True when the shim is preloaded into this process.
inline bool present() { return dlsym(RTLD_DEFAULT, "lanebus_faultfs_set_target") != nullptr; }

template <typename F>
F fn(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}
inline void set_target(const std::string& file) {
  fn<void (*)(const char*)>("lanebus_faultfs_set_target")(file.c_str());
}
inline void set_journal(const std::string& path) {
  fn<void (*)(const char*)>("lanebus_faultfs_set_journal")(path.c_str());
}
/// The n-th fsync/fdatasync of the target from now fails with EIO (0: off).
inline void fail_fsync(unsigned long long n) { fn<void (*)(unsigned long long)>("lanebus_faultfs_fail_fsync")(n); }
/// Bytes by which writes may still grow the target; -1: unlimited.
inline void set_space(long long bytes) { fn<void (*)(long long)>("lanebus_faultfs_set_space")(bytes); }
inline void set_short_writes(bool on) { fn<void (*)(int)>("lanebus_faultfs_set_short_writes")(on ? 1 : 0); }
enum Stat : int { kWrites, kBytes, kSyncs, kEioInjected, kEnospcInjected, kShortInjected, kRecords };
inline unsigned long long counter(Stat s) { return fn<unsigned long long (*)(int)>("lanebus_faultfs_stat")(s); }

/// One write that was not durable at the cut.
struct UndoRecord {
  std::uint64_t offset = 0;
  std::uint64_t old_size = 0;  ///< File size before the write.
  std::string old_bytes;       ///< What [offset, offset + old_bytes.size()) held before.
  std::string new_bytes;       ///< What the write wrote at offset.
  /// The write returned. A record whose process was killed between appending
  /// it and the write's return may or may not have reached the page cache:
  /// it is undone but never redone.
  bool done = false;
};

/// The complete records of the journal, oldest first. A torn last record (its
/// process was killed while appending it, before its write) is left out.
inline std::vector<UndoRecord> read_journal(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<UndoRecord> out;
  struct Header {
    std::uint32_t magic, done;
    std::uint64_t offset, len, old_len, old_size;
  };
  std::size_t pos = 0;
  while (pos + sizeof(Header) <= data.size()) {
    Header h;
    std::memcpy(&h, data.data() + pos, sizeof h);
    if (h.magic != 0x4c42464au) break;
    const std::size_t total = sizeof h + h.old_len + h.len + 4;
    if (pos + total > data.size()) break;
    std::uint32_t end;
    std::memcpy(&end, data.data() + pos + total - 4, 4);
    if (end != 0x4a454e44u) break;
    UndoRecord r;
    r.offset = h.offset;
    r.old_size = h.old_size;
    r.old_bytes = data.substr(pos + sizeof h, h.old_len);
    r.new_bytes = data.substr(pos + sizeof h + h.old_len, h.len);
    r.done = h.done != 0;
    out.push_back(std::move(r));
    pos += total;
  }
  return out;
}

/// How the device treats the writes that were not durable at the cut.
enum class Device {
  /// Each page (4 KiB, aligned to the file) of each write is kept or lost
  /// independently: the disk cache reorders freely.
  Torn,
  /// A prefix of the pages, in write order, reaches the disk (a file system
  /// that preserves write order), the rest is lost.
  Ordered,
};

struct CutReport {
  std::size_t records = 0;  ///< Writes not durable at the cut.
  std::size_t pages = 0;    ///< Their pages.
  std::size_t kept = 0;     ///< Pages that reached the disk anyway.
  std::size_t in_flight = 0;  ///< Writes whose process died before they returned (undone, never redone).
  /// Some pages of the unsynced writes were kept and some lost.
  bool torn() const { return kept > 0 && kept < pages; }
};

/// Cut the power on `data_file` (every process using it is dead): undo the
/// journal's writes newest first (the image as of the last successful fsync),
/// then redo a random subset of their pages in order, and empty the journal.
inline CutReport power_cut(const std::string& data_file, const std::string& journal, std::mt19937_64& rng,
                           Device device) {
  CutReport rep;
  std::vector<UndoRecord> recs = read_journal(journal);
  rep.records = recs.size();
  int fd = ::open(data_file.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return rep;
  for (std::size_t i = recs.size(); i-- > 0;) {
    const UndoRecord& r = recs[i];
    if (!r.old_bytes.empty()) {
      (void)!::pwrite(fd, r.old_bytes.data(), r.old_bytes.size(), static_cast<off_t>(r.offset));
    }
    (void)!::ftruncate(fd, static_cast<off_t>(r.old_size));
  }
  struct Page {
    std::size_t rec;
    std::uint64_t from, to;  // within the record's new bytes
  };
  // Only writes that returned can be redone. The Ordered device keeps a
  // prefix in write order, so it stops before the first one that did not.
  std::vector<Page> pages;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    if (!recs[i].done) {
      ++rep.in_flight;
      if (device == Device::Ordered) break;
      continue;
    }
    const std::uint64_t off = recs[i].offset, len = recs[i].new_bytes.size();
    for (std::uint64_t p = 0; p < len;) {
      std::uint64_t next = ((off + p) / 4096 + 1) * 4096 - off;
      if (next > len) next = len;
      pages.push_back({i, p, next});
      p = next;
    }
  }
  rep.pages = pages.size();
  std::vector<bool> keep(pages.size(), false);
  if (!pages.empty()) {
    if (device == Device::Ordered) {
      std::size_t k = std::uniform_int_distribution<std::size_t>(0, pages.size())(rng);
      for (std::size_t i = 0; i < k; ++i) keep[i] = true;
    } else {
      // Mix all-lost, all-kept and partial cuts.
      const double p = std::uniform_int_distribution<int>(0, 4)(rng) / 4.0;
      std::bernoulli_distribution coin(p);
      for (std::size_t i = 0; i < pages.size(); ++i) keep[i] = coin(rng);
    }
  }
  for (std::size_t i = 0; i < pages.size(); ++i) {
    if (!keep[i]) continue;
    const UndoRecord& r = recs[pages[i].rec];
    (void)!::pwrite(fd, r.new_bytes.data() + pages[i].from, pages[i].to - pages[i].from,
                    static_cast<off_t>(r.offset + pages[i].from));
    ++rep.kept;
  }
  ::close(fd);
  (void)!::truncate(journal.c_str(), 0);
  return rep;
}

}  // namespace lanebus::test::faultfs
