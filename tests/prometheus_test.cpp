// lanebus — MIT License.
// A real Prometheus server (Debian package prometheus, scripts/deps.sh)
// scrapes, every second, a live bus's MetricsServer (this process, with
// traffic running) and `lanebus serve` on the same store (another process);
// then every query of contrib/grafana/lanebus.json is evaluated through
// Prometheus' HTTP API (/api/v1/query), once per scrape job, and must return
// data: the dashboard's variables are substituted as Grafana would ($topic
// and $group = All, $__rate_interval = 5s) and each metric selector is
// narrowed to the job. The bus job, with traffic flowing, must answer with
// numbers; `lanebus serve` reads the store from outside (handler outcomes and
// latency live in the consuming process), so a NaN quantile from it counts
// as data.
//
// Every child (prometheus, lanebus serve) is killed and reaped on every path:
// a guard object's destructor, and PR_SET_PDEATHSIG for a test that dies.
// No prometheus: exit 77 (skip), or a failure under CI=true.
#include <arpa/inet.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "exposition_check.hpp"
#include "external_tool.hpp"
#include "lanebus/lanebus.hpp"
#include "lanebus/metrics_server.hpp"
#include "process.hpp"
#include "scratch_dir.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
using lanebus::test::Json;

namespace {

/// A child process killed (SIGKILL) and reaped when the guard goes, and
/// killed by the kernel if this process dies first (PR_SET_PDEATHSIG).
/// Its stdout and stderr go to `log`.
class Guarded {
 public:
  Guarded(const std::vector<std::string>& argv, const std::string& log) {
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
      const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Guarded() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
  }
  Guarded(const Guarded&) = delete;
  Guarded& operator=(const Guarded&) = delete;
  pid_t pid() const { return pid_; }
  bool running() const {
    int st = 0;
    return pid_ > 0 && ::waitpid(pid_, &st, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
};

/// GET http://127.0.0.1:port/target (HTTP/1.0): the body of a 200 reply, or "".
std::string http_get(std::uint16_t port, const std::string& target) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string reply;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET " + target + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) reply.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  if (reply.rfind("HTTP/1.", 0) != 0 || reply.find(" 200 ") != 8) return "";
  const std::size_t body = reply.find("\r\n\r\n");
  return body == std::string::npos ? "" : reply.substr(body + 4);
}

std::string url_encode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char hex[4];
      std::snprintf(hex, sizeof hex, "%%%02X", c);
      out += hex;
    }
  }
  return out;
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (std::size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}

/// The query with every lanebus_* selector narrowed to job `job` (a plain
/// scan: std::regex trips GCC 12's -Wmaybe-uninitialized under ASan).
std::string for_job(const std::string& q, const std::string& job) {
  std::string out;
  std::size_t i = 0;
  while (i < q.size()) {
    const std::size_t at = q.find("lanebus_", i);
    if (at == std::string::npos || (at > 0 && (std::isalnum(static_cast<unsigned char>(q[at - 1])) || q[at - 1] == '_'))) {
      const std::size_t stop = at == std::string::npos ? q.size() : at + 1;
      out.append(q, i, stop - i);
      i = stop;
      continue;
    }
    std::size_t end = at;
    while (end < q.size() && (std::isalnum(static_cast<unsigned char>(q[end])) || q[end] == '_')) ++end;
    out.append(q, i, end - i);
    if (end < q.size() && q[end] == '{') {
      out += "{job=\"" + job + "\",";
      ++end;
    } else {
      out += "{job=\"" + job + "\"}";
    }
    i = end;
  }
  return out;
}

struct DashboardQuery {
  std::string title;
  std::string promql;       // variables substituted
  std::string label;        // label_values(...): the label each series must carry; "" otherwise
};

