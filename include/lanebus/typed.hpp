// lanebus — MIT License.
// Typed topics: publish and receive C++ objects instead of bytes
// (doc/topics.md "Typed topics"). TypedTopic<T>, Delivery, TypedTopicOptions
// and the Bus member templates create_topic<T>, create_durable_topic<T>,
// create_queue<T>, subscribe<T> and consume<T>.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <new>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "lanebus/bus.hpp"
#include "lanebus/codec.hpp"

namespace lanebus {

/// The compiler's spelling of T ("Order", "app::FrameCaptured"), used to
/// tell topic types apart and in error messages. Stable within one
/// compiler; a typed topic is bound by the first create_topic<T> of this
/// process.
template <typename T>
constexpr std::string_view type_name() noexcept {
  std::string_view p = __PRETTY_FUNCTION__;  // "... [with T = Order; ...]" (GCC), "... [T = Order]" (Clang)
  std::size_t b = p.find("T = ") + 4;
  std::size_t e = p.find_first_of(";]", b);
  return p.substr(b, e - b);
}

/// What a typed handler learns about the message besides the object: all
/// that MessageView carries (ids, key, timestamps, attempt, lane, offset,
/// deadline) except the payload bytes. Valid only during the handler call.
///
/// Thread safety: const methods are safe.
class Delivery {
 public:
  explicit Delivery(const MessageView& view) noexcept : view_(view) {}
  const MessageHeader& header() const noexcept { return view_.header(); }
  std::uint64_t id() const noexcept { return view_.id(); }
  std::int64_t created_at_ns() const noexcept { return view_.created_at_ns(); }
  std::uint64_t correlation_id() const noexcept { return view_.correlation_id(); }
  std::uint64_t fencing_token() const noexcept { return view_.fencing_token(); }
  /// 1 for the first delivery to this group, 2 for the first retry, ...
  std::uint32_t attempt() const noexcept { return view_.attempt(); }
  std::uint16_t content_type() const noexcept { return view_.content_type(); }
  std::uint16_t schema_version() const noexcept { return view_.schema_version(); }
  std::string_view key() const noexcept { return view_.key(); }
  std::string_view idempotency_key() const noexcept { return view_.idempotency_key(); }
  std::uint32_t lane() const noexcept { return view_.lane(); }
  /// Offset in the lane's log (durable topics), 0 for in-memory ones.
  std::uint64_t offset() const noexcept { return view_.offset(); }
  std::int64_t deadline_ns() const noexcept { return view_.deadline_ns(); }
  /// The message's headers (OutgoingMessage::headers, plus the trace context
  /// the library added; doc/tracing.md), valid for the handler call.
  HeadersView headers() const noexcept { return view_.headers(); }
  /// The untyped view (its payload() is the object's bytes in memory, the
  /// encoded bytes on a durable topic).
  const MessageView& view() const noexcept { return view_; }

