// lanebus — MIT License.
// The library side of typed topics (include/lanebus/typed.hpp): binding a
// topic to a C++ type, the subscribe-time type check, and publishing an
// object (in memory) or its encoding (durable).
#include <string>

#include "bus_impl.hpp"
#include "trace.hpp"
#include "lanebus/typed.hpp"

namespace lanebus::detail {

namespace {

std::string q(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::uint64_t published(const TopicImpl& t) noexcept {
  std::uint64_t n = 0;
  for (std::uint32_t l = 0; l < t.options.lanes; ++l) n += t.lane_load[l].published.load(std::memory_order_relaxed);
  return n;
}
}  // namespace

Status TypedAccess::bind(const Topic& topic, std::string_view type, std::string_view codec) {
  TopicImpl* t = topic.impl_;
  if (t == nullptr) return Status(Code::InvalidArgument, "create_topic<T>: the topic handle is empty");
  if (t->durable && codec.empty())
    return Status(Code::InvalidArgument, "create_topic<" + std::string(type) + ">: durable topic " + q(t->name) +
                                             " stores bytes, and " + std::string(type) +
                                             " has no lanebus::Codec (codec.hpp; or use an in-memory topic)");
  MutexLock lock(&t->type_mu);
  if (t->cxx_type == type) return Status();
  if (!t->cxx_type.empty())
    return Status(Code::Conflict, "create_topic<" + std::string(type) + ">: topic " + q(t->name) +
                                      " carries type " + t->cxx_type + ", not " + std::string(type));
  // An in-memory topic that already carried bytes cannot become typed: a
  // typed handler would read those bytes as a T.
  if (!t->durable && published(*t) != 0)
    return Status(Code::Conflict, "create_topic<" + std::string(type) + ">: topic " + q(t->name) +
                                      " already carried bytes messages; a typed topic needs a name of its own");
  t->cxx_type.assign(type);
  // release: a publisher that sees objects_only also sees the type (cold path).
  if (!t->durable) t->objects_only.store(true, std::memory_order_release);
  return Status();
}

Status TypedAccess::expect(const Topic& topic, std::string_view type, std::string_view op) {
  TopicImpl* t = topic.impl_;
  if (t == nullptr) return Status(Code::InvalidArgument, std::string(op) + "<T>: the topic handle is empty");
  MutexLock lock(&t->type_mu);
  if (t->cxx_type == type) return Status();
  if (t->cxx_type.empty()) {
    // A durable topic holds bytes: a process that did not create it typed
    // may still read it with T's codec (decode failures are permanent).
    if (t->durable) return Status();
    return Status(Code::Conflict, std::string(op) + "<" + std::string(type) + ">: topic " + q(t->name) +
                                      " carries bytes, not " + std::string(type) + " (create it with create_topic<" +
                                      std::string(type) + ">)");
  }
  return Status(Code::Conflict, std::string(op) + "<" + std::string(type) + ">: topic " + q(t->name) +
                                    " carries type " + t->cxx_type + ", not " + std::string(type));
}

Status TypedAccess::publish_object(const Topic& topic, const OutgoingMessage& envelope, const ObjectFill& fill,
                                   bool may_block) noexcept {
  TopicImpl* t = topic.impl_;
  if (t == nullptr) return Status::from_literal(Code::InvalidArgument, "publish: the typed topic is empty");
  auto publish = [t, &fill, may_block](const OutgoingMessage& m) {
    // Through the calling thread's own publisher ("implicit publishers", bus_core.cpp).
    if (PublisherState* st = t->durable ? nullptr : t->bus->thread_publisher())
      return t->publish_via(*st, m, may_block, &fill);
    return t->publish(m, may_block, t->bus->take_ids(1), &fill);
  };
  // The Tracer's publish span (trace.hpp): one null check without one.
  if (Tracer* tracer = t->bus->options.tracer) [[unlikely]]
    return traced_publish(tracer, t->name, lane_for_key(envelope.key, t->options.lanes), envelope, publish);
  return publish(envelope);
}

Status TypedAccess::publish_encoded(const Topic& topic, const OutgoingMessage& envelope, const Status& codec_status,
                                    std::string_view type, std::string_view codec) noexcept {
  TopicImpl* t = topic.impl_;
  if (t == nullptr) return Status::from_literal(Code::InvalidArgument, "publish: the typed topic is empty");
  try {
    if (!codec_status.ok())
      return Status(Code::InvalidArgument, "publish to " + q(t->name) + ": " + std::string(codec) +
                                               " could not encode " + std::string(type) + ": " +
                                               std::string(codec_status.message()) + " (nothing published)");
    if (envelope.payload.empty())
      return Status(Code::InvalidArgument, "publish to " + q(t->name) + ": " + std::string(codec) + " encoded " +
                                               std::string(type) + " as no bytes (nothing published)");
    if (Tracer* tracer = t->bus->options.tracer) [[unlikely]]
      return traced_publish(tracer, t->name, lane_for_key(envelope.key, t->options.lanes), envelope,
                            [t](const OutgoingMessage& m) { return t->publish_durable(m, {}); });
    return t->publish_durable(envelope, {});
  } catch (const std::exception&) {
    return Status::from_literal(Code::Internal, "publish: out of memory copying the message for the store");
  }
}

std::string& TypedAccess::encode_buffer() noexcept {
  thread_local std::string buffer;
  return buffer;
}

}  // namespace lanebus::detail
