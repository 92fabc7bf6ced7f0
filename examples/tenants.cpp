// lanebus — MIT License.
// Three tenants share one bus and one store (doc/tenancy.md): each has its own
// namespace and credential, none can touch another's topics, the noisy one is
// held at its publish quota while the quiet ones keep flowing, and the usage
// report (the same counters that enforce the quota) survives a restart; then
// the noisy tenant moves to a store of its own with unchanged client code.
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>

#include "lanebus/client.hpp"
#include "lanebus/lanebus.hpp"

using namespace lanebus;

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "tenants: %s\n", what.c_str());
  return 1;
}

void report(Bus& bus) {
  std::printf("  %-10s %8s %8s %8s %8s %8s %12s\n", "namespace", "in", "out", "refused", "throttled", "ceil_s",
              "quota msg/s");
  for (const NamespaceInfo& n : bus.namespaces()->list()) {
    if (!n.declared) continue;
    std::printf("  %-10s %8llu %8llu %8llu %8llu %8llu %12.0f\n", n.name.c_str(),
                static_cast<unsigned long long>(n.usage.msgs_in), static_cast<unsigned long long>(n.usage.msgs_out),
                static_cast<unsigned long long>(n.usage.refused), static_cast<unsigned long long>(n.usage.throttled),
                static_cast<unsigned long long>(n.usage.seconds_at_ceiling), n.policy.publish.msgs_per_s);
  }
}

// The ads tenant's own code: the same before and after its namespace moves.
constexpr std::uint64_t kBillingEvents = 100;

TopicOptions billing_options() {
  TopicOptions t;
  t.durable = true;
  t.lanes = 2;
  return t;
}

Status publish_billing(Client& ads) {
  auto q = ads.create_queue("ads.billing", billing_options());
  if (!q.ok()) return q.status();
  for (std::uint64_t i = 0; i < kBillingEvents; ++i) {
    const std::string payload = "invoice-" + std::to_string(i);
    if (Status s = ads.publish(*q, {.key = "campaign", .payload = payload}); !s.ok()) return s;
  }
  return Status();
}

Result<std::uint64_t> consume_billing(Client& ads) {
  auto q = ads.create_queue("ads.billing", billing_options());
  if (!q.ok()) return q.status();
  std::atomic<std::uint64_t> got{0};
  auto sub = ads.consume(*q, [&](const MessageView&) {
    got.fetch_add(1);
    return Outcome::ack();
  });
  if (!sub.ok()) return sub.status();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.load() < kBillingEvents && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  (void)sub->close();
  return got.load();
}

}  // namespace

