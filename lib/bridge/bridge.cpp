// lanebus — MIT License.
// Bridge to NATS JetStream (doc/bridge.md, include/lanebus/bridge.hpp). The only
// file that includes nats.h: every natsStatus / jsErrCode becomes a Status here.
//
// Design notes
// - Out: one consumer group per mirror, through Bus::subscribe / consume (the
//   delivery core drives it). The handler publishes with js_PublishMsg and
//   returns ack only after the PubAck, so the offset the runner commits never
//   passes a message JetStream has not stored. A transient failure is a retry
//   outcome (max_attempts unlimited, the bridge's backoff): the message stays
//   at the head of its lane, so per-key order holds in the stream. Too large a
//   message is a reject: the delivery core dead-letters it with the reason.
// - In: a thread per mirror fetches a batch from a durable pull consumer and
//   appends it in ONE store transaction together with idempotency records
//   "stream sequence S was stored" (scope bridge-in.<stream>.<consumer>); only
//   after that commit are the messages acked. A crash between commit and ack
//   redelivers messages whose record exists: they are acked, not stored again.
//   Order: the same commit keeps the mark "stored through sequence W"; a
//   message is stored only while every delivery of the consumer was seen in
//   order, else the consumer is rewound to W + 1 (see run_in).
// - Status: a record of state and counters in the store (store_stats.hpp),
//   rewritten every status_interval and at each state change.
// - Connection: nats.c reconnects for ever (MaxReconnect -1). A server that is
//   down at open is retried the same way (RetryOnFailedConnect), but the first
//   attempt is made without it so that a refused login is reported at open.
//
// Invariants
// 1. Out: the handler returns ack only after a PubAck for that message.
// 2. In: natsMsg_Ack runs only after the commit that stored (or found) the
//    message's sequence record.
// 3. The connection outlives every handler call and in-thread: close() closes
//    subscriptions and joins threads before it closes the connection.
// 4. In, limits-retention streams: messages are stored in stream-sequence
//    order; the mark W only grows, in the commit that stores sequence W.
#include "lanebus/bridge.hpp"

#include <nats/nats.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include <unistd.h>

#include "access.hpp"
#include "bus_impl.hpp"
#include "coding.hpp"
#include "header_block.hpp"
#include "idempotency.hpp"
#include "names.hpp"
#include "store_stats.hpp"

namespace lanebus {
namespace detail {

namespace {

constexpr const char* kHdrKey = "Lanebus-Key";
constexpr const char* kHdrIdem = "Lanebus-Idempotency-Key";
constexpr const char* kHdrCreated = "Lanebus-Created-At";
constexpr const char* kHdrAttempt = "Lanebus-Attempt";
constexpr const char* kHdrTopic = "Lanebus-Topic";
/// How long one fetch waits for messages before the in-thread looks at its stop flag.
constexpr std::int64_t kFetchWaitMs = 250;

std::string nats_text(natsStatus s, jsErrCode jerr = static_cast<jsErrCode>(0)) {
  std::string out = natsStatus_GetText(s);
  if (jerr != 0) out += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
  const char* last = nats_GetLastError(nullptr);
  if (last != nullptr && *last != '\0' && out.find(last) == std::string::npos) {
    out += ": ";
    out += last;
  }
  return out;
}

bool token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
}

/// A key as one subject token: bytes outside [A-Za-z0-9_-] become ~XX.
void append_key_token(std::string& out, std::string_view key) {
  static const char* hex = "0123456789ABCDEF";
  if (key.empty()) {
    out += '~';
    return;
  }
  for (char c : key) {
    if (token_char(c)) {
      out += c;
    } else {
      const auto u = static_cast<unsigned char>(c);
      out += '~';
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
}

/// Header values: printable ASCII except '%' kept, the rest %XX.
std::string encode_header(std::string_view v) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    const auto u = static_cast<unsigned char>(c);
    if (u > 0x20 && u < 0x7f && c != '%') {
      out += c;
    } else {
      out += '%';
      out += hex[u >> 4];
      out += hex[u & 15];
    }
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string decode_header(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%' && i + 2 < v.size()) {
      const int h = hex_value(v[i + 1]), l = hex_value(v[i + 2]);
      if (h >= 0 && l >= 0) {
        out += static_cast<char>((h << 4) | l);
        i += 2;
        continue;
      }
    }
    out += v[i];
  }
  return out;
}

/// nats://host[:port] or tls://host[:port]; the scheme may be omitted.
Status check_url(const std::string& url) {
  auto bad = [&](const char* why) {
    return Status(Code::InvalidArgument, "bridge: server URL \"" + url.substr(0, 200) + "\": " + why +
                                             " (expected nats://host[:port] or tls://host[:port])");
  };
  std::string_view rest = url;
  const auto scheme_end = rest.find("://");
  if (scheme_end != std::string_view::npos) {
    const std::string_view scheme = rest.substr(0, scheme_end);
    if (scheme != "nats" && scheme != "tls") return bad("unknown scheme");
    rest.remove_prefix(scheme_end + 3);
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) rest.remove_prefix(at + 1);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  std::string_view host = rest, port;
  if (const auto colon = rest.rfind(':'); colon != std::string_view::npos && rest.find(']') == std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
    if (port.empty()) return bad("empty port");
  }
  if (host.empty()) return bad("no host");
  for (char c : host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_' || c == '[' || c == ']' ||
          c == ':'))
      return bad("the host contains an invalid character");
  if (!port.empty()) {
    if (port.size() > 5) return bad("port out of range");
    unsigned p = 0;
    for (char c : port) {
      if (c < '0' || c > '9') return bad("the port is not a number");
      p = p * 10 + static_cast<unsigned>(c - '0');
    }
    if (p == 0 || p > 65535) return bad("port out of range");
  }
  return Status();
}

Status check_stream_name(std::string_view stream) {
  if (stream.empty()) return Status(Code::InvalidArgument, "bridge: the stream name is empty");
  for (char c : stream)
    if (c == '.' || c == '*' || c == '>' || c == '/' || c == '\\' || static_cast<unsigned char>(c) <= 0x20 ||
        static_cast<unsigned char>(c) >= 0x7f)
      return Status(Code::InvalidArgument, "bridge: stream or consumer name \"" + std::string(stream.substr(0, 100)) +
                                               "\" contains '.', '*', '>', a slash or whitespace");
  return Status();
}

/// Lower-case, other characters '-': a valid lanebus name segment.
std::string name_segment(std::string_view s) {
  std::string out;
  for (char c : s) {
    const char l = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    out += ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9') || l == '_' || l == '-') ? l : '-';
  }
  if (out.size() > 80) out.resize(80);
  return out;
}

std::int64_t ms_to_ns(std::chrono::milliseconds ms) { return static_cast<std::int64_t>(ms.count()) * 1'000'000; }

}  // namespace

/// One token of a subject template.
struct SubjectToken {
  enum class Kind : std::uint8_t { Literal, Key, Topic, Lane };
  Kind kind = Kind::Literal;
  std::string text;
};

Result<std::vector<SubjectToken>> parse_subject_template(std::string_view tmpl) {
  auto bad = [&](const std::string& why) {
    return Status(Code::InvalidArgument, "bridge: subject template \"" + std::string(tmpl.substr(0, 200)) + "\": " + why);
  };
  if (tmpl.empty()) return bad("is empty");
  std::vector<SubjectToken> out;
  std::size_t pos = 0;
  while (true) {
    const std::size_t dot = tmpl.find('.', pos);
    const std::string_view tok = tmpl.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos);
    if (tok.empty()) return bad("has an empty token");
    SubjectToken t;
    if (tok.front() == '{') {
      if (tok == "{key}") {
        t.kind = SubjectToken::Kind::Key;
      } else if (tok == "{topic}") {
        t.kind = SubjectToken::Kind::Topic;
      } else if (tok == "{lane}") {
        t.kind = SubjectToken::Kind::Lane;
      } else {
        return bad("unknown placeholder " + std::string(tok.substr(0, 50)) + " (known: {key}, {topic}, {lane})");
      }
    } else {
      for (char c : tok) {
        if (c == '*' || c == '>') return bad("contains a wildcard ('*' or '>'); a publish subject must be literal");
        if (c == '{' || c == '}') return bad("a placeholder must be a whole token, as in \"orders.{key}\"");
        const auto u = static_cast<unsigned char>(c);
        if (u <= 0x20 || u >= 0x7f) return bad("contains whitespace or a non-printable byte");
      }
      t.text.assign(tok);
    }
    out.push_back(std::move(t));
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  return out;
}

class BridgeImpl;

