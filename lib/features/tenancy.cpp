// lanebus — MIT License.
// Namespaces, credentials, quotas and usage (design notes: tenancy.hpp;
// manual and storage keys: doc/tenancy.md).
#include "tenancy.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <sstream>

#include "coding.hpp"
#include "durable_store.hpp"
#include "names.hpp"
#include "quote.hpp"

namespace lanebus::detail {

thread_local constinit std::uint64_t tl_delivered_msgs = 0;
thread_local constinit std::uint64_t tl_delivered_bytes = 0;

namespace {

// ---------------------------------------------------------------- publish credit
// A thread's prepaid publish quota (invariant 3 in tenancy.hpp): ns of a
// namespace's pub_msgs and pub_bytes buckets it took ahead, spent without an
// atomic. Refills take up to kCreditChunkNs (capped at an eighth of the
// burst) and fall back to exactly what the message needs when the bucket is
// near its ceiling, so the buckets decide admission exactly as before.
// `owner` is the bus's TenancyImpl::uid(): a slot of another (perhaps dead)
// bus is never dereferenced, its credit is dropped.
struct PublishCredit {
  NamespaceState* ns = nullptr;
  std::uint64_t owner = 0;
  std::uint64_t epoch = 0;  // ns->policy_epoch the credit was taken under
  double msgs_ns = 0;
  double bytes_ns = 0;
};
constexpr int kCreditSlots = 4;
constexpr std::int64_t kCreditChunkNs = 100'000;
thread_local PublishCredit tl_credit[kCreditSlots];
std::atomic<std::uint64_t> g_next_tenancy_uid{1};

std::int64_t credit_chunk(const TokenBucket& b) noexcept {
  return std::min(kCreditChunkNs, b.tau_ns.load(std::memory_order_relaxed) / 8);
}

// The slot of `ns` in this thread, moved to the front; a new slot evicts the
// last one, whose credit goes back to its buckets when it is of the same bus.
PublishCredit& credit_of(NamespaceState* ns) noexcept {
  const std::uint64_t owner = ns->tenancy->uid();
  const std::uint64_t epoch = ns->policy_epoch.load(std::memory_order_acquire);
  int i = 0;
  while (i < kCreditSlots && !(tl_credit[i].ns == ns && tl_credit[i].owner == owner)) ++i;
  if (i == kCreditSlots) {
    PublishCredit& last = tl_credit[kCreditSlots - 1];
    if (last.ns != nullptr && last.owner == owner &&
        last.epoch == last.ns->policy_epoch.load(std::memory_order_acquire)) {
      last.ns->pub_msgs.give_back_ns(static_cast<std::int64_t>(last.msgs_ns));
      last.ns->pub_bytes.give_back_ns(static_cast<std::int64_t>(last.bytes_ns));
    }
    last = PublishCredit{ns, owner, epoch, 0, 0};
    i = kCreditSlots - 1;
  }
  if (i != 0) std::swap(tl_credit[0], tl_credit[i]);
  PublishCredit& c = tl_credit[0];
  if (c.epoch != epoch) c = PublishCredit{ns, owner, epoch, 0, 0};
  return c;
}

}  // namespace

namespace {

constexpr std::uint32_t kPbkdf2Iterations = 20000;
constexpr std::size_t kSaltBytes = 16;
constexpr std::size_t kHashBytes = 32;
constexpr std::size_t kMaxSecretBytes = 1024;
constexpr std::int64_t kMaxSleepNs = 10'000'000;  // re-check shutdown at least every 10 ms while throttled


std::string hex(std::string_view raw) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

bool unhex(std::string_view h, std::string* out) {
  if (h.size() % 2) return false;
  out->clear();
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < h.size(); i += 2) {
    int a = v(h[i]), b = v(h[i + 1]);
    if (a < 0 || b < 0) return false;
    out->push_back(static_cast<char>(a * 16 + b));
  }
  return true;
}

std::string pbkdf2(std::string_view secret, std::string_view salt, std::uint32_t iterations) {
  unsigned char out[kHashBytes];
  if (PKCS5_PBKDF2_HMAC(secret.data(), static_cast<int>(secret.size()),
                        reinterpret_cast<const unsigned char*>(salt.data()), static_cast<int>(salt.size()),
                        static_cast<int>(iterations), EVP_sha256(), sizeof out, out) != 1)
    return {};
  return std::string(reinterpret_cast<const char*>(out), sizeof out);
}


constexpr std::string_view kNsPrefix = "n/";
constexpr std::string_view kCredPrefix = "c/";
constexpr std::string_view kUsagePrefix = "u/";

std::string encode_grants(const std::vector<Grant>& grants) {
  std::string out;
  for (const Grant& g : grants) {
    out += "grant ";
    out += g.prefix;
    out += ' ';
    out += g.publish ? 'p' : '-';
    out += g.consume ? 'c' : '-';
    out += g.admin ? 'a' : '-';
    out += '\n';
  }
  return out;
}

Status check_grants(const std::vector<Grant>& grants) {
  for (const Grant& g : grants) {
    if (Status s = check_name(g.prefix, "grant prefix"); !s.ok()) return s;
  }
  return Status();
}

NamespaceUsage add(NamespaceUsage a, const NamespaceUsage& b) {
  a.msgs_in += b.msgs_in;
  a.bytes_in += b.bytes_in;
  a.msgs_out += b.msgs_out;
  a.bytes_out += b.bytes_out;
  a.throttled += b.throttled;
  a.refused += b.refused;
  a.seconds_at_ceiling += b.seconds_at_ceiling;
  a.peak_in_per_s = std::max(a.peak_in_per_s, b.peak_in_per_s);
  return a;
}

NamespaceUsage load(const NamespaceState& ns) {
  const UsageCounters& c = ns.live;
  NamespaceUsage u;
  u.msgs_in = ns.msgs_in();
  u.bytes_in = ns.bytes_in();
  u.msgs_out = c.msgs_out.load(std::memory_order_relaxed);
  u.bytes_out = c.bytes_out.load(std::memory_order_relaxed);
  u.throttled = c.throttled.load(std::memory_order_relaxed);
  u.refused = c.refused.load(std::memory_order_relaxed);
  u.seconds_at_ceiling = c.seconds_at_ceiling.load(std::memory_order_relaxed);
  return u;
}

}  // namespace

