// lanebus — MIT License.
// The public Bus facade: Topic, Subscription, Publisher, Bus and DeadLetters
// forward to detail::BusCore. The implementation is split by concern:
// bus_core.cpp (start, shutdown), registry.cpp, publish.cpp,
// publish_durable.cpp, scheduler.cpp (Scheduler), delivery.cpp (DeliveryCore),
// outage.cpp (OutageGate), ephemeral_lane.cpp, durable_lane.cpp,
// txconsume.cpp (design notes: bus_impl.hpp).
#include <algorithm>
#include <bit>
#include <cassert>
#include <exception>
#include <string>

#include "bus_impl.hpp"
#include "tenancy.hpp"
#include "lanebus/lease.hpp"
#include "names.hpp"
#include "trace.hpp"
#include "wall_clock.hpp"

namespace lanebus {

namespace {
Status no_topic() noexcept {
  return Status::from_literal(Code::InvalidArgument, "publish: the topic handle is empty or foreign to this bus");
}
}  // namespace

namespace {
Status publish_durable_noexcept(detail::TopicImpl* t, const OutgoingMessage& m) noexcept {
  try {
    return t->publish_durable(m, {});
  } catch (const std::exception& e) {
    return Status::from_literal(Code::Internal, "publish: out of memory copying the message for the store");
  }
}
}  // namespace

namespace {

BatchPublishResult publish_batch_through(detail::PublisherState& st, detail::TopicImpl* t,
                                         std::span<const OutgoingMessage> messages) noexcept {
  std::uint64_t first;
  if (st.end_id - st.next_id >= messages.size()) {
    first = st.next_id;  // from the private block
    st.next_id += messages.size();
  } else {
    first = st.bus->take_ids(messages.size());
  }
  return t->publish_batch(messages, true, first, &st);
}
}  // namespace

namespace {
/// The Tracer's publish span around `publish` (trace.hpp); without a tracer,
/// one null check. The lane is the message's (hash of its key).
template <class Publish>
Status traced(detail::TopicImpl* t, const OutgoingMessage& m, Publish&& publish) {
  if (Tracer* tracer = t->bus->options.tracer) [[unlikely]]
    return detail::traced_publish(tracer, t->name, lane_for_key(m.key, t->options.lanes), m, publish);
  return publish(m);
}

// Through the calling thread's own publisher ("implicit publishers", bus_core.cpp).
Status publish_one(detail::TopicImpl* t, const OutgoingMessage& m, bool may_block) noexcept {
  if (t->durable) return publish_durable_noexcept(t, m);
  if (detail::PublisherState* st = t->bus->thread_publisher()) return t->publish_via(*st, m, may_block);
  return t->publish(m, may_block, t->bus->take_ids(1));
}

/// publish_batch with a tracer: one span per message, published one by one
/// (the same result: the published prefix and the first refusal).
template <class Publish>
BatchPublishResult traced_batch(detail::TopicImpl* t, std::span<const OutgoingMessage> ms, Publish&& publish) {
  BatchPublishResult r;
  for (const OutgoingMessage& m : ms) {
    r.status = traced(t, m, publish);
    if (!r.status.ok()) return r;
    ++r.published;
  }
  return r;
}
}  // namespace

Status Topic::publish(const OutgoingMessage& message) const noexcept {
  if (impl_ == nullptr) return no_topic();
  return traced(impl_, message, [t = impl_](const OutgoingMessage& m) { return publish_one(t, m, true); });
}

Status Topic::try_publish(const OutgoingMessage& message) const noexcept {
  if (impl_ == nullptr) return no_topic();
  return traced(impl_, message, [t = impl_](const OutgoingMessage& m) { return publish_one(t, m, false); });
}

Status Topic::publish_async(const OutgoingMessage& message, PublishCallback done) const {
  if (impl_ == nullptr) return no_topic();
  if (!done) return Status(Code::InvalidArgument, "publish_async: the completion callback is empty");
  // With a tracer, the span ends when this call returns (not at the commit).
  return traced(impl_, message, [t = impl_, &done](const OutgoingMessage& m) -> Status {
    try {
      if (t->durable) return t->publish_durable(m, std::move(done));
    } catch (const std::exception&) {
      return Status::from_literal(Code::Internal, "publish: out of memory copying the message for the store");
    }
    Status s = t->publish(m, true, t->bus->take_ids(1));
    if (s.ok()) done(s, 0);
    return s;
  });
}

namespace {
/// publish_batch on a durable topic: runs of messages as one request to the
/// store's writer (TopicImpl::publish_batch_durable); with a tracer, one
/// span per message, published one by one.
BatchPublishResult publish_batch_durable(detail::TopicImpl* t, std::span<const OutgoingMessage> ms) noexcept {
  if (t->bus->options.tracer != nullptr) [[unlikely]]
    return traced_batch(t, ms, [t](const OutgoingMessage& m) { return publish_durable_noexcept(t, m); });
  return t->publish_batch_durable(ms);
}
}  // namespace

BatchPublishResult Topic::publish_batch(std::span<const OutgoingMessage> messages) const noexcept {
  if (impl_ == nullptr) return {0, no_topic()};
  if (impl_->durable) return publish_batch_durable(impl_, messages);
  if (messages.empty()) return {};
  if (impl_->bus->options.tracer != nullptr) [[unlikely]]
    return traced_batch(impl_, messages, [t = impl_](const OutgoingMessage& m) { return publish_one(t, m, true); });
  if (detail::PublisherState* st = impl_->bus->thread_publisher()) return publish_batch_through(*st, impl_, messages);
  return impl_->publish_batch(messages, true, impl_->bus->take_ids(messages.size()));
}

bool Topic::is_durable() const noexcept { return impl_ && impl_->durable; }

std::string_view Topic::name() const noexcept { return impl_ ? std::string_view(impl_->name) : std::string_view(); }
std::uint32_t Topic::lanes() const noexcept { return impl_ ? impl_->options.lanes : 0; }
bool Topic::is_queue() const noexcept { return impl_ && impl_->is_queue; }

// Subscription

Subscription::Subscription(std::shared_ptr<detail::BusCore> core, detail::Consumer* consumer) noexcept
    : core_(std::move(core)), consumer_(consumer) {}

Subscription::Subscription(Subscription&& other) noexcept
    : core_(std::move(other.core_)), consumer_(std::exchange(other.consumer_, nullptr)) {}

Subscription& Subscription::operator=(Subscription&& other) noexcept {
  if (this != &other) {
    (void)close();
    core_ = std::move(other.core_);
    consumer_ = std::exchange(other.consumer_, nullptr);
  }
  return *this;
}

Subscription::~Subscription() { (void)close(); }

Status Subscription::close() noexcept {
  if (consumer_ == nullptr) return Status();
  detail::Consumer* c = std::exchange(consumer_, nullptr);
  Status s = core_->detach(c);
  core_.reset();
  return s;
}

// Publisher

Publisher::Publisher() noexcept = default;
Publisher::Publisher(std::unique_ptr<detail::PublisherState> state) noexcept : state_(std::move(state)) {}
Publisher::Publisher(Publisher&&) noexcept = default;
Publisher& Publisher::operator=(Publisher&&) noexcept = default;
Publisher::~Publisher() = default;

namespace {
// Publisher::publish with a tracer or to a durable topic: out of line, so
// the common case below builds no lambda frame (19 instructions instead of
// about 35 before publish_via; GCC still calls it, as Status returns
// through memory).
[[gnu::noinline]] Status publish_slow(detail::TopicImpl* t, detail::PublisherState* st,
                                      const OutgoingMessage& message) noexcept {
  return traced(t, message, [t, st](const OutgoingMessage& m) {
    return t->durable ? publish_durable_noexcept(t, m) : t->publish_via(*st, m, true);
  });
}
}  // namespace

Status Publisher::publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (!state_ || topic.impl_ == nullptr || topic.impl_->bus != state_->bus) return no_topic();
  detail::TopicImpl* const t = topic.impl_;
  // No tracer, in memory (the common case): straight on to publish_via.
  if (t->bus->options.tracer == nullptr && !t->durable) [[likely]] return t->publish_via(*state_, message, true);
  return publish_slow(t, state_.get(), message);
}

