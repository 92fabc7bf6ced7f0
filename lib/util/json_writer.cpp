// lanebus — MIT License.
// The JSON writer (json_writer.hpp).
#include "json_writer.hpp"

#include <charconv>
#include <cmath>

#include "json.hpp"

namespace lanebus::detail {

std::string format_double(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

void JsonWriter::before_value() {
  if (after_key_) {
    after_key_ = false;
    return;
  }
  if (!first_.empty()) {
    if (!first_.back()) out_ += ',';
    first_.back() = false;
  }
}

void JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  first_.push_back(true);
}

void JsonWriter::end_object() {
  out_ += '}';
  first_.pop_back();
}

void JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  first_.push_back(true);
}

void JsonWriter::end_array() {
  out_ += ']';
  first_.pop_back();
}

void JsonWriter::key(std::string_view k) {
  before_value();
  write_string(k);
  out_ += ':';
  after_key_ = true;
}

void JsonWriter::string(std::string_view s) {
  before_value();
  write_string(s);
}

void JsonWriter::write_string(std::string_view s) { out_ += json_quote(s); }  // json.hpp: the one escaping

void JsonWriter::number(double v) {
  before_value();
  out_ += std::isfinite(v) ? format_double(v) : std::string("null");
}

void JsonWriter::number(std::optional<double> v) {
  if (v) {
    number(*v);
  } else {
    null();
  }
}

void JsonWriter::u64(std::uint64_t v) {
  before_value();
  out_ += std::to_string(v);
}

void JsonWriter::i64(std::int64_t v) {
  before_value();
  out_ += std::to_string(v);
}

void JsonWriter::boolean(bool b) {
  before_value();
  out_ += b ? "true" : "false";
}

void JsonWriter::null() {
  before_value();
  out_ += "null";
}

void JsonWriter::raw(std::string_view json) {
  before_value();
  out_ += json;
}

}  // namespace lanebus::detail
