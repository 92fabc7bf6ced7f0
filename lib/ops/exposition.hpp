// lanebus — MIT License.
// Writers for the two export formats, shared by lib/ops/metrics.cpp and the CLI
// (tools/cmd_stats.cpp): Prometheus text exposition 0.0.4 and JSON.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lanebus::detail {

/// Shortest text that reads back as the same double; "+Inf", "-Inf", "NaN"
/// for non-finite values (Prometheus spelling).
std::string format_double(double v);

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

/// Streaming JSON writer: commas and nesting are tracked, so callers only say
/// what comes next. Non-finite doubles and nullopt become null.
class JsonWriter {
 public:
  void begin_object();
  void end_object();
  void begin_array();
  void end_array();
  /// The next member's name (inside an object).
  void key(std::string_view k);
  void string(std::string_view s);
  void number(double v);
  void number(std::optional<double> v);
  void u64(std::uint64_t v);
  void i64(std::int64_t v);
  void boolean(bool b);
  void null();
  /// A complete JSON value written elsewhere, inserted as it is.
  void raw(std::string_view json);
  std::string take() { return std::move(out_); }

 private:
  void before_value();
  void write_string(std::string_view s);
  std::string out_;
  std::vector<bool> first_;  // per open container: no member written yet
  bool after_key_ = false;
};

}  // namespace lanebus::detail