// ---------------------------------------------------------------- encodings

std::string encode_policy(const NamespacePolicy& p) {
  std::ostringstream o;
  o.precision(17);
  o << "v1 pub_msgs=" << p.publish.msgs_per_s << " pub_bytes=" << p.publish.bytes_per_s
    << " pub_burst=" << p.publish.burst_s << " con_msgs=" << p.consume.msgs_per_s
    << " con_bytes=" << p.consume.bytes_per_s << " con_burst=" << p.consume.burst_s << " weight=" << p.weight
    << " store=" << p.store_dir;
  return o.str();
}

bool decode_policy(std::string_view s, NamespacePolicy* p) {
  std::string str(s);
  std::size_t store_at = str.find(" store=");
  if (str.rfind("v1 ", 0) != 0 || store_at == std::string::npos) return false;
  p->store_dir = str.substr(store_at + 7);
  std::istringstream in(str.substr(3, store_at - 3));
  std::string tok;
  while (in >> tok) {
    auto eq = tok.find('=');
    if (eq == std::string::npos) return false;
    std::string k = tok.substr(0, eq);
    double v = std::strtod(tok.c_str() + eq + 1, nullptr);
    if (k == "pub_msgs") p->publish.msgs_per_s = v;
    else if (k == "pub_bytes") p->publish.bytes_per_s = v;
    else if (k == "pub_burst") p->publish.burst_s = v;
    else if (k == "con_msgs") p->consume.msgs_per_s = v;
    else if (k == "con_bytes") p->consume.bytes_per_s = v;
    else if (k == "con_burst") p->consume.burst_s = v;
    else if (k == "weight") p->weight = static_cast<std::uint32_t>(v);
    // unknown keys: written by a newer release, ignored
  }
  return true;
}

std::string usage_key(std::string_view ns, std::uint64_t minute) {
  std::string k(kUsagePrefix);
  k += ns;
  k.push_back('\0');
  put_be64(k, minute);
  return k;
}

bool parse_usage_key(std::string_view key, std::string* ns, std::uint64_t* minute) {
  if (key.substr(0, kUsagePrefix.size()) != kUsagePrefix || key.size() < kUsagePrefix.size() + 9) return false;
  std::string_view rest = key.substr(kUsagePrefix.size());
  if (rest[rest.size() - 9] != '\0') return false;
  *ns = std::string(rest.substr(0, rest.size() - 9));
  *minute = get_be64(rest.data() + rest.size() - 8);
  return true;
}

std::string encode_usage(const NamespaceUsage& u) {
  std::string s;
  for (std::uint64_t v : {u.msgs_in, u.bytes_in, u.msgs_out, u.bytes_out, u.throttled, u.refused,
                          u.seconds_at_ceiling, static_cast<std::uint64_t>(u.peak_in_per_s)})
    put_be64(s, v);
  return s;
}

bool decode_usage(std::string_view s, NamespaceUsage* u) {
  if (s.size() < 64) return false;
  const char* p = s.data();
  u->msgs_in = get_be64(p);
  u->bytes_in = get_be64(p + 8);
  u->msgs_out = get_be64(p + 16);
  u->bytes_out = get_be64(p + 24);
  u->throttled = get_be64(p + 32);
  u->refused = get_be64(p + 40);
  u->seconds_at_ceiling = get_be64(p + 48);
  u->peak_in_per_s = static_cast<double>(get_be64(p + 56));
  return true;
}

