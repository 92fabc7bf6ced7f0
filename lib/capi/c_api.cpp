// lanebus — MIT License.
// The C API (include/lanebus/lanebus.h), written against the public C++ API
// only: every call checks its arguments, forwards to Bus/Topic/DeadLetters and
// turns the Status into a code plus a message in the caller's lanebus_error.
//
// Design notes:
// 1. No exception leaves an extern "C" function: each body runs inside
//    guarded(), which maps std::bad_alloc (the only exception the C++ API can
//    raise: a copied string or a vector) to LANEBUS_INTERNAL.
// 2. The bus owns the C handles. Topic handles live in a map keyed by name
//    (create_* and find of one name give one handle); subscription handles in
//    a set, so lanebus_close can close what the caller left open. The mutex
//    guards those containers only: it is never held while a call may wait for
//    a handler (Subscription::close, Bus::shutdown), because a handler may
//    itself call into the C API.
// 3. A handler closure captures the C function pointer and user data by
//    value, never the subscription handle, so a handle freed while a call
//    detaches (BUSY) leaves nothing dangling.
#include "lanebus/lanebus.h"

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "lanebus/metrics.hpp"
#include "lanebus/version.hpp"

using lanebus::Code;
using lanebus::Status;

struct lanebus_topic {
  lanebus::Topic topic;
};

struct lanebus_subscription {
  lanebus_bus* owner = nullptr;
  lanebus::Subscription subscription;
};

struct lanebus_bus {
  std::unique_ptr<lanebus::Bus> bus;
  std::mutex mu;  // guards topics and subscriptions (design note 2)
  std::map<std::string, std::unique_ptr<lanebus_topic>, std::less<>> topics;
  std::set<lanebus_subscription*> subscriptions;  // owned
};

struct lanebus_dlq_list {
  std::vector<lanebus::DlqEntry> entries;  // owns the bytes the views point at
  std::vector<lanebus_dlq_entry> views;
};

namespace {

// The C codes are lanebus::Code's values; a reordering of either is a compile error.
#define LANEBUS_SAME(c, cpp) static_assert(static_cast<int>(Code::cpp) == c, #c " != Code::" #cpp)
LANEBUS_SAME(LANEBUS_OK, Ok);
LANEBUS_SAME(LANEBUS_INVALID_ARGUMENT, InvalidArgument);
LANEBUS_SAME(LANEBUS_INVALID_NAME, InvalidName);
LANEBUS_SAME(LANEBUS_PAYLOAD_TOO_LARGE, PayloadTooLarge);
LANEBUS_SAME(LANEBUS_CONFLICT, Conflict);
LANEBUS_SAME(LANEBUS_WOULD_BLOCK, WouldBlock);
LANEBUS_SAME(LANEBUS_TIMED_OUT, TimedOut);
LANEBUS_SAME(LANEBUS_QUOTA_EXCEEDED, QuotaExceeded);
LANEBUS_SAME(LANEBUS_SHUT_DOWN, ShutDown);
LANEBUS_SAME(LANEBUS_NOT_FOUND, NotFound);
LANEBUS_SAME(LANEBUS_BUSY, Busy);
LANEBUS_SAME(LANEBUS_MAP_FULL, MapFull);
LANEBUS_SAME(LANEBUS_DISK_FULL, DiskFull);
LANEBUS_SAME(LANEBUS_PERMISSION_DENIED, PermissionDenied);
LANEBUS_SAME(LANEBUS_CORRUPTION, Corruption);
LANEBUS_SAME(LANEBUS_VERSION_TOO_NEW, VersionTooNew);
LANEBUS_SAME(LANEBUS_IO_ERROR, IOError);
LANEBUS_SAME(LANEBUS_STALE_TOKEN, StaleToken);
LANEBUS_SAME(LANEBUS_FENCE_VIOLATION, FenceViolation);
LANEBUS_SAME(LANEBUS_INCOMPATIBLE, Incompatible);
LANEBUS_SAME(LANEBUS_SCHEMA_VIOLATION, SchemaViolation);
LANEBUS_SAME(LANEBUS_INTERNAL, Internal);
static_assert(static_cast<int>(lanebus::LogLevel::Debug) == LANEBUS_LOG_DEBUG &&
                  static_cast<int>(lanebus::LogLevel::Info) == LANEBUS_LOG_INFO &&
                  static_cast<int>(lanebus::LogLevel::Warn) == LANEBUS_LOG_WARN &&
                  static_cast<int>(lanebus::LogLevel::Error) == LANEBUS_LOG_ERROR,
              "lanebus_log_level mirrors lanebus::LogLevel");
#undef LANEBUS_SAME

constexpr std::chrono::milliseconds kCloseTimeout{5000};
constexpr const char* kDefaultOperator = "capi";

lanebus_code ok(lanebus_error* error) noexcept {
  if (error != nullptr) {
    error->code = LANEBUS_OK;
    error->message[0] = '\0';
  }
  return LANEBUS_OK;
}

[[gnu::format(printf, 3, 4)]] lanebus_code fail(lanebus_error* error, lanebus_code code, const char* format,
                                                ...) noexcept {
  if (error != nullptr) {
    error->code = code;
    va_list args;
    va_start(args, format);
    std::vsnprintf(error->message, sizeof error->message, format, args);
    va_end(args);
  }
  return code;
}

// A C++ Status as the C result: its code, and its message (or the code's
// name when it has none) prefixed by the C call that failed.
lanebus_code from(lanebus_error* error, const char* call, const Status& status) noexcept {
  if (status.ok()) return ok(error);
  const std::string_view message = status.message();
  const auto code = static_cast<lanebus_code>(status.code());
  if (message.empty()) return fail(error, code, "%s: %s", call, lanebus::to_string(status.code()));
  return fail(error, code, "%s: %.*s", call, static_cast<int>(message.size()), message.data());
}

template <typename F>
lanebus_code guarded(lanebus_error* error, const char* call, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(error, LANEBUS_INTERNAL, "%s: out of memory", call);
  } catch (const std::exception& e) {
    return fail(error, LANEBUS_INTERNAL, "%s: %s", call, e.what());
  }
}

