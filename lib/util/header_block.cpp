// lanebus — MIT License.
// Message headers' stored form and checks (header_block.hpp), and W3C
// traceparent parsing and formatting (lanebus/trace.hpp TraceContext).
#include "header_block.hpp"

#include <cstring>

#include "coding.hpp"
#include "lanebus/trace.hpp"

namespace lanebus {

namespace {
int hex_value(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // uppercase is invalid in traceparent (W3C)
}
bool parse_hex(std::string_view s, std::uint8_t* out) noexcept {
  for (std::size_t i = 0; i < s.size() / 2; ++i) {
    const int hi = hex_value(s[2 * i]), lo = hex_value(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  return true;
}
constexpr char kHex[] = "0123456789abcdef";
void put_hex(const std::uint8_t* in, std::size_t n, char* out) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[in[i] >> 4];
    out[2 * i + 1] = kHex[in[i] & 15];
  }
}
template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& a) noexcept {
  for (std::uint8_t b : a)
    if (b != 0) return false;
  return true;
}
}  // namespace

Tracer::~Tracer() = default;

bool TraceContext::valid() const noexcept { return !all_zero(trace_id) && !all_zero(span_id); }

bool TraceContext::parse(std::string_view tp, TraceContext* out) noexcept {
  // version "-" trace-id "-" parent-id "-" trace-flags
  if (tp.size() < kTraceparentBytes) return false;
  std::uint8_t version;
  if (!parse_hex(tp.substr(0, 2), &version) || version == 0xff) return false;
  if (version == 0 ? tp.size() != kTraceparentBytes : (tp.size() > kTraceparentBytes && tp[kTraceparentBytes] != '-'))
    return false;
  if (tp[2] != '-' || tp[35] != '-' || tp[52] != '-') return false;
  TraceContext c;
  if (!parse_hex(tp.substr(3, 32), c.trace_id.data()) || !parse_hex(tp.substr(36, 16), c.span_id.data()) ||
      !parse_hex(tp.substr(53, 2), &c.flags) || !c.valid())
    return false;
  *out = c;
  return true;
}

std::string_view TraceContext::format(char* out) const noexcept {
  out[0] = '0';
  out[1] = '0';
  out[2] = '-';
  put_hex(trace_id.data(), 16, out + 3);
  out[35] = '-';
  put_hex(span_id.data(), 8, out + 36);
  out[52] = '-';
  put_hex(&flags, 1, out + 53);
  return {out, kTraceparentBytes};
}

std::string TraceContext::trace_id_hex() const {
  std::string s(32, '0');
  put_hex(trace_id.data(), 16, s.data());
  return s;
}

std::string TraceContext::span_id_hex() const {
  std::string s(16, '0');
  put_hex(span_id.data(), 8, s.data());
  return s;
}

}  // namespace lanebus

namespace lanebus::detail {

void HeaderBlock::add(std::string_view name, std::string_view value) noexcept {
  char* p = buf_ + size_;
  p[0] = static_cast<char>(name.size());
  put_le16(p + 1, static_cast<std::uint16_t>(value.size()));
  std::memcpy(p + 3, name.data(), name.size());
  if (!value.empty()) std::memcpy(p + 3 + name.size(), value.data(), value.size());
  size_ += 3 + name.size() + value.size();
  ++count_;
  buf_[0] = static_cast<char>(count_);
  buf_[1] = 0;
  put_le16(buf_ + 2, static_cast<std::uint16_t>(size_ - 4));
}

namespace {
bool valid_name(std::string_view n) noexcept {
  if (n.empty() || n.size() > kMaxHeaderNameBytes) return false;
  for (char c : n)
    if (c < 0x21 || c > 0x7e || c == ':') return false;
  return true;
}
bool valid_value(std::string_view v) noexcept {
  for (char c : v)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  return true;
}
}  // namespace

Status check_headers(std::span<const Header> hs) noexcept {
  if (hs.empty()) return Status();
  if (hs.size() > kMaxHeaders)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: more than 16 headers (kMaxHeaders; OutgoingMessage::headers)");
  std::size_t bytes = 0;
  for (std::size_t i = 0; i < hs.size(); ++i) {
    const Header& h = hs[i];
    if (!valid_name(h.name))
      return Status::from_literal(Code::InvalidArgument,
                                  "publish: a header name is empty, longer than 64 bytes (kMaxHeaderNameBytes) or "
                                  "not visible ASCII without ':'");
    if (!valid_value(h.value))
      return Status::from_literal(Code::InvalidArgument, "publish: a header value contains CR, LF or NUL");
    bytes += h.name.size() + h.value.size();
    for (std::size_t j = 0; j < i; ++j)
      if (hs[j].name == h.name)
        return Status::from_literal(Code::InvalidArgument, "publish: a header name appears twice");
    if (h.name == kTraceparent) {
      TraceContext c;
      if (!TraceContext::parse(h.value, &c))
        return Status::from_literal(Code::InvalidArgument,
                                    "publish: the traceparent header is not a W3C trace context "
                                    "(00-<32 hex>-<16 hex>-<2 hex>, lowercase, non-zero ids)");
    }
  }
  if (bytes > kMaxHeaderBytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the headers' names and values exceed 1024 bytes (kMaxHeaderBytes)");
  return Status();
}

bool valid_header_block(std::string_view b) noexcept {
  if (b.empty()) return true;
  if (b.size() < 4 || b.size() > kHeaderBlockMax) return false;
  const std::size_t count = static_cast<unsigned char>(b[0]);
  if (count == 0 || b[1] != 0 || get_le16(b.data() + 2) != b.size() - 4) return false;
  std::size_t at = 4;
  for (std::size_t i = 0; i < count; ++i) {
    if (b.size() - at < 3) return false;
    const std::size_t n = static_cast<unsigned char>(b[at]);
    const std::size_t v = get_le16(b.data() + at + 1);
    if (n == 0 || b.size() - at - 3 < n + v) return false;
    at += 3 + n + v;
  }
  return at == b.size();
}

}  // namespace lanebus::detail
