// lanebus — MIT License.
// The message header (stored form: doc/storage-format.md), the outgoing message a publisher fills in, and
// MessageView, the non-owning view a handler receives; message headers
// (Header, HeadersView, their limits: doc/tracing.md).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <span>
#include <string_view>

#include "lanebus/export.hpp"

namespace lanebus {

namespace detail {
struct Access;
}  // namespace detail

/// The fixed-size part of every message header. The variable parts
/// (key, idempotency key) travel next to it. The same struct is stored by the
/// durable layer, so its fields are plain integers with fixed meaning.
struct MessageHeader {
  /// Unique per bus; assigned by publish, increasing per publishing thread.
  std::uint64_t id = 0;
  /// Wall-clock time of publish, in nanoseconds since the Unix epoch. On
  /// in-process topics it is read from the TSC scaled to CLOCK_REALTIME:
  /// within 50 µs of CLOCK_REALTIME at the same moment (lib/util/wall_clock.hpp).
  std::int64_t created_at_ns = 0;
  /// Free for the application: ties a message to the request that caused it. 0 = none.
  std::uint64_t correlation_id = 0;
  /// Fencing token of the lease the publisher held (doc/leases.md). 0 = none.
  std::uint64_t fencing_token = 0;
  /// Delivery attempt, starting at 1 for the first delivery to a group.
  std::uint32_t attempt = 0;
  /// Application-defined content type id. 0 = unspecified.
  std::uint16_t content_type = 0;
  /// Schema version of the payload. 0 = unspecified.
  std::uint16_t schema_version = 0;
};

// ---------------------------------------------------------------- headers (doc/tracing.md)

/// One message header: a name and a value, both copied by publish.
/// Names are case-sensitive; W3C trace context uses `traceparent` and
/// `tracestate` (lanebus/trace.hpp).
struct Header {
  std::string_view name{};
  std::string_view value{};
};

/// At most this many headers per message (OutgoingMessage::headers), not
/// counting the `traceparent` / `tracestate` pair the library adds to a
/// message published inside a handler call (doc/tracing.md). More:
/// PayloadTooLarge.
inline constexpr std::size_t kMaxHeaders = 16;
/// At most this many bytes of names and values together per message, with the
/// same exception for the pair the library adds (at most 55 + 512 bytes of
/// values). More: PayloadTooLarge.
inline constexpr std::size_t kMaxHeaderBytes = 1024;
/// A header name is 1 to this many bytes of visible ASCII (0x21-0x7e) except
/// ':' (the rule of NATS and HTTP header names). Else InvalidArgument.
inline constexpr std::size_t kMaxHeaderNameBytes = 64;

/// The headers of a delivered message: a non-owning view of their stored
/// form, valid as long as the MessageView it came from. Iterates in publish
/// order, yielding Header values.
///
/// Stored form (the same in a slot and in a durable record,
/// doc/storage-format.md): u8 count, u8 0, le16 bytes of the entries, then
/// per header u8 name length, le16 value length, the name, the value. The
/// library checks the form before it makes a view (a durable record's at
/// decode), so iteration never reads outside it.
///
/// Thread safety: const methods are safe.
class HeadersView {
 public:
  class iterator {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = Header;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = Header;
    iterator() noexcept = default;
    Header operator*() const noexcept {
      const std::size_t nlen = static_cast<unsigned char>(p_[0]);
      const std::size_t vlen = static_cast<std::size_t>(static_cast<unsigned char>(p_[1])) |
                               static_cast<std::size_t>(static_cast<unsigned char>(p_[2])) << 8;
      return Header{std::string_view(p_ + 3, nlen), std::string_view(p_ + 3 + nlen, vlen)};
    }
    iterator& operator++() noexcept {
      const Header h = **this;
      p_ += 3 + h.name.size() + h.value.size();
      --left_;
      return *this;
    }
    iterator operator++(int) noexcept {
      iterator t = *this;
      ++*this;
      return t;
    }
    bool operator==(const iterator& o) const noexcept { return left_ == o.left_; }