Status Publisher::try_publish(const Topic& topic, const OutgoingMessage& message) noexcept {
  if (!state_ || topic.impl_ == nullptr || topic.impl_->bus != state_->bus) return no_topic();
  return traced(topic.impl_, message, [t = topic.impl_, st = state_.get()](const OutgoingMessage& m) {
    return t->durable ? publish_durable_noexcept(t, m) : t->publish_via(*st, m, false);
  });
}

BatchPublishResult Publisher::publish_batch(const Topic& topic, std::span<const OutgoingMessage> messages) noexcept {
  if (!state_ || topic.impl_ == nullptr || topic.impl_->bus != state_->bus) return {0, no_topic()};
  if (topic.impl_->durable) return publish_batch_durable(topic.impl_, messages);
  if (messages.empty()) return {};
  if (topic.impl_->bus->options.tracer != nullptr) [[unlikely]]
    return traced_batch(topic.impl_, messages, [t = topic.impl_, st = state_.get()](const OutgoingMessage& m) {
      return t->publish_via(*st, m, true);
    });
  return publish_batch_through(*state_, topic.impl_, messages);
}

// Bus

Bus::Bus(std::shared_ptr<detail::BusCore> core) noexcept : core_(std::move(core)) {}

Result<std::unique_ptr<Bus>> Bus::open(const BusOptions& options) {
  if (options.workers > 1024)
    return Status(Code::InvalidArgument, "bus \"" + options.name + "\": workers must be at most 1024, got " +
                                             std::to_string(options.workers));
  if (options.memory_budget > (std::size_t{1} << 40))
    return Status(Code::InvalidArgument, "bus \"" + options.name + "\": memory_budget must be at most 1 TiB, got " +
                                             std::to_string(options.memory_budget));
  if (options.max_topics == 0 || options.max_consumers_per_group == 0)
    return Status(Code::InvalidArgument,
                  "bus \"" + options.name + "\": max_topics and max_consumers_per_group must be at least 1");
  if (options.spin.count() < 0 || options.close_timeout.count() < 0)
    return Status(Code::InvalidArgument, "bus \"" + options.name + "\": spin and close_timeout must not be negative");
  // BusOptions::namespace_stores (doc/tenancy.md "Moving a namespace").
  for (std::size_t i = 0; i < options.namespace_stores.size(); ++i) {
    const NamespaceStore& m = options.namespace_stores[i];
    if (Status s = detail::check_name(m.name, "namespace"); !s.ok()) return s;
    if (m.directory.empty() || options.store.directory.empty() || m.directory == options.store.directory)
      return Status(Code::InvalidArgument, "bus \"" + options.name + "\": namespace \"" + m.name +
                                               "\" needs a store directory of its own, beside BusOptions::store.directory");
    for (std::size_t j = 0; j < i; ++j) {
      if (options.namespace_stores[j].name == m.name)
        return Status(Code::InvalidArgument, "bus \"" + options.name + "\": namespace \"" + m.name + "\" is mapped twice");
    }
  }
  // The message clock's calibration starts at the process's first read (wall_clock.hpp):
  // the bus's first messages, a few ms on, are stamped from the TSC.
  (void)detail::WallClock::now_ns();
  auto core = std::make_shared<detail::BusCore>(options);
  if (Status s = core->start(); !s.ok()) return s;
  auto bus = std::unique_ptr<Bus>(new Bus(std::move(core)));
  for (const NamespaceStore& m : options.namespace_stores) {
    BusOptions inner = options;
    inner.name = options.name + "/" + m.name;
    inner.store.directory = m.directory;
    inner.namespace_stores.clear();
    auto c = std::make_shared<detail::BusCore>(inner);
    if (Status s = c->start(); !s.ok()) {
      (void)c->shutdown(ShutdownMode::Drain, options.close_timeout);
      return Status(s.code(), "namespace \"" + m.name + "\" in store \"" + m.directory + "\": " + s.to_string());
    }
    bus->ns_cores_.emplace_back(m.name, std::move(c));
  }
  return bus;
}