Status check_policy(std::string_view name, const NamespacePolicy& p) {
  auto bad = [&](const std::string& why) {
    return Status(Code::InvalidArgument, "namespace " + quoted(name) + " policy: " + why);
  };
  for (const Quota* qt : {&p.publish, &p.consume}) {
    if (!std::isfinite(qt->msgs_per_s) || !std::isfinite(qt->bytes_per_s) || qt->msgs_per_s < 0 ||
        qt->bytes_per_s < 0)
      return bad("quota rates must be finite and >= 0 (0 = no limit)");
    if (!(qt->burst_s >= 0.01 && qt->burst_s <= 60)) return bad("Quota::burst_s must be 0.01..60 seconds");
  }
  if (p.weight < 1 || p.weight > 1000) return bad("weight must be 1..1000, got " + std::to_string(p.weight));
  if (p.store_dir.find('\n') != std::string::npos) return bad("store_dir must not contain a newline");
  return Status();
}

bool prefix_covers(std::string_view prefix, std::string_view name) noexcept {
  if (name.size() < prefix.size() || name.substr(0, prefix.size()) != prefix) return false;
  return name.size() == prefix.size() || name[prefix.size()] == '.';
}

// ---------------------------------------------------------------- token bucket

void TokenBucket::configure(double per_s, double burst_s) noexcept {
  if (per_s <= 0) {
    ns_per_unit.store(0, std::memory_order_relaxed);
    return;
  }
  const double per = 1e9 / per_s;
  tau_ns.store(static_cast<std::int64_t>(burst_s * 1e9), std::memory_order_relaxed);
  ns_per_unit.store(per, std::memory_order_relaxed);
}

std::int64_t TokenBucket::take_ns(std::int64_t inc, std::int64_t now) noexcept {
  if (ns_per_unit.load(std::memory_order_relaxed) <= 0) return 0;
  // A take larger than the burst passes when the bucket is full.
  const std::int64_t tau = std::max(tau_ns.load(std::memory_order_relaxed), inc);
  std::int64_t t = tat.load(std::memory_order_relaxed);
  for (;;) {
    const std::int64_t next = std::max(t, now) + inc;
    const std::int64_t wait = next - now - tau;
    if (wait > 0) return wait;
    if (tat.compare_exchange_weak(t, next, std::memory_order_relaxed, std::memory_order_relaxed)) return 0;
  }
}

void TokenBucket::give_back_ns(std::int64_t inc) noexcept {
  if (ns_per_unit.load(std::memory_order_relaxed) <= 0 || inc == 0) return;
  tat.fetch_sub(inc, std::memory_order_relaxed);
}

void TokenBucket::charge(double units, std::int64_t now) noexcept {
  if (ns_per_unit.load(std::memory_order_relaxed) <= 0) return;
  const std::int64_t inc = cost_ns(units);
  std::int64_t t = tat.load(std::memory_order_relaxed);
  while (!tat.compare_exchange_weak(t, std::max(t, now) + inc, std::memory_order_relaxed,
                                    std::memory_order_relaxed)) {
  }
}

std::int64_t TokenBucket::debt(std::int64_t now) const noexcept {
  if (ns_per_unit.load(std::memory_order_relaxed) <= 0) return 0;
  return std::max<std::int64_t>(0, tat.load(std::memory_order_relaxed) - now - tau_ns.load(std::memory_order_relaxed));
}

// ---------------------------------------------------------------- namespace admission

void NamespaceState::apply_policy() noexcept {
  pub_msgs.configure(policy.publish.msgs_per_s, policy.publish.burst_s);
  pub_bytes.configure(policy.publish.bytes_per_s, policy.publish.burst_s);
  con_msgs.configure(policy.consume.msgs_per_s, policy.consume.burst_s);
  con_bytes.configure(policy.consume.bytes_per_s, policy.consume.burst_s);
  pub_limited.store(pub_msgs.limited() || pub_bytes.limited(), std::memory_order_release);
  con_limited.store(con_msgs.limited() || con_bytes.limited(), std::memory_order_release);
  sched.weight.store(std::clamp<std::uint32_t>(policy.weight, 1, static_cast<std::uint32_t>(kMaxWeight)),
                     std::memory_order_relaxed);
  policy_epoch.fetch_add(1, std::memory_order_release);  // threads drop credit of the old policy
}

void NamespaceState::mark_ceiling(std::int64_t now) noexcept {
  const std::int64_t sec = now / 1'000'000'000;
  if (last_ceiling_sec.exchange(sec, std::memory_order_relaxed) != sec)
    live.seconds_at_ceiling.fetch_add(1, std::memory_order_relaxed);
}