// The bus's handle for `topic` (one per name), created on first sight.
lanebus_topic* handle_for(lanebus_bus* bus, const lanebus::Topic& topic) {
  std::lock_guard lock(bus->mu);
  auto it = bus->topics.find(topic.name());
  if (it == bus->topics.end()) {
    auto handle = std::make_unique<lanebus_topic>();
    handle->topic = topic;
    it = bus->topics.emplace(std::string(topic.name()), std::move(handle)).first;
  }
  return it->second.get();
}

lanebus_code create(lanebus_bus* bus, const char* name, std::uint32_t lanes, std::uint32_t flags,
                    lanebus_topic** out, lanebus_error* error, bool queue) {
  const char* call = queue ? "lanebus_create_queue" : "lanebus_create_topic";
  if (out != nullptr) *out = nullptr;
  if (bus == nullptr || name == nullptr || out == nullptr)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "%s: bus, name and the out-parameter must not be NULL", call);
  if ((flags & ~static_cast<std::uint32_t>(LANEBUS_DURABLE)) != 0)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "%s \"%s\": unknown flags 0x%x (only LANEBUS_DURABLE)", call, name,
                static_cast<unsigned>(flags));
  return guarded(error, call, [&] {
    lanebus::TopicOptions options;
    if (lanes != 0) options.lanes = lanes;
    options.durable = (flags & LANEBUS_DURABLE) != 0;
    auto topic = queue ? bus->bus->create_queue(name, options) : bus->bus->create_topic(name, options);
    if (!topic.ok()) return from(error, call, topic.status());
    *out = handle_for(bus, *topic);
    return ok(error);
  });
}

// The C log callback behind a LogHook: the line copied NUL-terminated into a
// stack buffer (lines are at most 1 KiB, log.hpp), no allocation.
lanebus::LogHook c_log_hook(lanebus_log_fn log, void* user_data) {
  return [log, user_data](lanebus::LogLevel level, std::string_view message) {
    char line[1025];
    const std::size_t n = std::min(message.size(), sizeof line - 1);
    std::memcpy(line, message.data(), n);
    line[n] = '\0';
    log(static_cast<lanebus_log_level>(level), line, n, user_data);
  };
}

