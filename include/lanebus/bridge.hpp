// lanebus — MIT License.
// Bridge (doc/bridge.md): mirrors durable topics to and from NATS JetStream, with
// at-least-once delivery, per-key order and message ids for broker-side dedup.
// Built only when libnats (nats.c) is found (Meson option `nats`).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/durable.hpp"
#include "lanebus/export.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class Bus;
class Topic;
namespace detail {
class BridgeImpl;
}

/// How a Bridge reaches the NATS servers and how it behaves when they fail.
/// Plain struct; every field has a default except `urls`.
struct BridgeOptions {
  // ---- connection ----
  /// Server URLs, `nats://host:port` or `tls://host:port` (port defaults to
  /// 4222). At least one. Reconnects go through the whole list.
  std::vector<std::string> urls{};
  /// A name shown by the server (connz) and in stats. Default "lanebus-bridge".
  std::string name = "lanebus-bridge";
  /// Credentials, passed to nats.c unchanged: a token, or a user and
  /// password, or a `.creds` file (JWT + nkey seed). Empty = none.
  std::string token{};
  std::string user{};
  std::string password{};
  std::string credentials_file{};
  // ---- TLS (passed through to nats.c; off unless `tls` or a tls:// URL) ----
  bool tls = false;
  std::string tls_ca_file{};     ///< CA certificates (PEM) that sign the server's.
  std::string tls_cert_file{};   ///< Client certificate chain (PEM), with tls_key_file.
  std::string tls_key_file{};    ///< Client private key (PEM).
  std::string tls_hostname{};    ///< Expected server host name; empty = the URL's.
  bool tls_skip_verify = false;  ///< Do not verify the server certificate (tests only).

  // ---- reconnect and backoff ----
  /// Timeout of one connection attempt. Default 2 s.
  std::chrono::milliseconds connect_timeout{2000};
  /// Wait between reconnect attempts to the server list (nats.c reconnects
  /// for ever; the bridge never gives up on an unreachable server). Default 250 ms.
  std::chrono::milliseconds reconnect_wait{250};
  /// Backoff of a message whose publish failed (server down, PubAck timed
  /// out): initial, doubled per attempt up to backoff_max. Default 100 ms / 5 s.
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{5000};
  /// Longest wait for one PubAck before the publish is retried (same
  /// Nats-Msg-Id, so a late first copy is removed by the server). Default 5 s.
  std::chrono::milliseconds publish_timeout{5000};
  /// Out, topics: most messages of one lane in flight at once. The handler
  /// call of the lane's head message reads up to this many stored messages
  /// of its lane, publishes them in order and waits for their PubAcks; the
  /// handler calls of the following messages then ack at once. Each handler
  /// still acks only a message whose PubAck arrived. 1 = one at a time
  /// (queues always publish one at a time). Default 256.
  std::uint32_t publish_window = 256;

  // ---- streams and consumers ----
  /// mirror_out: create a missing stream (file storage, subjects = the
  /// template with every placeholder replaced by `*`). false: a missing
  /// stream is an error (NotFound from mirror_out when the server is
  /// reachable; otherwise state Failed once it is). Default true.
  bool create_streams = true;
  /// Duplicate window of streams the bridge creates: how long JetStream
  /// remembers a Nats-Msg-Id. A re-send after a longer outage is stored twice
  /// (doc/bridge.md). Default 2 min (the server's default).
  std::chrono::milliseconds duplicate_window{120000};
  /// mirror_in: create a missing durable pull consumer (deliver all, explicit
  /// ack). false: a missing consumer is NotFound. Default true.
  bool create_consumers = true;
  /// mirror_in: messages per fetch, appended locally in one commit. Default 256.
  std::uint32_t fetch_batch = 256;
  /// mirror_in: ack wait of consumers the bridge creates; a message not acked
  /// within it is redelivered (and then stored once). Default 30 s.
  std::chrono::milliseconds ack_wait{30000};
  /// mirror_in: how long the record "stream sequence S was stored" is kept;
  /// a redelivery after that would be stored again. Default 7 days.
  std::chrono::milliseconds dedup_retention{std::chrono::hours(24 * 7)};

  // ---- status record ----
  /// How often the bridge writes its state and counters to the store (and at
  /// each state change), under its `name`: `lanebus stats` and `lanebus serve`
  /// of other processes show them, and mark them stale when they stop
  /// changing. Bridges sharing a store need distinct names. 0 = never.
  /// Default 1 s.
  std::chrono::milliseconds status_interval{1000};
};

/// Per mirror_out call.
struct MirrorOutOptions {
  /// The consumer group the bridge reads the topic with. Empty (default) =
  /// "bridge.<stream>" (lower-cased; other characters become '-'). The
  /// group's committed offset is where the mirror resumes after a restart.
  std::string group{};
  /// Where a new group starts. Default: the earliest retained message.
  StartPosition start{};
};