Bus::~Bus() { (void)shutdown(ShutdownMode::Drain, core_->options.close_timeout); }

detail::BusCore* Bus::core_for(std::string_view name) const noexcept {
  detail::BusCore* best = core_.get();
  std::size_t best_len = 0;
  for (const auto& [ns, c] : ns_cores_) {
    if (ns.size() > best_len && detail::prefix_covers(ns, name)) {
      best = c.get();
      best_len = ns.size();
    }
  }
  return best;
}

std::shared_ptr<detail::BusCore> Bus::owner_of(const Topic& topic) const noexcept {
  if (topic.impl_ == nullptr) return nullptr;
  if (topic.impl_->bus == core_.get()) return core_;
  for (const auto& [ns, c] : ns_cores_) {
    if (topic.impl_->bus == c.get()) return c;
  }
  return nullptr;
}

Result<Topic> Bus::create_topic(std::string_view name, const TopicOptions& options) {
  detail::BusCore* core = core_for(name);
  auto t = core->create(name, false, options);
  if (!t.ok()) return t.status();
  core->schemas()->bind(*t);  // a typed topic: its latest schema (doc/schemas.md)
  return Topic(*t);
}

Result<Topic> Bus::create_queue(std::string_view name, const TopicOptions& options) {
  detail::BusCore* core = core_for(name);
  auto t = core->create(name, true, options);
  if (!t.ok()) return t.status();
  core->schemas()->bind(*t);
  return Topic(*t);
}

