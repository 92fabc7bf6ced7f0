// lanebus — MIT License.
// Message headers' stored form (lanebus/message.hpp HeadersView, the same in a
// slot and in a durable record: doc/storage-format.md), built on the stack,
// and the checks of OutgoingMessage::headers at publish (doc/tracing.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "lanebus/message.hpp"
#include "lanebus/status.hpp"

namespace lanebus::detail {

inline constexpr std::string_view kTraceparent = "traceparent";
inline constexpr std::string_view kTracestate = "tracestate";
/// The longest `tracestate` the library carries into a message it adds it to
/// (W3C: 32 list members, about 512 bytes); a longer one is dropped there.
inline constexpr std::size_t kMaxTracestateBytes = 512;
/// The largest stored block: the application's headers at their limits plus
/// the trace pair the library may add (doc/tracing.md).
inline constexpr std::size_t kHeaderBlockMax =
    4 + (kMaxHeaders + 2) * 3 + kMaxHeaderBytes + kTraceparent.size() + 55 + kTracestate.size() + kMaxTracestateBytes;

/// A stored header block being built, in place (no allocation).
/// REQUIRES of add: the headers passed check_headers, and at most the trace
/// pair is added beyond them (kHeaderBlockMax has room for exactly that).
class HeaderBlock {
 public:
  HeaderBlock() noexcept = default;
  HeaderBlock(const HeaderBlock&) = delete;
  HeaderBlock& operator=(const HeaderBlock&) = delete;

  void add(std::string_view name, std::string_view value) noexcept;
  std::size_t count() const noexcept { return count_; }
  /// The stored form; empty when no header was added.
  std::string_view bytes() const noexcept { return count_ == 0 ? std::string_view() : std::string_view(buf_, size_); }

 private:
  std::size_t size_ = 4;
  std::uint8_t count_ = 0;
  char buf_[kHeaderBlockMax];
};

/// The application's headers against the limits and rules of
/// OutgoingMessage::headers: OK, PayloadTooLarge (count, bytes) or
/// InvalidArgument (a bad name or value, a name twice, a malformed
/// `traceparent`). Literal messages: allocation-free.
Status check_headers(std::span<const Header> headers) noexcept;

/// True when `block` is empty or a well-formed stored header block whose
/// entries fill it exactly (decoders of untrusted bytes call this before a
/// HeadersView is made of it).
bool valid_header_block(std::string_view block) noexcept;

}  // namespace lanebus::detail
