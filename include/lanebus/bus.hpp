// lanebus — MIT License.
// Bus: the root object. Topics, queues, consumer groups, publishing handles, shutdown.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/handler.hpp"
#include "lanebus/idempotency.hpp"
#include "lanebus/message.hpp"
#include "lanebus/options.hpp"
#include "lanebus/schema.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/transaction.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class Client;      // client.hpp (tenancy)
class Namespaces;  // tenancy.hpp
struct Credential;

class Delivery;  // typed.hpp
template <typename T>
class TypedTopic;  // typed.hpp
template <typename T>
struct TypedTopicOptions;  // typed.hpp

namespace detail {
struct Access;
struct TypedAccess;
class BusCore;
class TopicImpl;
struct Consumer;
struct PublisherState;
}  // namespace detail

/// Completion of Topic::publish_async: the publish's status and, for durable
/// topics, the message's offset in its lane (0 for ephemeral topics). Runs on
/// the store's writer thread (durable) or inline in publish_async (ephemeral),
/// with no lanebus lock held; it must be short and must not block (no
/// blocking publish, no shutdown) — hand work to your own thread instead.
using PublishCallback = std::function<void(const Status& status, std::uint64_t offset)>;

/// What Topic::publish_batch did: messages[0, published) are published, in
/// order; `status` is OK when all were, else the reason messages[published]
/// was not (nothing after it was attempted). See Topic::publish_batch.
struct BatchPublishResult {
  std::size_t published = 0;
  Status status;
  bool ok() const noexcept { return status.ok(); }
};

/// A topic or queue: a cheap, copyable reference. Valid while its Bus lives.
/// A default-constructed Topic refers to nothing; using it gives InvalidArgument.
///
/// Publishing, in one sentence per guarantee:
/// - The message is copied into a pooled slot; once publish returns OK the bus
///   owns it, and the views in OutgoingMessage may be reused.
/// - Ordering contract: within one key (one lane), if one publish returns
///   before another starts (same thread, or threads ordered by any
///   synchronisation), every group sees them in that order. Publishes that
///   overlap in time have no defined order. There is no order across lanes.
/// - Ephemeral topics are at-most-once across a crash: nothing is stored.
/// - Durable topics store the message in LMDB before publish returns OK: in
///   Durability::Sync mode after the commit is fsynced (a kill -9 or power
///   loss after OK loses nothing); in Async mode after the commit, flushed on
///   an interval (a kill -9 loses nothing, a power loss may lose the last
///   interval). Many concurrent publishers share one commit (group commit).
/// - With no groups subscribed, a published message is counted (`unrouted`)
///   and discarded.
///
/// Thread safety: thread-safe.
class LANEBUS_API Topic {
 public:
  Topic() noexcept = default;

  /// Publish one message. Allocation-free once the topic exists and the
  /// calling thread has published to its bus once.
  ///
  /// On an in-memory topic the message goes through a publisher of the
  /// calling thread's own, made on the thread's first publish to the bus (one
  /// allocation) and kept until the thread exits or the bus goes: the same
  /// path and speed as a Publisher (slots from a private cache, ids from a
  /// private block, no locked instruction while one thread publishes to the
  /// topic). A thread keeps its publishers for the last two buses it
  /// published to.
  ///
  /// Blocks only under Backpressure::Block, for at most the topic's
  /// block_timeout, waiting for a free slot. Errors (nothing is published):
  /// A payload that does not fit the slot with the keys takes a block of the
  /// bus's payload pool (TopicOptions::max_payload, doc/topics.md "Payload
  /// sizes"); a full pool is backpressure like a full topic.
  /// - InvalidArgument: empty payload, a default-constructed Topic, or an
  ///   in-memory typed topic (publish through its TypedTopic<T>).
  /// - PayloadTooLarge: the payload exceeds max_payload, or is larger than
  ///   the largest block BusOptions::memory_budget provides; the key or the
  ///   idempotency key exceeds 65535 bytes; the keys leave no room in the
  ///   slot for the block reference (slot_bytes). The message names which.
  /// - WouldBlock: topic (or payload pool) full under Backpressure::FailFast.
  /// - TimedOut: topic (or payload pool) still full after block_timeout under
  ///   Backpressure::Block.
  /// - ShutDown: the bus is shut down or shutting down.
  Status publish(const OutgoingMessage& message) const noexcept;

