// lanebus — MIT License.
// Argument parsers of the lanebus tool's commands, apart from the commands so
// that a fuzz target (fuzz/cli_args_fuzz.cpp) can drive them.
#pragma once

#include <cstdint>
#include <string>

#include "lanebus/durable.hpp"

namespace lanebus::tool {

/// A decimal u64 with nothing else around it ("" / "-1" / "12x" are refused).
bool parse_u64(const char* s, std::uint64_t* out);

/// A finite number of seconds > 0, fractions allowed ("0.5"; "" / "0" / "-1" / "1s" / "inf" are refused).
bool parse_seconds(const char* s, double* out);

/// `lanebus tail DIR TOPIC [--from ...] [--lane N] [--count N]`.
struct TailArgs {
  std::string dir, topic;
  StartPosition from = StartPosition::earliest();
  long long only_lane = -1;  ///< -1 = every lane
  std::uint64_t count = 100;  ///< 0 = no limit
};
/// argv starts at the command name. Returns 0, or 2 with `*error` set.
int parse_tail_args(int argc, char** argv, TailArgs* out, std::string* error);

/// `lanebus verify DIR [--quiet] [--progress N]`.
struct VerifyArgs {
  std::string dir;
  bool quiet = false;                   ///< only the summary (and problems)
  std::uint64_t progress_every = 50000;  ///< a progress line every N records of a database
};
int parse_verify_args(int argc, char** argv, VerifyArgs* out, std::string* error);

}  // namespace lanebus::tool