lanebus::Handler c_handler(lanebus_handler handler, void* user_data) {
  return [handler, user_data](const lanebus::MessageView& m) {
    lanebus_message message{};
    message.payload = m.payload().data();
    message.payload_len = m.payload().size();
    message.key = m.key().empty() ? nullptr : m.key().data();
    message.key_len = m.key().size();
    message.id = m.id();
    message.created_at_ns = m.created_at_ns();
    message.attempt = m.attempt();
    message.lane = m.lane();
    message.offset = m.offset();
    message.reason = nullptr;
    const std::string_view headers = m.headers().encoded();
    message.headers = headers.empty() ? nullptr : headers.data();
    message.headers_len = headers.size();
    const lanebus_outcome outcome = handler(&message, user_data);
    switch (outcome) {
      case LANEBUS_ACK:
        return lanebus::Outcome::ack();
      case LANEBUS_RETRY:
        return lanebus::Outcome::retry(message.reason != nullptr ? message.reason : "the C handler returned RETRY");
      case LANEBUS_REJECT:
        return lanebus::Outcome::reject(message.reason != nullptr ? message.reason : "the C handler returned REJECT");
    }
    return lanebus::Outcome::reject("the C handler returned an unknown outcome");
  };
}

lanebus_code attach(lanebus_bus* bus, lanebus_topic* topic, const char* group, lanebus_handler handler,
                    void* user_data, std::uint32_t max_attempts, lanebus_subscription** out, lanebus_error* error,
                    bool queue) {
  const char* call = queue ? "lanebus_consume" : "lanebus_subscribe";
  if (out != nullptr) *out = nullptr;
  if (bus == nullptr || topic == nullptr || handler == nullptr || out == nullptr || (!queue && group == nullptr))
    return fail(error, LANEBUS_INVALID_ARGUMENT, "%s: bus, %s, handler and the out-parameter must not be NULL", call,
                queue ? "queue" : "topic, group");
  return guarded(error, call, [&] {
    lanebus::GroupOptions options;
    if (max_attempts != 0) options.max_attempts = max_attempts;
    auto sub = queue ? bus->bus->consume(topic->topic, c_handler(handler, user_data), options)
                     : bus->bus->subscribe(topic->topic, group, c_handler(handler, user_data), options);
    if (!sub.ok()) return from(error, call, sub.status());
    auto handle = std::make_unique<lanebus_subscription>();
    handle->owner = bus;
    handle->subscription = std::move(*sub);
    std::lock_guard lock(bus->mu);
    bus->subscriptions.insert(handle.get());
    *out = handle.release();
    return ok(error);
  });
}

// A stored header block handed to C (a message's, a DLQ entry's): NULL = none.
lanebus::HeadersView headers_of(const void* block, size_t len) {
  return block == nullptr ? lanebus::HeadersView()
                          : lanebus::HeadersView(std::string_view(static_cast<const char*>(block), len));
}
int header_at(const lanebus::HeadersView& hv, size_t index, lanebus_header* out) {
  if (out == nullptr || index >= hv.size()) return -1;
  auto it = hv.begin();
  for (size_t i = 0; i < index; ++i) ++it;
  const lanebus::Header h = *it;
  *out = lanebus_header{h.name.data(), h.name.size(), h.value.data(), h.value.size()};
  return 0;
}

}  // namespace