/// Out, per lane: the publish window (only the lane's handler call touches it).
struct LaneWindow {
  natsSubscription* replies = nullptr;  // PubAcks: <prefix>.<generation>.<offset>
  std::string prefix;
  std::uint64_t generation = 0;
  std::deque<std::uint64_t> acked;  // offsets past the head whose PubAck arrived, increasing
};

struct OutMirror {
  BridgeImpl* bridge = nullptr;
  std::vector<LaneWindow> lanes;
  TopicImpl* topic = nullptr;
  std::string tmpl;
  std::vector<SubjectToken> tokens;
  std::string stream;
  std::string group;
  Subscription sub;
  std::atomic<bool> stream_ready{false};
  std::atomic<std::uint64_t> published{0}, acked{0}, duplicates{0}, dead_lettered{0};
};

struct InMirror {
  BridgeImpl* bridge = nullptr;
  TopicImpl* topic = nullptr;
  std::string stream;
  std::string consumer;
  IdempotencyImpl* seen = nullptr;
  std::string mark_key;  // user-table key of the mark "stored through stream sequence W"
  // Owned by the in-thread (and by mirror_in before the thread starts):
  natsSubscription* sub = nullptr;
  bool mark_loaded = false;
  bool have_mark = false;            // a mark is in the store (this mirror stored before)
  std::uint64_t stored_through = 0;  // W: every sequence <= W is stored (or was acked before the mirror began)
  bool guard = true;                 // order guard on: the stream has limits retention (rewinds are safe)
  std::uint64_t next_dseq = 1;       // E: the consumer sequence of the next delivery
  bool rewind = false;               // re-create the consumer at W + 1 before the next fetch
  std::thread thread;
  std::atomic<std::uint64_t> acked{0}, duplicates{0}, redelivered{0}, stored{0}, pending{0}, rewinds{0};
};

class BridgeImpl {
 public:
  BridgeImpl(std::shared_ptr<BusCore> core, Bus* bus, const BridgeOptions& options)
      : core_(std::move(core)), bus_(bus), options_(options) {}
  ~BridgeImpl() { (void)close(); }

  Status open();
  Status mirror_out(const Topic& topic, TopicImpl* t, std::string_view tmpl, std::string_view stream, const MirrorOutOptions& o);
  Status mirror_in(std::string_view stream, std::string_view consumer, TopicImpl* t);
  BridgeStats snapshot(const BusStats& bus) const;
  Status close();

  BusCore* core() const { return core_.get(); }

 private:
  static void on_disconnected(natsConnection*, void* self) {
    auto* b = static_cast<BridgeImpl*>(self);
    b->note_error("disconnected from the server; reconnecting", false);
    if (b->closing_.load(std::memory_order_acquire)) return;  // close() ends the connection: no news
    b->core_->logger.log(LogLevel::Warn, "bridge: disconnected from the NATS server; reconnecting every %lld ms",
                         static_cast<long long>(b->options_.reconnect_wait.count()));
  }
  static void on_reconnected(natsConnection* nc, void* self) {
    auto* b = static_cast<BridgeImpl*>(self);
    // Relaxed: a statistic.
    b->reconnects_.fetch_add(1, std::memory_order_relaxed);
    b->log_connected(nc, "reconnected");
  }
  static void on_connected(natsConnection* nc, void* self) {
    static_cast<BridgeImpl*>(self)->log_connected(nc, "connected");
  }
  // "bridge: connected to nats://..." (BusOptions::log), on a nats.c thread or open().
  void log_connected(natsConnection* nc, const char* how) const {
    if (!core_->logger.enabled()) return;
    char url[256] = "?";
    if (natsConnection_GetConnectedUrl(nc, url, sizeof url) != NATS_OK) std::snprintf(url, sizeof url, "?");
    core_->logger.log(LogLevel::Info, "bridge: %s to the NATS server %s", how, url);
  }
  // The last callback nats.c runs for a connection (on its callback thread):
  // close() waits for it before freeing what the callbacks use.
  static void on_closed(natsConnection*, void* self) {
    auto* b = static_cast<BridgeImpl*>(self);
    std::lock_guard<std::mutex> l(b->stop_mu_);
    b->closed_cb_ = true;
    b->stop_cv_.notify_all();
  }

  Outcome publish_one(OutMirror& m, const MessageView& v);
  /// The window path of publish_one (topics); see BridgeOptions::publish_window.
  Outcome publish_window(OutMirror& m, const MessageView& v);
  /// A message as published: subject, headers, Nats-Msg-Id. *bytes: payload + headers.
  natsMsg* build_msg(OutMirror& m, std::string_view key, std::string_view idem, std::string_view payload,
                     std::int64_t created_at_ns, std::uint32_t attempt, std::uint32_t lane, std::uint64_t offset,
                     const char* reply, bool id_header, std::uint64_t* bytes,
                     std::string_view headers);
  /// OK: the stream exists (or was created). NotFound: it does not and may
  /// not be created. Other codes: could not tell (server unreachable).
  Status ensure_stream(OutMirror& m);
  Status bind_in(InMirror& m);
  /// The status record (store_stats.hpp): written every status_interval and
  /// at each state change by status_thread_, and once more by close().
  void run_status();
  void write_status(bool stopped);
  BridgeState current_state() const {
    return failed_.load(std::memory_order_acquire) ? BridgeState::Failed
           : connected()                             ? BridgeState::Connected
                                                     : BridgeState::Retrying;
  }
  Status load_mark(InMirror& m);
  /// Re-create m's consumer (same configuration) delivering from `start`; see run_in.
  Status rewind_in(InMirror& m, std::uint64_t start);
  void run_in(InMirror* m);
  bool connected() const { return nc_ != nullptr && natsConnection_Status(nc_) == NATS_CONN_STATUS_CONNECTED; }
  void note_error(std::string_view what, bool fatal) {
    std::lock_guard<std::mutex> l(err_mu_);
    last_error_ = what;
    last_error_ns_ = now_ns();
    if (fatal) failed_.store(true, std::memory_order_release);
  }
  void sleep_backoff(std::int64_t& ns) {
    std::unique_lock<std::mutex> l(stop_mu_);
    stop_cv_.wait_for(l, std::chrono::nanoseconds(ns), [&] { return stopping_; });
    ns = std::min<std::int64_t>(ns * 2, ms_to_ns(options_.backoff_max));
  }
  Status load_store_id();

  std::shared_ptr<BusCore> core_;
  Bus* bus_;  // outlives the bridge (bridge.hpp)
  const BridgeOptions options_;
  natsOptions* nopts_ = nullptr;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
  std::string store_id_;
  std::uint64_t stats_id_ = 0;
  bool closed_ = false;

  mutable std::mutex mirrors_mu_;  // guards the two vectors (appends; close)
  std::vector<std::unique_ptr<OutMirror>> outs_;
  std::vector<std::unique_ptr<InMirror>> ins_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;   // guarded by stop_mu_
  bool closed_cb_ = false;  // guarded by stop_mu_: on_closed ran
  std::atomic<bool> closing_{false};
  std::thread status_thread_;

  mutable std::mutex err_mu_;
  std::string last_error_;
  std::int64_t last_error_ns_ = 0;
  std::atomic<bool> failed_{false};
  std::atomic<std::uint64_t> reconnects_{0};
};

Status BridgeImpl::load_store_id() {
  auto k = user_key_public("bridge", "store-id");
  if (!k.ok()) return k.status();
  std::random_device rd;
  std::mt19937_64 rng((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ static_cast<std::uint64_t>(now_ns()));
  char fresh[17];
  std::snprintf(fresh, sizeof fresh, "%016llx", static_cast<unsigned long long>(rng()));
  std::string id;
  Status s = core_->store()->write([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::User, *k);
    if (v.ok()) {
      id.assign(*v);
      return Status();
    }
    if (v.code() != Code::NotFound) return v.status();
    id = fresh;
    return t.put(StoreTable::User, *k, id);
  });
  if (!s.ok()) return s;
  store_id_ = id;
  return Status();
}

