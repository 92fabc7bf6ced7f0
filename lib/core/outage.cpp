// lanebus — MIT License.
// The outage pause (lib/core/outage.hpp): the breaker itself, the delivery
// core's hooks into it, Bus::resume, and a durable group's pause record in
// the store (so a restart, `lanebus stats` and `lanebus resume` see it).
#include "outage.hpp"

#include <algorithm>
#include <cstring>
#include <unistd.h>

#include "bus_impl.hpp"
#include "coding.hpp"
#include "hash.hpp"

namespace lanebus::detail {

namespace {

std::int64_t ms_to_ns(std::chrono::milliseconds d) noexcept { return static_cast<std::int64_t>(d.count()) * 1'000'000; }

constexpr std::uint8_t kPauseFormat = 1;

std::string outage_key(std::string_view kind, std::string_view topic, std::string_view group) {
  std::string k = "outage";
  k.push_back('\0');
  k.append(kind);
  k.push_back('/');
  k.append(topic);
  k.push_back('\0');
  k.append(group);
  return k;
}

}  // namespace

// ---------------------------------------------------------------- the breaker

void OutageBreaker::copy_text(std::array<char, kText>& into, std::string_view s) noexcept {
  const std::size_t n = std::min(s.size(), kText - 1);
  std::memcpy(into.data(), s.data(), n);
  into[n] = '\0';
}

std::int64_t OutageBreaker::poll_ns() const {
  return std::min<std::int64_t>(std::max<std::int64_t>(backoff_ns_, 1'000'000), kPollNs);
}

void OutageBreaker::clear_window() {
  head_ = 0;
  count_ = 0;
}

void OutageBreaker::judge(std::int64_t since_ns, std::uint32_t enough, std::uint32_t* failures,
                          std::uint32_t* keys) const {
  *failures = 0;
  *keys = 0;
  for (std::uint32_t i = 0; i < count_; ++i) {
    const Failure& f = ring_[(head_ + kRing - 1 - i) % kRing];  // newest first
    if (f.at_ns < since_ns) break;
    ++*failures;
    if (*keys >= enough) continue;
    bool seen = false;
    for (std::uint32_t j = 0; j < i && !seen; ++j) seen = ring_[(head_ + kRing - 1 - j) % kRing].key == f.key;
    if (!seen) ++*keys;
  }
}

std::int64_t OutageBreaker::gate(const OutageOptions& o, std::int64_t steady_ns, bool take, bool* probe) {
  *probe = false;
  if (!paused()) return -1;
  MutexLock l(&mu_);
  if (!paused_.load(std::memory_order_relaxed)) return -1;
  const std::int64_t poll = poll_ns();
  if (probe_out_) return poll;
  if (steady_ns < next_probe_ns_) return std::min(next_probe_ns_ - steady_ns, poll);
  if (take) {
    probe_out_ = true;
    ++probes_;
    *probe = true;
  }
  (void)o;
  return -1;
}

OutageBreaker::Verdict OutageBreaker::on_transient(const OutageOptions& o, std::int64_t steady_ns,
                                                   std::int64_t wall_ns, std::uint64_t key, bool last, bool probe,
                                                   std::string_view reason) {
  Verdict v;
  MutexLock l(&mu_);
  copy_text(last_error_, reason);
  dirty_.store(true, std::memory_order_relaxed);
  if (paused_.load(std::memory_order_relaxed)) {
    if (probe) {  // the probe failed: wait longer before the next one
      probe_out_ = false;
      backoff_ns_ = std::min(backoff_ns_ * 2, std::max(ms_to_ns(o.probe_max), ms_to_ns(o.probe_initial)));
      next_probe_ns_ = steady_ns + backoff_ns_;
    }
    v.paused = true;
    v.wait_ns = std::clamp<std::int64_t>(next_probe_ns_ - steady_ns, 1'000'000, poll_ns());
    return v;
  }
  ring_[head_] = Failure{steady_ns, key};
  head_ = (head_ + 1) % kRing;
  count_ = std::min(count_ + 1, kRing);
  std::uint32_t failures = 0, keys = 0;
  const std::uint32_t need_keys = std::max<std::uint32_t>(o.distinct_keys, 1);
  judge(steady_ns - ms_to_ns(o.window), need_keys, &failures, &keys);
  if (keys < need_keys || (failures < o.threshold && !last)) return v;
  paused_.store(true, std::memory_order_release);
  since_wall_ns_ = wall_ns;
  backoff_ns_ = std::max<std::int64_t>(ms_to_ns(o.probe_initial), 1'000'000);
  next_probe_ns_ = steady_ns + backoff_ns_;
  probe_out_ = false;
  ++pauses_;
  char text[kText];
  std::snprintf(text, sizeof text, "%u transient failures of %u+ keys within %lld ms%s", failures, keys,
                static_cast<long long>(o.window.count()), failures < o.threshold ? " (attempts running out)" : "");
  copy_text(reason_, text);
  v.paused = true;
  v.tripped = true;
  v.wait_ns = poll_ns();
  return v;
}

bool OutageBreaker::on_ack() { return !quiet() && resume(); }

void OutageBreaker::end_probe() {
  MutexLock l(&mu_);
  probe_out_ = false;
}

bool OutageBreaker::resume() {
  MutexLock l(&mu_);
  clear_window();
  dirty_.store(false, std::memory_order_relaxed);
  if (!paused_.load(std::memory_order_relaxed)) return false;
  paused_.store(false, std::memory_order_release);
  probe_out_ = false;
  since_wall_ns_ = 0;
  return true;
}

void OutageBreaker::restore(const OutageOptions& o, std::int64_t steady_ns, std::int64_t since_wall_ns,
                            std::string_view reason, std::string_view last_error) {
  MutexLock l(&mu_);
  if (paused_.load(std::memory_order_relaxed)) return;
  clear_window();
  since_wall_ns_ = since_wall_ns;
  backoff_ns_ = std::max<std::int64_t>(ms_to_ns(o.probe_initial), 1'000'000);
  next_probe_ns_ = steady_ns + backoff_ns_;
  probe_out_ = false;
  copy_text(reason_, reason);
  copy_text(last_error_, last_error);
  dirty_.store(true, std::memory_order_relaxed);
  paused_.store(true, std::memory_order_release);
}

OutageBreaker::Snapshot OutageBreaker::snapshot() const {
  Snapshot s;
  MutexLock l(&mu_);
  s.paused = paused_.load(std::memory_order_relaxed);
  s.since_ns = s.paused ? since_wall_ns_ : 0;
  s.reason = s.paused ? reason_.data() : "";
  s.last_error = last_error_.data();
  s.pauses = pauses_;
  s.probes = probes_;
  return s;
}

// ---------------------------------------------------------------- the pause record

std::string outage_pause_key(std::string_view topic, std::string_view group) {
  return outage_key("pause", topic, group);
}

std::string outage_resume_key(std::string_view topic, std::string_view group) {
  return outage_key("resume", topic, group);
}

std::string encode_outage_pause(std::int64_t since_ns, std::string_view reason, std::string_view last_error) {
  ByteWriter w;
  w.u8(kPauseFormat);
  w.u32(static_cast<std::uint32_t>(::getpid()));
  w.i64(since_ns);
  w.str16(reason.substr(0, OutageBreaker::kText));
  w.str16(last_error.substr(0, OutageBreaker::kText));
  return w.take();
}

Status decode_outage_pause(std::string_view value, GroupStats* gs) {
  ByteReader r(value);
  const auto format = r.u8();
  if (r.ok() && format != kPauseFormat)
    return Status(Code::Corruption, "outage pause record: unknown format " + std::to_string(format));
  (void)r.u32();  // pid of the process that paused it
  const std::int64_t since = r.i64();
  std::string reason = r.str16();
  std::string last_error = r.str16();
  if (!r.ok())
    return Status(Code::Corruption, "outage pause record: truncated (" + std::to_string(value.size()) + " bytes)");
  gs->paused = true;
  gs->paused_since_ns = since;
  gs->pause_reason = std::move(reason);
  gs->pause_last_error = std::move(last_error);
  return Status();
}

Status request_outage_resume(DurableStore& store, std::string_view topic, std::string_view group) {
  const std::string pause = outage_pause_key(topic, group);
  const std::string request = outage_resume_key(topic, group);
  bool was_paused = false;
  Status s = store.write([&](StoreTxn& t) -> Status {
    auto g = t.get(StoreTable::User, pause);
    was_paused = g.ok();
    if (!g.ok() && g.code() != Code::NotFound) return g.status();
    if (!was_paused) return Status();
    ByteWriter w;
    w.i64(WallClock::now_ns());
    if (Status ps = t.put(StoreTable::User, request, w.take()); !ps.ok()) return ps;
    return t.del(StoreTable::User, pause);
  });
  if (!s.ok()) return s;
  if (!was_paused)
    return Status(Code::NotFound, "resume: group \"" + std::string(group) + "\" of \"" + std::string(topic) +
                                      "\" is not paused (no pause record in the store)");
  return Status();
}

Status check_outage_options(std::string_view topic, const OutageOptions& o) {
  if (!o.enabled) return Status();
  if (o.threshold == 0 || o.threshold > OutageBreaker::kRing || o.distinct_keys == 0 ||
      o.distinct_keys > o.threshold)
    return Status(Code::InvalidArgument, "subscribe to \"" + std::string(topic) + "\": outage.threshold must be 1.." +
                                             std::to_string(OutageBreaker::kRing) +
                                             " and outage.distinct_keys 1..threshold, got " +
                                             std::to_string(o.threshold) + " and " + std::to_string(o.distinct_keys));
  if (o.window.count() <= 0 || o.probe_initial.count() <= 0 || o.probe_max < o.probe_initial)
    return Status(Code::InvalidArgument, "subscribe to \"" + std::string(topic) +
                                             "\": outage.window and outage.probe_initial must be positive and "
                                             "outage.probe_max at least probe_initial");
  return Status();
}

// ---------------------------------------------------------------- the delivery core's hooks

std::int64_t OutageGate::gate(GroupLane* gl, bool take) noexcept {
  GroupImpl* g = gl->group;
  if (!g->options.outage.enabled || !g->outage.paused()) return -1;
  bool probe = false;
  const std::int64_t wait = g->outage.gate(g->options.outage, RetryTimer::now_ns(), take, &probe);
  if (probe) gl->probing = true;
  return wait;
}

std::int64_t OutageGate::wait(GroupLane* gl, std::ptrdiff_t parked_index) noexcept {
  if (!gl->group->options.outage.enabled) return -1;
  const std::int64_t wait = gate(gl, true);
  if (wait >= 0 && parked_index >= 0)
    gl->parked[static_cast<std::size_t>(parked_index)].due_ns = RetryTimer::now_ns() + wait;
  return wait;
}

bool OutageGate::claim_later(GroupLane* gl) noexcept {
  if (!gl->group->options.outage.enabled) return false;
  const std::int64_t wait = gate(gl, false);
  if (wait < 0) return false;
  gl->retry_delay_ns = wait;
  return true;
}

bool OutageGate::held(GroupLane* gl, std::ptrdiff_t parked_index) noexcept {
  const std::int64_t w = wait(gl, parked_index);
  if (w < 0) return false;
  gl->retry_delay_ns = w;
  return true;
}

bool OutageGate::on_transient(GroupLane* gl, const Parcel& p, const Invocation& inv, Settlement* st) noexcept {
  GroupImpl* g = gl->group;
  const OutageOptions& o = g->options.outage;
  // Keyless messages are each their own key: an outage of keyless traffic
  // still shows many keys.
  const std::uint64_t key = p.key.empty() ? (p.header->id | (1ull << 63)) : fnv1a64(p.key);
  const bool probe = gl->probing;
  gl->probing = false;
  const OutageBreaker::Verdict v =
      g->outage.on_transient(o, RetryTimer::now_ns(), now_ns(), key, p.attempt >= g->options.max_attempts, probe,
                             inv.outcome.reason().empty() ? std::string_view("retry") : inv.outcome.reason());
  if (!v.paused) return false;
  if (v.tripped) {
    record(g, true);
    if (logger_.enabled()) {  // a trip is rare: the snapshot's strings may allocate
      const OutageBreaker::Snapshot s = g->outage.snapshot();
      logger_.log(LogLevel::Warn, "group \"%s\" on \"%s\" paused (outage): %s; last error: %s", g->name.c_str(),
                  g->topic->name.c_str(), s.reason.c_str(), s.last_error.c_str());
    }
  }
  st->next = Settlement::Next::Retry;
  st->uncounted = true;
  st->delay_ns = v.wait_ns;
  return true;
}

void OutageGate::on_ack(GroupLane* gl) noexcept {
  gl->probing = false;
  GroupImpl* g = gl->group;
  if (g->outage.quiet()) return;
  if (g->outage.on_ack()) {
    record(g, false);
    if (logger_.enabled())
      logger_.log(LogLevel::Info, "group \"%s\" on \"%s\" resumed: a probe succeeded", g->name.c_str(),
                  g->topic->name.c_str());
  }
}

void OutageGate::end_probe(GroupLane* gl) noexcept {
  if (!gl->probing) return;
  gl->probing = false;
  gl->group->outage.end_probe();
}

void OutageGate::record(GroupImpl* g, bool paused) noexcept {
  if (!g->topic->durable || store_ == nullptr || store_->read_only()) return;
  try {
    std::string key = outage_pause_key(g->topic->name, g->store_group.name);
    std::string value;
    if (paused) {
      const OutageBreaker::Snapshot s = g->outage.snapshot();
      value = encode_outage_pause(s.since_ns, s.reason, s.last_error);
    }
    // Batched into the writer's next transaction (a trip is rare; the
    // worker does not wait for it).
    (void)store_->write_async(
        [key = std::move(key), value = std::move(value), paused](StoreTxn& t) -> Status {
          if (paused) return t.put(StoreTable::User, key, value);
          Status s = t.del(StoreTable::User, key);
          return s.code() == Code::NotFound ? Status() : s;
        },
        [](const Status&) {});
  } catch (...) {
  }
}

void OutageGate::restore(GroupImpl* g) {
  if (!g->options.outage.enabled || !g->topic->durable || store_ == nullptr) return;
  {
    MutexLock l(&mu_);
    if (std::find(durable_.begin(), durable_.end(), g) == durable_.end()) durable_.push_back(g);
  }
  GroupStats gs;
  const std::string key = outage_pause_key(g->topic->name, g->store_group.name);
  Status s = store_->read([&](StoreTxn& t) -> Status {
    auto v = t.get(StoreTable::User, key);
    if (!v.ok()) return v.code() == Code::NotFound ? Status() : v.status();
    return decode_outage_pause(*v, &gs);
  });
  if (s.ok() && gs.paused)
    g->outage.restore(g->options.outage, RetryTimer::now_ns(), gs.paused_since_ns, gs.pause_reason,
                      gs.pause_last_error);
}

bool OutageGate::resume(GroupImpl* g) noexcept {
  if (!g->outage.resume()) return false;
  record(g, false);
  if (logger_.enabled())
    logger_.log(LogLevel::Info, "group \"%s\" on \"%s\" resumed by Bus::resume", g->name.c_str(),
                g->topic->name.c_str());
  return true;
}

void OutageGate::poll_resume() noexcept {
  if (store_ == nullptr) return;
  try {
    std::vector<std::pair<GroupImpl*, std::string>> paused;
    {
      MutexLock l(&mu_);
      for (GroupImpl* g : durable_)
        if (g->options.outage.enabled && g->outage.paused())
          paused.emplace_back(g, outage_resume_key(g->topic->name, g->store_group.name));
    }
    for (auto& entry : paused) {
      // Not a structured binding: clang 14 (the fuzz build) cannot capture one in the lambdas below.
      GroupImpl* const g = entry.first;
      const std::string& key = entry.second;
      bool asked = false;
      Status s = store_->read([&](StoreTxn& t) -> Status {
        auto v = t.get(StoreTable::User, key);
        asked = v.ok();
        return Status();
      });
      if (!s.ok() || !asked) continue;
      (void)store_->write([&](StoreTxn& t) -> Status {
        Status d = t.del(StoreTable::User, key);
        return d.code() == Code::NotFound ? Status() : d;
      });
      if (g->outage.resume()) record(g, false);
    }
  } catch (...) {
  }
}

}  // namespace lanebus::detail