extern "C" {

const char* lanebus_code_name(lanebus_code code) { return lanebus::to_string(static_cast<Code>(code)); }

const char* lanebus_version(void) { return LANEBUS_VERSION_STRING; }

lanebus_code lanebus_open(const char* name, const char* store_directory, uint32_t workers, lanebus_bus** bus,
                          lanebus_error* error) {
  return lanebus_open_logged(name, store_directory, workers, nullptr, nullptr, bus, error);
}

lanebus_code lanebus_open_logged(const char* name, const char* store_directory, uint32_t workers, lanebus_log_fn log,
                                 void* log_user_data, lanebus_bus** bus, lanebus_error* error) {
  if (bus == nullptr) return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_open: the out-parameter must not be NULL");
  *bus = nullptr;
  return guarded(error, "lanebus_open", [&] {
    lanebus::BusOptions options;
    if (name != nullptr && name[0] != '\0') options.name = name;
    options.workers = workers;
    if (store_directory != nullptr) options.store.directory = store_directory;
    if (log != nullptr) options.log = c_log_hook(log, log_user_data);
    auto opened = lanebus::Bus::open(options);
    if (!opened.ok()) return from(error, "lanebus_open", opened.status());
    auto handle = std::make_unique<lanebus_bus>();
    handle->bus = std::move(*opened);
    *bus = handle.release();
    return ok(error);
  });
}

lanebus_code lanebus_close(lanebus_bus* bus, lanebus_error* error) {
  if (bus == nullptr) return ok(error);
  return guarded(error, "lanebus_close", [&] {
    // Drain first (the consumers are still attached and handle what is
    // queued), then detach them, then free.
    Status status = bus->bus->shutdown(lanebus::ShutdownMode::Drain, kCloseTimeout);
    if (status.code() == Code::Busy) return from(error, "lanebus_close", status);
    std::set<lanebus_subscription*> left;
    {
      std::lock_guard lock(bus->mu);
      left.swap(bus->subscriptions);
    }
    for (lanebus_subscription* s : left) {
      (void)s->subscription.close();  // the bus is stopped: no handler runs, nothing to report
      delete s;
    }
    delete bus;
    return from(error, "lanebus_close", status);
  });
}

lanebus_code lanebus_create_topic(lanebus_bus* bus, const char* name, uint32_t lanes, uint32_t flags,
                                  lanebus_topic** topic, lanebus_error* error) {
  return create(bus, name, lanes, flags, topic, error, false);
}

lanebus_code lanebus_create_queue(lanebus_bus* bus, const char* name, uint32_t lanes, uint32_t flags,
                                  lanebus_topic** queue, lanebus_error* error) {
  return create(bus, name, lanes, flags, queue, error, true);
}

lanebus_code lanebus_find(lanebus_bus* bus, const char* name, lanebus_topic** topic, lanebus_error* error) {
  if (topic != nullptr) *topic = nullptr;
  if (bus == nullptr || name == nullptr || topic == nullptr)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_find: bus, name and the out-parameter must not be NULL");
  return guarded(error, "lanebus_find", [&] {
    auto found = bus->bus->find(name);
    if (!found.ok()) return from(error, "lanebus_find", found.status());
    *topic = handle_for(bus, *found);
    return ok(error);
  });
}

lanebus_code lanebus_publish(lanebus_topic* topic, const void* key, size_t key_len, const void* payload,
                             size_t payload_len, lanebus_error* error) {
  return lanebus_publish_ex(topic, key, key_len, payload, payload_len, nullptr, error);
}

lanebus_code lanebus_publish_ex(lanebus_topic* topic, const void* key, size_t key_len, const void* payload,
                                size_t payload_len, const lanebus_publish_options* options, lanebus_error* error) {
  if (topic == nullptr) return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_publish: the topic must not be NULL");
  if (payload == nullptr || payload_len == 0)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_publish \"%.*s\": empty payload (NULL or 0 bytes)",
                static_cast<int>(topic->topic.name().size()), topic->topic.name().data());
  if (key == nullptr && key_len != 0)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_publish \"%.*s\": key is NULL but key_len is %zu",
                static_cast<int>(topic->topic.name().size()), topic->topic.name().data(), key_len);
  lanebus::OutgoingMessage message;
  if (key_len != 0) message.key = std::string_view(static_cast<const char*>(key), key_len);
  message.payload = std::string_view(static_cast<const char*>(payload), payload_len);
  if (options != nullptr) {
    message.delay = std::chrono::nanoseconds(options->delay_ns);
    message.deliver_at = options->deliver_at_ns;
    // 0 keeps the topic's default TTL; a negative one is refused by publish, naming it.
    if (options->ttl_ns != 0) message.ttl = std::chrono::nanoseconds(options->ttl_ns);
  }
  return from(error, "lanebus_publish", topic->topic.publish(message));
}