Schemas Bus::schemas() { return Schemas(core_->schemas()); }

Result<Topic> Bus::find(std::string_view name) const {
  if (Status s = detail::check_name(name, "topic"); !s.ok()) return s;
  detail::TopicImpl* t = core_for(name)->find(name);
  if (t == nullptr) return Status(Code::NotFound, "no topic or queue named \"" + std::string(name) + "\"");
  return Topic(t);
}

Result<Subscription> Bus::attach_plain(const Topic& topic, std::string_view group, Handler handler,
                                      BatchHandler batch, const GroupOptions& options, bool queue) {
  const char* what = queue ? (batch ? "consume_batch" : "consume") : (batch ? "subscribe_batch" : "subscribe");
  const std::shared_ptr<detail::BusCore> owner = owner_of(topic);
  if (owner == nullptr)
    return Status(Code::InvalidArgument, std::string(what) + ": the " + (queue ? "queue" : "topic") +
                                             " handle is empty or belongs to another bus");
  if (!queue && topic.impl_->is_queue)
    return Status(Code::InvalidArgument, std::string(what) + ": \"" + topic.impl_->name +
                                             "\" is a queue; use Bus::consume for competing consumers");
  if (queue && !topic.impl_->is_queue)
    return Status(Code::InvalidArgument, std::string(what) + ": \"" + topic.impl_->name +
                                             "\" is a topic; use Bus::subscribe with a group name");
  if (!queue) {
    if (Status s = detail::check_name(group, "group"); !s.ok()) return s;
  }
  auto c = owner->attach(topic.impl_, group, std::move(handler), {}, options, std::move(batch));
  if (!c.ok()) return c.status();
  return Subscription(owner, *c);
}

Result<Subscription> Bus::subscribe(const Topic& topic, std::string_view group, Handler handler,
                                    const GroupOptions& options) {
  return attach_plain(topic, group, std::move(handler), {}, options, false);
}

Result<Subscription> Bus::consume(const Topic& queue, Handler handler, const GroupOptions& options) {
  return attach_plain(queue, {}, std::move(handler), {}, options, true);
}

Result<Subscription> Bus::subscribe_batch(const Topic& topic, std::string_view group, BatchHandler handler,
                                          const GroupOptions& options) {
  if (!handler) return Status(Code::InvalidArgument, "subscribe_batch: the handler is empty");
  return attach_plain(topic, group, {}, std::move(handler), options, false);
}

Result<Subscription> Bus::consume_batch(const Topic& queue, BatchHandler handler, const GroupOptions& options) {
  if (!handler) return Status(Code::InvalidArgument, "consume_batch: the handler is empty");
  return attach_plain(queue, {}, {}, std::move(handler), options, true);
}

Status Bus::seek(const Topic& topic, std::string_view group, const StartPosition& position) {
  const std::shared_ptr<detail::BusCore> owner = owner_of(topic);
  if (owner == nullptr)
    return Status(Code::InvalidArgument, "seek: the topic handle is empty or belongs to another bus");
  return owner->seek(topic.impl_, group, position);
}

Status Bus::resume(const Topic& topic, std::string_view group) {
  const std::shared_ptr<detail::BusCore> owner = owner_of(topic);
  if (owner == nullptr)
    return Status(Code::InvalidArgument, "resume: the topic handle is empty or belongs to another bus");
  return owner->resume(topic.impl_, group);
}