void collect(const Json& j, const std::string& title, std::vector<DashboardQuery>& out) {
  if (const auto* o = std::get_if<Json::Object>(&j.v)) {
    std::string here = title;
    if (auto t = o->find("title"); t != o->end() && std::holds_alternative<std::string>(t->second.v))
      here = t->second.str();
    for (const auto& [k, v] : *o) {
      if ((k == "expr" || k == "definition") && std::holds_alternative<std::string>(v.v)) {
        std::string q = v.str();
        replace_all(q, "$topic", ".*");
        replace_all(q, "$group", ".*");
        replace_all(q, "$__rate_interval", "5s");
        DashboardQuery dq{here, q, ""};
        if (q.rfind("label_values(", 0) == 0) {  // label_values(SELECTOR, LABEL)
          const std::size_t comma = q.rfind(',');
          dq.promql = q.substr(13, comma - 13);
          dq.label = q.substr(comma + 1, q.size() - comma - 2);
          replace_all(dq.label, " ", "");
          dq.title = "variable " + dq.label;
        }
        out.push_back(dq);
      }
      collect(v, here, out);
    }
  } else if (const auto* a = std::get_if<Json::Array>(&j.v)) {
    for (const auto& v : *a) collect(v, title, out);
  }
}

/// The series an instant query returns ("" and the count, or the error).
struct Answer {
  std::size_t series = 0;
  std::size_t numbers = 0;  // series whose value is not NaN
  bool label_ok = false;
  std::string error;
};

