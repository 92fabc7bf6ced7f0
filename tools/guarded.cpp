// lanebus — MIT License.
// run_guarded: a command's store reads in a child process (see guarded.hpp).
#include "guarded.hpp"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>

#include <sys/wait.h>
#include <unistd.h>

namespace lanebus::tool {

int run_guarded(const char* command, const std::string& dir, const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) return body();
  if (pid == 0) {
    // Die by the signal itself, whatever handler a sanitizer installed.
    for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) std::signal(sig, SIG_DFL);
    const int rc = body();
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(rc);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::fprintf(stderr, "lanebus %s: waitpid: %s\n", command, std::strerror(errno));
      return 1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  const int sig = WTERMSIG(status);
  std::fprintf(stderr,
               "lanebus %s: Corruption: reading \"%s\" died with signal %d (%s): the store's LMDB structure is "
               "damaged; run `lanebus verify %s`\n",
               command, dir.c_str(), sig, strsignal(sig), dir.c_str());
  return 1;
}

}  // namespace lanebus::tool