std::uint64_t NamespaceState::msgs_in() const noexcept {
  std::uint64_t n = live.msgs_in.load(std::memory_order_relaxed);
  for (const PublisherTally& t : pub_tally) n += t.msgs.load(std::memory_order_relaxed);
  return n;
}

std::uint64_t NamespaceState::bytes_in() const noexcept {
  std::uint64_t n = live.bytes_in.load(std::memory_order_relaxed);
  for (const PublisherTally& t : pub_tally) n += t.bytes.load(std::memory_order_relaxed);
  return n;
}

Status NamespaceState::admit_publish(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept {
  if (pub_limited.load(std::memory_order_relaxed)) {
    if (Status s = admit_credit(bytes, may_block, timeout); !s.ok()) return s;
  }
  live.msgs_in.fetch_add(1, std::memory_order_relaxed);
  live.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
  return Status();
}

Status NamespaceState::admit_credit(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept {
  // The common case: this thread's credit covers the message (no atomic write).
  PublishCredit& c = tl_credit[0];
  const double need_m = pub_msgs.per_unit();
  const double need_b = static_cast<double>(bytes) * pub_bytes.per_unit();
  if (c.ns == this && c.msgs_ns >= need_m && c.bytes_ns >= need_b &&
      c.epoch == policy_epoch.load(std::memory_order_relaxed) && c.owner == tenancy->uid()) {
    c.msgs_ns -= need_m;
    c.bytes_ns -= need_b;
    return Status();
  }
  return admit_limited(bytes, may_block, timeout);
}

Status NamespaceState::admit_limited(std::size_t bytes, bool may_block, std::chrono::milliseconds timeout) noexcept {
  PublishCredit& c = credit_of(this);
  const double need_m = pub_msgs.per_unit();
  const double need_b = static_cast<double>(bytes) * pub_bytes.per_unit();
  // Takes m ns of pub_msgs and b of pub_bytes, both or neither: 0 or the wait.
  auto take = [this](std::int64_t m, std::int64_t b, std::int64_t now) {
    std::int64_t wait = m > 0 ? pub_msgs.take_ns(m, now) : 0;
    if (wait == 0 && b > 0) {
      wait = pub_bytes.take_ns(b, now);
      if (wait > 0) pub_msgs.give_back_ns(m);
    }
    return wait;
  };
  std::int64_t now = tenancy->now();
  std::int64_t deadline = 0;
  for (bool first = true;; first = false) {
    // What the credit lacks, then the same topped up to a chunk.
    const auto dm = need_m > c.msgs_ns ? static_cast<std::int64_t>(std::ceil(need_m - c.msgs_ns)) : 0;
    const auto db = need_b > c.bytes_ns ? static_cast<std::int64_t>(std::ceil(need_b - c.bytes_ns)) : 0;
    const std::int64_t cm = dm > 0 ? std::max(dm, credit_chunk(pub_msgs)) : 0;
    const std::int64_t cb = db > 0 ? std::max(db, credit_chunk(pub_bytes)) : 0;
    std::int64_t got_m = cm, got_b = cb;
    std::int64_t wait = take(cm, cb, now);
    if (wait > 0 && (cm > dm || cb > db)) {
      got_m = dm;
      got_b = db;
      wait = take(dm, db, now);
    }
    if (wait == 0) {
      c.msgs_ns += static_cast<double>(got_m) - need_m;
      c.bytes_ns += static_cast<double>(got_b) - need_b;
      return Status();
    }
    mark_ceiling(now);
    if (first) {
      if (!may_block) {
        live.refused.fetch_add(1, std::memory_order_relaxed);
        return Status::from_literal(Code::QuotaExceeded,
                                    "publish: the namespace's publish quota is used up (NamespacePolicy::publish)");
      }
      live.throttled.fetch_add(1, std::memory_order_relaxed);
      deadline = now + std::chrono::duration_cast<std::chrono::nanoseconds>(timeout).count();
    }
    if (now + wait > deadline) {
      live.refused.fetch_add(1, std::memory_order_relaxed);
      return Status::from_literal(Code::QuotaExceeded,
                                  "publish: the namespace's publish quota would not admit the message within "
                                  "the topic's block_timeout");
    }
    if (tenancy->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
    tenancy->sleep(std::min(wait, kMaxSleepNs));
    now = tenancy->now();
  }
}

void NamespaceState::unadmit_publish(std::size_t bytes) noexcept {
  if (pub_limited.load(std::memory_order_relaxed)) give_back_credit(bytes);
  live.msgs_in.fetch_sub(1, std::memory_order_relaxed);
  live.bytes_in.fetch_sub(bytes, std::memory_order_relaxed);
}

void NamespaceState::give_back_credit(std::size_t bytes) noexcept {
  // Back into this thread's credit (the admission just filled it).
  PublishCredit& c = credit_of(this);
  c.msgs_ns += pub_msgs.per_unit();
  c.bytes_ns += static_cast<double>(bytes) * pub_bytes.per_unit();
}

void NamespaceState::delivered(std::uint64_t msgs, std::uint64_t bytes) noexcept {
  live.msgs_out.fetch_add(msgs, std::memory_order_relaxed);
  live.bytes_out.fetch_add(bytes, std::memory_order_relaxed);
  if (con_limited.load(std::memory_order_relaxed)) {
    const std::int64_t now = tenancy->now();
    con_msgs.charge(static_cast<double>(msgs), now);
    con_bytes.charge(static_cast<double>(bytes), now);
  }
}

std::int64_t NamespaceState::consume_wait() noexcept {
  if (!con_limited.load(std::memory_order_relaxed)) return 0;
  const std::int64_t now = tenancy->now();
  const std::int64_t w = std::max(con_msgs.debt(now), con_bytes.debt(now));
  if (w > 0) live.throttled.fetch_add(1, std::memory_order_relaxed);
  return w;
}

// ---------------------------------------------------------------- registry

TenancyImpl::TenancyImpl(DurableStore* store, const std::atomic<bool>* closing)
    : store_(store),
      closing_(closing),
      opened_ns_(now()),
      uid_(g_next_tenancy_uid.fetch_add(1, std::memory_order_relaxed)) {}

TenancyImpl::~TenancyImpl() { close(); }

void TenancyImpl::sleep(std::int64_t ns) const noexcept {
  if (clock_.sleep_ns) {
    clock_.sleep_ns(ns);
    return;
  }
  std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
}

Status TenancyImpl::open() {
  if (store_ != nullptr) {
    std::vector<std::pair<std::string, std::string>> rows;
    Status s = store_->read([&](StoreTxn& t) {
      rows.clear();
      return t.scan(StoreTable::Tenancy, std::string_view("\0", 1), {}, [&](std::string_view k, std::string_view v) {
        rows.emplace_back(std::string(k), std::string(v));
        return true;
      });
    });
    if (!s.ok()) return s;
    MutexLock l(&mu_);
    for (auto& [k, v] : rows) {
      std::string_view key(k);
      if (key.substr(0, kNsPrefix.size()) == kNsPrefix) {
        NamespacePolicy p;
        std::string name(key.substr(kNsPrefix.size()));
        if (!decode_policy(v, &p))
          return Status(Code::Corruption, "tenancy table: namespace " + quoted(name) + " has an unreadable policy");
        NamespaceState* ns = exact_locked(name);
        ns->declared = true;
        ns->policy = p;
        ns->apply_policy();
      } else if (key.substr(0, kCredPrefix.size()) == kCredPrefix) {
        auto c = std::make_shared<CredentialState>();
        c->id = std::string(key.substr(kCredPrefix.size()));
        std::istringstream in(v);
        std::string line;
        auto grants = std::make_shared<std::vector<Grant>>();
        bool ok = false;
        while (std::getline(in, line)) {
          std::istringstream ls(line);
          std::string word;
          ls >> word;
          if (word == "v1") {
            std::string salt, hash;
            ls >> c->iterations >> salt >> hash;
            ok = unhex(salt, &c->salt) && unhex(hash, &c->hash) && c->iterations > 0;
          } else if (word == "grant") {
            Grant g;
            std::string flags;
            ls >> g.prefix >> flags;
            if (flags.size() != 3) return Status(Code::Corruption, "tenancy table: credential " + quoted(c->id) + ": bad grant");
            g.publish = flags[0] == 'p';
            g.consume = flags[1] == 'c';
            g.admin = flags[2] == 'a';
            grants->push_back(std::move(g));
          }
        }
        if (!ok) return Status(Code::Corruption, "tenancy table: credential " + quoted(c->id) + " has an unreadable hash");
        {
          MutexLock cl(&c->mu);
          c->grants = std::move(grants);
        }
        credentials_[c->id] = c;
      } else {
        std::string ns;
        std::uint64_t minute = 0;
        NamespaceUsage u;
        if (parse_usage_key(key, &ns, &minute) && decode_usage(v, &u)) {
          NamespaceState* st = exact_locked(ns);
          st->base = add(st->base, u);
        }
      }
    }
  }
  try {
    ticker_ = std::thread([this] { ticker_main(); });
  } catch (const std::exception& e) {
    return Status(Code::Internal, std::string("tenancy: starting the usage ticker: ") + e.what());
  }
  return Status();
}

void TenancyImpl::close() {
  if (ticker_.joinable()) {
    {
      std::lock_guard l(ticker_mu_);
      ticker_stop_ = true;
    }
    ticker_cv_.notify_all();
    ticker_.join();
    (void)flush_usage();
  }
}

void TenancyImpl::ticker_main() {
  auto last_flush = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock l(ticker_mu_);
      if (ticker_cv_.wait_for(l, std::chrono::seconds(1), [&] { return ticker_stop_; })) return;
    }
    tick();
    if (std::chrono::steady_clock::now() - last_flush >= std::chrono::minutes(1)) {
      (void)flush_usage();
      last_flush = std::chrono::steady_clock::now();
    }
  }
}

void TenancyImpl::tick() noexcept {
  // Namespaces that hit their publish quota since the last tick, logged after
  // mu_ is released (the hook runs with no lanebus lock held). A fixed array:
  // logging allocates nothing; a namespace beyond it keeps its last counts
  // and is reported at the next tick.
  struct Ceiling {
    const NamespaceState* ns;
    std::uint64_t refused, throttled;
  };
  std::array<Ceiling, 16> ceilings;
  std::size_t n = 0;
  const bool logging = logger_ != nullptr && logger_->enabled();
  {
    MutexLock l(&mu_);
    for (auto& [name, ns] : namespaces_) {
      const std::uint64_t in = ns->msgs_in();
      const std::uint64_t d = in - ns->ticker_last_in;
      ns->ticker_last_in = in;
      if (d > ns->peak_per_s.load(std::memory_order_relaxed)) ns->peak_per_s.store(d, std::memory_order_relaxed);
      const std::uint64_t refused = ns->live.refused.load(std::memory_order_relaxed);
      const std::uint64_t throttled = ns->live.throttled.load(std::memory_order_relaxed);
      if (refused == ns->ticker_last_refused && throttled == ns->ticker_last_throttled) continue;
      if (logging) {
        if (n == ceilings.size()) continue;
        ceilings[n++] = {ns.get(), refused - ns->ticker_last_refused, throttled - ns->ticker_last_throttled};
      }
      ns->ticker_last_refused = refused;
      ns->ticker_last_throttled = throttled;
    }
  }
  // A namespace is never removed once created, so its name outlives the lock.
  for (std::size_t i = 0; i < n; ++i)
    logger_->log(LogLevel::Warn,
                 "namespace \"%s\" is at its publish quota ceiling (NamespacePolicy::publish): %llu publishes "
                 "refused with QuotaExceeded, %llu throttled since the last report",
                 ceilings[i].ns->name.c_str(), static_cast<unsigned long long>(ceilings[i].refused),
                 static_cast<unsigned long long>(ceilings[i].throttled));
}

Status TenancyImpl::flush_usage() {
  if (store_ == nullptr || store_->read_only()) return Status();
  MutexLock fl(&flush_mu_);
  const auto wall_min = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::minutes>(std::chrono::system_clock::now().time_since_epoch()).count());
  std::vector<std::pair<NamespaceState*, NamespaceUsage>> deltas;
  {
    MutexLock l(&mu_);
    for (auto& [name, ns] : namespaces_) {
      NamespaceUsage now = load(*ns);
      now.peak_in_per_s = static_cast<double>(ns->peak_per_s.load(std::memory_order_relaxed));
      const NamespaceUsage& f = ns->flushed;
      NamespaceUsage d;
      d.msgs_in = now.msgs_in - f.msgs_in;
      d.bytes_in = now.bytes_in - f.bytes_in;
      d.msgs_out = now.msgs_out - f.msgs_out;
      d.bytes_out = now.bytes_out - f.bytes_out;
      d.throttled = now.throttled - f.throttled;
      d.refused = now.refused - f.refused;
      d.seconds_at_ceiling = now.seconds_at_ceiling - f.seconds_at_ceiling;
      d.peak_in_per_s = now.peak_in_per_s;
      if (d.msgs_in == 0 && d.msgs_out == 0 && d.throttled == 0 && d.refused == 0 && d.bytes_in == 0) continue;
      deltas.emplace_back(ns.get(), d);
    }
  }
  if (deltas.empty()) return Status();
  Status s = store_->write([&](StoreTxn& t) -> Status {
    for (auto& [ns, d] : deltas) {
      const std::string key = usage_key(ns->name, wall_min);
      NamespaceUsage merged = d;
      auto old = t.get(StoreTable::Tenancy, key);
      NamespaceUsage prev;
      if (old.ok() && decode_usage(*old, &prev)) merged = add(prev, d);
      if (Status ps = t.put(StoreTable::Tenancy, key, encode_usage(merged)); !ps.ok()) return ps;
    }
    return Status();
  });
  if (!s.ok()) return s;
  MutexLock l(&mu_);
  for (auto& [ns, d] : deltas) {
    NamespaceUsage& f = ns->flushed;
    f.msgs_in += d.msgs_in;
    f.bytes_in += d.bytes_in;
    f.msgs_out += d.msgs_out;
    f.bytes_out += d.bytes_out;
    f.throttled += d.throttled;
    f.refused += d.refused;
    f.seconds_at_ceiling += d.seconds_at_ceiling;
  }
  return Status();
}