  /// Like publish, but never blocks: a full topic gives WouldBlock (or, under
  /// DropOldest, drops the oldest message to make room). On a durable topic it
  /// is the same as publish (which waits for the commit).
  Status try_publish(const OutgoingMessage& message) const noexcept;

  /// Publish without waiting for durability, so a producer can keep many
  /// publishes in flight: `done` runs once the message is committed (Sync:
  /// fsynced) or has failed. Returns an error, and never calls `done`, when
  /// the message is refused up front (the codes of publish, except that a
  /// durable store with StoreOptions::max_pending appends queued makes this
  /// call wait for room). On an ephemeral topic `done` runs inline.
  /// REQUIRES: done is not empty (else InvalidArgument).
  Status publish_async(const OutgoingMessage& message, PublishCallback done) const;

  /// Publish many messages in one call: the same result as calling publish
  /// for each message in span order and stopping at the first error, but
  /// cheaper per message: it claims slots for up to 64 messages with one
  /// atomic operation, appends each lane's share to each group's lane with
  /// one more, wakes each lane once and reads the clock once per 64 (the
  /// messages of one such chunk share `created_at`). Allocation-free.
  /// doc/performance.md has the measured gain.
  ///
  /// - Order: per key, messages keep their span order, and the ordering
  ///   contract of publish holds for each of them (a publish that returned
  ///   before this call started comes first; one that starts after it
  ///   returns comes later).
  /// - Validation first: an empty payload or an oversized message anywhere in
  ///   the span publishes nothing (published = 0; InvalidArgument or
  ///   PayloadTooLarge). An empty span is OK with published = 0. A span with
  ///   a payload beyond the slot (a block) is published one message at a time.
  ///   An in-memory typed topic refuses bytes (InvalidArgument).
  /// - Backpressure: the batch takes the free slots it finds, up to 64 at a
  ///   time; when none is free, the next message waits exactly as publish
  ///   would: Block waits up to block_timeout for that message (TimedOut),
  ///   FailFast stops (WouldBlock), DropOldest drops to make room. A partial
  ///   batch returns the prefix published and the status of the first
  ///   message that was not; `publish_refused` grows by one for that message
  ///   (its meaning is unchanged: refused publish results), and the messages
  ///   after it were never attempted — publish them again if you want them.
  /// - Durable topics: the span goes to the store's writer as one request and
  ///   the call waits once: its messages share the writer's group commits
  ///   (one transaction, one fsync in Sync mode, when the span fits
  ///   StoreOptions::max_batch), where publishing them one by one waits for a
  ///   commit each. On return every published message is committed, as after
  ///   publish. A message refused up front (validation, the namespace's quota)
  ///   ends the batch: the ones before it are still published. A delayed or
  ///   expiring message is published alone (the delayed index), the runs
  ///   around it as above; on a fenced topic, and with a Tracer (a span per
  ///   message), each message is published as by publish.
  /// - ShutDown: as publish, for the first message not yet published.
  BatchPublishResult publish_batch(std::span<const OutgoingMessage> messages) const noexcept;

  std::string_view name() const noexcept;
  std::uint32_t lanes() const noexcept;
  bool is_queue() const noexcept;
  bool is_durable() const noexcept;
  bool valid() const noexcept { return impl_ != nullptr; }

 private:
  friend class Bus;
  friend class Bridge;
  friend class Publisher;
  friend class Transaction;
  friend class Client;
  friend struct detail::TypedAccess;
  explicit Topic(detail::TopicImpl* impl) noexcept : impl_(impl) {}
  detail::TopicImpl* impl_ = nullptr;
};

/// One consumer attached to a group (topic) or to a queue's consumer set.
/// Move-only RAII: destroying it unsubscribes and waits for a running call of
/// its handler to finish; no handler call of it starts after close() returns.
///
/// Thread safety: one thread at a time.
class LANEBUS_API Subscription {
 public:
  Subscription() noexcept = default;
  Subscription(Subscription&& other) noexcept;
  Subscription& operator=(Subscription&& other) noexcept;
  Subscription(const Subscription&) = delete;
  Subscription& operator=(const Subscription&) = delete;
  /// close(); from inside its own handler it detaches without waiting.
  ~Subscription();