Status BridgeImpl::open() {
  if (options_.urls.empty()) return Status(Code::InvalidArgument, "bridge: BridgeOptions::urls is empty");
  for (const auto& u : options_.urls)
    if (Status s = check_url(u); !s.ok()) return s;
  if (core_->store() == nullptr)
    return Status(Code::InvalidArgument, "bridge: the bus has no store (BusOptions::store.directory is empty)");
  if (options_.publish_window == 0 || options_.publish_window > 65536)
    return Status(Code::InvalidArgument, "bridge: publish_window must be 1..65536");
  if (options_.fetch_batch == 0 || options_.fetch_batch > 65536)
    return Status(Code::InvalidArgument, "bridge: fetch_batch must be 1..65536");
  if (options_.backoff_initial.count() <= 0 || options_.backoff_max < options_.backoff_initial)
    return Status(Code::InvalidArgument, "bridge: backoff_initial must be > 0 and <= backoff_max");
  if (Status s = load_store_id(); !s.ok()) return s;

  auto fail = [&](natsStatus st, const char* what) {
    return Status(Code::IOError, std::string("bridge: ") + what + ": " + nats_text(st));
  };
  natsStatus st = natsOptions_Create(&nopts_);
  if (st != NATS_OK) return fail(st, "natsOptions_Create");
  std::vector<const char*> servers;
  for (const auto& u : options_.urls) servers.push_back(u.c_str());
  st = natsOptions_SetServers(nopts_, servers.data(), static_cast<int>(servers.size()));
  if (st != NATS_OK) return Status(Code::InvalidArgument, "bridge: server URLs refused by nats.c: " + nats_text(st));
  (void)natsOptions_SetName(nopts_, options_.name.c_str());
  (void)natsOptions_SetNoRandomize(nopts_, true);
  (void)natsOptions_SetTimeout(nopts_, std::max<std::int64_t>(1, options_.connect_timeout.count()));
  (void)natsOptions_SetMaxReconnect(nopts_, -1);
  (void)natsOptions_SetReconnectWait(nopts_, std::max<std::int64_t>(1, options_.reconnect_wait.count()));
  (void)natsOptions_SetDisconnectedCB(nopts_, &BridgeImpl::on_disconnected, this);
  (void)natsOptions_SetReconnectedCB(nopts_, &BridgeImpl::on_reconnected, this);
  (void)natsOptions_SetClosedCB(nopts_, &BridgeImpl::on_closed, this);
  if (!options_.token.empty() && (st = natsOptions_SetToken(nopts_, options_.token.c_str())) != NATS_OK)
    return fail(st, "token");
  if (!options_.user.empty() &&
      (st = natsOptions_SetUserInfo(nopts_, options_.user.c_str(), options_.password.c_str())) != NATS_OK)
    return fail(st, "user");
  if (!options_.credentials_file.empty() &&
      (st = natsOptions_SetUserCredentialsFromFiles(nopts_, options_.credentials_file.c_str(), nullptr)) != NATS_OK)
    return fail(st, "credentials file");
  bool tls = options_.tls;
  for (const auto& u : options_.urls) tls = tls || u.rfind("tls://", 0) == 0;
  if (tls) {
    if ((st = natsOptions_SetSecure(nopts_, true)) != NATS_OK) return fail(st, "TLS (is nats.c built with TLS?)");
    if (!options_.tls_ca_file.empty() &&
        (st = natsOptions_LoadCATrustedCertificates(nopts_, options_.tls_ca_file.c_str())) != NATS_OK)
      return fail(st, "TLS CA file");
    if (!options_.tls_cert_file.empty() &&
        (st = natsOptions_LoadCertificatesChain(nopts_, options_.tls_cert_file.c_str(),
                                                options_.tls_key_file.c_str())) != NATS_OK)
      return fail(st, "TLS certificate/key files");
    if (!options_.tls_hostname.empty() &&
        (st = natsOptions_SetExpectedHostname(nopts_, options_.tls_hostname.c_str())) != NATS_OK)
      return fail(st, "TLS host name");
    if (options_.tls_skip_verify && (st = natsOptions_SkipServerVerification(nopts_, true)) != NATS_OK)
      return fail(st, "TLS skip verify");
  }

  // First attempt without RetryOnFailedConnect: a refused login must be an
  // error now, not a reconnect loop.
  st = natsConnection_Connect(&nc_, nopts_);
  if (st == NATS_CONNECTION_AUTH_FAILED || st == NATS_NOT_PERMITTED) {
    return Status(Code::PermissionDenied,
                  "bridge: " + options_.urls.front() + ": the server refused the credentials: " + nats_text(st));
  }
  if (st == NATS_SECURE_CONNECTION_WANTED || st == NATS_SECURE_CONNECTION_REQUIRED || st == NATS_SSL_ERROR) {
    return Status(Code::IOError, "bridge: " + options_.urls.front() + ": TLS: " + nats_text(st));
  }
  if (st != NATS_OK) {
    // Unreachable now: keep trying in the background (nats.c's reconnect loop).
    nc_ = nullptr;
    note_error("cannot connect to " + options_.urls.front() + ": " + nats_text(st) + "; retrying", false);
    core_->logger.log(LogLevel::Warn, "bridge: cannot connect to %s: %s; retrying in the background",
                      options_.urls.front().c_str(), nats_text(st).c_str());
    (void)natsOptions_SetRetryOnFailedConnect(nopts_, true, &BridgeImpl::on_connected, this);
    st = natsConnection_Connect(&nc_, nopts_);
    if (st != NATS_OK && st != NATS_NOT_YET_CONNECTED) {
      nc_ = nullptr;
      return Status(Code::IOError, "bridge: connect to " + options_.urls.front() + ": " + nats_text(st));
    }
  }
  if (connected()) log_connected(nc_, "connected");
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = std::max<std::int64_t>(1, options_.publish_timeout.count());
  st = natsConnection_JetStream(&js_, nc_, &jo);
  if (st != NATS_OK) return fail(st, "JetStream context");
  stats_id_ = core_->add_bridge_stats([this](const BusStats& bs) { return snapshot(bs); });
  if (options_.status_interval.count() > 0) status_thread_ = std::thread([this] { run_status(); });
  return Status();
}

void BridgeImpl::write_status(bool stopped) {
  const BusStats bs = core_->stats();
  const BridgeStats b = snapshot(bs);
  std::string value = encode_bridge_status(b, static_cast<std::uint32_t>(::getpid()), options_.status_interval.count(),
                                           now_ns(), stopped);
  std::string key = bridge_status_key(options_.name);
  auto put = [key, value](StoreTxn& t) -> Status { return t.put(StoreTable::User, key, value); };
  if (stopped) {
    (void)core_->store()->write(put);  // the last word: synchronous
  } else {
    // Batched into the writer's next transaction; a failure shows as a stale record.
    (void)core_->store()->write_async(put, [](const Status&) {});
  }
}

void BridgeImpl::run_status() {
  const auto interval = std::chrono::duration_cast<std::chrono::steady_clock::duration>(options_.status_interval);
  const auto poll = std::min<std::chrono::steady_clock::duration>(interval, std::chrono::milliseconds(100));
  auto last_write = std::chrono::steady_clock::time_point::min();
  int last_state = -1;
  std::unique_lock<std::mutex> l(stop_mu_);
  while (!stopping_) {
    l.unlock();
    const int state = static_cast<int>(current_state());
    const auto now = std::chrono::steady_clock::now();
    if (state != last_state || now - last_write >= interval) {
      write_status(false);
      last_write = now;
      last_state = state;
    }
    l.lock();
    stop_cv_.wait_for(l, poll, [&] { return stopping_; });
  }
}

