// lanebus — MIT License.
// Writers for the two export formats, shared by lib/ops/metrics.cpp and the CLI
// (tools/cmd_stats.cpp): Prometheus text exposition 0.0.4 here, JSON in
// lib/util/json_writer.hpp.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json_writer.hpp"

namespace lanebus::detail {

/// `ns` nanoseconds as an exact decimal number of seconds ("0.000001024").
std::string format_ns_as_seconds(std::uint64_t ns);

/// Label value escaping of the exposition format: \ → \\, " → \", newline → \n.
std::string prom_escape_label(std::string_view v);
/// HELP text escaping: \ → \\, newline → \n.
std::string prom_escape_help(std::string_view v);

/// Builds an exposition document family by family. Every family's HELP and
/// TYPE come first, then its samples, contiguous (the format requires it).
class PromWriter {
 public:
  using Labels = std::vector<std::pair<std::string_view, std::string>>;
  /// Start a family. `type` is counter, gauge, histogram or untyped.
  void family(std::string_view name, std::string_view type, std::string_view help);
  /// One sample line `name{labels} value`.
  void sample(std::string_view name, const Labels& labels, double value);
  void sample_u64(std::string_view name, const Labels& labels, std::uint64_t value);
  /// Like sample with a pre-formatted value.
  void sample_text(std::string_view name, const Labels& labels, std::string_view value);
  std::string take() { return std::move(out_); }

 private:
  void labels(const Labels& labels);
  std::string out_;
};

}  // namespace lanebus::detail
