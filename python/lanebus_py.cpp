// lanebus — MIT License.
// The Python binding (`import lanebus`, pybind11): a thin layer over the public
// C++ API (include/lanebus/), documented in python/README.md.
//
// Invariants (the GIL and lifetimes):
// 1. Every call that can block — publish (a durable publish waits for its
//    fsync), create_*, subscribe/consume, unsubscribe, close, DLQ and stats
//    reads, serve — releases the GIL while the bus works, so Python handlers
//    (which take the GIL) and other Python threads run meanwhile. Closing a
//    subscription waits for its running handler, which may be waiting for
//    the GIL: holding it there would deadlock.
// 2. A handler runs on a bus worker thread; it takes the GIL for the call
//    only. Its return value and any exception are turned into an Outcome with
//    the GIL held; an exception never escapes into the bus (it is a retry
//    whose reason names it).
// 3. A Python callable is owned by its SubState (a py::object) and only ever
//    released with the GIL held, after the C++ subscription is closed (no call
//    runs or starts afterwards). The C++ handler refers to the SubState by a
//    raw pointer, valid for the same reason.
// 4. The C++ Bus lives in a BusState shared by every Python object made from
//    it (Bus, Topic, Subscription, MetricsServer), so a Topic kept after
//    close() is safe: its calls raise ShutDown. BusState's destructor, and an
//    atexit hook for buses never closed, close the bus before the interpreter
//    goes away (a worker must never wait for the GIL of a finalized
//    interpreter).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "lanebus/lanebus.hpp"
#include "lanebus/metrics_server.hpp"
#include "lanebus/version.hpp"

namespace py = pybind11;
using lanebus::Code;
using lanebus::Status;

namespace {

// ---------------------------------------------------------------- errors

PyObject* g_error = nullptr;  // lanebus.Error

/// Raise lanebus.Error carrying the Status: str(e) is Status::to_string()
/// ("InvalidArgument: publish: empty payload"), e.code its code's name.
[[noreturn]] void raise(const Status& status) {
  py::object error = py::reinterpret_borrow<py::object>(g_error)(status.to_string());
  error.attr("code") = lanebus::to_string(status.code());
  PyErr_SetObject(g_error, error.ptr());
  throw py::error_already_set();
}

void check(const Status& status) {
  if (!status.ok()) raise(status);
}

template <typename T>
T take(lanebus::Result<T>&& result) {
  if (!result.ok()) raise(result.status());
  return std::move(result).value();
}

/// bytes or str (UTF-8) as a byte string; None as "". Anything else is a TypeError.
std::string to_bytes(const py::handle& value, const char* what) {
  if (value.is_none()) return {};
  if (py::isinstance<py::bytes>(value)) return value.cast<std::string>();
  if (py::isinstance<py::str>(value)) return value.cast<std::string>();
  if (py::isinstance<py::bytearray>(value) || py::isinstance<py::memoryview>(value))
    return py::bytes(py::reinterpret_borrow<py::object>(value)).cast<std::string>();
  throw py::type_error(std::string(what) + " must be bytes or str, not " +
                       std::string(py::str(value.get_type().attr("__name__"))));
}

// ---------------------------------------------------------------- state

struct BusState;

/// One subscription: the C++ Subscription and the Python callable it calls.
struct SubState {
  lanebus::Subscription subscription;
  py::object callable;  // released with the GIL held, after `subscription` is closed
  std::weak_ptr<BusState> owner;
  std::string description;

  /// Close the C++ subscription (GIL released: a running handler may wait for it).
  Status close() {
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = subscription.close();
    }
    return s;
  }
  ~SubState() {
    if (subscription.active() && Py_IsInitialized() != 0) (void)close();
  }
};

struct ServerState {
  std::unique_ptr<lanebus::MetricsServer> server;
  void stop() {
    if (!server) return;
    py::gil_scoped_release unlocked;
    server->stop();
  }
};

std::mutex g_open_mu;
std::set<BusState*> g_open;  // buses not yet closed, for the atexit hook

