// lanebus — MIT License.
// `lanebus bridge DIR --nats URL --out TOPIC=SUBJECT[@STREAM]... --in STREAM:CONSUMER=TOPIC...`:
// a standalone bridge process on a store the application shares.
// Stops cleanly on SIGTERM / SIGINT; prints a progress line every --progress-ms.
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "args.hpp"
#include "commands.hpp"
#include "durable_store.hpp"
#include "lanebus/bridge.hpp"
#include "lanebus/lanebus.hpp"

namespace lanebus::tool {

namespace {

const CommandSpec kSpec{
    "bridge",
    "DIR",
    1,
    1,
    {{"--nats", "URL", "a NATS server (repeat for several)"},
     {"--out", "TOPIC=SUBJECT[@STREAM]", "mirror a durable topic to JetStream (repeatable)"},
     {"--in", "STREAM:CONSUMER=TOPIC", "stream into a durable topic (repeatable)"},
     {"--token", "T", "authenticate with a token"},
     {"--user", "U", "authenticate as U (with --password)"},
     {"--password", "P", "the password of --user"},
     {"--creds", "FILE", "authenticate with a credentials file"},
     {"--tls-ca", "FILE", "TLS, trusting this CA"},
     {"--no-create", nullptr, "create no streams or consumers"},
     {"--lanes", "N", "lanes of a local topic --in creates (default 8)"},
     {"--workers", "N", "worker threads (default 16)"},
     {"--ack-wait-ms", "MS", "how long JetStream waits for an ack"},
     {"--progress-ms", "MS", "a progress line every MS (default 1000; 0 = only at exit)"},
     {"--name", "NAME", "the bridge's name in the store (default lanebus-bridge)"}},
    "Mirrors durable topics of the store DIR to NATS JetStream (--out) and streams into\n"
    "durable topics (--in). SUBJECT may use {key}, {topic} and {lane}; STREAM defaults to\n"
    "the topic name upper-cased. --in creates a missing local topic with --lanes lanes (8).\n"
    "SIGTERM or SIGINT stops it cleanly (exit 0). Exit 1: an error; 2: usage.\n"
    "Its state and counters are also written to the store every second under --name\n"
    "(bridges sharing a store need distinct names): `lanebus stats DIR`\n"
    "shows them, marked stale when the process is gone.\n"};

struct OutSpec {
  std::string topic, subject, stream;
};
struct InSpec {
  std::string stream, consumer, topic;
};

void print_progress(const char* what, const BridgeStats& s) {
  std::printf(
      "bridge: %s state=%s published=%llu acked=%llu duplicates=%llu redelivered=%llu stored=%llu "
      "dead_lettered=%llu lag=%llu reconnects=%llu rewinds=%llu%s%s\n",
      what, to_string(s.state), static_cast<unsigned long long>(s.total.published),
      static_cast<unsigned long long>(s.total.acked), static_cast<unsigned long long>(s.total.duplicates),
      static_cast<unsigned long long>(s.total.redelivered), static_cast<unsigned long long>(s.total.stored),
      static_cast<unsigned long long>(s.total.dead_lettered), static_cast<unsigned long long>(s.total.lag),
      static_cast<unsigned long long>(s.reconnects), static_cast<unsigned long long>(s.total.rewinds),
      s.last_error.empty() ? "" : " last_error=",
      s.last_error.c_str());
  std::fflush(stdout);
}

}  // namespace

int cmd_bridge(int argc, char** argv) {
  ParsedArgs args;
  std::string error;
  if (parse_options(kSpec, argc, argv, &args, &error) != 0) return usage_error(kSpec, error);
  if (args.help) return print_help(kSpec);
  const std::string dir = args.operands[0];
  BridgeOptions bo;
  std::vector<OutSpec> outs;
  std::vector<InSpec> ins;
  std::uint32_t lanes = 8;
  std::size_t workers = 16;
  long progress_ms = 1000;
  for (const auto& [a, value] : args.options) {
    const char* v = value.c_str();
    if (a == "--no-create") {
      bo.create_streams = false;
      bo.create_consumers = false;
    } else if (a == "--nats") {
      bo.urls.emplace_back(v);
    } else if (a == "--name") {
      bo.name = v;
    } else if (a == "--token") {
      bo.token = v;
    } else if (a == "--user") {
      bo.user = v;
    } else if (a == "--password") {
      bo.password = v;
    } else if (a == "--creds") {
      bo.credentials_file = v;
    } else if (a == "--tls-ca") {
      bo.tls = true;
      bo.tls_ca_file = v;
    } else if (a == "--lanes") {
      lanes = static_cast<std::uint32_t>(std::strtoul(v, nullptr, 10));
    } else if (a == "--workers") {
      workers = std::strtoul(v, nullptr, 10);
    } else if (a == "--ack-wait-ms") {
      bo.ack_wait = std::chrono::milliseconds(std::strtol(v, nullptr, 10));
    } else if (a == "--progress-ms") {
      progress_ms = std::strtol(v, nullptr, 10);
    } else if (a == "--out") {
      std::string s = v;
      const auto eq = s.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::fprintf(stderr, "lanebus bridge: --out %s: expected TOPIC=SUBJECT[@STREAM]\n", v);
        return 2;
      }
      OutSpec o;
      o.topic = s.substr(0, eq);
      o.subject = s.substr(eq + 1);
      if (const auto at = o.subject.find('@'); at != std::string::npos) {
        o.stream = o.subject.substr(at + 1);
        o.subject.resize(at);
      } else {
        for (char c : o.topic) o.stream += (c >= 'a' && c <= 'z') ? static_cast<char>(c - 32) : (c == '.' ? '_' : c);
      }
      outs.push_back(o);
    } else if (a == "--in") {
      std::string s = v;
      const auto colon = s.find(':'), eq = s.find('=');
      if (colon == std::string::npos || eq == std::string::npos || colon > eq || colon == 0) {
        std::fprintf(stderr, "lanebus bridge: --in %s: expected STREAM:CONSUMER=TOPIC\n", v);
        return 2;
      }
      ins.push_back(InSpec{s.substr(0, colon), s.substr(colon + 1, eq - colon - 1), s.substr(eq + 1)});
    }
  }
  if (bo.urls.empty() || (outs.empty() && ins.empty())) {
    std::fprintf(stderr, "lanebus bridge: need --nats URL and at least one --out or --in\n");
    return 2;
  }

