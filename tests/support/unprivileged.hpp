// lanebus — MIT License.
// as_unprivileged(body): run a permission check as a user without root's
// privileges. Root bypasses file permissions, so as root (how CI runs) the
// body runs in a forked child that drops to nobody/nogroup; otherwise it runs
// in this process.
#pragma once

#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <string>

#include "lanebus/status.hpp"

namespace lanebus::test {

inline constexpr uid_t kNobody = 65534;  // Debian's `nobody` user and `nogroup` group

/// "CODE MESSAGE" of a status, for checks on what a child returned.
inline std::string status_line(const Status& st) {
  return std::string(to_string(st.code())) + " " + std::string(st.message());
}

/// Runs `body` unprivileged and returns what it returned. As root: in a forked
/// child that calls setgroups(0), setgid and setuid to kNobody and checks that
/// it cannot get root back, then runs `body` and sends its result over a pipe;
/// a line starting with "child:" says the drop failed. Not root: in this process.
/// REQUIRES: no other thread is running (fork copies only the calling thread).
inline std::string as_unprivileged(const std::function<std::string()>& body) {
  if (::geteuid() != 0) return body();
  int fds[2];
  if (::pipe(fds) != 0) return "child: pipe: " + std::string(std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) return "child: fork: " + std::string(std::strerror(errno));
  if (pid == 0) {
    ::close(fds[0]);
    std::string out;
    if (::setgroups(0, nullptr) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0) {
      out = "child: cannot drop privileges: " + std::string(std::strerror(errno));
    } else if (::setuid(0) == 0 || ::geteuid() != kNobody || ::getegid() != kNobody) {
      out = "child: privileges were not dropped";
    } else {
      out = body();
    }
    for (std::size_t done = 0; done < out.size();) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) break;
      done += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) out = "child: died (wait status " + std::to_string(status) + ") after: " + out;
  return out;
}

}  // namespace lanebus::test