struct BusState {
  std::unique_ptr<lanebus::Bus> bus;
  std::string name;
  bool closed = false;
  // Touched with the GIL held only.
  std::vector<std::shared_ptr<SubState>> subs;
  std::vector<std::shared_ptr<ServerState>> servers;

  BusState() = default;
  BusState(const BusState&) = delete;
  BusState& operator=(const BusState&) = delete;

  /// Stop the metrics servers, drain the bus (handlers keep running, taking
  /// the GIL), then close the subscriptions and free the callables.
  /// Idempotent. REQUIRES: the GIL is held.
  Status close(std::chrono::milliseconds timeout) {
    if (closed || !bus) return Status();
    for (auto& server : servers) server->stop();
    servers.clear();
    Status status;
    {
      py::gil_scoped_release unlocked;
      status = bus->shutdown(lanebus::ShutdownMode::Drain, timeout);
    }
    if (status.code() == Code::Busy) return status;  // called from a handler: nothing changed
    closed = true;
    {
      std::lock_guard lock(g_open_mu);
      g_open.erase(this);
    }
    std::vector<std::shared_ptr<SubState>> left;
    left.swap(subs);
    for (auto& sub : left) (void)sub->close();
    left.clear();  // drops the callables, GIL held
    return status;
  }

  ~BusState() {
    if (!closed && Py_IsInitialized() != 0) (void)close(std::chrono::seconds(5));
    std::lock_guard lock(g_open_mu);
    g_open.erase(this);
  }
};

/// The atexit hook: close every bus still open while the interpreter works.
void close_all_at_exit() {
  std::vector<BusState*> open;
  {
    std::lock_guard lock(g_open_mu);
    open.assign(g_open.begin(), g_open.end());
  }
  for (BusState* b : open) (void)b->close(std::chrono::seconds(5));
}

// ---------------------------------------------------------------- Python-side types

/// What a handler returns besides None (ack): lanebus.retry(reason) or lanebus.reject(reason).
struct PyOutcome {
  lanebus::Outcome::Kind kind = lanebus::Outcome::Kind::Ack;
  std::string reason;
};

/// A delivered message, copied out of the bus (valid after the handler returns).
struct PyMessage {
  py::bytes payload;
  py::bytes key;
  py::bytes idempotency_key;
  std::uint64_t id = 0;
  std::int64_t created_at_ns = 0;
  std::uint64_t correlation_id = 0;
  std::uint32_t attempt = 0;
  std::uint32_t lane = 0;
  std::uint64_t offset = 0;
  std::string topic;
  /// The message headers (doc/tracing.md), name -> value, in publish order.
  py::dict headers;
};

struct PyTopic {
  std::shared_ptr<BusState> state;
  lanebus::Topic topic;

  void publish(const py::object& payload, const py::object& key, const py::object& idempotency_key,
               std::uint64_t correlation_id, const py::object& headers) const {
    const std::string p = to_bytes(payload, "payload");
    const std::string k = to_bytes(key, "key");
    const std::string ik = to_bytes(idempotency_key, "idempotency_key");
    lanebus::OutgoingMessage m;
    m.payload = p;
    m.key = k;
    m.idempotency_key = ik;
    m.correlation_id = correlation_id;
    // Headers: a mapping of str/bytes to str/bytes (doc/tracing.md); the
    // library checks the limits and rules.
    std::vector<std::string> texts;
    std::vector<lanebus::Header> hs;
    if (!headers.is_none()) {
      const py::dict d = py::dict(headers);
      texts.reserve(2 * d.size());
      for (auto item : d) {
        texts.push_back(to_bytes(py::reinterpret_borrow<py::object>(item.first), "header name"));
        texts.push_back(to_bytes(py::reinterpret_borrow<py::object>(item.second), "header value"));
      }
      for (std::size_t i = 0; i + 1 < texts.size(); i += 2) hs.push_back({texts[i], texts[i + 1]});
      m.headers = hs;
    }
    Status s;
    {
      py::gil_scoped_release unlocked;
      s = topic.publish(m);
    }
    check(s);
  }
};

