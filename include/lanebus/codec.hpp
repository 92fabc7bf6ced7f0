// lanebus — MIT License.
// Codec<T>: how a typed event becomes bytes on a durable topic and back
// (doc/topics.md "Typed topics"). Built-in codecs: std::string, trivially
// copyable types that opt in with StableLayout<T>, and (record_codec.hpp)
// structs described by a RecordSchema<T>.
#pragma once

#include <concepts>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "lanebus/status.hpp"

namespace lanebus {

/// The customization point. The primary template is left undefined: a type
/// has a codec only where a specialization exists. A specialization provides
///
///   static constexpr std::string_view name = "...";   // shown in errors
///   /// Write `value` into `out` (replacing its contents). A failure is a
///   /// non-OK Status whose message says why; publish then returns
///   /// InvalidArgument naming the type and this message (nothing published).
///   static Status encode(const T& value, std::string& out);
///   /// Read `bytes` into `out`. A failure is a permanent failure of the
///   /// message: it is not retried, it goes to the DLQ (class permanent)
///   /// with this message as the reason.
///   static Status decode(std::string_view bytes, T& out);
///
/// Both run on the calling thread (encode: the publisher; decode: the worker
/// that delivers), with no lanebus lock held, and must not call the bus.
/// `out` of encode is a per-thread buffer the bus reuses, so an encoder that
/// writes at most the buffer's earlier size allocates nothing.
///
/// In-memory topics never call a codec: a T travels there as an object
/// (typed.hpp). Durable topics need one: TypedTopic<T> on a durable topic
/// without Codec<T> does not compile (Bus::create_durable_topic<T>), or is
/// refused with InvalidArgument when durability is chosen at run time.
template <typename T>
struct Codec;

/// True when Codec<T> is a complete specialization with encode and decode.
template <typename T>
concept HasCodec = requires(const T& value, std::string& out, std::string_view bytes, T& into) {
  { Codec<T>::encode(value, out) } -> std::same_as<Status>;
  { Codec<T>::decode(bytes, into) } -> std::same_as<Status>;
  { Codec<T>::name } -> std::convertible_to<std::string_view>;
};

/// Opt-in trait for the memcpy codec: specialize as std::true_type for a
/// trivially copyable T whose layout you promise is stable across the
/// processes and builds that share the store (same ABI, same field order,
/// same padding). lanebus cannot check that promise; it checks the size on
/// decode.
template <typename T>
struct StableLayout : std::false_type {};

/// std::string: the bytes as they are.
template <>
struct Codec<std::string> {
  static constexpr std::string_view name = "lanebus::Codec<std::string>";
  static Status encode(const std::string& value, std::string& out) {
    out.assign(value);
    return Status();
  }
  static Status decode(std::string_view bytes, std::string& out) {
    out.assign(bytes);
    return Status();
  }
};

/// Trivially copyable types with StableLayout<T>: their object bytes.
template <typename T>
  requires(StableLayout<T>::value)
struct Codec<T> {
  static_assert(std::is_trivially_copyable_v<T>, "lanebus::StableLayout<T> needs a trivially copyable T");
  static constexpr std::string_view name = "lanebus::Codec<StableLayout>";
  static Status encode(const T& value, std::string& out) {
    out.assign(reinterpret_cast<const char*>(&value), sizeof(T));
    return Status();
  }
  static Status decode(std::string_view bytes, T& out) {
    if (bytes.size() != sizeof(T))
      return Status::from_literal(Code::Corruption,
                                  "stable-layout decode: the stored size differs from sizeof(T) (a layout change?)");
    std::memcpy(&out, bytes.data(), sizeof(T));
    return Status();
  }
};

}  // namespace lanebus