Status BridgeImpl::ensure_stream(OutMirror& m) {
  if (m.stream_ready.load(std::memory_order_acquire)) return Status();
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus st = js_GetStreamInfo(&si, js_, m.stream.c_str(), nullptr, &jerr);
  if (st == NATS_OK) {
    jsStreamInfo_Destroy(si);
    m.stream_ready.store(true, std::memory_order_release);
    return Status();
  }
  if (st != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
    return Status(Code::IOError, "bridge: stream \"" + m.stream + "\": cannot look it up: " + nats_text(st, jerr));
  if (!options_.create_streams)
    return Status(Code::NotFound, "bridge: stream \"" + m.stream +
                                      "\" does not exist on the server (BridgeOptions::create_streams is false)");
  std::string filter;
  for (std::size_t i = 0; i < m.tokens.size(); ++i) {
    if (i) filter += '.';
    filter += m.tokens[i].kind == SubjectToken::Kind::Literal ? m.tokens[i].text : "*";
  }
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = m.stream.c_str();
  const char* subjects[1] = {filter.c_str()};
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  cfg.Duplicates = ms_to_ns(options_.duplicate_window);
  jerr = static_cast<jsErrCode>(0);
  st = js_AddStream(&si, js_, &cfg, nullptr, &jerr);
  if (st != NATS_OK) {
    // Created meanwhile by another bridge: fine if it exists now.
    if (js_GetStreamInfo(&si, js_, m.stream.c_str(), nullptr, nullptr) == NATS_OK) {
      jsStreamInfo_Destroy(si);
      m.stream_ready.store(true, std::memory_order_release);
      return Status();
    }
    return Status(Code::IOError, "bridge: cannot create stream \"" + m.stream + "\" for \"" + filter +
                                     "\": " + nats_text(st, jerr));
  }
  jsStreamInfo_Destroy(si);
  m.stream_ready.store(true, std::memory_order_release);
  return Status();
}

natsMsg* BridgeImpl::build_msg(OutMirror& m, std::string_view key, std::string_view idem, std::string_view payload,
                               std::int64_t created_at_ns, std::uint32_t attempt, std::uint32_t lane,
                               std::uint64_t offset, const char* reply, bool id_header, std::uint64_t* bytes,
                               std::string_view headers) {
  std::string subject;
  for (std::size_t i = 0; i < m.tokens.size(); ++i) {
    if (i) subject += '.';
    switch (m.tokens[i].kind) {
      case SubjectToken::Kind::Literal: subject += m.tokens[i].text; break;
      case SubjectToken::Kind::Key: append_key_token(subject, key); break;
      case SubjectToken::Kind::Topic: append_key_token(subject, m.topic->name); break;
      case SubjectToken::Kind::Lane: subject += std::to_string(lane); break;
    }
  }
  natsMsg* msg = nullptr;
  if (natsMsg_Create(&msg, subject.c_str(), reply, payload.data(), static_cast<int>(payload.size())) != NATS_OK)
    return nullptr;
  std::uint64_t header_bytes = 12;  // "NATS/1.0\r\n" ... "\r\n"
  auto header = [&](const char* k, const std::string& val) {
    if (val.empty()) return;
    (void)natsMsgHeader_Set(msg, k, val.c_str());
    header_bytes += std::char_traits<char>::length(k) + val.size() + 4;
  };
  const std::string msg_id = store_id_ + "." + m.topic->name + "." + std::to_string(lane) + "." + std::to_string(offset);
  if (id_header) {
    header("Nats-Msg-Id", msg_id);
    header("Nats-Expected-Stream", m.stream);
  } else {
    header_bytes += 15 + msg_id.size();  // js_PublishMsg adds it
  }
  header(kHdrKey, encode_header(key));
  header(kHdrIdem, encode_header(idem));
  header(kHdrCreated, std::to_string(created_at_ns));
  header(kHdrAttempt, std::to_string(attempt));
  header(kHdrTopic, encode_header(m.topic->name));
  // The message's own headers (traceparent, tracestate, ...; doc/tracing.md)
  // as NATS headers of the same names; mirror_in takes them back.
  for (Header h : HeadersView(headers)) {
    const std::string name(h.name);
    if (name.rfind("Nats-", 0) == 0 || name.rfind("Lanebus-", 0) == 0) continue;  // the bridge's and the server's own
    (void)natsMsgHeader_Set(msg, name.c_str(), std::string(h.value).c_str());
    header_bytes += h.name.size() + h.value.size() + 4;
  }
  *bytes = payload.size() + header_bytes;
  return msg;
}

Outcome BridgeImpl::publish_one(OutMirror& m, const MessageView& v) {
  if (closing_.load(std::memory_order_acquire)) return Outcome::retry("bridge closing");
  if (!m.stream_ready.load(std::memory_order_acquire)) {
    Status s = ensure_stream(m);
    if (!s.ok()) {
      note_error(s.message(), s.code() == Code::NotFound);
      return Outcome::retry(s.message());
    }
    if (failed_.load(std::memory_order_acquire)) failed_.store(false, std::memory_order_release);
  }
  if (!m.topic->is_queue && options_.publish_window > 1) return publish_window(m, v);
  std::uint64_t total = 0;
  natsMsg* msg = build_msg(m, v.key(), v.idempotency_key(), v.payload(), v.created_at_ns(), v.attempt(), v.lane(),
                           v.offset(), nullptr, false, &total, v.headers().encoded());
  if (msg == nullptr) return Outcome::retry("bridge: natsMsg_Create failed");
  const std::int64_t max_payload = connected() ? natsConnection_GetMaxPayload(nc_) : 0;
  if (max_payload > 0 && total > static_cast<std::uint64_t>(max_payload)) {
    natsMsg_Destroy(msg);
    m.dead_lettered.fetch_add(1, std::memory_order_relaxed);
    return Outcome::reject("bridge: message of " + std::to_string(total) + " bytes exceeds the server's max_payload " +
                           std::to_string(max_payload));
  }
  const std::string msg_id =
      store_id_ + "." + m.topic->name + "." + std::to_string(v.lane()) + "." + std::to_string(v.offset());
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = msg_id.c_str();
  po.MaxWait = std::max<std::int64_t>(1, options_.publish_timeout.count());
  po.ExpectStream = m.stream.c_str();
  jsPubAck* pa = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  // Relaxed: statistics.
  m.published.fetch_add(1, std::memory_order_relaxed);
  natsStatus st = js_PublishMsg(&pa, js_, msg, &po, &jerr);
  natsMsg_Destroy(msg);
  if (st == NATS_OK) {
    m.acked.fetch_add(1, std::memory_order_relaxed);
    if (pa != nullptr && pa->Duplicate) m.duplicates.fetch_add(1, std::memory_order_relaxed);
    jsPubAck_Destroy(pa);
    return Outcome::ack();
  }
  if (st == NATS_MAX_PAYLOAD || jerr == JSStreamMessageExceedsMaximumErr) {
    m.dead_lettered.fetch_add(1, std::memory_order_relaxed);
    return Outcome::reject("bridge: message of " + std::to_string(total) + " bytes refused: " + nats_text(st, jerr));
  }
  std::string why = "bridge: publish to stream \"" + m.stream + "\": " + nats_text(st, jerr);
  if (st == NATS_NO_RESPONDERS) {
    why += "; no stream takes this subject (or the server's JetStream is not ready yet)";
    m.stream_ready.store(false, std::memory_order_release);  // look the stream up again
  }
  note_error(why, false);
  return Outcome::retry(why);
}

namespace {

// What came back for a window's publishes: per message 1 PubAck, -1 error,
// 0 nothing (yet); the first error; whether the head was refused as too large.
struct WindowReplies {
  std::vector<std::int8_t> result;
  std::string first_error;
  bool head_too_large = false;
};

// Collect the PubAcks of the window `gen` of `lw` for the offsets `sent`
// (increasing) until all came or `deadline` passes. A reply of another
// generation or offset, or a second one, is dropped.
WindowReplies collect_pubacks(OutMirror& m, LaneWindow& lw, std::uint64_t gen, const std::vector<std::uint64_t>& sent,
                              std::chrono::steady_clock::time_point deadline) {
  WindowReplies out;
  std::vector<std::int8_t>& result = out.result;
  result.assign(sent.size(), 0);
  std::size_t got = 0;
  while (got < sent.size()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    natsMsg* r = nullptr;
    if (natsSubscription_NextMsg(&r, lw.replies, left.count()) != NATS_OK) break;
    const std::string subj = natsMsg_GetSubject(r);
    const auto d2 = subj.rfind('.');
    const auto d1 = subj.rfind('.', d2 - 1);
    const std::uint64_t rgen = std::strtoull(subj.c_str() + d1 + 1, nullptr, 10);
    const std::uint64_t roff = std::strtoull(subj.c_str() + d2 + 1, nullptr, 10);
    const auto it = std::lower_bound(sent.begin(), sent.end(), roff);
    if (rgen != gen || it == sent.end() || *it != roff || result[static_cast<std::size_t>(it - sent.begin())] != 0) {
      natsMsg_Destroy(r);
      continue;
    }
    const std::size_t i = static_cast<std::size_t>(it - sent.begin());
    const std::string_view data(natsMsg_GetData(r), static_cast<std::size_t>(natsMsg_GetDataLength(r)));
    ++got;
    if (data.empty()) {  // a status reply (503: no responders)
      result[i] = -1;
      if (out.first_error.empty()) out.first_error = "no stream takes this subject (or JetStream is not ready yet)";
      m.stream_ready.store(false, std::memory_order_release);
    } else if (data.find("\"error\"") != std::string_view::npos) {
      result[i] = -1;
      if (i == 0 && data.find("10054") != std::string_view::npos) out.head_too_large = true;
      if (out.first_error.empty()) out.first_error = std::string(data.substr(0, 300));
    } else {
      result[i] = 1;
      m.acked.fetch_add(1, std::memory_order_relaxed);
      if (data.find("\"duplicate\":true") != std::string_view::npos)
        m.duplicates.fetch_add(1, std::memory_order_relaxed);
    }
    natsMsg_Destroy(r);
  }
  return out;
}

}  // namespace

// The window: the head's handler call publishes up to publish_window stored
// messages of the lane (plain publishes with a reply subject that names the
// window's generation and the offset) and collects their PubAcks; later calls
// find their offset in `acked` and ack at once. A reply of an older window
// (timed out) is ignored: its message is simply published again (same
// Nats-Msg-Id: the server drops the copy).
Outcome BridgeImpl::publish_window(OutMirror& m, const MessageView& v) {
  LaneWindow& lw = m.lanes[v.lane()];
  while (!lw.acked.empty() && lw.acked.front() < v.offset()) lw.acked.pop_front();
  if (!lw.acked.empty() && lw.acked.front() == v.offset()) {
    lw.acked.pop_front();
    return Outcome::ack();
  }
  lw.acked.clear();
  if (!connected()) {
    note_error("bridge: not connected to a server; retrying", false);
    return Outcome::retry("bridge: not connected");
  }
  if (lw.replies == nullptr) {
    std::random_device rd;
    char buf[48];
    std::snprintf(buf, sizeof buf, "%08x%08x", rd(), rd());
    lw.prefix = std::string("_INBOX.lanebus.") + buf + "." + std::to_string(v.lane());
    if (natsConnection_SubscribeSync(&lw.replies, nc_, (lw.prefix + ".*.*").c_str()) != NATS_OK) {
      lw.replies = nullptr;
      return Outcome::retry("bridge: cannot subscribe to the PubAck inbox");
    }
  }
  ReadLimits limits;
  limits.max_messages = options_.publish_window;
  limits.max_bytes = 4ull << 20;
  auto rb = core_->store()->read(m.topic->store_topic, v.lane(), v.offset(), limits);
  const bool have = rb.ok() && !rb->messages.empty() && rb->messages.front().offset == v.offset();
  const std::int64_t max_payload = natsConnection_GetMaxPayload(nc_);
  const std::uint64_t gen = ++lw.generation;
  std::vector<std::uint64_t> sent;
  std::uint64_t head_bytes = 0;
  const std::size_t count = have ? rb->messages.size() : 1;
  for (std::size_t k = 0; k < count; ++k) {
    const StoredMessage* sm = have ? &rb->messages[k] : nullptr;
    const std::uint64_t off = sm ? sm->offset : v.offset();
    const std::string reply = lw.prefix + "." + std::to_string(gen) + "." + std::to_string(off);
    std::uint64_t bytes = 0;
    natsMsg* msg = sm ? build_msg(m, sm->key, sm->idempotency_key, sm->payload, sm->header.created_at_ns,
                                  k == 0 ? v.attempt() : 1, v.lane(), off, reply.c_str(), true, &bytes, sm->headers)
                      : build_msg(m, v.key(), v.idempotency_key(), v.payload(), v.created_at_ns(), v.attempt(),
                                  v.lane(), off, reply.c_str(), true, &bytes, v.headers().encoded());
    if (msg == nullptr) break;
    if (k == 0) head_bytes = bytes;
    if (max_payload > 0 && bytes > static_cast<std::uint64_t>(max_payload)) {
      natsMsg_Destroy(msg);
      if (k == 0) {
        m.dead_lettered.fetch_add(1, std::memory_order_relaxed);
        return Outcome::reject("bridge: message of " + std::to_string(bytes) +
                               " bytes exceeds the server's max_payload " + std::to_string(max_payload));
      }
      break;  // the window ends before it; its own call dead-letters it
    }
    const natsStatus ps = natsConnection_PublishMsg(nc_, msg);
    natsMsg_Destroy(msg);
    if (ps != NATS_OK) break;
    sent.push_back(off);
  }
  m.published.fetch_add(sent.size(), std::memory_order_relaxed);
  if (sent.empty()) {
    note_error("bridge: publish failed: " + nats_text(NATS_CONNECTION_DISCONNECTED), false);
    return Outcome::retry("bridge: publish failed");
  }
  const WindowReplies replies =
      collect_pubacks(m, lw, gen, sent, std::chrono::steady_clock::now() + options_.publish_timeout);
  const std::vector<std::int8_t>& result = replies.result;
  const std::string& first_error = replies.first_error;
  for (std::size_t i = 1; i < sent.size(); ++i)
    if (result[i] == 1) lw.acked.push_back(sent[i]);
  if (result[0] == 1) return Outcome::ack();
  if (replies.head_too_large) {
    m.dead_lettered.fetch_add(1, std::memory_order_relaxed);
    return Outcome::reject("bridge: message of " + std::to_string(head_bytes) + " bytes refused: " + first_error);
  }
  const std::string why = "bridge: publish to stream \"" + m.stream + "\": " +
                          (first_error.empty() ? std::string("no PubAck within publish_timeout") : first_error);
  note_error(why, false);
  return Outcome::retry(why);
}

Status BridgeImpl::mirror_out(const Topic& topic, TopicImpl* t, std::string_view tmpl, std::string_view stream, const MirrorOutOptions& o) {
  if (closing_.load()) return Status(Code::ShutDown, "bridge: closed");
  if (t == nullptr || t->bus != core_.get() || !t->durable)
    return Status(Code::InvalidArgument, "bridge: mirror_out needs a durable topic or queue of the bridge's bus");
  auto tokens = parse_subject_template(tmpl);
  if (!tokens.ok()) return tokens.status();
  if (Status s = check_stream_name(stream); !s.ok()) return s;
  auto m = std::make_unique<OutMirror>();
  m->bridge = this;
  m->topic = t;
  m->tmpl.assign(tmpl);
  m->tokens = std::move(*tokens);
  m->stream.assign(stream);
  m->group = o.group.empty() ? "bridge." + name_segment(stream) : o.group;
  m->lanes.resize(t->options.lanes);
  if (Status s = check_name(m->group, "bridge group"); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> l(mirrors_mu_);
    for (const auto& x : outs_)
      if (x->topic == t && x->group == m->group)
        return Status(Code::Conflict, "bridge: topic \"" + t->name + "\" group \"" + m->group + "\" is already mirrored");
  }
  if (connected()) {
    Status s = ensure_stream(*m);
    if (s.code() == Code::NotFound) return s;
  }
  GroupOptions g;
  g.max_attempts = ~0u;  // transient failures are retried for ever; only a reject dead-letters
  g.backoff_initial = options_.backoff_initial;
  g.backoff_max = options_.backoff_max;
  g.backoff_multiplier = 2.0;
  g.backoff_jitter = 0.2;
  g.start = o.start;
  OutMirror* mp = m.get();
  Handler h = [this, mp](const MessageView& v) { return publish_one(*mp, v); };
  auto sub = topic.is_queue() ? bus_->consume(topic, std::move(h), g) : bus_->subscribe(topic, m->group, std::move(h), g);
  if (!sub.ok()) return sub.status();
  m->sub = std::move(*sub);
  std::lock_guard<std::mutex> l(mirrors_mu_);
  outs_.push_back(std::move(m));
  return Status();
}

namespace {

std::string le64(std::uint64_t v) {
  std::string s;
  put_le64(s, v);
  return s;
}

/// The consumer the bridge creates: explicit ack, at most one fetch unacked.
/// start > 0: deliver from that stream sequence; else deliver all.
void default_consumer_config(jsConsumerConfig& cc, const InMirror& m, const BridgeOptions& o, std::uint64_t start) {
  jsConsumerConfig_Init(&cc);
  cc.Durable = m.consumer.c_str();
  cc.AckPolicy = js_AckExplicit;
  cc.DeliverPolicy = start > 0 ? js_DeliverByStartSequence : js_DeliverAll;
  cc.OptStartSeq = start;
  cc.AckWait = ms_to_ns(o.ack_wait);
  cc.MaxAckPending = static_cast<int64_t>(o.fetch_batch);
}

}  // namespace

// In-direction order (doc/bridge.md, "In: per-key order"). JetStream delivers
// a consumer's messages the first time in stream-sequence order, and numbers
// every delivery with a consumer sequence (dseq). A delivery the bridge never
// saw (taken by a pull request of a killed bridge process, or lost in the
// socket when the server died) is redelivered only after ack_wait, behind
// newer messages. So the in-thread stores a message only while it has seen
// every delivery since the consumer was bound (dseq == E, the next expected),
// and keeps the mark W ("every sequence <= W is stored") in the same commit.
// Anything else (a dseq gap, an unknown redelivery, a failed commit) rewinds:
// the consumer is deleted and re-created with the same configuration and
// DeliverByStartSequence W + 1, and the thread subscribes afresh. A bind of a
// consumer with unacked deliveries or a waiting pull request (a killed
// bridge's) rewinds the same way, so after a restart the stream is stored in
// sequence order from W + 1. Rewinds delete the consumer, which is safe only
// on a stream with limits retention; on interest or work-queue streams the
// guard is off (order after a crash is then best effort; no loss, no duplicate).

Status BridgeImpl::load_mark(InMirror& m) {
  if (m.mark_loaded) return Status();
  std::uint64_t w = 0;
  bool have = false;
  Status s = core_->store()->read([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::User, m.mark_key);
    if (v.ok()) {
      have = true;
      w = get_le64_prefix(*v);
      return Status();
    }
    return v.code() == Code::NotFound ? Status() : v.status();
  });
  if (!s.ok()) return s;
  m.have_mark = have;
  m.stored_through = w;
  m.mark_loaded = true;
  return Status();
}