  // The topics' lane counts and retention come from the store (the
  // application created them); a bridge must open them exactly so.
  std::vector<detail::TopicRef> stored;
  {
    StoreOptions so;
    so.directory = dir;
    so.read_only = true;
    auto store = detail::DurableStore::open(so);
    if (store.ok()) {
      auto t = (*store)->list_topics();
      if (t.ok()) stored = std::move(*t);
    }
  }
  // Signals are taken with sigtimedwait below; block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGINT);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  BusOptions opts;
  opts.name = "bridge";
  opts.store.directory = dir;
  opts.workers = workers;
  opts.durable_poll = std::chrono::milliseconds(20);
  // A bridge process that dies (kill -9, OOM, host reboot) says nothing about
  // the message it was publishing: never dead-letter a message as poison
  // because the bridge crashed with it in flight (DlqOptions).
  opts.dlq.poison_after_crashes = 0;
  auto bus = Bus::open(opts);
  if (!bus.ok()) {
    std::fprintf(stderr, "lanebus bridge: %s\n", bus.status().to_string().c_str());
    return 1;
  }
  auto topic = [&](const std::string& name, bool create) -> Result<Topic> {
    for (const auto& t : stored) {
      if (t.name != name) continue;
      TopicOptions to;
      to.durable = true;
      to.lanes = t.lanes;
      to.retention = t.retention;
      to.fence = t.fence;
      to.fence_per_lane = t.fence_per_lane;
      return t.is_queue ? (*bus)->create_queue(name, to) : (*bus)->create_topic(name, to);
    }
    if (!create) return Status(Code::NotFound, "topic \"" + name + "\" does not exist in the store " + dir);
    TopicOptions to;
    to.durable = true;
    to.lanes = lanes;
    return (*bus)->create_topic(name, to);
  };
  auto bridge = Bridge::open(**bus, bo);
  if (!bridge.ok()) {
    std::fprintf(stderr, "lanebus bridge: %s\n", bridge.status().to_string().c_str());
    return 1;
  }
  for (const OutSpec& o : outs) {
    auto t = topic(o.topic, false);
    Status s = t.ok() ? (*bridge)->mirror_out(*t, o.subject, o.stream) : t.status();
    if (!s.ok()) {
      std::fprintf(stderr, "lanebus bridge: --out %s=%s@%s: %s\n", o.topic.c_str(), o.subject.c_str(),
                   o.stream.c_str(), s.to_string().c_str());
      return 1;
    }
  }
  for (const InSpec& in : ins) {
    auto t = topic(in.topic, true);
    Status s = t.ok() ? (*bridge)->mirror_in(in.stream, in.consumer, *t) : t.status();
    if (!s.ok()) {
      std::fprintf(stderr, "lanebus bridge: --in %s:%s=%s: %s\n", in.stream.c_str(), in.consumer.c_str(),
                   in.topic.c_str(), s.to_string().c_str());
      return 1;
    }
  }
  print_progress("started", (*bridge)->stats());
  for (;;) {
    timespec ts;
    const long ms = progress_ms > 0 ? progress_ms : 1000;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1'000'000;
    const int sig = sigtimedwait(&sigs, nullptr, &ts);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (progress_ms > 0) print_progress("progress", (*bridge)->stats());
  }
  const BridgeStats last = (*bridge)->stats();
  Status cs = (*bridge)->close();
  Status ss = (*bus)->shutdown(ShutdownMode::Abandon, std::chrono::seconds(5));
  print_progress("stopped", last);
  if (!cs.ok() || !ss.ok()) {
    std::fprintf(stderr, "lanebus bridge: stop: %s %s\n", cs.to_string().c_str(), ss.to_string().c_str());
    return 1;
  }
  return 0;
}

}  // namespace lanebus::tool