NamespaceState* TenancyImpl::exact_locked(std::string_view name) {
  auto it = namespaces_.find(name);
  if (it != namespaces_.end()) return it->second.get();
  auto owned = std::make_unique<NamespaceState>(this, std::string(name));
  NamespaceState* ns = owned.get();
  namespaces_.emplace(std::string(name), std::move(owned));
  return ns;
}

const NamespaceState* TenancyImpl::declared_locked(std::string_view name) const {
  // Longest declared namespace that covers the name, segment-wise.
  std::string_view cand = name;
  for (;;) {
    auto it = namespaces_.find(cand);
    if (it != namespaces_.end() && it->second->declared) return it->second.get();
    const auto dot = cand.rfind('.');
    if (dot == std::string_view::npos) return nullptr;
    cand = cand.substr(0, dot);
  }
}

NamespaceState* TenancyImpl::resolve_locked(std::string_view name) {
  if (const NamespaceState* d = declared_locked(name)) return const_cast<NamespaceState*>(d);
  return exact_locked(name.substr(0, name.find('.')));
}

NamespaceState* TenancyImpl::resolve(std::string_view name) {
  MutexLock l(&mu_);
  return resolve_locked(name);
}

std::string TenancyImpl::namespace_of(std::string_view name) const {
  MutexLock l(&mu_);
  if (const NamespaceState* d = declared_locked(name)) return d->name;
  return std::string(name.substr(0, name.find('.')));
}