lanebus_code lanebus_publish_headers(lanebus_topic* topic, const void* key, size_t key_len, const void* payload,
                                     size_t payload_len, const lanebus_header* headers, size_t header_count,
                                     lanebus_error* error) {
  if (topic == nullptr)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_publish_headers: the topic must not be NULL");
  if (payload == nullptr || payload_len == 0 || (key == nullptr && key_len != 0) ||
      (headers == nullptr && header_count != 0))
    return fail(error, LANEBUS_INVALID_ARGUMENT,
                "lanebus_publish_headers \"%.*s\": empty payload, or a NULL key or headers with a non-zero length",
                static_cast<int>(topic->topic.name().size()), topic->topic.name().data());
  if (header_count > lanebus::kMaxHeaders)
    return fail(error, LANEBUS_PAYLOAD_TOO_LARGE, "lanebus_publish_headers \"%.*s\": %zu headers, at most %zu",
                static_cast<int>(topic->topic.name().size()), topic->topic.name().data(), header_count,
                lanebus::kMaxHeaders);
  lanebus::Header hs[lanebus::kMaxHeaders];
  for (size_t i = 0; i < header_count; ++i) {
    if ((headers[i].name == nullptr && headers[i].name_len != 0) ||
        (headers[i].value == nullptr && headers[i].value_len != 0))
      return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_publish_headers: header %zu has a NULL name or value", i);
    hs[i].name = std::string_view(headers[i].name == nullptr ? "" : headers[i].name, headers[i].name_len);
    hs[i].value = std::string_view(headers[i].value == nullptr ? "" : headers[i].value, headers[i].value_len);
  }
  lanebus::OutgoingMessage message;
  if (key_len != 0) message.key = std::string_view(static_cast<const char*>(key), key_len);
  message.payload = std::string_view(static_cast<const char*>(payload), payload_len);
  message.headers = std::span<const lanebus::Header>(hs, header_count);
  return from(error, "lanebus_publish_headers", topic->topic.publish(message));
}


size_t lanebus_message_header_count(const lanebus_message* message) {
  return message == nullptr ? 0 : headers_of(message->headers, message->headers_len).size();
}

int lanebus_message_header(const lanebus_message* message, size_t index, lanebus_header* out) {
  return message == nullptr ? -1 : header_at(headers_of(message->headers, message->headers_len), index, out);
}

size_t lanebus_dlq_entry_header_count(const lanebus_dlq_entry* entry) {
  return entry == nullptr ? 0 : headers_of(entry->headers, entry->headers_len).size();
}

int lanebus_dlq_entry_header(const lanebus_dlq_entry* entry, size_t index, lanebus_header* out) {
  return entry == nullptr ? -1 : header_at(headers_of(entry->headers, entry->headers_len), index, out);
}

lanebus_code lanebus_subscribe(lanebus_bus* bus, lanebus_topic* topic, const char* group, lanebus_handler handler,
                               void* user_data, uint32_t max_attempts, lanebus_subscription** subscription,
                               lanebus_error* error) {
  return attach(bus, topic, group, handler, user_data, max_attempts, subscription, error, false);
}

lanebus_code lanebus_consume(lanebus_bus* bus, lanebus_topic* queue, lanebus_handler handler, void* user_data,
                             uint32_t max_attempts, lanebus_subscription** subscription, lanebus_error* error) {
  return attach(bus, queue, nullptr, handler, user_data, max_attempts, subscription, error, true);
}

lanebus_code lanebus_unsubscribe(lanebus_subscription* subscription, lanebus_error* error) {
  if (subscription == nullptr) return ok(error);
  Status status = subscription->subscription.close();
  if (status.code() == Code::Busy) return from(error, "lanebus_unsubscribe", status);
  lanebus_bus* owner = subscription->owner;
  {
    std::lock_guard lock(owner->mu);
    owner->subscriptions.erase(subscription);
  }
  delete subscription;
  return from(error, "lanebus_unsubscribe", status);
}

