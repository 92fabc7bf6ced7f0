// lanebus — MIT License.
// The one JSON writer: metrics and store stats exports (lib/ops), the CLI's
// --json output. Reading JSON is json.hpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lanebus::detail {

/// Shortest text that reads back as the same double; "+Inf", "-Inf", "NaN"
/// for non-finite values (Prometheus spelling).
std::string format_double(double v);

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