  /// Unsubscribe. Blocks until a running call of this subscription's handler
  /// returns (no timeout: a handler that never returns blocks close forever).
  /// Messages not yet handled stay with the group for its other consumers;
  /// when the last consumer of a group leaves, the group stops receiving and
  /// its queued messages are discarded (counted as dropped). A subscription
  /// that joins the group again receives every message published after its
  /// subscribe returned, and any of the old queue not yet discarded.
  /// Errors: Busy when called from inside this subscription's own handler
  /// (the subscription is then detached but the running call is not awaited).
  /// Closing twice, or a moved-from subscription, is OK.
  Status close() noexcept;

  bool active() const noexcept { return consumer_ != nullptr; }

 private:
  friend class Bus;
  Subscription(std::shared_ptr<detail::BusCore> core, detail::Consumer* consumer) noexcept;
  std::shared_ptr<detail::BusCore> core_;
  detail::Consumer* consumer_ = nullptr;
};

/// A per-thread publishing handle: hands out message ids from a private block
/// so that publishers on different threads do not contend on one counter,
/// and slots from a private cache. Topic::publish does the same through a
/// publisher it keeps for the calling thread; a Publisher of your own adds
/// publish_batch with the same solo path, and control over its lifetime.
/// Valid while its Bus lives.
///
/// Thread safety: one thread at a time.
class LANEBUS_API Publisher {
 public:
  Publisher() noexcept;
  Publisher(Publisher&&) noexcept;
  Publisher& operator=(Publisher&&) noexcept;
  ~Publisher();

  /// As Topic::publish (same errors and blocking).
  Status publish(const Topic& topic, const OutgoingMessage& message) noexcept;
  /// As Topic::try_publish.
  Status try_publish(const Topic& topic, const OutgoingMessage& message) noexcept;
  /// As Topic::publish_batch (ids from this handle's private block).
  BatchPublishResult publish_batch(const Topic& topic, std::span<const OutgoingMessage> messages) noexcept;

 private:
  friend class Bus;
  explicit Publisher(std::unique_ptr<detail::PublisherState> state) noexcept;
  std::unique_ptr<detail::PublisherState> state_;
};

/// How shutdown treats messages that are queued but not yet handled.
enum class ShutdownMode : std::uint8_t {
  /// Stop accepting publishes, let workers handle everything queued (up to
  /// the timeout), then stop. Messages still queued at the timeout are
  /// abandoned and shutdown returns TimedOut.
  Drain,
  /// Stop accepting publishes, let running handler calls finish, discard the
  /// rest, then stop.
  Abandon,
};

/// The root object: owns topics, queues, groups, the message pools and the
/// worker threads. There are no globals; several buses may live in one process.
///
/// Thread safety: thread-safe.
class LANEBUS_API Bus {
 public:
  /// Create a bus and start its workers.
  /// Errors: InvalidArgument (a zero or absurd option, e.g. memory_budget
  /// over 1 TiB), Internal (threads could not be started).
  static Result<std::unique_ptr<Bus>> open(const BusOptions& options = {});

  /// shutdown(Drain, options.close_timeout), then abandon what is left.
  ~Bus();
  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;

  /// Create a topic (fan-out to consumer groups), or return the existing one
  /// if it was created with the same kind and lane count. Allocates its
  /// slots and lane buffers now, once.
  /// Errors: InvalidName; InvalidArgument (lanes 0 or > 4096, capacity 0 or
  /// > 2^24, slot_bytes 0 or > 16 MiB, max_payload 0 or > 16 MiB in memory /
  /// 64 MiB durable, max_groups 0 or > 1024); Conflict (the
  /// name exists as a queue, or with another lane count); ShutDown;
  /// Busy (max_topics reached).
  Result<Topic> create_topic(std::string_view name, const TopicOptions& options = {});

  /// Create a queue: one implicit group whose consumers compete (each
  /// message handled by one of them). Same rules and errors as create_topic.
  Result<Topic> create_queue(std::string_view name, const TopicOptions& options = {});

