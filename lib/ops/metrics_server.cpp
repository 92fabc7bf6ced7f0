// lanebus — MIT License.
// MetricsServer: /metrics, /stats.json, /healthz and the dashboard over HTTP,
// with Boost.Beast on one io_context run by one thread of the server's own.
//
// Design notes:
// - Everything mutable (the MetricsWindow, the session set, the counters)
//   is touched only on the server's thread, so it needs no lock; the public
//   calls that come from other threads (stop) post to that thread. port_ and
//   url_ are written before the thread starts and never again.
// - Bounds: at most max_connections sessions (a connection beyond that is
//   accepted and closed at once, so the kernel's backlog never fills with
//   clients that wait forever); headers and body each at most
//   max_request_bytes (beast's parser limits); each read of a request and
//   each write of a response under a request_timeout deadline (tcp_stream
//   closes the socket when it passes). Every socket is non-blocking, so a
//   client that sends nothing or never reads costs one session slot until
//   its deadline and blocks nobody.
// - The bus is only read through the stats source, on the sample timer: a
//   scrape never calls Bus::stats(), so any number of scrapers cost the bus
//   nothing beyond one stats() per sample_interval.
// - Shutdown: stop() posts "close the acceptor, cancel the timers, close
//   every socket, then stop the loop" and joins. Closing completes every
//   pending operation with operation_aborted and the sessions drop their last
//   references; the final ioc.stop() makes run() return even if something
//   is still outstanding.
#include "lanebus/metrics_server.hpp"

#include <algorithm>
// GCC 12 with -fsanitize=address reports a bogus -Wmaybe-uninitialized for the
// boost::optional<std::uint64_t> inside beast's basic_parser::do_field (GCC
// PR 80635, false positives on optional storage); -Werror would turn it into
// a build error. It is silenced for these includes only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#pragma GCC diagnostic pop
#include <charconv>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>

#include "dashboard_html.hpp"
#include "exposition.hpp"
#include "lanebus/bus.hpp"
#include "lanebus/lease.hpp"

namespace lanebus {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

std::int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
std::int64_t wall_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "HOST:PORT", HOST an IPv4 literal or a bracketed IPv6 literal.
Result<tcp::endpoint> parse_listen(const std::string& listen) {
  auto bad = [&](const char* why) {
    return Result<tcp::endpoint>(Code::InvalidArgument,
                                 "MetricsServerOptions::listen \"" + listen + "\": " + why + " (want HOST:PORT)");
  };
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no HOST:PORT");
  std::string host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  unsigned port = 0;
  auto [p, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || p != port_text.data() + port_text.size() || port_text.empty() || port > 65535)
    return bad("the port is not a number in 0..65535");
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  boost::system::error_code aec;
  auto addr = asio::ip::make_address(host, aec);
  if (aec) return bad("the host is not an IP address literal");
  return tcp::endpoint(addr, static_cast<std::uint16_t>(port));
}

Status socket_error(const boost::system::error_code& ec, const std::string& what) {
  Code code = Code::IOError;
  if (ec == asio::error::address_in_use) code = Code::Busy;
  if (ec == asio::error::access_denied) code = Code::PermissionDenied;
  if (ec == boost::system::errc::address_not_available) code = Code::InvalidArgument;
  return Status(code, what + ": " + ec.message());
}

}  // namespace

namespace detail {

class MetricsSession;

// The server's state; MetricsServer::Impl is this (sessions reach it by pointer).
struct MetricsServerCore {
  MetricsServerCore(std::function<Result<BusStats>()> s, const MetricsServerOptions& o, MetricsWindow w)
      : source(std::move(s)), options(o), window(std::move(w)) {}

  void sample();
  void tick();
  void accept();
  std::string stats_json() const;
  // 200 or 503 and the reasons (one per line).
  std::pair<bool, std::vector<std::string>> health() const;

  const std::function<Result<BusStats>()> source;
  const MetricsServerOptions options;
  std::uint16_t port = 0;
  std::string url;
  std::int64_t started_ns = steady_now_ns();

  // ---- server thread only
  MetricsWindow window;
  Status source_status;      // the last source read
  std::string store_error;   // BusStats::store_error of the last reading
  std::vector<LeaseInfo> leases;
  Status leases_status;
  std::uint64_t requests = 0, bad_requests = 0, refused = 0, timeouts = 0;
  std::unordered_set<MetricsSession*> sessions;  // declared before ioc: outlives the handlers' sessions
  // Set by stop()'s posted handler. A timer that had already expired when
  // stop() cancelled it still runs its handler with success: without this
  // flag that handler re-armed the timer and run() never returned (stop()
  // hung in join; seen under TSan, once in a plain run).
  bool stopping = false;