Status BridgeImpl::rewind_in(InMirror& m, std::uint64_t start) {
  if (m.sub != nullptr) {  // deliveries of the old consumer queued here are dropped with it
    natsSubscription_Destroy(m.sub);
    m.sub = nullptr;
  }
  start = std::max<std::uint64_t>(start, 1);
  jsConsumerInfo* ci = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus st = js_GetConsumerInfo(&ci, js_, m.stream.c_str(), m.consumer.c_str(), nullptr, &jerr);
  jsConsumerConfig cc;
  if (st == NATS_OK && ci->Config != nullptr) {
    cc = *ci->Config;  // the same configuration (filter, ack wait, ...), only the start moves
    cc.DeliverPolicy = js_DeliverByStartSequence;
    cc.OptStartSeq = start;
    cc.OptStartTime = 0;
    jerr = static_cast<jsErrCode>(0);
    natsStatus ds = js_DeleteConsumer(js_, m.stream.c_str(), m.consumer.c_str(), nullptr, &jerr);
    if (ds != NATS_OK && ds != NATS_NOT_FOUND && jerr != JSConsumerNotFoundErr) {
      jsConsumerInfo_Destroy(ci);
      return Status(Code::IOError, "bridge: rewinding consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                       "\": delete: " + nats_text(ds, jerr));
    }
  } else if (st == NATS_OK || st == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr) {
    if (st == NATS_OK) jsConsumerInfo_Destroy(ci);
    ci = nullptr;
    if (!options_.create_consumers)
      return Status(Code::NotFound, "bridge: consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                        "\" does not exist (BridgeOptions::create_consumers is false)");
    default_consumer_config(cc, m, options_, start);
  } else {
    return Status(Code::IOError, "bridge: consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                     "\": cannot look it up: " + nats_text(st, jerr));
  }
  jsConsumerInfo* created = nullptr;
  jerr = static_cast<jsErrCode>(0);
  st = js_AddConsumer(&created, js_, m.stream.c_str(), &cc, nullptr, &jerr);
  if (ci != nullptr) jsConsumerInfo_Destroy(ci);  // after the add: cc points into it
  if (st != NATS_OK)
    return Status(Code::IOError, "bridge: rewinding consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                     "\" to sequence " + std::to_string(start) + ": " + nats_text(st, jerr));
  jsConsumerInfo_Destroy(created);
  m.next_dseq = 1;
  // Relaxed: a statistic.
  m.rewinds.fetch_add(1, std::memory_order_relaxed);
  core_->logger.log(LogLevel::Warn, "bridge: rewound consumer \"%s\" of stream \"%s\" to sequence %llu",
                    m.consumer.c_str(), m.stream.c_str(), static_cast<unsigned long long>(start));
  return Status();
}