   private:
    friend class HeadersView;
    iterator(const char* p, std::size_t left) noexcept : p_(p), left_(left) {}
    const char* p_ = nullptr;
    std::size_t left_ = 0;
  };

  HeadersView() noexcept = default;
  /// A view of a stored header block. REQUIRES: `encoded` is empty or a block
  /// in the stored form above (the library's own views are checked).
  explicit HeadersView(std::string_view encoded) noexcept : encoded_(encoded) {}

  iterator begin() const noexcept { return encoded_.empty() ? iterator() : iterator(encoded_.data() + 4, size()); }
  iterator end() const noexcept { return iterator(); }
  /// Number of headers.
  std::size_t size() const noexcept { return encoded_.empty() ? 0 : static_cast<unsigned char>(encoded_[0]); }
  bool empty() const noexcept { return size() == 0; }
  /// The value of the first header named `name` (exact, case-sensitive match), or nullopt.
  std::optional<std::string_view> find(std::string_view name) const noexcept {
    for (Header h : *this)
      if (h.name == name) return h.value;
    return std::nullopt;
  }
  /// The stored form (empty when there are no headers).
  std::string_view encoded() const noexcept { return encoded_; }

 private:
  std::string_view encoded_{};
};

/// What a publisher hands to publish(). All views are read during the call
/// only: publish copies key, idempotency key and payload into the bus.
struct OutgoingMessage {
  /// Ordering key: `lane = hash(key) % lanes` (hash = 64-bit FNV-1a, stable
  /// across processes and releases). May be empty; an empty key is one key
  /// like any other, so all empty-key messages share one lane and keep order.
  std::string_view key{};
  /// The payload bytes. Must not be empty.
  std::string_view payload{};
  /// The stable business key used for deduplication (doc/idempotency.md). Optional.
  std::string_view idempotency_key{};
  std::uint64_t correlation_id = 0;
  std::uint64_t fencing_token = 0;
  std::uint16_t content_type = 0;
  std::uint16_t schema_version = 0;
  /// Message headers (doc/tracing.md): name/value pairs copied by publish and
  /// given to every handler (MessageView::headers), kept in a durable record,
  /// carried across the NATS bridge as NATS headers. At most kMaxHeaders
  /// headers and kMaxHeaderBytes of names and values (else PayloadTooLarge,
  /// naming the limit); a name of 1-kMaxHeaderNameBytes bytes of visible ASCII
  /// without ':', a value without CR, LF or NUL, no name twice (else
  /// InvalidArgument, naming the header). A `traceparent` header must be a W3C
  /// trace context (version 00: `00-<32 hex>-<16 hex>-<2 hex>`, lowercase,
  /// non-zero ids; else InvalidArgument). Published inside a handler call
  /// without its own `traceparent`, a message gets the handler's trace
  /// context (lanebus/trace.hpp). On an in-memory topic the headers live in
  /// the message's slot: key + idempotency key + 24 + their stored size (4 +
  /// 3 per header + names + values) + the payload or its 12-byte block
  /// reference must fit TopicOptions::slot_bytes (else PayloadTooLarge).
  std::span<const Header> headers{};