 private:
  const MessageView& view_;
};

/// Options of a typed topic: the topic's options plus how a message's key
/// is taken from the object.
template <typename T>
struct TypedTopicOptions {
  TopicOptions topic{};
  /// Key extractor: the ordering key of an object published without an
  /// explicit key (publish(value), emplace). Runs on the publishing thread
  /// during publish; the view must stay valid until it returns (a member of
  /// the object is fine). It must not throw (publish is noexcept).
  /// Empty (default): such messages have the empty key.
  std::function<std::string_view(const T&)> key_of{};
};

namespace detail {

/// How publish builds a typed object in the slot (lib/core/payload_pool.hpp).
struct ObjectFill {
  std::size_t size = 0;
  std::size_t align = 1;
  bool (*construct)(void* dst, void* ctx) noexcept = nullptr;
  void (*destroy)(void* obj) noexcept = nullptr;  // nullptr: trivially destructible
  void* ctx = nullptr;
};

/// The library side of the templates below (lib/core/typed.cpp).
struct TypedAccess {
  /// Bind topic `t` to type `type` (create_topic<T>). Conflict if it carries
  /// another type (both named) or is already used for bytes; InvalidArgument
  /// for a durable topic without a codec (`codec` empty).
  LANEBUS_API static Status bind(const Topic& t, std::string_view type, std::string_view codec);
  /// The check of subscribe<T> / consume<T>: Conflict naming both types when
  /// the topic carries another type (or bytes, in memory).
  LANEBUS_API static Status expect(const Topic& t, std::string_view type, std::string_view op);
  /// Publish an object constructed in the slot (in-memory topics).
  LANEBUS_API static Status publish_object(const Topic& t, const OutgoingMessage& envelope, const ObjectFill& fill,
                                           bool may_block) noexcept;
  /// Publish encoded bytes (durable topics); `codec_status` is the encoder's.
  LANEBUS_API static Status publish_encoded(const Topic& t, const OutgoingMessage& envelope,
                                            const Status& codec_status, std::string_view type,
                                            std::string_view codec) noexcept;
  /// This thread's encode buffer (kept between publishes).
  LANEBUS_API static std::string& encode_buffer() noexcept;
};

template <typename T, typename Src>
bool construct_from(void* dst, void* src) noexcept {
  try {
    ::new (dst) T(std::forward<Src>(*static_cast<std::remove_reference_t<Src>*>(src)));
    return true;
  } catch (...) {
    return false;
  }
}

template <typename T, typename Tuple>
bool construct_emplace(void* dst, void* args) noexcept {
  try {
    std::apply([dst](auto&&... a) { ::new (dst) T(std::forward<decltype(a)>(a)...); }, *static_cast<Tuple*>(args));
    return true;
  } catch (...) {
    return false;
  }
}

template <typename T>
void destroy_object(void* obj) noexcept {
  static_cast<T*>(obj)->~T();
}

template <typename T>
constexpr auto destroyer() noexcept {
  if constexpr (std::is_trivially_destructible_v<T>) {
    return static_cast<void (*)(void*) noexcept>(nullptr);
  } else {
    return &destroy_object<T>;
  }
}

template <typename T>
constexpr std::string_view codec_name() noexcept {
  if constexpr (HasCodec<T>) {
    return Codec<T>::name;
  } else {
    return {};
  }
}

}  // namespace detail

/// A topic (or queue) that carries objects of type T. A cheap, copyable
/// reference, valid while its Bus lives; a default-constructed one refers to
/// nothing (publish gives InvalidArgument).
///
/// How a T travels (doc/topics.md "Typed topics"):
/// - in-memory topic: the object is constructed (copied, moved or emplaced)
///   in the message's slot — or, if it does not fit there, in a block of the
///   bus's payload pool (TopicOptions::max_payload) — and destroyed when the
///   last group is done with it. No serialization; a trivially copyable T is
///   a plain copy and nothing is allocated.
/// - durable topic: Codec<T>::encode writes it into a per-thread buffer and
///   the bytes are stored; each delivery decodes a fresh T.
///
/// REQUIRES: alignof(T) <= 64; T is destructible.
/// Thread safety: thread-safe.
template <typename T>
class TypedTopic {
  static_assert(alignof(T) <= 64, "lanebus: typed objects are aligned to at most 64 bytes");

 public:
  TypedTopic() noexcept = default;

  /// Publish a copy of `value` (a move for the rvalue overloads), keyed by
  /// the key extractor (or the empty key). Same blocking as Topic::publish.
  /// Errors: those of Topic::publish, and
  /// - InvalidArgument: a default-constructed TypedTopic; T's copy or move
  ///   constructor threw (in memory; nothing published); Codec<T>::encode
  ///   failed (durable; the message names T, the codec and its message).
  /// - PayloadTooLarge: sizeof(T) (in memory) or the encoded size (durable)
  ///   exceeds TopicOptions::max_payload.
  Status publish(const T& value) const noexcept { return send(value, envelope_for(value)); }
  Status publish(T&& value) const noexcept { return send(std::move(value), envelope_for(value)); }