Result<IdempotencyTable*> Bus::idempotency(std::string_view scope, const IdempotencyOptions& options) {
  return core_for(scope)->idempotency(scope, options);
}

Result<Subscription> Bus::subscribe_tx(const Topic& topic, std::string_view group, TxHandler handler,
                                       const GroupOptions& options) {
  const std::shared_ptr<detail::BusCore> owner = owner_of(topic);
  if (owner == nullptr)
    return Status(Code::InvalidArgument, "subscribe_tx: the topic handle is empty or belongs to another bus");
  if (topic.impl_->is_queue)
    return Status(Code::InvalidArgument, "subscribe_tx: \"" + topic.impl_->name + "\" is a queue; use consume_tx");
  if (Status s = detail::check_name(group, "group"); !s.ok()) return s;
  auto c = owner->attach(topic.impl_, group, {}, std::move(handler), options);
  if (!c.ok()) return c.status();
  return Subscription(owner, *c);
}

Result<Subscription> Bus::consume_tx(const Topic& queue, TxHandler handler, const GroupOptions& options) {
  const std::shared_ptr<detail::BusCore> owner = owner_of(queue);
  if (owner == nullptr)
    return Status(Code::InvalidArgument, "consume_tx: the queue handle is empty or belongs to another bus");
  if (!queue.impl_->is_queue)
    return Status(Code::InvalidArgument, "consume_tx: \"" + queue.impl_->name + "\" is a topic; use subscribe_tx");
  auto c = owner->attach(queue.impl_, {}, {}, std::move(handler), options);
  if (!c.ok()) return c.status();
  return Subscription(owner, *c);
}

Result<std::string> Bus::table_get(std::string_view table, std::string_view key) const {
  return core_for(table)->table_get(table, key);
}

Result<DeadLetters*> Bus::dead_letters() {
  if (core_->dead_letters() == nullptr)
    return Status(Code::InvalidArgument, "dead_letters: an in-memory bus has no DLQ (set BusOptions::store.directory)");
  return core_->dead_letters();
}

Result<std::vector<DlqEntry>> DeadLetters::list(const DlqFilter& filter) { return core_->dlq()->list(filter); }
Result<DlqEntry> DeadLetters::show(std::uint64_t id) { return core_->dlq()->show(id); }
Result<std::uint64_t> DeadLetters::replay(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  auto r = core_->dlq()->replay(std::span<const std::uint64_t>(ids), operator_name,
                                [this](const DlqEntry& e) { return core_->republish(e); });
  if (!r.ok()) return r.status();
  return static_cast<std::uint64_t>(r->size());
}
Status DeadLetters::archive(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  return core_->dlq()->archive(std::span<const std::uint64_t>(ids), operator_name);
}
Result<std::uint64_t> DeadLetters::purge(const std::vector<std::uint64_t>& ids, std::string_view operator_name) {
  return core_->dlq()->purge(std::span<const std::uint64_t>(ids), operator_name);
}
Result<std::vector<DlqAuditRecord>> DeadLetters::audit() { return core_->dlq()->audit(); }
Result<DlqCounters> DeadLetters::counters() { return core_->dlq()->counters(); }

Publisher Bus::publisher() {
  auto st = std::make_unique<detail::PublisherState>();
  st->bus = core_.get();
  st->keep = core_;
  st->slot = core_->claim_publisher_slot();
  return Publisher(std::move(st));
}

BusStats Bus::stats() const {
  BusStats s = core_->stats();
  // Deprecated fields and their readers (doc/schemas.md), read after the
  // core's lock is released (the registry's lock order).
  if (auto d = core_->schemas()->deprecated_fields(); d.ok()) s.deprecated_fields = std::move(*d);
  return s;
}

Status Bus::shutdown(ShutdownMode mode, std::chrono::milliseconds timeout) {
  Status first;
  for (const auto& [ns, c] : ns_cores_) {
    Status s = c->shutdown(mode, timeout);
    if (first.ok() && !s.ok()) first = s;
  }
  Status s = core_->shutdown(mode, timeout);
  return first.ok() ? s : first;
}

}  // namespace lanebus