Status TenancyImpl::persist(std::string key, std::string value, bool erase) {
  if (store_ == nullptr) return Status();
  return store_->write([&](StoreTxn& t) -> Status {
    if (erase) {
      Status s = t.del(StoreTable::Tenancy, key);
      return s.code() == Code::NotFound ? Status() : s;
    }
    return t.put(StoreTable::Tenancy, key, value);
  });
}

Status TenancyImpl::create(std::string_view name, const NamespacePolicy& policy) {
  if (Status s = check_name(name, "namespace"); !s.ok()) return s;
  if (Status s = check_policy(name, policy); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    auto it = namespaces_.find(name);
    if (it != namespaces_.end() && it->second->declared) {
      if (encode_policy(it->second->policy) == encode_policy(policy)) return Status();
      return Status(Code::Conflict, "namespace " + quoted(name) +
                                        " is declared with another policy; use Namespaces::set_policy to change it");
    }
  }
  if (Status s = persist(std::string(kNsPrefix) + std::string(name), encode_policy(policy)); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    NamespaceState* ns = exact_locked(name);
    ns->declared = true;
    ns->policy = policy;
    ns->apply_policy();
  }
  if (rebind_) rebind_();
  return Status();
}

Status TenancyImpl::set_policy(std::string_view name, const NamespacePolicy& policy) {
  if (Status s = check_name(name, "namespace"); !s.ok()) return s;
  if (Status s = check_policy(name, policy); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    auto it = namespaces_.find(name);
    if (it == namespaces_.end() || !it->second->declared)
      return Status(Code::NotFound, "set_policy: no declared namespace " + quoted(name) + " (declare it with Namespaces::create)");
  }
  if (Status s = persist(std::string(kNsPrefix) + std::string(name), encode_policy(policy)); !s.ok()) return s;
  MutexLock l(&mu_);
  NamespaceState* ns = namespaces_.find(name)->second.get();
  ns->policy = policy;
  ns->apply_policy();
  return Status();
}