struct PySubscription {
  std::shared_ptr<SubState> sub;

  void close() {
    if (!sub->subscription.active()) return;
    check(sub->close());
    if (auto owner = sub->owner.lock()) {
      auto& v = owner->subs;
      v.erase(std::remove(v.begin(), v.end(), sub), v.end());
    }
  }
};

struct PyServer {
  std::shared_ptr<BusState> state;  // the bus outlives its server
  std::shared_ptr<ServerState> server;
  std::uint16_t port() const { return server->server ? server->server->port() : 0; }
  std::string url() const { return server->server ? server->server->url() : std::string(); }
  void stop() { server->stop(); }
};

// ---------------------------------------------------------------- handlers

/// Call the Python callable for one message. Runs on a bus worker thread.
lanebus::Outcome call_python(SubState* sub, std::string_view topic, const lanebus::MessageView& m) {
  py::gil_scoped_acquire locked;
  try {
    PyMessage msg;
    msg.payload = py::bytes(m.payload().data(), m.payload().size());
    msg.key = py::bytes(m.key().data(), m.key().size());
    msg.idempotency_key = py::bytes(m.idempotency_key().data(), m.idempotency_key().size());
    msg.id = m.id();
    msg.created_at_ns = m.created_at_ns();
    msg.correlation_id = m.correlation_id();
    msg.attempt = m.attempt();
    msg.lane = m.lane();
    msg.offset = m.offset();
    msg.topic = std::string(topic);
    for (lanebus::Header h : m.headers())
      msg.headers[py::str(std::string(h.name))] = py::bytes(h.value.data(), h.value.size());
    py::object result = sub->callable(std::move(msg));
    if (result.is_none() || (py::isinstance<py::bool_>(result) && result.cast<bool>()))
      return lanebus::Outcome::ack();
    if (py::isinstance<PyOutcome>(result)) {
      const auto& o = result.cast<const PyOutcome&>();
      switch (o.kind) {
        case lanebus::Outcome::Kind::Ack:
          return lanebus::Outcome::ack();
        case lanebus::Outcome::Kind::Retry:
          return lanebus::Outcome::retry(o.reason.empty() ? "the Python handler returned retry" : o.reason);
        case lanebus::Outcome::Kind::Reject:
          return lanebus::Outcome::reject(o.reason.empty() ? "the Python handler returned reject" : o.reason);
      }
    }
    const std::string type = py::str(result.get_type().attr("__name__"));
    return lanebus::Outcome::reject("the Python handler returned a " + type +
                                    " (expected None, True, lanebus.ack(), retry() or reject())");
  } catch (py::error_already_set& e) {
    // An exception in the callable: a transient failure (retried up to
    // max_attempts, then to the DLQ), as a C++ handler's exception is.
    std::string reason = "exception: " + std::string(py::str(e.type().attr("__name__")));
    const std::string text = py::str(e.value());
    if (!text.empty()) reason += ": " + text;
    return lanebus::Outcome::retry(reason);
  } catch (const std::exception& e) {
    return lanebus::Outcome::retry(std::string("exception: ") + e.what());
  }
}

lanebus::GroupOptions group_options(std::uint32_t max_attempts, std::uint32_t backoff_ms, double visibility_s,
                                    const std::string& start) {
  lanebus::GroupOptions o;
  if (max_attempts == 0) raise(Status(Code::InvalidArgument, "max_attempts must be at least 1"));
  o.max_attempts = max_attempts;
  o.backoff_initial = std::chrono::milliseconds(backoff_ms);
  if (!(visibility_s > 0)) raise(Status(Code::InvalidArgument, "visibility must be > 0 seconds"));
  o.visibility = std::chrono::milliseconds(static_cast<std::int64_t>(visibility_s * 1000));
  if (start == "earliest")
    o.start = lanebus::StartPosition::earliest();
  else if (start == "latest")
    o.start = lanebus::StartPosition::latest();
  else
    raise(Status(Code::InvalidArgument, "start must be \"earliest\" or \"latest\", not \"" + start + "\""));
  return o;
}