Answer evaluate(std::uint16_t port, const DashboardQuery& q, const std::string& promql) {
  Answer a;
  const std::string body = http_get(port, "/api/v1/query?query=" + url_encode(promql));
  if (body.empty()) {
    a.error = "no 200 reply";
    return a;
  }
  std::string error;
  auto j = lanebus::test::parse_json(body, &error);
  if (!j || (*j)["status"].str() != "success") {
    a.error = "bad reply: " + body.substr(0, 300);
    return a;
  }
  const Json& result = (*j)["data"]["result"];
  a.series = result.size();
  for (std::size_t i = 0; i < result.size(); ++i) {
    const auto& metric = std::get<Json::Object>(result[i]["metric"].v);
    if (result[i]["value"][1].str() != "NaN") ++a.numbers;
    if (auto l = metric.find(q.label); !q.label.empty() && l != metric.end() && !l->second.str().empty())
      a.label_ok = true;
  }
  if (q.label.empty()) a.label_ok = true;
  return a;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("a real Prometheus scrapes a live bus and lanebus serve; every Grafana query returns data") {
  std::string prometheus = lanebus::test::find_tool("LANEBUS_PROMETHEUS", "prometheus");
  if (prometheus.empty()) {
    if (lanebus::test::tool_required())
      FAIL("prometheus is not installed (apt-get install prometheus); CI=true makes this a failure");
    MESSAGE("prometheus not found: skipping");
    std::exit(77);
  }
  const char* tool = std::getenv("LANEBUS_TOOL");
  const char* grafana = std::getenv("LANEBUS_GRAFANA_JSON");
  REQUIRE_MESSAGE(tool != nullptr, "LANEBUS_TOOL is not set");
  REQUIRE_MESSAGE(grafana != nullptr, "LANEBUS_GRAFANA_JSON is not set");
  std::string error;
  auto dashboard = lanebus::test::parse_json(read_file(grafana), &error);
  REQUIRE_MESSAGE(dashboard, grafana << ": " << error);
  std::vector<DashboardQuery> queries;
  collect(*dashboard, "", queries);
  REQUIRE(queries.size() >= 20);

  lanebus::test::ScratchDir tmp;
  // The live bus: an in-memory topic and a durable queue (Async: the traffic
  // is not fsync-bound) with handlers that ack, retry, reject and fail.
  BusOptions o = lanebus::test::store_bus(tmp.path);
  o.name = "live";
  o.store.durability = Durability::Async;
  auto bus = Bus::open(o).value();
  auto orders = bus->create_topic("live.orders", {.lanes = 4}).value();
  auto jobs = bus->create_queue("live.jobs", {.lanes = 4, .durable = true}).value();
  auto outcome = [](const MessageView& m) {
    if (m.key() == "reject-me") return Outcome::reject("rejected on purpose");
    if (m.key() == "retry-me" && m.attempt() == 1) return Outcome::retry("once");
    if (m.key() == "fail-me") return Outcome::retry("always");
    return Outcome::ack();
  };
  auto billing = bus->subscribe(orders, "billing", outcome, {.max_attempts = 2}).value();
  auto shipping = bus->subscribe(orders, "shipping", outcome, {.max_attempts = 2}).value();
  auto worker = bus->consume(jobs, outcome, {.max_attempts = 2}).value();

  // Traffic until the end: ~80 % of it on one key (a hot lane), the rest
  // spread, every 25th message one that is rejected, retried or failed.
  std::atomic<bool> stop{false};
  std::thread traffic([&] {
    static const char* keys[] = {"k1", "k2", "k3", "k4", "k5", "reject-me", "retry-me", "fail-me"};
    for (std::uint64_t i = 0; !stop.load(); ++i) {
      const std::string key = i % 25 == 0 ? keys[5 + (i / 25) % 3] : (i % 5 == 0 ? keys[(i / 5) % 5] : "hot");
      const std::string payload = "m" + std::to_string(i);
      (void)orders.publish({.key = key, .payload = payload});
      (void)jobs.publish({.key = key, .payload = payload});
      std::this_thread::sleep_for(2ms);
    }
  });
  struct Joiner {
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, traffic};

  MetricsServerOptions so;
  so.listen = "127.0.0.1:0";
  so.sample_interval = 250ms;
  so.metrics.window = 5s;
  so.metrics.default_sla = SlaPolicy{60s, 0.75, 0ns};
  auto server = MetricsServer::start(*bus, so).value();

  // lanebus serve on the same store, from another process.
  const int serve_port = lanebus::test::free_loopback_port();
  REQUIRE(serve_port > 0);
  Guarded serve({tool, "serve", (tmp.path / "store").string(), "--listen", "127.0.0.1:" + std::to_string(serve_port),
                 "--sla", "60", "--window", "5", "--interval", "0.25"},
                (tmp.path / "serve.log").string());

  const int prom_port_or = lanebus::test::free_loopback_port();
  REQUIRE(prom_port_or > 0);
  const auto prom_port = static_cast<std::uint16_t>(prom_port_or);
  const std::string config = (tmp.path / "prometheus.yml").string();
  std::ofstream(config) << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
                        << "scrape_configs:\n"
                        << "  - job_name: bus\n    static_configs:\n      - targets: ['127.0.0.1:" << server->port()
                        << "']\n"
                        << "  - job_name: serve\n    static_configs:\n      - targets: ['127.0.0.1:" << serve_port
                        << "']\n";
  const std::string prom_log = (tmp.path / "prometheus.log").string();
  Guarded prom({prometheus, "--config.file=" + config, "--storage.tsdb.path=" + (tmp.path / "tsdb").string(),
                "--web.listen-address=127.0.0.1:" + std::to_string(prom_port), "--log.level=warn"},
               prom_log);

  // Both targets up (polled through the API, not slept for): about 5 s,
  // Prometheus' fixed throttle before it applies a configuration's targets.
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + 30s;  // a hang guard: ~7 s on a loaded 2-core VM
  auto up = [&](const char* job) {
    DashboardQuery q{"up", std::string("up{job=\"") + job + "\"} == 1", ""};
    return evaluate(prom_port, q, q.promql).series == 1;
  };
  while (!(up("bus") && up("serve")) && std::chrono::steady_clock::now() < deadline) {
    REQUIRE_MESSAGE(prom.running(), "prometheus exited: " << read_file(prom_log));
    REQUIRE_MESSAGE(serve.running(), "lanebus serve exited: " << read_file((tmp.path / "serve.log").string()));
    std::this_thread::sleep_for(100ms);
  }
  REQUIRE_MESSAGE(up("bus"), "the bus target is not up: " << read_file(prom_log));
  REQUIRE_MESSAGE(up("serve"), "the lanebus serve target is not up: " << read_file(prom_log));
  MESSAGE("both targets up after " << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                                   << " s");

  // Each query, per job, polled until it returns data (rates need two
  // scrapes in their 5 s range) or the deadline passes.
  std::size_t answered = 0, nan_only = 0;
  for (const DashboardQuery& q : queries) {
    for (const std::string job : {"bus", "serve"}) {
      const std::string promql = for_job(q.promql, job);
      // The bus job (traffic flowing) must give numbers; a NaN from the serve
      // job (a latency quantile of a store with no latency recorded) is data.
      auto done = [&](const Answer& a) { return a.series > 0 && a.label_ok && (job == "serve" || a.numbers > 0); };
      Answer a = evaluate(prom_port, q, promql);
      while (!done(a) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(100ms);
        a = evaluate(prom_port, q, promql);
      }
      INFO(job << " / " << q.title << ": " << promql);
      CHECK_MESSAGE(a.error.empty(), a.error);
      CHECK_MESSAGE(a.series > 0, "no data");
      CHECK_MESSAGE(a.label_ok, "no series carries the label " << q.label);
      if (job == "bus") CHECK_MESSAGE(a.numbers > 0, "only NaN");
      answered += done(a) ? 1 : 0;
      nan_only += a.series > 0 && a.numbers == 0 ? 1 : 0;
    }
  }
  // Negative control: a metric nobody exports is an empty answer.
  DashboardQuery none{"none", "lanebus_no_such_metric", ""};
  CHECK(evaluate(prom_port, none, for_job(none.promql, "bus")).series == 0);
  MESSAGE(answered << " answered of " << queries.size() << " queries x 2 jobs (" << nan_only << " NaN only), in "
                   << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() << " s");
  CHECK(std::chrono::steady_clock::now() < deadline);
}

TEST_CASE("the job filter narrows every selector (and the check sees an empty answer)") {
  CHECK(for_job("sum by (topic) (rate(lanebus_published_total{topic=~\".*\"}[5s]))", "bus") ==
        "sum by (topic) (rate(lanebus_published_total{job=\"bus\",topic=~\".*\"}[5s]))");
  CHECK(for_job("lanebus_dlq_depth_messages", "serve") == "lanebus_dlq_depth_messages{job=\"serve\"}");
  CHECK(for_job("a / lanebus_x_sum{a=\"b\"} or xlanebus_y", "j") == "a / lanebus_x_sum{job=\"j\",a=\"b\"} or xlanebus_y");
}

TEST_CASE("a guarded child dies with a test process that dies without cleaning up") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  const pid_t test = ::fork();
  REQUIRE(test >= 0);
  if (test == 0) {  // the "test": starts a guarded sleep, reports its pid, dies by SIGKILL
    ::close(fds[0]);
    auto* g = new Guarded({"/bin/sleep", "60"}, "/dev/null");
    const pid_t p = g->pid();
    (void)!::write(fds[1], &p, sizeof p);
    ::raise(SIGKILL);
  }
  ::close(fds[1]);
  pid_t sleeper = 0;
  REQUIRE(::read(fds[0], &sleeper, sizeof sleeper) == static_cast<ssize_t>(sizeof sleeper));
  ::close(fds[0]);
  int st = 0;
  REQUIRE(::waitpid(test, &st, 0) == test);
  CHECK(WIFSIGNALED(st));
  // The sleeper is not our child (it was reparented): poll kill(pid, 0), and
  // count a zombie (killed, not yet reaped by its new parent) as gone.
  auto dead = [&] {
    if (::kill(sleeper, 0) != 0 && errno == ESRCH) return true;
    const std::string stat = read_file("/proc/" + std::to_string(sleeper) + "/stat");
    const std::size_t paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
  };
  bool gone = false;
  for (int i = 0; i < 500 && !gone; ++i) {
    gone = dead();
    if (!gone) std::this_thread::sleep_for(10ms);
  }
  CHECK_MESSAGE(gone, "the guarded child " << sleeper << " outlived its parent");
  if (!gone) ::kill(sleeper, SIGKILL);
}
