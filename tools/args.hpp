// lanebus — MIT License.
// The option parser every command of the lanebus tool uses, and the parsers of
// tail and verify, apart from the commands so that a fuzz target
// (fuzz/cli_args_fuzz.cpp) can drive them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lanebus/durable.hpp"

namespace lanebus::tool {

// ---------------------------------------------------------------- the option parser

/// One option of a command, as parse_options reads it and help_text lists it.
struct OptionSpec {
  const char* name;   ///< "--watch"
  const char* value;  ///< the value's name in --help ("SECONDS"); nullptr for a flag
  const char* help;   ///< its line in --help
  const char* alias = nullptr;  ///< a short form ("-q"), or nullptr
};

/// A command's line: its options, its operands and the prose of its --help.
struct CommandSpec {
  const char* name;      ///< "stats"
  const char* operands;  ///< "DIR"; shown in the usage line and in "needs ..." errors
  std::size_t min_operands;
  std::size_t max_operands;
  std::vector<OptionSpec> options;
  const char* about;  ///< what the command does, after the option list
};

/// What parse_options read: the options in order (a flag's value is ""), the operands.
struct ParsedArgs {
  std::vector<std::pair<std::string, std::string>> options;
  std::vector<std::string> operands;
  bool help = false;  ///< --help or -h was given (nothing else is checked then)
  /// The last value given for `name`, or nullptr when it was not given.
  const std::string* get(std::string_view name) const;
  bool has(std::string_view name) const { return get(name) != nullptr; }
};

/// Reads argv[1..argc) (argv[0] is the command's name). An option's value is
/// the next argument, whatever it looks like; "--" ends the options. Returns 0,
/// or 2 with *error set to one of the messages every command shares:
/// `unknown option "X"`, `X needs VALUE`, `needs OPERANDS`, `unexpected argument "X"`.
int parse_options(const CommandSpec& spec, int argc, char** argv, ParsedArgs* out, std::string* error);

/// The --help text: the usage line, one line per option, the about text.
std::string help_text(const CommandSpec& spec);

/// Prints help_text to stdout; returns 0 (for --help).
int print_help(const CommandSpec& spec);
/// Prints "lanebus NAME: ERROR", a blank line and help_text to stderr; returns 2.
int usage_error(const CommandSpec& spec, const std::string& error);

/// --sla SECONDS and --page-fraction F, which stats and serve share: 0, or 2
/// after usage_error for a bad value.
int read_sla_options(const CommandSpec& spec, const ParsedArgs& args, std::optional<double>* sla_seconds,
                     double* page_fraction);

// ---------------------------------------------------------------- values and commands

/// A decimal u64 with nothing else around it ("" / "-1" / "12x" are refused).
bool parse_u64(const char* s, std::uint64_t* out);

/// A finite number of seconds > 0, fractions allowed ("0.5"; "" / "0" / "-1" / "1s" / "inf" are refused).
bool parse_seconds(const char* s, double* out);

/// The specs of tail and verify (their --help).
const CommandSpec& tail_spec();
const CommandSpec& verify_spec();

/// `lanebus tail DIR TOPIC [--from ...] [--lane N] [--count N]`.
struct TailArgs {
  std::string dir, topic;
  StartPosition from = StartPosition::earliest();
  long long only_lane = -1;  ///< -1 = every lane
  std::uint64_t count = 100;  ///< 0 = no limit
};
/// argv starts at the command name; DIR and TOPIC come first. Returns 0, or 2
/// with `*error` set (the command answers a leading --help itself).
int parse_tail_args(int argc, char** argv, TailArgs* out, std::string* error);

/// `lanebus verify DIR [--quiet] [--progress N]`.
struct VerifyArgs {
  std::string dir;
  bool quiet = false;                   ///< only the summary (and problems)
  std::uint64_t progress_every = 50000;  ///< a progress line every N records of a database
};
int parse_verify_args(int argc, char** argv, VerifyArgs* out, std::string* error);

}  // namespace lanebus::tool