lanebus_code lanebus_dlq_list_entries(lanebus_bus* bus, const char* topic, int pending_only, lanebus_dlq_list** list,
                                      lanebus_error* error) {
  if (list != nullptr) *list = nullptr;
  if (bus == nullptr || list == nullptr)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_dlq_list_entries: bus and the out-parameter must not be NULL");
  return guarded(error, "lanebus_dlq_list_entries", [&] {
    auto dlq = bus->bus->dead_letters();
    if (!dlq.ok()) return from(error, "lanebus_dlq_list_entries", dlq.status());
    lanebus::DlqFilter filter;
    if (topic != nullptr) filter.topic = std::string(topic);
    if (pending_only != 0) filter.state = lanebus::DlqState::Pending;
    auto entries = (*dlq)->list(filter);
    if (!entries.ok()) return from(error, "lanebus_dlq_list_entries", entries.status());
    auto out = std::make_unique<lanebus_dlq_list>();
    out->entries = std::move(*entries);
    out->views.reserve(out->entries.size());
    for (const lanebus::DlqEntry& e : out->entries) {
      lanebus_dlq_entry v{};
      v.id = e.id;
      v.state = lanebus::to_string(e.state);
      v.error_class = lanebus::to_string(e.error_class);
      v.topic = e.topic.c_str();
      v.group = e.group.c_str();
      v.reason = e.reason.c_str();
      v.key = e.key.empty() ? nullptr : e.key.data();
      v.key_len = e.key.size();
      v.payload = e.payload.c_str();
      v.payload_len = e.payload.size();
      v.attempts = e.attempts;
      v.lane = e.lane;
      v.offset = e.offset;
      v.dead_at_ns = e.dead_at_ns;
      v.headers = e.headers.empty() ? nullptr : e.headers.data();
      v.headers_len = e.headers.size();
      out->views.push_back(v);
    }
    *list = out.release();
    return ok(error);
  });
}

size_t lanebus_dlq_list_size(const lanebus_dlq_list* list) { return list == nullptr ? 0 : list->views.size(); }

const lanebus_dlq_entry* lanebus_dlq_list_at(const lanebus_dlq_list* list, size_t i) {
  if (list == nullptr || i >= list->views.size()) return nullptr;
  return &list->views[i];
}

void lanebus_dlq_list_free(lanebus_dlq_list* list) { delete list; }

lanebus_code lanebus_dlq_replay(lanebus_bus* bus, const uint64_t* ids, size_t count, const char* operator_name,
                                uint64_t* replayed, lanebus_error* error) {
  if (replayed != nullptr) *replayed = 0;
  if (bus == nullptr || (ids == nullptr && count != 0))
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_dlq_replay: bus must not be NULL, nor ids when count > 0");
  return guarded(error, "lanebus_dlq_replay", [&] {
    auto dlq = bus->bus->dead_letters();
    if (!dlq.ok()) return from(error, "lanebus_dlq_replay", dlq.status());
    const std::vector<std::uint64_t> which(ids, ids + count);
    const char* who = operator_name != nullptr && operator_name[0] != '\0' ? operator_name : kDefaultOperator;
    auto done = (*dlq)->replay(which, who);
    if (!done.ok()) return from(error, "lanebus_dlq_replay", done.status());
    if (replayed != nullptr) *replayed = *done;
    return ok(error);
  });
}

lanebus_code lanebus_stats_json(lanebus_bus* bus, char** json, lanebus_error* error) {
  if (json != nullptr) *json = nullptr;
  if (bus == nullptr || json == nullptr)
    return fail(error, LANEBUS_INVALID_ARGUMENT, "lanebus_stats_json: bus and the out-parameter must not be NULL");
  return guarded(error, "lanebus_stats_json", [&] {
    // One reading through a fresh Monitor: counters and gauges (rates need
    // two readings and stay null, as in a Monitor's first snapshot).
    auto monitor = lanebus::Monitor::create(*bus->bus);
    if (!monitor.ok()) return from(error, "lanebus_stats_json", monitor.status());
    if (Status s = (*monitor)->sample(); !s.ok()) return from(error, "lanebus_stats_json", s);
    const std::string text = (*monitor)->json();
    char* copy = static_cast<char*>(std::malloc(text.size() + 1));
    if (copy == nullptr) return fail(error, LANEBUS_INTERNAL, "lanebus_stats_json: out of memory");
    std::memcpy(copy, text.c_str(), text.size() + 1);
    *json = copy;
    return ok(error);
  });
}

void lanebus_string_free(char* text) { std::free(text); }

}  // extern "C"
