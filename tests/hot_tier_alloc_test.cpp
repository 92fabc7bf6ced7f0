// lanebus — MIT License.
// The idempotency hot tier allocates nothing after warm-up (doc/idempotency.md): lookups
// never, and inserts neither once it reached hot_capacity or a stable
// working set. Its own executable: the allocation counter replaces malloc,
// so under sanitizers it exits 77 (SKIP) and takes nothing else with it.
#include <doctest/doctest.h>

#include <cstdint>
#include <string_view>

#include "alloc_counter.hpp"
#include "hot_tier.hpp"

using lanebus::detail::HotTier;

namespace {

// "key-<n>" into buf without allocating.
std::string_view key_of(char* buf, std::uint32_t n) {
  char digits[16];
  int len = 0;
  do {
    digits[len++] = static_cast<char>('0' + n % 10);
    n /= 10;
  } while (n != 0);
  buf[0] = 'k', buf[1] = 'e', buf[2] = 'y', buf[3] = '-';
  for (int i = 0; i < len; ++i) buf[4 + i] = digits[len - 1 - i];
  return {buf, static_cast<std::size_t>(4 + len)};
}

}  // namespace

TEST_CASE("hot tier lookups and inserts after warm-up to hot_capacity allocate nothing") {
  lanebus::test::skip_if_sanitized();
  constexpr std::int64_t kTtl = 1'000'000'000;
  HotTier hot(8192, 64, kTtl);
  char buf[32];
  for (std::uint32_t i = 0; i < 20'000; ++i) hot.put(key_of(buf, i), HotTier::State::Done, 1, 1);  // warm-up
  REQUIRE(hot.entries() == 8192);
  lanebus::test::alloc_counting(true);
  std::uint64_t hits = 0;
  for (std::uint32_t i = 0; i < 100'000; ++i) {
    hits += hot.get(key_of(buf, 19'999 + i - i % 50), 2) != HotTier::State::Unknown;  // recent: mostly hits
    hits += hot.get(key_of(buf, i % 10'000), 2) != HotTier::State::Unknown;           // long evicted: misses
    hot.put(key_of(buf, 20'000 + i), HotTier::State::Done, 2, 2);                  // evicts
    hot.put(key_of(buf, 20'000 + i), HotTier::State::InProgress, 2, 2);            // updates
    if (i % 7 == 0) hot.forget(key_of(buf, 20'000 + i));
  }
  hits += hot.get(key_of(buf, 1), 2 + kTtl + 1) == HotTier::State::Done;  // expired on lookup
  lanebus::test::alloc_counting(false);
  CHECK(lanebus::test::alloc_count() == 0);
  CHECK(hits > 50'000);
}

TEST_CASE("hot tier inserts of a stable working set below hot_capacity allocate nothing") {
  lanebus::test::skip_if_sanitized();
  constexpr std::int64_t kTtl = 1'000'000;
  HotTier hot(65'536, 512, kTtl);
  char buf[32];
  std::int64_t now = 0;
  auto step = [&](std::uint32_t i) {
    now += kTtl / 800;  // 800 keys per TTL window
    hot.put(key_of(buf, i), HotTier::State::Done, now, now);
    return hot.get(key_of(buf, i), now) == HotTier::State::Done;
  };
  for (std::uint32_t i = 0; i < 5'000; ++i) REQUIRE(step(i));  // warm-up
  const std::uint64_t before = lanebus::test::alloc_count();
  lanebus::test::alloc_counting(true);
  bool all = true;
  for (std::uint32_t i = 5'000; i < 105'000; ++i) all &= step(i);
  lanebus::test::alloc_counting(false);
  CHECK(lanebus::test::alloc_count() == before);
  CHECK(all);
  CHECK(hot.entries() == 1024);
}
