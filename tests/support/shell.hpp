// lanebus — MIT License.
// run_shell(cmd, &out): the CLI tests run `lanebus ...` as a user would and
// check its exit code and combined output.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <string_view>

namespace lanebus::test {

/// Runs `cmd` with /bin/sh, stderr joined to stdout. Returns the exit code,
/// 128 + N if a signal N ended it, -1 if it could not run.
inline int run_shell(const std::string& cmd, std::string* out) {
  out->clear();
  std::FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->append(buf, n);
  const int st = ::pclose(f);
  if (st == -1) return -1;
  if (WIFSIGNALED(st)) return 128 + WTERMSIG(st);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

inline bool contains(std::string_view hay, std::string_view needle) { return hay.find(needle) != std::string_view::npos; }

}  // namespace lanebus::test