  asio::io_context ioc{1};
  tcp::acceptor acceptor{ioc};
  asio::steady_timer sample_timer{ioc};
  asio::steady_timer accept_retry{ioc};
  std::thread thread;

  std::mutex stop_mu;
  bool stopped = false;  // GUARDED_BY(stop_mu)
};

// One connection: read a request, write its response, repeat while the
// client keeps the connection alive.
class MetricsSession : public std::enable_shared_from_this<MetricsSession> {
 public:
  MetricsSession(MetricsServerCore* server, tcp::socket socket)
      : server_(server), stream_(std::move(socket)), buffer_(server->options.max_request_bytes * 2) {
    server_->sessions.insert(this);
  }
  ~MetricsSession() { server_->sessions.erase(this); }

  void read() {
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_->options.max_request_bytes));
    parser_->body_limit(server_->options.max_request_bytes);
    stream_.expires_after(server_->options.request_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
  }

  void close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
  }

  // After a response that ends the connection: send FIN, then read and drop
  // what the client still sends until it closes (or request_timeout). Closing
  // with unread input would make the kernel send RST, and a client could then
  // lose the response it has not read yet.
  void linger() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.expires_after(server_->options.request_timeout);
    drain();
  }

  void drain() {
    stream_.async_read_some(asio::buffer(scratch_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
      if (ec) {
        if (ec != asio::error::operation_aborted) self->stream_.close();
        return;
      }
      self->drain();
    });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec == asio::error::operation_aborted) return;
    if (ec == beast::error::timeout) {
      ++server_->timeouts;
      return;  // tcp_stream closed the socket
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset) {
      close();
      return;
    }
    if (ec) {
      ++server_->bad_requests;
      if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
        error_reply(http::status::request_header_fields_too_large, "request headers too large\n");
      } else if (ec == http::error::body_limit) {
        error_reply(http::status::payload_too_large, "request body too large\n");
      } else if (ec.category() == http::make_error_code(http::error::bad_target).category()) {
        error_reply(http::status::bad_request, "malformed request: " + ec.message() + "\n");
      } else {
        close();  // a socket error: nobody to answer
      }
      return;
    }
    handle(parser_->get());
  }

  void error_reply(http::status status, std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(status, 11);
    res->set(http::field::content_type, "text/plain; charset=utf-8");
    res->set(http::field::connection, "close");
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    write(std::move(res));
  }

  void handle(const http::request<http::string_body>& req) {
    ++server_->requests;
    const bool head = req.method() == http::verb::head;
    auto res = std::make_shared<http::response<http::string_body>>(http::status::ok, req.version());
    res->keep_alive(req.keep_alive());
    res->set(http::field::cache_control, "no-store");
    res->set("X-Content-Type-Options", "nosniff");
    std::string_view target(req.target().data(), req.target().size());
    std::string body;
    if (req.method() != http::verb::get && !head) {
      ++server_->bad_requests;
      res->result(http::status::method_not_allowed);
      res->set(http::field::allow, "GET, HEAD");
      res->set(http::field::content_type, "text/plain; charset=utf-8");
      body = "method not allowed: use GET or HEAD\n";
    } else if (target.empty() || target.front() != '/') {
      ++server_->bad_requests;
      res->result(http::status::bad_request);
      res->set(http::field::content_type, "text/plain; charset=utf-8");
      body = "bad request target: want an absolute path such as /metrics\n";
    } else {
      const std::string_view path = target.substr(0, target.find('?'));
      if (path == "/metrics") {
        res->set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
        body = to_prometheus(server_->window.snapshot());
      } else if (path == "/stats.json") {
        res->set(http::field::content_type, "application/json");
        body = server_->stats_json();
      } else if (path == "/healthz") {
        auto [ok, reasons] = server_->health();
        res->result(ok ? http::status::ok : http::status::service_unavailable);
        res->set(http::field::content_type, "text/plain; charset=utf-8");
        if (ok) body = "ok\n";
        for (const auto& r : reasons) body += r + "\n";
      } else if (path == "/" || path == "/index.html") {
        res->set(http::field::content_type, "text/html; charset=utf-8");
        // The page is self-contained: forbid every origin but this server.
        res->set("Content-Security-Policy",
                 "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                 "connect-src 'self'; img-src 'self' data:");
        body = std::string(detail::kDashboardHtml);
      } else {
        res->result(http::status::not_found);
        res->set(http::field::content_type, "text/plain; charset=utf-8");
        body = "not found; try /metrics, /stats.json, /healthz or /\n";
      }
    }
    if (head) {
      res->content_length(body.size());
    } else {
      res->body() = std::move(body);
      res->prepare_payload();
    }
    write(std::move(res));
  }

  void write(std::shared_ptr<http::response<http::string_body>> res) {
    stream_.expires_after(server_->options.request_timeout);
    // For HEAD the body is empty while Content-Length tells the real size:
    // the serializer must not send (or expect) a body.
    auto* r = res.get();
    http::async_write(stream_, *r, [self = shared_from_this(), res](beast::error_code ec, std::size_t) {
      if (ec == asio::error::operation_aborted) return;
      if (ec == beast::error::timeout) {
        ++self->server_->timeouts;
        return;
      }
      if (ec) {
        self->close();
        return;
      }
      if (!res->keep_alive()) {
        self->linger();
        return;
      }
      self->read();
    });
  }

  MetricsServerCore* server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  char scratch_[4096];
};