Status BridgeImpl::bind_in(InMirror& m) {
  if (Status s = load_mark(m); !s.ok()) return s;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus st = js_GetStreamInfo(&si, js_, m.stream.c_str(), nullptr, &jerr);
  if (st != NATS_OK) {
    if (st == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
      return Status(Code::NotFound, "bridge: stream \"" + m.stream + "\" does not exist on the server");
    return Status(Code::IOError, "bridge: stream \"" + m.stream + "\": cannot look it up: " + nats_text(st, jerr));
  }
  m.guard = si->Config == nullptr || si->Config->Retention == js_LimitsPolicy;
  jsStreamInfo_Destroy(si);

  if (m.rewind && m.guard) {
    m.rewind = false;
    if (Status s = rewind_in(m, m.stored_through + 1); !s.ok()) {
      m.rewind = true;
      return s;
    }
  } else {
    m.rewind = false;
    jsConsumerInfo* ci = nullptr;
    jerr = static_cast<jsErrCode>(0);
    st = js_GetConsumerInfo(&ci, js_, m.stream.c_str(), m.consumer.c_str(), nullptr, &jerr);
    if (st == NATS_OK) {
      // Clean: nothing delivered and unacked, no pull request waiting (a killed
      // bridge's), nothing delivered past the mark. Then the consumer's next
      // delivery is the true next one and it is used as it is.
      const bool clean = ci->NumAckPending == 0 && ci->NumWaiting == 0 &&
                         (!m.have_mark || ci->Delivered.Stream <= m.stored_through);
      const std::uint64_t delivered_dseq = ci->Delivered.Consumer, delivered_sseq = ci->Delivered.Stream;
      const std::uint64_t ack_floor = ci->AckFloor.Stream;
      jsConsumerInfo_Destroy(ci);
      if (clean || !m.guard) {
        m.next_dseq = delivered_dseq + 1;
        if (!m.have_mark) m.stored_through = delivered_sseq;  // acked before this mirror began
      } else {
        // First bind without a mark: what was acked is the ack floor.
        if (!m.have_mark) m.stored_through = ack_floor;
        if (Status s = rewind_in(m, m.stored_through + 1); !s.ok()) return s;
      }
    } else if (jerr == JSStreamNotFoundErr) {
      return Status(Code::NotFound, "bridge: stream \"" + m.stream + "\" does not exist on the server");
    } else if (st == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr) {
      if (!options_.create_consumers)
        return Status(Code::NotFound, "bridge: consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                          "\" does not exist (BridgeOptions::create_consumers is false)");
      jsConsumerConfig cc;
      // With a mark (the consumer was deleted meanwhile): resume after it.
      default_consumer_config(cc, m, options_, m.have_mark ? m.stored_through + 1 : 0);
      jerr = static_cast<jsErrCode>(0);
      st = js_AddConsumer(&ci, js_, m.stream.c_str(), &cc, nullptr, &jerr);
      if (st != NATS_OK) {
        if (jerr == JSStreamNotFoundErr)
          return Status(Code::NotFound, "bridge: stream \"" + m.stream + "\" does not exist on the server");
        return Status(Code::IOError, "bridge: cannot create consumer \"" + m.consumer + "\" of stream \"" +
                                         m.stream + "\": " + nats_text(st, jerr));
      }
      jsConsumerInfo_Destroy(ci);
      m.next_dseq = 1;
    } else {
      return Status(Code::IOError, "bridge: consumer \"" + m.consumer + "\" of stream \"" + m.stream +
                                       "\": cannot look it up: " + nats_text(st, jerr));
    }
  }
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = m.stream.c_str();
  so.Consumer = m.consumer.c_str();
  jerr = static_cast<jsErrCode>(0);
  st = js_PullSubscribe(&m.sub, js_, "", m.consumer.c_str(), nullptr, &so, &jerr);
  if (st != NATS_OK) {
    m.sub = nullptr;
    return Status(Code::IOError, "bridge: pull subscribe to \"" + m.stream + "\"/\"" + m.consumer +
                                     "\": " + nats_text(st, jerr));
  }
  return Status();
}

namespace {

// One fetched batch of an in-mirror: what to store (in delivery order) and
// what to ack. `take` stops at the first anomaly: the rest is neither stored
// nor acked.
struct InBatch {
  std::vector<AppendRequest> reqs;  // an empty request for a known copy of a stored message
  std::vector<std::string> seqs;    // the stream sequences: idempotency keys of `seen`
  std::vector<char> known_dup;      // 1: a copy of a stored message (acked, not stored)
  std::vector<char> dup;            // filled by store_in_batch: 1 when not stored
  std::uint64_t next_dseq = 0, through = 0;
  int take = 0;
  bool anomaly = false;
  /// With a tracer: the Publish span of each new message (doc/tracing.md),
  /// ended once the batch is stored or refused (end_in_spans). Views into
  /// the fetched messages, valid until the list is destroyed.
  struct Span {
    SpanInfo info;
    TraceContext span;
  };
  std::vector<Span> spans;
};

// Decide, message by message, what of `list` to store (see run_in for the
// order guard).
// The NATS headers of `msg` other than the server's (Nats-*) and the bridge's
// own (Lanebus-*), as message headers (doc/tracing.md): the first value of
// each, in the server's order, while they pass the rules and limits of
// OutgoingMessage::headers; one that does not is left out.
void in_headers(natsMsg* msg, HeaderBlock* out, Tracer* tracer, InBatch::Span* span) {
  const char** keys = nullptr;
  int count = 0;
  if (natsMsgHeader_Keys(msg, &keys, &count) != NATS_OK || keys == nullptr) return;
  Header kept[kMaxHeaders];
  std::size_t n = 0, bytes = 0;
  for (int i = 0; i < count && n < kMaxHeaders; ++i) {
    const std::string_view name(keys[i]);
    if (name.rfind("Nats-", 0) == 0 || name.rfind("Lanebus-", 0) == 0) continue;
    const char* value = nullptr;
    if (natsMsgHeader_Get(msg, keys[i], &value) != NATS_OK || value == nullptr) continue;
    const Header h{name, value};
    if (bytes + name.size() + h.value.size() > kMaxHeaderBytes) continue;
    kept[n] = h;
    if (!check_headers(std::span<const Header>(kept, n + 1)).ok()) continue;
    bytes += name.size() + h.value.size();
    ++n;
  }
  if (span == nullptr) {
    for (std::size_t i = 0; i < n; ++i) out->add(kept[i].name, kept[i].value);
  } else {
    // Traced: the stored message continues the span the tracer started for
    // this publish (its context becomes the traceparent, added last, as a
    // local traced publish does: trace.hpp).
    for (std::size_t i = 0; i < n; ++i) {
      if (kept[i].name == kTraceparent) {
        (void)TraceContext::parse(kept[i].value, &span->info.parent);  // checked above
        continue;
      }
      if (kept[i].name == kTracestate) span->info.tracestate = kept[i].value;
      out->add(kept[i].name, kept[i].value);
    }
    const TraceContext started = tracer->start(span->info);
    span->span = started.valid() ? started : span->info.parent;  // else the sender's context stays
    if (span->span.valid()) {
      char tp[TraceContext::kTraceparentBytes];
      out->add(kTraceparent, span->span.format(tp));
    }
  }
  std::free(static_cast<void*>(keys));
}

void plan_in_batch(InMirror& m, const natsMsgList& list, Tracer* tracer, InBatch* b) {
  b->reqs.clear();
  b->spans.clear();
  b->seqs.clear();
  b->known_dup.clear();
  b->next_dseq = m.next_dseq;
  b->through = m.stored_through;
  b->take = list.Count;
  b->anomaly = false;
  for (int i = 0; i < list.Count; ++i) {
    natsMsg* msg = list.Msgs[i];
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, msg) != NATS_OK) {
      b->take = i;
      b->anomaly = true;
      return;
    }
    const std::uint64_t seq = meta->Sequence.Stream, dseq = meta->Sequence.Consumer;
    const std::int64_t ts = meta->Timestamp;
    const bool again = meta->NumDelivered > 1;
    // Relaxed: statistics.
    if (again) m.redelivered.fetch_add(1, std::memory_order_relaxed);
    m.pending.store(meta->NumPending, std::memory_order_relaxed);
    jsMsgMetaData_Destroy(meta);
    if (m.guard) {
      // Stored in sequence order or not at all: every delivery seen (dseq ==
      // E); a first delivery past W is the next sequence; a redelivery past
      // W is one the bridge never stored in order. Either anomaly rewinds.
      const bool in_order = dseq == b->next_dseq && (seq <= b->through || !again);
      const bool old_copy = dseq < b->next_dseq && seq <= b->through;  // a late copy of a stored message
      if (!in_order && !old_copy) {
        b->take = i;
        b->anomaly = true;
        return;
      }
      if (dseq == b->next_dseq) ++b->next_dseq;
      if (seq <= b->through) {
        b->seqs.push_back(std::to_string(seq));
        b->reqs.emplace_back();  // a copy of a stored message: acked, not stored
        b->known_dup.push_back(1);
        continue;
      }
      b->through = seq;
    } else {
      b->through = std::max(b->through, seq);
    }
    const char* hv = nullptr;
    std::string key, idem;
    if (natsMsgHeader_Get(msg, kHdrKey, &hv) == NATS_OK && hv != nullptr) key = decode_header(hv);
    if (natsMsgHeader_Get(msg, kHdrIdem, &hv) == NATS_OK && hv != nullptr) idem = decode_header(hv);
    std::int64_t created = 0;
    if (natsMsgHeader_Get(msg, kHdrCreated, &hv) == NATS_OK && hv != nullptr) created = std::atoll(hv);
    OutgoingMessage om;
    om.key = key;
    om.idempotency_key = idem;
    om.payload = std::string_view(natsMsg_GetData(msg), static_cast<std::size_t>(natsMsg_GetDataLength(msg)));
    HeaderBlock headers;
    InBatch::Span* span = nullptr;
    if (tracer != nullptr) [[unlikely]] {
      span = &b->spans.emplace_back();
      span->info.kind = SpanKind::Publish;
      span->info.topic = m.topic->name;
      span->info.lane = lane_for_key(om.key, m.topic->options.lanes);
    }
    in_headers(msg, &headers, tracer, span);
    AppendRequest r = m.topic->append_request(om, headers.bytes());
    r.header.created_at_ns = created > 0 ? created : (ts > 0 ? ts : r.header.created_at_ns);
    b->reqs.push_back(std::move(r));
    b->seqs.push_back(std::to_string(seq));
    b->known_dup.push_back(0);
  }
}