/// A bridge between one Bus's store and a NATS JetStream server (or cluster).
///
/// Out (mirror_out): a consumer group of a durable topic or queue publishes
/// each message to JetStream; its handler acks only after the message's
/// PubAck, so the group's offset is committed after the PubAck, in order per
/// lane. One lane publishes in order (per-key order holds in the stream),
/// with up to publish_window messages in flight; lanes publish in parallel. Nats-Msg-Id is
/// "<store id>.<topic>.<lane>.<offset>" — stable across restarts, so a re-send
/// after a crash is removed by JetStream's duplicate window. Headers:
/// Lanebus-Key, Lanebus-Idempotency-Key, Lanebus-Created-At (ns),
/// Lanebus-Attempt, Lanebus-Topic (values percent-encoded where needed).
/// A message larger than the server's max_payload (or the stream's max message
/// size) is dead-lettered with the reason; nothing else ever is: transient
/// failures are retried with backoff, without limit.
///
/// In (mirror_in): a durable pull consumer; each fetched batch is appended to
/// the local durable topic in one commit together with "stream sequence S was
/// stored" records, and acked to JetStream only after that commit. A
/// redelivered message is stored once. The lane comes from Lanebus-Key.
/// Messages are stored in stream-sequence order, also across a crash of the
/// bridge: when a delivery went elsewhere (a killed bridge's pull request, a
/// server crash), the bridge re-creates its durable consumer (same
/// configuration) at the first sequence it has not stored instead of letting
/// the redelivery arrive behind newer messages (limits-retention streams;
/// doc/bridge.md). One bridge per durable consumer.
///
/// Faults: a server down at open, or going away, puts the bridge in state
/// Retrying; it reconnects and resumes without loss. Authorization failures
/// and bad configuration are errors, not retried.
///
/// Thread safety: thread-safe. The Bridge must be destroyed (or closed)
/// before its Bus.
class LANEBUS_API Bridge {
 public:
  /// Connect to the servers. A server that cannot be reached now is not an
  /// error: the bridge starts in state Retrying and connects when it can.
  /// Blocks for at most about connect_timeout per URL.
  /// Errors:
  /// - InvalidArgument: no URL, a URL that is not nats://host[:port] or
  ///   tls://host[:port], a bus without a store, bad options.
  /// - PermissionDenied: the server refused the credentials (not retried).
  /// - IOError: TLS setup failed (certificate files), or another nats.c error.
  static Result<std::unique_ptr<Bridge>> open(Bus& bus, const BridgeOptions& options);

  /// close().
  ~Bridge();
  Bridge(const Bridge&) = delete;
  Bridge& operator=(const Bridge&) = delete;

  /// Mirror a durable topic or queue to `stream`. `subject_template` is a
  /// dotted NATS subject whose tokens may be literals or the placeholders
  /// {key} (the message key, escaped into one token: bytes outside
  /// [A-Za-z0-9_-] become ~XX, an empty key "~"), {topic} or {lane}, e.g.
  /// "orders.{key}". Starts at once.
  /// Errors: InvalidArgument (not a durable topic of this bus; a template
  /// with an empty token, a wildcard, whitespace or an unknown placeholder;
  /// an empty stream name), NotFound (the stream does not exist and
  /// create_streams is false), Conflict (the group is already mirrored),
  /// the codes of Bus::subscribe. With the server unreachable the stream is
  /// checked (or created) on the first publish.
  Status mirror_out(const Topic& topic, std::string_view subject_template, std::string_view stream,
                    const MirrorOutOptions& options = {});

  /// Mirror JetStream `stream` through the durable pull consumer `consumer`
  /// into a durable topic of this bus. Starts a thread that fetches, appends
  /// and acks.
  /// Errors: InvalidArgument (not a durable topic of this bus, a queue, empty
  /// names), NotFound (stream or consumer missing and not to be created,
  /// when the server is reachable), Conflict (the consumer is already mirrored).
  Status mirror_in(std::string_view stream, std::string_view consumer, const Topic& topic);

  /// A snapshot of state, last error, counters and lag (also part of
  /// Bus::stats() while the bridge is open).
  BridgeStats stats() const;

  /// Stop: the out groups' subscriptions are closed (waits for a publish in
  /// progress, at most publish_timeout), the in threads are joined, the
  /// connection is flushed and closed. Calling it again is OK.
  Status close();

 private:
  explicit Bridge(std::unique_ptr<detail::BridgeImpl> impl) noexcept;
  std::unique_ptr<detail::BridgeImpl> impl_;
};

}  // namespace lanebus
