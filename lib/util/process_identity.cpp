// lanebus — MIT License.
// ProcessIdentity: reading pid, start time, pid namespace and boot id from
// /proc, encoding them, and deciding whether a recorded process is dead.
#include "process_identity.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lanebus::detail {

namespace {

// Reads a small /proc file with plain syscalls (no iostreams: this runs on the
// claim path). Returns the byte count, or -1.
ssize_t read_small_file(const char* path, char* buf, std::size_t cap) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  std::size_t got = 0;
  while (got < cap) {
    ssize_t n = ::read(fd, buf + got, cap - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return static_cast<ssize_t>(got);
}

std::uint64_t inode_of(const char* path) {
  struct stat st {};
  if (::stat(path, &st) != 0) return 0;
  return st.st_ino;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The UUID text "8-4-4-4-12" as 16 bytes; all zero when it is not one.
std::array<std::uint8_t, 16> parse_boot_id(const std::string& text) {
  std::array<std::uint8_t, 16> out{};
  std::size_t nibbles = 0;
  for (char c : text) {
    if (c == '-') continue;
    int v = hex_value(c);
    if (v < 0 || nibbles >= 32) return {};
    out[nibbles / 2] = static_cast<std::uint8_t>(out[nibbles / 2] | (nibbles % 2 == 0 ? v << 4 : v));
    ++nibbles;
  }
  if (nibbles != 32) return {};
  return out;
}

const std::array<std::uint8_t, 16>& current_boot_id() {
  static const std::array<std::uint8_t, 16> id = parse_boot_id(current_boot_id_text());
  return id;
}

void put_le(char* p, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_le(const char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

ProcessIdentity compute_self() {
  ProcessIdentity id;
  id.pid = static_cast<std::uint32_t>(::getpid());
  id.start_time = read_start_time(static_cast<pid_t>(id.pid));
  id.pid_ns = inode_of("/proc/self/ns/pid");
  id.boot_id = current_boot_id();
  return id;
}

// The cached identity of this process. A node is published once and never
// freed; after fork() the child publishes a new node that links the old one
// (so nothing is unreachable), which keeps readers lock-free and fork-safe:
// there is no lock a forking thread could have held.
struct IdentityNode {
  ProcessIdentity id;
  const IdentityNode* previous;
};
std::atomic<const IdentityNode*> g_self{nullptr};

}  // namespace

bool ProcessIdentity::boot_known() const noexcept {
  for (std::uint8_t b : boot_id)
    if (b != 0) return true;
  return false;
}

void ProcessIdentity::encode_to(char* out) const noexcept {
  out[0] = static_cast<char>(kFormat);
  put_le(out + 1, pid, 4);
  put_le(out + 5, start_time, 8);
  put_le(out + 13, pid_ns, 8);
  std::memcpy(out + 21, boot_id.data(), boot_id.size());
}

std::string ProcessIdentity::encode() const {
  std::string s(kEncodedBytes, '\0');
  encode_to(s.data());
  return s;
}

bool ProcessIdentity::decode(std::string_view bytes, ProcessIdentity* out) noexcept {
  if (bytes.size() != kEncodedBytes || static_cast<std::uint8_t>(bytes[0]) != kFormat) return false;
  ProcessIdentity id;
  id.pid = static_cast<std::uint32_t>(get_le(bytes.data() + 1, 4));
  id.start_time = get_le(bytes.data() + 5, 8);
  id.pid_ns = get_le(bytes.data() + 13, 8);
  std::memcpy(id.boot_id.data(), bytes.data() + 21, id.boot_id.size());
  *out = id;
  return true;
}

std::string ProcessIdentity::to_string() const {
  return "pid " + std::to_string(pid) + " (start " + std::to_string(start_time) + ")";
}

const std::string& current_boot_id_text() {
  static const std::string text = [] {
    char buf[128];
    ssize_t n = read_small_file("/proc/sys/kernel/random/boot_id", buf, sizeof(buf) - 1);
    if (n <= 0) return std::string();
    std::string s(buf, static_cast<std::size_t>(n));
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }();
  return text;
}

std::uint64_t read_start_time(pid_t pid, char* state) {
  char path[48];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  char buf[1024];
  ssize_t n = read_small_file(path, buf, sizeof(buf) - 1);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // Field 2 (comm) may contain spaces and parentheses: parse after the last ')'.
  char* close = std::strrchr(buf, ')');
  if (close == nullptr) return 0;
  // After ") " come field 3 (state), 4, ... 22 (starttime), space separated.
  char* p = close + 1;
  for (int field = 3; field <= 22; ++field) {
    while (*p == ' ') ++p;
    if (*p == '\0') return 0;
    char* end = p;
    while (*end != ' ' && *end != '\0') ++end;
    if (field == 3 && state != nullptr) *state = *p;
    if (field == 22) return std::strtoull(p, nullptr, 10);
    p = end;
  }
  return 0;
}

ProcessIdentity self_identity() {
  const std::uint32_t pid = static_cast<std::uint32_t>(::getpid());
  // acquire: pairs with the release in compare_exchange, so the node's
  // fields are visible before its pointer.
  const IdentityNode* cur = g_self.load(std::memory_order_acquire);
  if (cur != nullptr && cur->id.pid == pid) return cur->id;
  auto* fresh = new IdentityNode{compute_self(), cur};
  // Two threads racing here compute the same identity; the loser frees its copy.
  if (g_self.compare_exchange_strong(cur, fresh, std::memory_order_acq_rel, std::memory_order_acquire)) {
    return fresh->id;
  }
  ProcessIdentity id = fresh->id;
  delete fresh;
  return id;
}

bool process_is_dead(const ProcessIdentity& id) {
  if (id.pid == 0 || id.start_time == 0 || !id.boot_known()) return false;  // unknown: alive
  const std::array<std::uint8_t, 16>& boot = current_boot_id();
  bool boot_known = false;
  for (std::uint8_t b : boot) boot_known |= (b != 0);
  if (!boot_known) return false;
  if (boot != id.boot_id) return true;  // it ran in an earlier boot
  // Pids name processes only inside one pid namespace: a pid from another
  // (a container sharing the store) says nothing about our namespace's pid.
  const ProcessIdentity self = self_identity();
  if (id.pid_ns == 0 || self.pid_ns == 0 || id.pid_ns != self.pid_ns) return false;
  if (id.pid == self.pid) return self.start_time != id.start_time;
  if (::kill(static_cast<pid_t>(id.pid), 0) != 0 && errno == ESRCH) return true;
  char state = '?';
  const std::uint64_t start = read_start_time(static_cast<pid_t>(id.pid), &state);
  if (start == 0) {
    // /proc/<pid>/stat vanished between the two calls: dead if kill agrees now.
    return ::kill(static_cast<pid_t>(id.pid), 0) != 0 && errno == ESRCH;
  }
  if (start != id.start_time) return true;  // the pid was reused
  return state == 'Z' || state == 'X';      // killed, waiting to be reaped
}

}  // namespace lanebus::detail