// ---------------------------------------------------------------- the Bus

struct PyBus {
  std::shared_ptr<BusState> state;

  lanebus::Bus& bus() const {
    if (state->closed) raise(Status(Code::ShutDown, "bus \"" + state->name + "\" is closed"));
    return *state->bus;
  }

  PyTopic create(const std::string& name, std::uint32_t lanes, bool durable, bool queue) {
    lanebus::TopicOptions o;
    o.lanes = lanes;
    o.durable = durable;
    lanebus::Bus& b = bus();
    lanebus::Result<lanebus::Topic> t(Code::Internal, "not run");
    {
      py::gil_scoped_release unlocked;
      t = queue ? b.create_queue(name, o) : b.create_topic(name, o);
    }
    return PyTopic{state, take(std::move(t))};
  }

  PyTopic find(const std::string& name) { return PyTopic{state, take(bus().find(name))}; }

  PySubscription attach(const PyTopic& topic, const std::string& group, const py::object& handler,
                        const lanebus::GroupOptions& options, bool queue) {
    if (!PyCallable_Check(handler.ptr())) throw py::type_error("handler must be callable");
    if (topic.state != state) raise(Status(Code::InvalidArgument, "the topic belongs to another bus"));
    lanebus::Bus& b = bus();
    auto sub = std::make_shared<SubState>();
    sub->callable = handler;
    sub->owner = state;
    SubState* raw = sub.get();
    const std::string topic_name(topic.topic.name());
    lanebus::Handler h = [raw, topic_name](const lanebus::MessageView& m) { return call_python(raw, topic_name, m); };
    lanebus::Result<lanebus::Subscription> s(Code::Internal, "not run");
    {
      py::gil_scoped_release unlocked;
      s = queue ? b.consume(topic.topic, std::move(h), options) : b.subscribe(topic.topic, group, std::move(h), options);
    }
    sub->subscription = take(std::move(s));
    state->subs.push_back(sub);
    return PySubscription{sub};
  }

  lanebus::DeadLetters* dlq() { return take(bus().dead_letters()); }

  py::list dead_letters(const std::optional<std::string>& topic, const std::optional<std::string>& group,
                        const std::optional<std::string>& state_name, std::uint32_t limit) {
    lanebus::DlqFilter f;
    f.topic = topic;
    f.group = group;
    if (state_name) {
      auto s = lanebus::parse_dlq_state(*state_name);
      if (!s)
        raise(Status(Code::InvalidArgument,
                     "state must be \"pending\", \"replayed\" or \"archived\", not \"" + *state_name + "\""));
      f.state = *s;
    }
    f.limit = limit;
    lanebus::DeadLetters* d = dlq();
    lanebus::Result<std::vector<lanebus::DlqEntry>> entries(Code::Internal, "not run");
    {
      py::gil_scoped_release unlocked;
      entries = d->list(f);
    }
    py::list out;
    for (lanebus::DlqEntry& e : take(std::move(entries))) out.append(py::cast(std::move(e)));
    return out;
  }

  std::uint64_t replay(const std::vector<std::uint64_t>& ids, const std::string& operator_name) {
    lanebus::DeadLetters* d = dlq();
    lanebus::Result<std::uint64_t> n(Code::Internal, "not run");
    {
      py::gil_scoped_release unlocked;
      n = d->replay(ids, operator_name);
    }
    return take(std::move(n));
  }

  std::string stats_json() {
    lanebus::Bus& b = bus();
    std::string text;
    Status s;
    {
      py::gil_scoped_release unlocked;
      auto monitor = lanebus::Monitor::create(b);
      if (!monitor.ok()) {
        s = monitor.status();
      } else if (s = (*monitor)->sample(); s.ok()) {
        text = (*monitor)->json();
      }
    }
    check(s);
    return text;
  }

