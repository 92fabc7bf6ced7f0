// lanebus — MIT License.
// External programs the tests start (nats-server, promtool, prometheus): where
// to find one, whether a missing one fails the run (CI=true) or skips it, and
// a free loopback port to give it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace lanebus::test {

/// The executable `name`: $env_var when set, else the first `name` on PATH
/// or in /usr/sbin, /usr/bin, /usr/local/bin; "" when there is none.
inline std::string find_tool(const char* env_var, const char* name) {
  if (const char* e = std::getenv(env_var); e != nullptr && *e != '\0') return e;
  std::string dirs = std::getenv("PATH") != nullptr ? std::getenv("PATH") : "";
  dirs += ":/usr/sbin:/usr/bin:/usr/local/bin";
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    const std::size_t c = dirs.find(':', pos);
    const std::string d = dirs.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    if (!d.empty() && ::access((d + "/" + name).c_str(), X_OK) == 0) return d + "/" + name;
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  return "";
}

/// True when a missing tool must fail the test (CI=true) instead of skipping it (exit 77).
inline bool tool_required() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

/// A free TCP port on 127.0.0.1 (bound and released; the small race with
/// other processes is acceptable for tests), or -1.
inline int free_loopback_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = -1;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

}  // namespace lanebus::test