  /// As publish(value), with key, idempotency key, correlation id, fencing
  /// token, content type and schema version taken from `envelope`.
  /// REQUIRES: envelope.payload is empty (else InvalidArgument).
  Status publish(const T& value, const OutgoingMessage& envelope) const noexcept { return send(value, envelope); }
  Status publish(T&& value, const OutgoingMessage& envelope) const noexcept {
    return send(std::move(value), envelope);
  }

  /// Never blocks (Topic::try_publish): a full topic or a full payload pool
  /// gives WouldBlock (DropOldest: drops to make room).
  Status try_publish(const T& value) const noexcept { return send(value, envelope_for(value), false); }

  /// Construct the object from `args` directly in the slot (in memory; on a
  /// durable topic a T is built on the stack and encoded). With a key
  /// extractor the key needs the object first, so a T is then built on the
  /// stack and moved in; use emplace_keyed to avoid that. Errors as publish.
  template <typename... Args>
  Status emplace(Args&&... args) const noexcept {
    if (!key_of_) return emplace_keyed(std::string_view{}, std::forward<Args>(args)...);
    try {
      return publish(T(std::forward<Args>(args)...));
    } catch (...) {
      return Status::from_literal(Code::InvalidArgument, "emplace: constructing the object threw");
    }
  }
  /// emplace with the key given.
  template <typename... Args>
  Status emplace_keyed(std::string_view key, Args&&... args) const noexcept {
    if (!topic_.valid() || durable_) {
      try {
        return send(T(std::forward<Args>(args)...), OutgoingMessage{.key = key});
      } catch (...) {
        return Status::from_literal(Code::InvalidArgument, "emplace: constructing the object threw");
      }
    }
    auto refs = std::forward_as_tuple(std::forward<Args>(args)...);
    detail::ObjectFill fill{sizeof(T), alignof(T), &detail::construct_emplace<T, decltype(refs)>,
                            detail::destroyer<T>(), &refs};
    return detail::TypedAccess::publish_object(topic_, OutgoingMessage{.key = key}, fill, true);
  }

  /// The untyped handle (name, lanes, stats). Publishing bytes through it to
  /// an in-memory typed topic is refused (InvalidArgument).
  const Topic& topic() const noexcept { return topic_; }
  operator const Topic&() const noexcept { return topic_; }  // NOLINT: a TypedTopic is a Topic
  bool valid() const noexcept { return topic_.valid(); }

 private:
  friend class Bus;
  TypedTopic(Topic topic, std::function<std::string_view(const T&)> key_of) noexcept
      : topic_(topic), durable_(topic.is_durable()), key_of_(std::move(key_of)) {}

  OutgoingMessage envelope_for(const T& value) const noexcept {
    OutgoingMessage m;
    if (key_of_) m.key = key_of_(value);
    return m;
  }

  template <typename V>
  Status send(V&& value, const OutgoingMessage& envelope, bool may_block = true) const noexcept {
    if (!envelope.payload.empty())
      return Status::from_literal(Code::InvalidArgument, "typed publish: the envelope's payload must be empty");
    if (!topic_.valid()) return Status::from_literal(Code::InvalidArgument, "publish: the typed topic is empty");
    if (!durable_) {
      detail::ObjectFill fill{sizeof(T), alignof(T), &detail::construct_from<T, V&&>, detail::destroyer<T>(),
                              const_cast<void*>(static_cast<const void*>(&value))};
      return detail::TypedAccess::publish_object(topic_, envelope, fill, may_block);
    }
    if constexpr (HasCodec<T>) {
      std::string& buffer = detail::TypedAccess::encode_buffer();
      Status st;
      try {
        st = Codec<T>::encode(value, buffer);
      } catch (...) {
        st = Status::from_literal(Code::Internal, "the encoder threw");
      }
      OutgoingMessage m = envelope;
      m.payload = buffer;
      return detail::TypedAccess::publish_encoded(topic_, m, st, type_name<T>(), Codec<T>::name);
    } else {
      return Status::from_literal(Code::InvalidArgument,
                                  "typed publish: a durable topic needs a lanebus::Codec<T> for its type");
    }
  }