  // ---- typed topics (typed.hpp, doc/topics.md "Typed topics") ----
  /// Create (or open) topic `name` carrying objects of type T: as
  /// create_topic, then the topic is bound to T. Errors: those of
  /// create_topic, and Conflict (the topic carries another type, or bytes
  /// were published to it; both named), InvalidArgument (durable, and T has
  /// no Codec<T>: use create_durable_topic<T> to get that as a compile-time
  /// error). The key extractor of `options` applies to this handle.
  template <typename T>
  Result<TypedTopic<T>> create_topic(std::string_view name, const TypedTopicOptions<T>& options);
  template <typename T>
  Result<TypedTopic<T>> create_topic(std::string_view name, const TopicOptions& options);
  template <typename T>
  Result<TypedTopic<T>> create_topic(std::string_view name) {
    return create_topic<T>(name, TopicOptions{});
  }
  /// create_topic<T> with options.topic.durable = true; does not compile
  /// unless lanebus::Codec<T> exists (codec.hpp).
  template <typename T>
  Result<TypedTopic<T>> create_durable_topic(std::string_view name, const TypedTopicOptions<T>& options = {});
  /// create_queue for objects of type T (rules of create_topic<T>).
  template <typename T>
  Result<TypedTopic<T>> create_queue(std::string_view name, const TypedTopicOptions<T>& options = {});
  /// Subscribe with a typed handler `Outcome handler(const T&, const Delivery&)`:
  /// as subscribe; the object is valid during the call only (in memory it is
  /// the one in the slot, shared by every group: do not cast const away; on a
  /// durable topic it is decoded for this call, and a decode failure is a
  /// permanent failure — rejected, to the DLQ as class permanent with the
  /// codec's message as the reason). Errors: those of subscribe, and
  /// Conflict (the topic carries another type or, in memory, bytes; both
  /// named), InvalidArgument (durable, and T has no codec or no default
  /// constructor).
  template <typename T, typename F>
    requires std::invocable<F&, const T&, const Delivery&>
  Result<Subscription> subscribe(const Topic& topic, std::string_view group, F handler,
                                 const GroupOptions& options = {});
  /// consume for a queue of T (rules of subscribe<T>).
  template <typename T, typename F>
    requires std::invocable<F&, const T&, const Delivery&>
  Result<Subscription> consume(const Topic& queue, F handler, const GroupOptions& options = {});

  /// Look a topic or queue up. Errors: InvalidName, NotFound.
  Result<Topic> find(std::string_view name) const;

  /// Attach a consumer to consumer group `group` of a topic. The group is
  /// created on first use and receives every message published after that;
  /// several subscriptions to one group compete for its messages (each
  /// message goes to one of them, lanes stay ordered). The group's options
  /// are fixed by its first subscription.
  /// The handler runs on a worker thread (see Handler).
  /// Errors: InvalidArgument (invalid Topic, empty handler, the topic is a
  /// queue: use consume), InvalidName (group), Busy (max_groups or
  /// max_consumers_per_group reached), ShutDown.
  Result<Subscription> subscribe(const Topic& topic, std::string_view group, Handler handler,
                                 const GroupOptions& options = {});

  /// Attach a competing consumer to a queue. Same rules as subscribe.
  /// Errors: InvalidArgument (not a queue, empty handler), Busy, ShutDown.
  Result<Subscription> consume(const Topic& queue, Handler handler, const GroupOptions& options = {});

  /// subscribe / consume with a batch handler (see BatchHandler): one call
  /// receives up to GroupOptions::batch_max consecutive messages of a lane
  /// and settles them with one BatchOutcome. Same groups, guarantees and
  /// errors as subscribe / consume (plus InvalidArgument for batch_max
  /// outside 1..1024). Retries, the DLQ and per-key order apply per message.
  Result<Subscription> subscribe_batch(const Topic& topic, std::string_view group, BatchHandler handler,
                                       const GroupOptions& options = {});
  Result<Subscription> consume_batch(const Topic& queue, BatchHandler handler, const GroupOptions& options = {});

  /// subscribe / consume with a transactional handler (see transaction.hpp):
  /// its store writes, outbox publishes, dedup record and ack commit in one
  /// LMDB transaction. Durable topics and queues only (else InvalidArgument).
  Result<Subscription> subscribe_tx(const Topic& topic, std::string_view group, TxHandler handler,
                                    const GroupOptions& options = {});
  Result<Subscription> consume_tx(const Topic& queue, TxHandler handler, const GroupOptions& options = {});