void MetricsServerCore::sample() {
  Result<BusStats> r = source();
  if (!r.ok()) {
    source_status = r.status();
  } else {
    source_status = Status();
    store_error = r->store_error;
    // A steady clock that did not advance only skips this sample.
    (void)window.add(std::move(*r), steady_now_ns(), wall_now_ns());
  }
  if (options.leases != nullptr) {
    auto l = options.leases->list();
    leases_status = l.status();
    if (l.ok()) leases = std::move(*l);
  }
}

void MetricsServerCore::tick() {
  sample_timer.expires_after(options.sample_interval);
  sample_timer.async_wait([this](beast::error_code ec) {
    if (ec || stopping) return;  // cancelled, or expired just before stop()
    sample();
    tick();
  });
}

void MetricsServerCore::accept() {
  acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (stopping || ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    if (ec) {
      // EMFILE and friends: try again shortly instead of spinning.
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](beast::error_code e) {
        if (!e && !stopping) accept();
      });
      return;
    }
    if (sessions.size() >= options.max_connections) {
      ++refused;
      beast::error_code ignored;
      socket.close(ignored);
    } else {
      std::make_shared<MetricsSession>(this, std::move(socket))->read();
    }
    accept();
  });
}

std::pair<bool, std::vector<std::string>> MetricsServerCore::health() const {
  std::vector<std::string> reasons;
  if (!store_error.empty()) reasons.push_back("store failed: " + store_error);
  if (!source_status.ok()) reasons.push_back("stats source failed: " + source_status.to_string());
  const MetricsSnapshot& s = window.snapshot();
  for (const auto& t : s.topics)
    for (const auto& g : t.groups)
      if (g.sla && g.sla->state == SlaState::Breached)
        reasons.push_back("SLA breached: " + t.name + "/" + g.name + " oldest unprocessed " +
                          detail::format_double(g.oldest_age_seconds.value_or(0)) + " s >= SLA " +
                          detail::format_double(g.sla->sla_seconds) + " s");
  return {reasons.empty(), std::move(reasons)};
}

std::string MetricsServerCore::stats_json() const {
  detail::JsonWriter server;
  server.begin_object();
  server.key("url"); server.string(url);
  server.key("uptime_seconds"); server.number(static_cast<double>(steady_now_ns() - started_ns) / 1e9);
  server.key("sample_interval_seconds"); server.number(static_cast<double>(options.sample_interval.count()) / 1e3);
  server.key("connections"); server.u64(sessions.size());
  server.key("max_connections"); server.u64(options.max_connections);
  server.key("requests"); server.u64(requests);
  server.key("bad_requests"); server.u64(bad_requests);
  server.key("refused"); server.u64(refused);
  server.key("timeouts"); server.u64(timeouts);
  server.end_object();

  auto [ok, reasons] = health();
  detail::JsonWriter h;
  h.begin_object();
  h.key("ok"); h.boolean(ok);
  h.key("reasons");
  h.begin_array();
  for (const auto& r : reasons) h.string(r);
  h.end_array();
  h.end_object();

  detail::JsonWriter l;
  l.begin_object();
  l.key("available"); l.boolean(options.leases != nullptr && leases_status.ok());
  l.key("error");
  if (leases_status.ok()) {
    l.null();
  } else {
    l.string(leases_status.to_string());
  }
  l.key("entries");
  l.begin_array();
  for (const LeaseInfo& e : leases) {
    l.begin_object();
    l.key("name"); l.string(e.name);
    l.key("owner"); l.string(e.owner.to_string());
    l.key("token"); l.u64(e.token);
    l.key("held"); l.boolean(e.held);
    l.key("time_left_seconds"); l.number(static_cast<double>(e.time_left().count()) / 1e9);
    l.key("grants"); l.u64(e.grants);
    l.end_object();
  }
  l.end_array();
  l.end_object();

  return "{\"server\":" + server.take() + ",\"health\":" + h.take() + ",\"leases\":" + l.take() +
         ",\"metrics\":" + to_json(window.snapshot()) + "}";
}

}  // namespace detail

