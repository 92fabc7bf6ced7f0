// lanebus — MIT License.
// Running a command's store reads in a child process: LMDB does not
// checksum its pages, and a damaged branch page can make it read outside the
// map. The child dies then, and the tool reports Corruption instead of crashing.
#pragma once

#include <functional>
#include <string>

namespace lanebus::tool {

/// Run `body` in a forked child and return its exit code. A child killed by a
/// signal (SIGSEGV, SIGBUS, ...) is reported on stderr as
/// "lanebus COMMAND: Corruption: ..." naming the signal and suggesting
/// `lanebus verify DIR`, and gives exit code 1. Output the child printed
/// before dying stays printed. Falls back to running `body` here if fork fails.
int run_guarded(const char* command, const std::string& dir, const std::function<int()>& body);

}  // namespace lanebus::tool