int main() {
  char tmpl[] = "/tmp/lanebus-tenants-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return fail("mkdtemp failed");
  const std::string dir = std::string(tmpl) + "/store";
  BusOptions o;
  o.workers = 2;
  o.access_control = true;  // deny by default
  o.store.directory = dir;
  o.store.durability = Durability::Async;

  std::uint64_t ads_in = 0;
  {
    auto opened = Bus::open(o);
    if (!opened.ok()) return fail(opened.status().to_string());
    Bus& bus = **opened;
    Namespaces& ns = *bus.namespaces();

    // 1. Three namespaces with quotas; "ads" is the noisy one.
    NamespacePolicy quiet;
    quiet.publish.msgs_per_s = 5000;
    NamespacePolicy noisy;
    noisy.publish.msgs_per_s = 2000;
    noisy.publish.burst_s = 0.05;
    for (auto [name, p] : {std::pair{"shop", quiet}, std::pair{"blog", quiet}, std::pair{"ads", noisy}})
      if (Status s = ns.create(name, p); !s.ok()) return fail(s.to_string());
    std::printf("1. namespaces shop, blog (5000 msg/s) and ads (2000 msg/s) declared\n");

    // 2. One credential per tenant, granted only its own namespace.
    for (const char* t : {"shop", "blog", "ads"}) {
      Status s = ns.add_credential({std::string(t) + "-svc", std::string("secret-of-") + t},
                                   {Grant{t, true, true, true}});
      if (!s.ok()) return fail(s.to_string());
    }
    Client shop = bus.client({"shop-svc", "secret-of-shop"}).value();
    Client blog = bus.client({"blog-svc", "secret-of-blog"}).value();
    Client ads = bus.client({"ads-svc", "secret-of-ads"}).value();

    TopicOptions fail_fast;
    fail_fast.backpressure = Backpressure::FailFast;
    Topic orders = shop.create_topic("shop.orders").value();
    Topic posts = blog.create_topic("blog.posts").value();
    Topic clicks = ads.create_topic("ads.clicks", fail_fast).value();

    // 3. Isolation is enforced, not a naming convention.
    Status denied = blog.publish(orders, {.key = "x", .payload = "fake order"});
    std::printf("2. blog publishing into shop.orders: %s\n", denied.to_string().c_str());
    if (denied.code() != Code::PermissionDenied) return fail("blog was allowed into shop's namespace");
    if (blog.subscribe(orders, "spy", [](const MessageView&) { return Outcome::ack(); }).code() !=
        Code::PermissionDenied)
      return fail("blog was allowed to read shop's topic");

    std::atomic<std::uint64_t> handled{0};
    auto h = [&](const MessageView&) {
      handled.fetch_add(1);
      return Outcome::ack();
    };
    auto s1 = shop.subscribe(orders, "billing", h).value();
    auto s2 = blog.subscribe(posts, "indexer", h).value();
    auto s3 = ads.subscribe(clicks, "counter", h).value();

    // 4. The noisy tenant offers far more than its quota for one second while
    //    the quiet ones publish at their normal pace.
    std::atomic<bool> stop{false};
    // t0 before the noisy thread starts: the bound below must cover all of its
    // publishing, also when this thread is descheduled right after starting it.
    const auto t0 = std::chrono::steady_clock::now();
    std::thread noisy_thread([&] {
      while (!stop.load()) {
        Status s = ads.try_publish(clicks, {.key = "c", .payload = "click"});
        if (s.ok()) ++ads_in;
      }
    });
    std::uint64_t quiet_sent = 0;
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
      if (!shop.publish(orders, {.key = "o", .payload = "order"}).ok()) return fail("shop publish failed");
      if (!blog.publish(posts, {.key = "p", .payload = "post"}).ok()) return fail("blog publish failed");
      quiet_sent += 2;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    stop.store(true);
    noisy_thread.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("3. one second of flash traffic: ads got %llu publishes through (quota 2000/s), "
                "shop and blog published all %llu of theirs\n",
                static_cast<unsigned long long>(ads_in), static_cast<unsigned long long>(quiet_sent));
    if (static_cast<double>(ads_in) > 2000 * secs * 1.05 + 100) return fail("ads was not held at its quota");

    // 3b. Fair sharing below the ceilings: shop gets weight 3, ads keeps 1.
    //     Both queue slow jobs (ads ten times as many, within its quota); while both have
    //     work, shop gets about 3/4 of the two workers.
    // (Declared out here: the consumers run until the drain below.)
    std::atomic<std::uint64_t> shop_done{0}, ads_done{0}, ads_when_shop_done{0};
    std::atomic<bool> measured{false};
    Subscription jobs_consumers[2];
    {
      NamespacePolicy shop_policy = quiet;
      shop_policy.weight = 3;
      if (Status s = ns.set_policy("shop", shop_policy); !s.ok()) return fail(s.to_string());
      TopicOptions jobs_options;
      jobs_options.capacity = 8192;
      Topic shop_jobs = shop.create_queue("shop.jobs", jobs_options).value();
      Topic ads_jobs = ads.create_queue("ads.jobs", jobs_options).value();
      for (int i = 0; i < 1000; ++i) {
        const std::string key = "j" + std::to_string(i % 32);
        if (i < 100 && !shop.publish(shop_jobs, {.key = key, .payload = "job"}).ok()) return fail("shop job");
        if (!ads.publish(ads_jobs, {.key = key, .payload = "job"}).ok()) return fail("ads job");
        ++ads_in;
      }
      GroupOptions small_batches;  // a worker switches lanes every 4 jobs
      small_batches.batch = 4;
      auto job = [](const MessageView&) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        return Outcome::ack();
      };
      jobs_consumers[0] = shop.consume(shop_jobs, [&, job](const MessageView& m) {
                                Outcome out = job(m);
                                if (shop_done.fetch_add(1) + 1 == 80) {
                                  ads_when_shop_done.store(ads_done.load());
                                  measured.store(true);
                                }
                                return out;
                              }, small_batches).value();
      jobs_consumers[1] = ads.consume(ads_jobs, [&, job](const MessageView& m) {
                                Outcome out = job(m);
                                ads_done.fetch_add(1);
                                return out;
                              }, small_batches).value();
      while (!measured.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const double a = static_cast<double>(ads_when_shop_done.load());
      std::printf("3b. fair sharing, weights shop 3 : ads 1, both busy: shop ran 80 jobs, ads %.0f "
                  "(shares %.2f / %.2f)\n",
                  a, 80 / (80 + a), a / (80 + a));
    }
    (void)bus.shutdown(ShutdownMode::Drain);
    std::printf("4. usage report:\n");
    report(bus);
  }

  // 5. The usage survives a restart (persisted by minute in the store).
  {
    auto reopened = Bus::open(o);
    if (!reopened.ok()) return fail(reopened.status().to_string());
    auto info = (*reopened)->namespaces()->describe("ads").value();
    std::printf("5. after a restart, ads shows %llu messages in, %llu refused\n",
                static_cast<unsigned long long>(info.usage.msgs_in),
                static_cast<unsigned long long>(info.usage.refused));
    if (info.usage.msgs_in != ads_in) return fail("usage did not survive the restart");
    // ads keeps billing events in a durable queue of the shared store.
    Client ads = (*reopened)->client({"ads-svc", "secret-of-ads"}).value();
    if (Status s = publish_billing(ads); !s.ok()) return fail("billing: " + s.to_string());
    (void)(*reopened)->shutdown(ShutdownMode::Drain);
  }

  // 6. ads outgrows the shared store: move its namespace to a store of its own
  //    (bus closed; the same as `lanebus namespace move DIR ADS_DIR ads`), then
  //    map it in BusOptions. The ads code below is unchanged: same names.
  const std::string ads_dir = std::string(tmpl) + "/ads-store";
  if (Status s = move_namespace(dir, ads_dir, "ads"); !s.ok()) return fail("move: " + s.to_string());
  o.namespace_stores.push_back({"ads", ads_dir});
  {
    auto moved = Bus::open(o);
    if (!moved.ok()) return fail(moved.status().to_string());
    Client ads = (*moved)->client({"ads-svc", "secret-of-ads"}).value();
    auto billed = consume_billing(ads);
    if (!billed.ok()) return fail("billing after the move: " + billed.status().to_string());
    std::printf("6. ads moved to its own store; its unchanged code consumed all %llu billing events there\n",
                static_cast<unsigned long long>(*billed));
    if (*billed != kBillingEvents) return fail("billing events were lost in the move");
    (void)(*moved)->shutdown(ShutdownMode::Drain);
  }
  std::filesystem::remove_all(tmpl);
  std::printf("done\n");
  return 0;
}