struct MetricsServer::Impl : detail::MetricsServerCore {
  using MetricsServerCore::MetricsServerCore;
};

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) noexcept : impl_(std::move(impl)) {}

MetricsServer::~MetricsServer() { stop(); }

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const Bus& bus, const MetricsServerOptions& options) {
  const Bus* b = &bus;
  return start([b]() -> Result<BusStats> { return b->stats(); }, options);
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(std::function<Result<BusStats>()> source,
                                                            const MetricsServerOptions& options) {
  using R = Result<std::unique_ptr<MetricsServer>>;
  if (!source) return R(Code::InvalidArgument, "MetricsServer::start: the stats source is empty");
  if (options.sample_interval.count() <= 0)
    return R(Code::InvalidArgument, "MetricsServerOptions::sample_interval must be > 0");
  if (options.max_connections < 1) return R(Code::InvalidArgument, "MetricsServerOptions::max_connections must be >= 1");
  if (options.max_request_bytes < 256 || options.max_request_bytes > (1u << 30))
    return R(Code::InvalidArgument, "MetricsServerOptions::max_request_bytes must be in 256..2^30");
  if (options.request_timeout.count() <= 0)
    return R(Code::InvalidArgument, "MetricsServerOptions::request_timeout must be > 0");
  auto endpoint = parse_listen(options.listen);
  if (!endpoint.ok()) return endpoint.status();
  auto window = MetricsWindow::create(options.metrics);
  if (!window.ok()) return window.status();
  for (const GroupSla& s : options.slas) {
    Status st = window->set_sla(s.topic, s.group, s.policy);
    if (!st.ok()) return Status(st.code(), "MetricsServerOptions::slas[" + s.topic + "/" + s.group + "]: " + std::string(st.message()));
  }

  auto impl = std::make_unique<Impl>(std::move(source), options, std::move(*window));
  const std::string where = "MetricsServer listen " + options.listen;
  beast::error_code ec;
  impl->acceptor.open(endpoint->protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(*endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return socket_error(ec, where);
  const tcp::endpoint bound = impl->acceptor.local_endpoint(ec);
  if (ec) return socket_error(ec, where);
  impl->port = bound.port();
  const std::string host = bound.address().is_v6() ? "[" + bound.address().to_string() + "]" : bound.address().to_string();
  impl->url = "http://" + host + ":" + std::to_string(impl->port) + "/";

  // The first sample before anyone can ask, so / and /metrics have data at once.
  impl->sample();
  impl->tick();
  impl->accept();
  detail::MetricsServerCore* raw = impl.get();
  try {
    impl->thread = std::thread([raw] { raw->ioc.run(); });
  } catch (const std::system_error& e) {
    return R(Code::Internal, std::string("MetricsServer: cannot start its thread: ") + e.what());
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

std::uint16_t MetricsServer::port() const noexcept { return impl_->port; }

std::string MetricsServer::url() const { return impl_->url; }

void MetricsServer::stop() noexcept {
  std::lock_guard<std::mutex> l(impl_->stop_mu);
  if (impl_->stopped) return;
  impl_->stopped = true;
  Impl* s = impl_.get();
  asio::post(s->ioc, [s] {
    s->stopping = true;
    beast::error_code ignored;
    s->acceptor.close(ignored);
    s->sample_timer.cancel();
    s->accept_retry.cancel();
    // close() may drop a session's last reference: copy the set first.
    std::vector<detail::MetricsSession*> open(s->sessions.begin(), s->sessions.end());
    for (detail::MetricsSession* m : open) m->close();
    // The closes above queued the aborted handlers; once they have run, stop
    // the loop even if some operation is still outstanding (a hang in join
    // with the server thread in epoll_wait(-1) was seen under ASan and TSan).
    // Handlers left behind are destroyed with the io_context; `sessions`
    // outlives it.
    asio::post(s->ioc, [s] { s->ioc.stop(); });
  });
  if (s->thread.joinable()) s->thread.join();
}

}  // namespace lanebus