// Store the new messages of `b` and the mark W in one transaction (skipping
// sequences `seen` already holds). Sets *wrote when a transaction ran.
Status store_in_batch(DurableStore& store, InMirror& m, InBatch& b, bool* wrote) {
  b.dup.assign(b.reqs.size(), 0);
  const bool any_new = std::find(b.known_dup.begin(), b.known_dup.end(), 0) != b.known_dup.end();
  *wrote = any_new || (!b.reqs.empty() && b.through != m.stored_through);
  if (!*wrote) return Status();
  return store.write([&](StoreTxn& t) -> Status {
    std::fill(b.dup.begin(), b.dup.end(), 0);  // the store may run this again (map growth)
    for (std::size_t i = 0; i < b.reqs.size(); ++i) {
      if (b.known_dup[i]) {
        b.dup[i] = 1;
        continue;
      }
      auto rec = m.seen->status_in(t, b.seqs[i]);
      if (rec.ok() && rec->state == ClaimState::Done) {
        b.dup[i] = 1;
        continue;
      }
      if (!rec.ok() && rec.code() != Code::NotFound) return rec.status();
      auto a = t.append(b.reqs[i]);
      if (!a.ok()) return a.status();
      Status c = m.seen->complete_in(t, b.seqs[i], {}, false);
      if (!c.ok()) return c;
    }
    if (b.through != m.stored_through || !m.have_mark) return t.put(StoreTable::User, m.mark_key, le64(b.through));
    return Status();
  });
}

// The tracer's end of the batch's Publish spans: Ok once stored (or known
// stored already), else Failed with the store's status.
void end_in_spans(Tracer* tracer, InBatch& b, const Status& stored) {
  if (tracer == nullptr) return;
  const SpanEnd e{stored.ok() ? SpanOutcome::Ok : SpanOutcome::Failed, stored};
  for (const InBatch::Span& s : b.spans) tracer->end(s.info, s.span, e);
  b.spans.clear();
}