  Topic topic_;
  bool durable_ = false;  // topic_.is_durable(), read once (publish is hot)
  std::function<std::string_view(const T&)> key_of_;
};

// ---- Bus member templates (declared in bus.hpp) ----

template <typename T>
Result<TypedTopic<T>> Bus::create_topic(std::string_view name, const TypedTopicOptions<T>& options) {
  auto t = create_topic(name, options.topic);
  if (!t.ok()) return t.status();
  if (Status s = detail::TypedAccess::bind(*t, type_name<T>(), detail::codec_name<T>()); !s.ok()) return s;
  return TypedTopic<T>(*t, options.key_of);
}

template <typename T>
Result<TypedTopic<T>> Bus::create_topic(std::string_view name, const TopicOptions& options) {
  return create_topic<T>(name, TypedTopicOptions<T>{options, {}});
}

template <typename T>
Result<TypedTopic<T>> Bus::create_durable_topic(std::string_view name, const TypedTopicOptions<T>& options) {
  static_assert(HasCodec<T>,
                "lanebus: a durable topic stores bytes, so its type needs a codec: specialize lanebus::Codec<T> "
                "(codec.hpp), or mark a trivially copyable T with lanebus::StableLayout<T>");
  TypedTopicOptions<T> o = options;
  o.topic.durable = true;
  return create_topic<T>(name, o);
}

template <typename T>
Result<TypedTopic<T>> Bus::create_queue(std::string_view name, const TypedTopicOptions<T>& options) {
  auto t = create_queue(name, options.topic);
  if (!t.ok()) return t.status();
  if (Status s = detail::TypedAccess::bind(*t, type_name<T>(), detail::codec_name<T>()); !s.ok()) return s;
  return TypedTopic<T>(*t, options.key_of);
}

template <typename T, typename F>
Handler Bus::typed_handler(const Topic& topic, F&& handler) {
  using Fn = std::decay_t<F>;
  if (!topic.is_durable()) {
    return [fn = Fn(std::forward<F>(handler))](const MessageView& m) mutable -> Outcome {
      // The payload is the object publish constructed (TypedAccess::expect
      // checked the topic's type; bytes publishes to it are refused).
      return fn(*std::launder(reinterpret_cast<const T*>(m.payload().data())), Delivery(m));
    };
  }
  if constexpr (HasCodec<T> && std::default_initializable<T>) {
    return [fn = Fn(std::forward<F>(handler))](const MessageView& m) mutable -> Outcome {
      T value{};
      Status st = Codec<T>::decode(m.payload(), value);
      // A message that cannot be decoded never will be: a permanent failure.
      if (!st.ok()) return Outcome::reject(st.message().empty() ? std::string_view("decode failed") : st.message());
      return fn(static_cast<const T&>(value), Delivery(m));
    };
  } else {
    return {};
  }
}

template <typename T, typename F>
  requires std::invocable<F&, const T&, const Delivery&>
Result<Subscription> Bus::subscribe(const Topic& topic, std::string_view group, F handler,
                                    const GroupOptions& options) {
  if (Status s = detail::TypedAccess::expect(topic, type_name<T>(), "subscribe"); !s.ok()) return s;
  Handler h = typed_handler<T>(topic, std::move(handler));
  if (!h)
    return Status::from_literal(Code::InvalidArgument,
                                "subscribe: a durable topic's type needs a lanebus::Codec<T> and a default "
                                "constructor to decode into");
  return subscribe(topic, group, std::move(h), options);
}

template <typename T, typename F>
  requires std::invocable<F&, const T&, const Delivery&>
Result<Subscription> Bus::consume(const Topic& queue, F handler, const GroupOptions& options) {
  if (Status s = detail::TypedAccess::expect(queue, type_name<T>(), "consume"); !s.ok()) return s;
  Handler h = typed_handler<T>(queue, std::move(handler));
  if (!h)
    return Status::from_literal(Code::InvalidArgument,
                                "consume: a durable queue's type needs a lanebus::Codec<T> and a default "
                                "constructor to decode into");
  return consume(queue, std::move(h), options);
}

}  // namespace lanebus