NamespaceUsage TenancyImpl::usage_locked(const NamespaceState& ns) const {
  NamespaceUsage u = add(ns.base, load(ns));
  const double run_peak = static_cast<double>(ns.peak_per_s.load(std::memory_order_relaxed));
  u.peak_in_per_s = run_peak;
  const double secs = static_cast<double>(now() - opened_ns_) / 1e9;
  u.avg_in_per_s = secs > 0 ? static_cast<double>(ns.msgs_in()) / secs : 0;
  return u;
}

Result<NamespaceInfo> TenancyImpl::describe(std::string_view name) const {
  if (Status s = check_name(name, "namespace"); !s.ok()) return s;
  MutexLock l(&mu_);
  auto it = namespaces_.find(name);
  if (it == namespaces_.end()) return Status(Code::NotFound, "no namespace " + quoted(name));
  const NamespaceState& ns = *it->second;
  return NamespaceInfo{ns.name, ns.declared, ns.policy, usage_locked(ns)};
}

std::vector<NamespaceInfo> TenancyImpl::list() const {
  MutexLock l(&mu_);
  std::vector<NamespaceInfo> out;
  for (const auto& [name, ns] : namespaces_) out.push_back({ns->name, ns->declared, ns->policy, usage_locked(*ns)});
  return out;
}

// ---------------------------------------------------------------- credentials