// After the store: count and ack the first `take` messages of `list`.
void ack_in_batch(InMirror& m, const natsMsgList& list, const InBatch& b) {
  for (int i = 0; i < b.take; ++i) {
    if (b.dup[static_cast<std::size_t>(i)]) {
      m.duplicates.fetch_add(1, std::memory_order_relaxed);
    } else {
      m.stored.fetch_add(1, std::memory_order_relaxed);
    }
    if (natsMsg_Ack(list.Msgs[i], nullptr) == NATS_OK) m.acked.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace

void BridgeImpl::run_in(InMirror* m) {
  std::int64_t backoff = ms_to_ns(options_.backoff_initial);
  InBatch batch;
  while (true) {
    {
      std::lock_guard<std::mutex> l(stop_mu_);
      if (stopping_) break;
    }
    if (m->sub == nullptr) {
      if (!connected()) {
        sleep_backoff(backoff);
        continue;
      }
      Status s = bind_in(*m);
      if (!s.ok()) {
        // Not fatal here: the stream may be created later (by an out-mirror).
        note_error(s.message(), false);
        sleep_backoff(backoff);
        continue;
      }
    }
    natsMsgList list{nullptr, 0};
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus st = natsSubscription_Fetch(&list, m->sub, static_cast<int>(options_.fetch_batch), kFetchWaitMs, &jerr);
    if (st == NATS_TIMEOUT && list.Count == 0) {
      backoff = ms_to_ns(options_.backoff_initial);
      continue;  // nothing new
    }
    if (st != NATS_OK && list.Count == 0) {
      note_error("bridge: fetch from \"" + m->stream + "\"/\"" + m->consumer + "\": " + nats_text(st, jerr), false);
      if (st == NATS_CONNECTION_CLOSED || st == NATS_INVALID_SUBSCRIPTION || st == NATS_NOT_FOUND) {
        natsSubscription_Destroy(m->sub);
        m->sub = nullptr;
      }
      sleep_backoff(backoff);
      continue;
    }
    Tracer* tracer = core_->options.tracer;
    plan_in_batch(*m, list, tracer, &batch);
    bool wrote = false;
    Status cs = store_in_batch(*core_->store(), *m, batch, &wrote);
    end_in_spans(tracer, batch, cs);
    if (!cs.ok()) {
      // Not acked: JetStream redelivers after ack_wait; with the guard on, the
      // consumer is rewound to W + 1 instead, so the order holds.
      note_error("bridge: storing messages of \"" + m->stream + "\" in \"" + m->topic->name + "\": " + cs.to_string(),
                 false);
      natsMsgList_Destroy(&list);
      if (m->guard) {
        m->rewind = true;
        natsSubscription_Destroy(m->sub);
        m->sub = nullptr;
      }
      sleep_backoff(backoff);
      continue;
    }
    if (wrote) m->have_mark = true;
    m->stored_through = batch.through;
    m->next_dseq = batch.next_dseq;
    ack_in_batch(*m, list, batch);
    natsMsgList_Destroy(&list);
    if (batch.anomaly) {
      // A delivery went elsewhere (or came back out of order): store nothing
      // past W until the consumer is re-created at W + 1.
      m->rewind = true;
      natsSubscription_Destroy(m->sub);
      m->sub = nullptr;
    }
    backoff = ms_to_ns(options_.backoff_initial);
  }
  if (m->sub != nullptr) {
    natsSubscription_Destroy(m->sub);
    m->sub = nullptr;
  }
}

Status BridgeImpl::mirror_in(std::string_view stream, std::string_view consumer, TopicImpl* t) {
  if (closing_.load()) return Status(Code::ShutDown, "bridge: closed");
  if (t == nullptr || t->bus != core_.get() || !t->durable || t->is_queue)
    return Status(Code::InvalidArgument, "bridge: mirror_in needs a durable topic of the bridge's bus");
  if (Status s = check_stream_name(stream); !s.ok()) return s;
  if (Status s = check_stream_name(consumer); !s.ok()) return s;
  auto m = std::make_unique<InMirror>();
  m->bridge = this;
  m->topic = t;
  m->stream.assign(stream);
  m->consumer.assign(consumer);
  {
    std::lock_guard<std::mutex> l(mirrors_mu_);
    for (const auto& x : ins_)
      if (x->stream == m->stream && x->consumer == m->consumer)
        return Status(Code::Conflict, "bridge: consumer \"" + m->consumer + "\" of stream \"" + m->stream +
                                          "\" is already mirrored");
  }
  IdempotencyOptions io;
  io.durable_retention = options_.dedup_retention;
  io.hot_capacity = 1024;
  auto table = core_->idempotency("bridge-in." + name_segment(stream) + "." + name_segment(consumer), io);
  if (!table.ok()) return table.status();
  m->seen = detail::Access::impl(**table);
  auto mk = user_key_public("bridge", "in-mark/" + m->stream + "/" + m->consumer);
  if (!mk.ok()) return mk.status();
  m->mark_key = std::move(*mk);
  if (connected()) {
    Status s = bind_in(*m);
    if (s.code() == Code::NotFound || s.code() == Code::InvalidArgument) return s;
  }
  InMirror* mp = m.get();
  m->thread = std::thread([this, mp] { run_in(mp); });
  std::lock_guard<std::mutex> l(mirrors_mu_);
  ins_.push_back(std::move(m));
  return Status();
}

BridgeStats BridgeImpl::snapshot(const BusStats& bus) const {
  BridgeStats out;
  out.name = options_.name;
  out.state = current_state();
  {
    std::lock_guard<std::mutex> l(err_mu_);
    out.last_error = last_error_;
    out.last_error_ns = last_error_ns_;
  }
  out.reconnects = reconnects_.load(std::memory_order_relaxed);
  auto add = [&](const BridgeMirrorStats& s) {
    out.total.published += s.published;
    out.total.acked += s.acked;
    out.total.duplicates += s.duplicates;
    out.total.redelivered += s.redelivered;
    out.total.stored += s.stored;
    out.total.dead_lettered += s.dead_lettered;
    out.total.lag += s.lag;
    out.total.rewinds += s.rewinds;
    out.mirrors.push_back(s);
  };
  std::lock_guard<std::mutex> l(mirrors_mu_);
  for (const auto& m : outs_) {
    BridgeMirrorStats s;
    s.direction = "out";
    s.topic = m->topic->name;
    s.stream = m->stream;
    s.via = m->tmpl;
    s.published = m->published.load(std::memory_order_relaxed);
    s.acked = m->acked.load(std::memory_order_relaxed);
    s.duplicates = m->duplicates.load(std::memory_order_relaxed);
    s.dead_lettered = m->dead_lettered.load(std::memory_order_relaxed);
    for (const TopicStats& ts : bus.topics) {
      if (ts.name != m->topic->name) continue;
      for (const GroupStats& gs : ts.groups)
        if (ts.is_queue || gs.name == m->group) s.lag = gs.total.in_flight;
    }
    add(s);
  }
  for (const auto& m : ins_) {
    BridgeMirrorStats s;
    s.direction = "in";
    s.topic = m->topic->name;
    s.stream = m->stream;
    s.via = m->consumer;
    s.acked = m->acked.load(std::memory_order_relaxed);
    s.duplicates = m->duplicates.load(std::memory_order_relaxed);
    s.redelivered = m->redelivered.load(std::memory_order_relaxed);
    s.stored = m->stored.load(std::memory_order_relaxed);
    s.lag = m->pending.load(std::memory_order_relaxed);
    s.rewinds = m->rewinds.load(std::memory_order_relaxed);
    add(s);
  }
  return out;
}

Status BridgeImpl::close() {
  if (closed_) return Status();
  closed_ = true;
  closing_.store(true, std::memory_order_release);
  if (stats_id_ != 0) core_->remove_bridge_stats(stats_id_);
  {
    std::lock_guard<std::mutex> l(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (status_thread_.joinable()) {
    status_thread_.join();
    write_status(true);
  }
  std::vector<std::unique_ptr<OutMirror>> outs;
  std::vector<std::unique_ptr<InMirror>> ins;
  {
    std::lock_guard<std::mutex> l(mirrors_mu_);
    outs.swap(outs_);
    ins.swap(ins_);
  }
  Status first;
  for (auto& m : outs) {
    Status s = m->sub.close();
    if (!s.ok() && first.ok()) first = s;
    for (LaneWindow& lw : m->lanes)
      if (lw.replies != nullptr) natsSubscription_Destroy(lw.replies);
  }
  for (auto& m : ins)
    if (m->thread.joinable()) m->thread.join();
  if (nc_ != nullptr) {
    (void)natsConnection_FlushTimeout(nc_, 1000);  // the last acks of the in-mirrors
    natsConnection_Close(nc_);
    // Callbacks (disconnected, closed) run on nats.c's callback thread and use
    // `this`: wait for the closed callback, the last one.
    std::unique_lock<std::mutex> l(stop_mu_);
    stop_cv_.wait_for(l, std::chrono::seconds(10), [&] { return closed_cb_; });
  }
  if (js_ != nullptr) jsCtx_Destroy(js_);
  js_ = nullptr;
  if (nc_ != nullptr) natsConnection_Destroy(nc_);
  nc_ = nullptr;
  if (nopts_ != nullptr) natsOptions_Destroy(nopts_);
  nopts_ = nullptr;
  return first;
}

}  // namespace detail

// ---------------------------------------------------------------- public API

Bridge::Bridge(std::unique_ptr<detail::BridgeImpl> impl) noexcept : impl_(std::move(impl)) {}

Bridge::~Bridge() {
  if (impl_) (void)impl_->close();
}

Result<std::unique_ptr<Bridge>> Bridge::open(Bus& bus, const BridgeOptions& options) {
  auto impl = std::make_unique<detail::BridgeImpl>(bus.core_, &bus, options);
  Status s = impl->open();
  if (!s.ok()) return s;
  return std::unique_ptr<Bridge>(new Bridge(std::move(impl)));
}

Status Bridge::mirror_out(const Topic& topic, std::string_view subject_template, std::string_view stream,
                          const MirrorOutOptions& options) {
  return impl_->mirror_out(topic, topic.impl_, subject_template, stream, options);
}

Status Bridge::mirror_in(std::string_view stream, std::string_view consumer, const Topic& topic) {
  return impl_->mirror_in(stream, consumer, topic.impl_);
}

BridgeStats Bridge::stats() const {
  BusStats bs = impl_->core()->stats();
  return impl_->snapshot(bs);
}

Status Bridge::close() { return impl_->close(); }

}  // namespace lanebus
