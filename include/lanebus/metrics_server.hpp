// lanebus — MIT License.
// MetricsServer: serves a bus's metrics over HTTP (Prometheus /metrics,
// /stats.json, /healthz and a live dashboard at /) from one thread of its own.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lanebus/export.hpp"
#include "lanebus/metrics.hpp"
#include "lanebus/stats.hpp"
#include "lanebus/status.hpp"

namespace lanebus {

class Bus;
class LeaseTable;

/// The SLA of one consumer group (MetricsWindow::set_sla).
struct GroupSla {
  std::string topic{};
  std::string group{};  ///< "" for a queue's consumers.
  SlaPolicy policy{};
};

/// Options of a MetricsServer. Plain struct; every limit is enforced per
/// connection on the server's own thread.
struct MetricsServerOptions {
  // ---- behaviour ----
  /// "HOST:PORT" to listen on; HOST is an IPv4 or IPv6 literal ("[::1]:9464").
  /// Port 0 picks a free port (read it back with MetricsServer::port()).
  /// Default "127.0.0.1:9464": loopback only. Exposing the metrics beyond the
  /// machine is a choice to make explicitly (e.g. "0.0.0.0:9464"); the server
  /// has no authentication.
  std::string listen = "127.0.0.1:9464";
  /// How often the server reads the stats source and adds a sample to its
  /// MetricsWindow (rates and SLA verdicts move at this pace). Default 1 s. > 0.
  std::chrono::milliseconds sample_interval{1000};
  /// The window, hot-lane rule and default SLA of the server's MetricsWindow.
  MetricsOptions metrics{};
  /// Per-group SLA policies (override metrics.default_sla).
  std::vector<GroupSla> slas{};
  /// Leases to list on /stats.json and the dashboard. nullptr: none. Must
  /// outlive the server. Read on the server's thread with LeaseTable::list(),
  /// which may wait up to the table's lock_timeout. Default nullptr.
  LeaseTable* leases = nullptr;

  // ---- bounds ----
  /// Connections open at once; a connection beyond this is closed as soon as
  /// it is accepted (counted in /stats.json server.refused). Default 32. >= 1.
  std::size_t max_connections = 32;
  /// Largest request line + headers, and separately largest body, in bytes;
  /// beyond it the request gets 431 (headers) or 413 (body) and the
  /// connection is closed. Default 8192. 256..2^30.
  std::size_t max_request_bytes = 8192;
  /// Longest a connection may take to deliver one complete request (or sit
  /// idle between keep-alive requests) and to take the response; then it is
  /// closed. A client that connects and sends nothing holds one connection
  /// slot for at most this long and never delays anyone else. Default 5 s. > 0.
  std::chrono::milliseconds request_timeout{5000};
};

/// An HTTP server for the metrics of one Bus (or any BusStats source).
///
/// Endpoints (GET or HEAD; other methods get 405, unknown paths 404,
/// malformed requests 400, oversized ones 413/431):
/// - `/metrics`: Prometheus text exposition 0.0.4 (to_prometheus of the
///   newest snapshot; `text/plain; version=0.0.4`).
/// - `/stats.json`: `{"server":{...},"health":{...},"leases":[...],
///   "metrics":to_json(snapshot)}` (layout in doc/observability.md).
/// - `/healthz`: 200 "ok", or 503 with one line per reason when a group's SLA
///   is breached, the store has failed (a failed write made it unusable), or
///   the stats source could not be read.
/// - `/`: a self-contained dashboard page (no external resources) that polls
///   /stats.json.
///
/// Threads: the server runs one thread of its own. It samples the source on
/// that thread every sample_interval (Bus::stats(): a brief bus lock, no
/// handler is waited for) and serves every connection there, with
/// non-blocking sockets and per-connection deadlines: a slow or stuck client
/// delays no bus thread, and no other client by more than one response's
/// write. No bus worker ever runs server code.
///
/// Thread safety: thread-safe.
class LANEBUS_API MetricsServer {
 public:
  /// Bind, take the first sample and start serving `bus`.
  /// REQUIRES: `bus` outlives the server (stop it, or destroy it, first).
  /// Errors: InvalidArgument (a bad listen address or option; the message
  /// names it), Busy (the address is in use), PermissionDenied (a privileged
  /// port), IOError (other socket errors), Internal (no thread).
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(const Bus& bus,
                                                                    const MetricsServerOptions& options = {});
  /// Serve any stats source, e.g. a durable store read from another process
  /// (`lanebus serve`). `source` runs on the server's thread; an error it
  /// returns is reported by /healthz (503) and /stats.json, and the previous
  /// snapshot stays. Errors: as above; InvalidArgument when `source` is empty.
  [[nodiscard]] static Result<std::unique_ptr<MetricsServer>> start(std::function<Result<BusStats>()> source,
                                                                    const MetricsServerOptions& options = {});

  /// stop().
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  /// The port bound (useful with port 0).
  std::uint16_t port() const noexcept;
  /// "http://HOST:PORT/".
  std::string url() const;

  /// Stop listening, close every connection (a response being written is cut
  /// off), and join the server's thread. Blocks until that thread has ended:
  /// at most as long as one source read takes. Idempotent.
  void stop() noexcept;

 private:
  struct Impl;
  explicit MetricsServer(std::unique_ptr<Impl> impl) noexcept;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lanebus