  PyServer serve(const std::string& listen, double sample_interval_s) {
    if (!(sample_interval_s > 0)) raise(Status(Code::InvalidArgument, "sample_interval must be > 0 seconds"));
    lanebus::MetricsServerOptions o;
    o.listen = listen;
    o.sample_interval = std::chrono::milliseconds(std::max<std::int64_t>(1, static_cast<std::int64_t>(sample_interval_s * 1000)));
    lanebus::Bus& b = bus();
    lanebus::Result<std::unique_ptr<lanebus::MetricsServer>> started(Code::Internal, "not run");
    {
      py::gil_scoped_release unlocked;
      started = lanebus::MetricsServer::start(b, o);
    }
    auto server = std::make_shared<ServerState>();
    server->server = take(std::move(started));
    state->servers.push_back(server);
    return PyServer{state, server};
  }

  void close(double timeout_s) {
    if (state->closed) return;
    check(state->close(std::chrono::milliseconds(static_cast<std::int64_t>(timeout_s * 1000))));
  }
};

PyBus open_bus(const std::optional<std::string>& directory, const std::string& name, std::size_t workers,
               const std::string& durability) {
  lanebus::BusOptions o;
  o.name = name;
  o.workers = workers;
  if (directory) {
    if (directory->empty()) raise(Status(Code::InvalidArgument, "directory must not be empty (None: in memory)"));
    o.store.directory = *directory;
  }
  if (durability == "sync")
    o.store.durability = lanebus::Durability::Sync;
  else if (durability == "async")
    o.store.durability = lanebus::Durability::Async;
  else
    raise(Status(Code::InvalidArgument, "durability must be \"sync\" or \"async\", not \"" + durability + "\""));
  lanebus::Result<std::unique_ptr<lanebus::Bus>> opened(Code::Internal, "not run");
  {
    py::gil_scoped_release unlocked;
    opened = lanebus::Bus::open(o);
  }
  std::unique_ptr<lanebus::Bus> bus = take(std::move(opened));
  auto state = std::make_shared<BusState>();
  state->bus = std::move(bus);
  state->name = name;
  {
    std::lock_guard lock(g_open_mu);
    g_open.insert(state.get());
  }
  return PyBus{state};
}

py::bytes as_bytes(const std::string& s) { return py::bytes(s.data(), s.size()); }

}  // namespace