Status TenancyImpl::add_credential(const Credential& c, const std::vector<Grant>& grants) {
  if (Status s = check_name(c.id, "credential id"); !s.ok()) return s;
  if (c.secret.empty() || c.secret.size() > kMaxSecretBytes)
    return Status(Code::InvalidArgument, "credential " + quoted(c.id) + ": the secret must be 1..1024 bytes");
  if (Status s = check_grants(grants); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    if (credentials_.count(c.id))
      return Status(Code::Conflict, "credential " + quoted(c.id) + " exists; remove it first or use set_grants");
  }
  auto st = std::make_shared<CredentialState>();
  st->id = c.id;
  st->salt.resize(kSaltBytes);
  if (RAND_bytes(reinterpret_cast<unsigned char*>(st->salt.data()), static_cast<int>(kSaltBytes)) != 1)
    return Status(Code::Internal, "credential " + quoted(c.id) + ": no random bytes for the salt (RAND_bytes)");
  st->iterations = kPbkdf2Iterations;
  st->hash = pbkdf2(c.secret, st->salt, st->iterations);
  if (st->hash.size() != kHashBytes) return Status(Code::Internal, "credential " + quoted(c.id) + ": PBKDF2 failed");
  {
    MutexLock cl(&st->mu);
    st->grants = std::make_shared<const std::vector<Grant>>(grants);
  }
  std::string rec = "v1 " + std::to_string(st->iterations) + " " + hex(st->salt) + " " + hex(st->hash) + "\n" +
                    encode_grants(grants);
  if (Status s = persist(std::string(kCredPrefix) + c.id, rec); !s.ok()) return s;
  MutexLock l(&mu_);
  credentials_[c.id] = st;
  return Status();
}

Status TenancyImpl::set_grants(std::string_view id, const std::vector<Grant>& grants) {
  if (Status s = check_grants(grants); !s.ok()) return s;
  std::shared_ptr<CredentialState> st;
  {
    MutexLock l(&mu_);
    auto it = credentials_.find(id);
    if (it == credentials_.end()) return Status(Code::NotFound, "set_grants: no credential " + quoted(id));
    st = it->second;
  }
  std::string rec = "v1 " + std::to_string(st->iterations) + " " + hex(st->salt) + " " + hex(st->hash) + "\n" +
                    encode_grants(grants);
  if (Status s = persist(std::string(kCredPrefix) + std::string(id), rec); !s.ok()) return s;
  MutexLock cl(&st->mu);
  st->grants = std::make_shared<const std::vector<Grant>>(grants);
  st->version.fetch_add(1, std::memory_order_release);
  return Status();
}

Status TenancyImpl::remove_credential(std::string_view id) {
  std::shared_ptr<CredentialState> st;
  {
    MutexLock l(&mu_);
    auto it = credentials_.find(id);
    if (it == credentials_.end()) return Status(Code::NotFound, "remove_credential: no credential " + quoted(id));
    st = it->second;
  }
  if (Status s = persist(std::string(kCredPrefix) + std::string(id), {}, true); !s.ok()) return s;
  {
    MutexLock l(&mu_);
    credentials_.erase(std::string(id));
  }
  MutexLock cl(&st->mu);
  st->removed = true;
  st->grants = std::make_shared<const std::vector<Grant>>();
  st->version.fetch_add(1, std::memory_order_release);
  return Status();
}

Result<std::vector<Grant>> TenancyImpl::grants(std::string_view id) const {
  std::shared_ptr<CredentialState> st;
  {
    MutexLock l(&mu_);
    auto it = credentials_.find(id);
    if (it == credentials_.end()) return Status(Code::NotFound, "no credential " + quoted(id));
    st = it->second;
  }
  MutexLock cl(&st->mu);
  return *st->grants;
}

Result<std::shared_ptr<CredentialState>> TenancyImpl::authenticate(const Credential& c) const {
  if (Status s = check_name(c.id, "credential id"); !s.ok()) return s;
  if (c.secret.empty() || c.secret.size() > kMaxSecretBytes)
    return Status(Code::InvalidArgument, "credential " + quoted(c.id) + ": the secret must be 1..1024 bytes");
  std::shared_ptr<CredentialState> st;
  {
    MutexLock l(&mu_);
    auto it = credentials_.find(c.id);
    if (it != credentials_.end()) st = it->second;
  }
  // An unknown id costs the same hash as a known one and gets the same answer.
  static const std::string kDummySalt(kSaltBytes, 's');
  const std::string h = pbkdf2(c.secret, st ? st->salt : kDummySalt, st ? st->iterations : kPbkdf2Iterations);
  const bool match = st && h.size() == st->hash.size() && CRYPTO_memcmp(h.data(), st->hash.data(), h.size()) == 0;
  if (!match)
    return Status(Code::PermissionDenied,
                  "credential " + quoted(c.id) + " is unknown or its secret does not match (Namespaces::add_credential)");
  return st;
}

}  // namespace lanebus::detail
