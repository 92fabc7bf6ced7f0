// lanebus — MIT License.
// Helpers shared by the fence tests and fence_helper: opening a store and a lease table
// wired together, and reading a fenced topic's log back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "durable_store.hpp"
#include "lanebus/lease.hpp"

namespace lanebus::test {

inline LeaseTableOptions fence_table_options() {
  LeaseTableOptions o;
  o.allow_volatile_epoch = true;  // tests: the epoch file lives in the test's temp dir
  o.capacity = 256;
  return o;
}

inline Result<std::unique_ptr<detail::DurableStore>> open_fenced_store(const std::string& dir, LeaseTable* table,
                                                                       bool check = true) {
  StoreOptions o;
  o.directory = dir;
  auto s = detail::DurableStore::open(o);
  if (!s.ok()) return s;
  if (table != nullptr) {
    (*s)->set_fence_confirm(
        [table](std::string_view lease, std::uint64_t token) { return table->confirm_grant(lease, token); });
  }
  (*s)->set_fence_check_for_testing(check);
  return s;
}

/// Every message of `lane`, in offset order.
inline std::vector<detail::StoredMessage> read_lane_all(detail::DurableStore& store, const detail::TopicRef& topic,
                                                        std::uint32_t lane) {
  std::vector<detail::StoredMessage> out;
  std::uint64_t from = 0;
  for (;;) {
    auto b = store.read(topic, lane, from);
    if (!b.ok() || b->messages.empty()) break;
    for (auto& m : b->messages) out.push_back(std::move(m));
    from = b->next_offset;
  }
  return out;
}

/// Places where a lower token follows a higher one in the log (0 when fenced correctly).
inline std::size_t token_regressions(const std::vector<detail::StoredMessage>& log) {
  std::size_t n = 0;
  std::uint64_t high = 0;
  for (const auto& m : log) {
    if (m.header.fencing_token < high) ++n;
    high = std::max(high, m.header.fencing_token);
  }
  return n;
}

}  // namespace lanebus::test