PYBIND11_MODULE(lanebus, m) {
  m.doc() = "lanebus: an embedded event bus (topics, queues, durable LMDB stores, DLQ). See python/README.md.";
  m.attr("__version__") = LANEBUS_VERSION_STRING;

  static py::exception<std::exception> error(m, "Error");
  g_error = error.ptr();
  error.attr("code") = py::none();
  error.doc() = "A lanebus call failed: str(e) is the Status (\"<Code>: <message>\"), e.code the code's name.";

  py::class_<PyOutcome>(m, "Outcome")
      .def_property_readonly("kind",
                             [](const PyOutcome& o) {
                               return o.kind == lanebus::Outcome::Kind::Ack     ? "ack"
                                      : o.kind == lanebus::Outcome::Kind::Retry ? "retry"
                                                                                : "reject";
                             })
      .def_readonly("reason", &PyOutcome::reason);
  m.def("ack", [] { return PyOutcome{}; }, "The handler's message is done (the same as returning None).");
  m.def("retry", [](const std::string& reason) { return PyOutcome{lanebus::Outcome::Kind::Retry, reason}; },
        py::arg("reason") = "", "A transient failure: deliver again, up to max_attempts, then to the DLQ.");
  m.def("reject", [](const std::string& reason) { return PyOutcome{lanebus::Outcome::Kind::Reject, reason}; },
        py::arg("reason") = "", "A permanent failure: to the DLQ at once (with a store).");

  py::class_<PyMessage>(m, "Message")
      .def_readonly("payload", &PyMessage::payload)
      .def_readonly("key", &PyMessage::key)
      .def_readonly("idempotency_key", &PyMessage::idempotency_key)
      .def_readonly("id", &PyMessage::id)
      .def_readonly("created_at_ns", &PyMessage::created_at_ns)
      .def_readonly("correlation_id", &PyMessage::correlation_id)
      .def_readonly("attempt", &PyMessage::attempt)
      .def_readonly("lane", &PyMessage::lane)
      .def_readonly("offset", &PyMessage::offset)
      .def_readonly("topic", &PyMessage::topic)
      .def_readonly("headers", &PyMessage::headers)
      .def("__repr__", [](const PyMessage& msg) {
        return "<lanebus.Message " + msg.topic + " id=" + std::to_string(msg.id) +
               " lane=" + std::to_string(msg.lane) + " attempt=" + std::to_string(msg.attempt) + ">";
      });

  py::class_<lanebus::DlqEntry>(m, "DeadLetter")
      .def_readonly("id", &lanebus::DlqEntry::id)
      .def_property_readonly("state", [](const lanebus::DlqEntry& e) { return lanebus::to_string(e.state); })
      .def_property_readonly("error_class", [](const lanebus::DlqEntry& e) { return lanebus::to_string(e.error_class); })
      .def_readonly("topic", &lanebus::DlqEntry::topic)
      .def_readonly("group", &lanebus::DlqEntry::group)
      .def_readonly("reason", &lanebus::DlqEntry::reason)
      .def_property_readonly("key", [](const lanebus::DlqEntry& e) { return as_bytes(e.key); })
      .def_property_readonly("payload", [](const lanebus::DlqEntry& e) { return as_bytes(e.payload); })
      .def_readonly("attempts", &lanebus::DlqEntry::attempts)
      .def_readonly("lane", &lanebus::DlqEntry::lane)
      .def_readonly("offset", &lanebus::DlqEntry::offset)
      .def_readonly("dead_at_ns", &lanebus::DlqEntry::dead_at_ns)
      .def_property_readonly("headers", [](const lanebus::DlqEntry& e) {
        py::dict d;  // the message's headers, name -> value (doc/tracing.md); a replay publishes them again
        for (lanebus::Header h : lanebus::HeadersView(e.headers))
          d[py::str(std::string(h.name))] = py::bytes(h.value.data(), h.value.size());
        return d;
      })
      .def("__repr__", [](const lanebus::DlqEntry& e) {
        return "<lanebus.DeadLetter " + std::to_string(e.id) + " " + e.topic + "/" + e.group + " " +
               lanebus::to_string(e.error_class) + " " + lanebus::to_string(e.state) + ": " + e.reason + ">";
      });

  py::class_<PyTopic>(m, "Topic")
      .def_property_readonly("name", [](const PyTopic& t) { return std::string(t.topic.name()); })
      .def_property_readonly("lanes", [](const PyTopic& t) { return t.topic.lanes(); })
      .def_property_readonly("is_queue", [](const PyTopic& t) { return t.topic.is_queue(); })
      .def_property_readonly("durable", [](const PyTopic& t) { return t.topic.is_durable(); })
      .def("publish", &PyTopic::publish, py::arg("payload"), py::kw_only(), py::arg("key") = py::none(),
           py::arg("idempotency_key") = py::none(), py::arg("correlation_id") = 0, py::arg("headers") = py::none(),
           "Publish one message (payload and key: bytes or str, UTF-8; headers: a dict of str/bytes, doc/tracing.md). "
           "Blocks, GIL released, while the topic is full (up to 1 s) or, durable, until the commit is fsynced.")
      .def("__repr__", [](const PyTopic& t) {
        return std::string("<lanebus.") + (t.topic.is_queue() ? "Queue " : "Topic ") + std::string(t.topic.name()) +
               " lanes=" + std::to_string(t.topic.lanes()) + (t.topic.is_durable() ? " durable>" : ">");
      });

  py::class_<PySubscription>(m, "Subscription")
      .def("close", &PySubscription::close,
           "Detach; waits (GIL released) for a running handler call. No call starts afterwards. Idempotent.")
      .def_property_readonly("active", [](const PySubscription& s) { return s.sub->subscription.active(); })
      .def("__enter__", [](PySubscription& s) { return s; })
      .def("__exit__", [](PySubscription& s, const py::args&) { s.close(); });

  py::class_<PyServer>(m, "MetricsServer")
      .def_property_readonly("port", &PyServer::port)
      .def_property_readonly("url", &PyServer::url)
      .def("stop", &PyServer::stop)
      .def("__enter__", [](PyServer& s) { return s; })
      .def("__exit__", [](PyServer& s, const py::args&) { s.stop(); });

  py::class_<PyBus>(m, "Bus")
      .def("create_topic",
           [](PyBus& b, const std::string& name, std::uint32_t lanes, bool durable) {
             return b.create(name, lanes, durable, false);
           },
           py::arg("name"), py::kw_only(), py::arg("lanes") = 8, py::arg("durable") = false)
      .def("create_queue",
           [](PyBus& b, const std::string& name, std::uint32_t lanes, bool durable) {
             return b.create(name, lanes, durable, true);
           },
           py::arg("name"), py::kw_only(), py::arg("lanes") = 8, py::arg("durable") = false)
      .def("find", &PyBus::find, py::arg("name"))
      .def("subscribe",
           [](PyBus& b, const PyTopic& topic, const std::string& group, const py::object& handler,
              std::uint32_t max_attempts, std::uint32_t backoff_ms, const std::string& start) {
             return b.attach(topic, group, handler, group_options(max_attempts, backoff_ms, 30.0, start), false);
           },
           py::arg("topic"), py::arg("group"), py::arg("handler"), py::kw_only(), py::arg("max_attempts") = 3,
           py::arg("backoff_ms") = 0, py::arg("start") = "earliest")
      .def("consume",
           [](PyBus& b, const PyTopic& queue, const py::object& handler, std::uint32_t max_attempts,
              std::uint32_t backoff_ms, double visibility) {
             return b.attach(queue, "", handler, group_options(max_attempts, backoff_ms, visibility, "earliest"), true);
           },
           py::arg("queue"), py::arg("handler"), py::kw_only(), py::arg("max_attempts") = 3,
           py::arg("backoff_ms") = 0, py::arg("visibility") = 30.0)
      .def("dead_letters", &PyBus::dead_letters, py::kw_only(), py::arg("topic") = py::none(),
           py::arg("group") = py::none(), py::arg("state") = py::none(), py::arg("limit") = 0)
      .def("replay", &PyBus::replay, py::arg("ids"), py::kw_only(), py::arg("operator") = "python")
      .def("stats_json", &PyBus::stats_json)
      .def("stats", [](PyBus& b) { return py::module_::import("json").attr("loads")(b.stats_json()); })
      .def("serve", &PyBus::serve, py::kw_only(), py::arg("listen") = "127.0.0.1:9464",
           py::arg("sample_interval") = 1.0)
      .def("close", &PyBus::close, py::kw_only(), py::arg("timeout") = 5.0)
      .def_property_readonly("closed", [](const PyBus& b) { return b.state->closed; })
      .def_property_readonly("name", [](const PyBus& b) { return b.state->name; })
      .def("__enter__", [](PyBus& b) { return b; })
      .def("__exit__", [](PyBus& b, const py::args&) { b.close(5.0); });

  m.def("open", &open_bus, py::arg("directory") = py::none(), py::kw_only(), py::arg("name") = "bus",
        py::arg("workers") = 0, py::arg("durability") = "sync",
        "Open a bus: in memory (directory None) or with the durable LMDB store in `directory`.");
  m.def("version", [] { return std::string(LANEBUS_VERSION_STRING); });

  py::module_::import("atexit").attr("register")(py::cpp_function(&close_all_at_exit));
}