  // ---- time (doc/delays.md) ----
  /// Delayed delivery: deliver no earlier than `delay` after publish, or at
  /// the wall-clock time `deliver_at` (ns since the Unix epoch; a time in the
  /// past means now). Set at most one of the two; 0 = none. Negative values,
  /// both set, or a due time past 2200-01-01 are refused with InvalidArgument.
  /// Works on in-memory and durable topics and queues.
  ///
  /// Order rule: a delayed message enters its lane at its due time, as if it
  /// had been published then. Within a key, delayed messages are delivered in
  /// the order of their due times (publish order among equal due times); a
  /// delayed message does not hold back the undelayed messages of its key
  /// published after it, and is delivered after the messages that were
  /// already in its lane at its due time. Its MessageHeader::created_at_ns is
  /// its due time (latency metrics, seek by time and age retention count
  /// from there); its TTL counts from publish.
  ///
  /// In-memory topics: the message holds its slot while it waits (it counts
  /// in slots_in_use and in the topic's backpressure); a message not yet due
  /// when the bus closes is discarded. Durable topics and queues: stored with
  /// its due time (surviving kill -9 and power loss like any Sync message),
  /// indexed by due time, and appended to its lane's log when due.
  std::chrono::nanoseconds delay{0};
  std::int64_t deliver_at = 0;
  /// Expiry: a message whose handler has not started within `ttl` of publish
  /// is never delivered: it is counted as `expired` (LaneCounters) and
  /// dead-lettered with class `expired` when the group asks for it
  /// (GroupOptions::dead_letter_expired). A retry never starts after the
  /// expiry. A delayed message whose expiry (publish + ttl) comes before its
  /// due time is refused with InvalidArgument. Unset = the topic's
  /// TopicOptions::default_ttl (none by default). Must be positive and at
  /// most 100 years (else InvalidArgument).
  std::optional<std::chrono::nanoseconds> ttl{};
};

/// A delivered message, valid only while the handler that received it runs
/// (the bytes live in a pooled slot that is recycled afterwards). Copy out
/// what you keep.
///
/// Thread safety: const methods are safe.
class MessageView {
 public:
  MessageView(const MessageHeader& header, std::string_view key, std::string_view idempotency_key,
              std::string_view payload, std::uint32_t lane, std::uint64_t offset = 0) noexcept
      : header_(&header),
        key_(key),
        idempotency_key_(idempotency_key),
        payload_(payload),
        lane_(lane),
        offset_(offset) {}

  const MessageHeader& header() const noexcept { return *header_; }
  std::uint64_t id() const noexcept { return header_->id; }
  std::int64_t created_at_ns() const noexcept { return header_->created_at_ns; }
  std::uint64_t correlation_id() const noexcept { return header_->correlation_id; }
  std::uint64_t fencing_token() const noexcept { return header_->fencing_token; }
  /// 1 for the first delivery to this group, 2 for the first retry, ...
  std::uint32_t attempt() const noexcept { return attempt_override_ ? attempt_override_ : header_->attempt; }
  std::uint16_t content_type() const noexcept { return header_->content_type; }
  std::uint16_t schema_version() const noexcept { return header_->schema_version; }

  std::string_view key() const noexcept { return key_; }
  std::string_view idempotency_key() const noexcept { return idempotency_key_; }
  std::string_view payload() const noexcept { return payload_; }
  /// The lane the message travels in (hash(key) % lanes).
  std::uint32_t lane() const noexcept { return lane_; }
  /// The message's offset in its lane's log (durable topics); 0 for ephemeral ones.
  std::uint64_t offset() const noexcept { return offset_; }
  /// The message's headers (OutgoingMessage::headers, plus the trace context
  /// the library added); empty when it has none. Valid as long as this view.
  HeadersView headers() const noexcept { return HeadersView(headers_); }

  /// Wall-clock deadline of this handler call (GroupOptions::attempt_timeout),
  /// in nanoseconds since the Unix epoch; 0 = none.
  std::int64_t deadline_ns() const noexcept { return deadline_ns_; }

 private:
  friend struct detail::Access;  // the dispatcher sets the attempt and the deadline
  const MessageHeader* header_;
  std::string_view key_;
  std::string_view idempotency_key_;
  std::string_view payload_;
  std::uint32_t lane_;
  std::uint32_t attempt_override_ = 0;
  std::uint64_t offset_;
  std::int64_t deadline_ns_ = 0;
  std::string_view headers_{};  // the stored header block (HeadersView)
};

/// The lane a key maps to: 64-bit FNV-1a of the key bytes, modulo `lanes`.
/// REQUIRES: lanes > 0. Stable across processes, platforms and releases.
LANEBUS_API std::uint32_t lane_for_key(std::string_view key, std::uint32_t lanes) noexcept;

}  // namespace lanebus