  /// Read a value a transactional handler wrote (committed state).
  /// Errors: NotFound, InvalidName, InvalidArgument (no store), storage codes.
  Result<std::string> table_get(std::string_view table, std::string_view key) const;

  /// Move a durable consumer group (or a durable queue's consumers) to
  /// `position` in every lane: replay from the earliest retained message, from
  /// an offset or a timestamp, or skip to the end. Takes effect for the next
  /// batch a worker reads; a handler call already running finishes first.
  /// Errors: InvalidArgument (not a durable topic/queue), NotFound (no such
  /// group in this bus), ShutDown, storage codes.
  Status seek(const Topic& topic, std::string_view group, const StartPosition& position);

  /// End the outage pause of a consumer group (GroupOptions::outage) now:
  /// its lanes deliver again at once, with an empty failure window. A group
  /// that is not paused is left as it is (Ok). A durable group's pause record
  /// is deleted too (another process: `lanebus resume`).
  /// Errors: InvalidArgument (empty handle, or the group has no outage
  /// option), NotFound (no such group in this bus), ShutDown.
  Status resume(const Topic& topic, std::string_view group);

  /// The idempotency table of `scope` (doc/idempotency.md), created on first use and
  /// kept in the bus's store (durable tier) behind an in-memory hot tier.
  /// Later calls with the same scope return the same table (their options
  /// are ignored). Valid while the Bus lives.
  /// Errors: InvalidArgument (an in-memory bus: no store; bad options),
  /// InvalidName (scope), ShutDown.
  Result<IdempotencyTable*> idempotency(std::string_view scope, const IdempotencyOptions& options = {});

  /// The dead-letter queue of the bus's store, for review and replay.
  /// Errors: InvalidArgument (an in-memory bus has no DLQ).
  Result<DeadLetters*> dead_letters();

  /// The schema registry (typed topics, contracts, usage audit, deprecation;
  /// doc/schemas.md). A cheap handle, valid while the Bus lives.
  Schemas schemas();

  /// A publishing handle for one thread (allocates once, here).
  Publisher publisher();

  /// A snapshot of every counter, taken without stopping the bus.
  BusStats stats() const;

  // ---- tenancy (manual: doc/tenancy.md) ----
  /// Declare and describe namespaces, manage credentials (tenancy.hpp).
  /// The Bus itself is the admin handle: its own calls are never refused.
  Namespaces* namespaces() noexcept;
  /// A handle bound to `credential` (client.hpp): with
  /// BusOptions::access_control on, the credential must match (else
  /// PermissionDenied, the same for an unknown id and a wrong secret) and
  /// every call is checked against its grants. Off: any valid id is accepted
  /// and nothing is checked. Errors: InvalidName (id), InvalidArgument
  /// (empty or over-long secret), PermissionDenied.
  Result<Client> client(const Credential& credential);

  /// Stop the bus: refuse new publishes (ShutDown), then drain or abandon
  /// queued messages, then join every worker thread. Blocks up to `timeout`
  /// for draining plus however long running handler calls take to return.
  /// Calling it again is OK (returns OK at once).
  /// Errors: TimedOut (Drain could not finish in time; the rest was
  /// abandoned), Busy (called from a handler: a worker cannot join itself).
  Status shutdown(ShutdownMode mode, std::chrono::milliseconds timeout = std::chrono::seconds(5));

 private:
  friend struct detail::Access;
  friend class Bridge;
  explicit Bus(std::shared_ptr<detail::BusCore> core) noexcept;
  template <typename T, typename F>
  static Handler typed_handler(const Topic& topic, F&& handler);
  std::shared_ptr<detail::BusCore> core_;
  // BusOptions::namespace_stores: (namespace, the inner bus of its store).
  std::vector<std::pair<std::string, std::shared_ptr<detail::BusCore>>> ns_cores_;
  detail::BusCore* core_for(std::string_view name) const noexcept;
  std::shared_ptr<detail::BusCore> owner_of(const Topic& topic) const noexcept;
  Result<Subscription> attach_plain(const Topic& topic, std::string_view group, Handler handler, BatchHandler batch,
                                    const GroupOptions& options, bool queue);
};

}  // namespace lanebus

#include "lanebus/typed.hpp"  // the member templates above
