// lanebus — MIT License.
// HotTier: the in-memory front of an idempotency table (SPEC §4). A bounded
// cache of (key → state, written_at) with a TTL, in pre-allocated nodes linked
// into a Boost.Intrusive hash set (lookup) and list (LRU order). After
// construction, lookups, inserts, updates and evictions never allocate.
//
// It only ever answers "known done" / "known in progress by this process" /
// "unknown": a miss (or an expired entry) sends the caller to the durable
// tier, so evicting early is always safe, never a duplicate.
#pragma once

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/unordered_set.hpp>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <vector>

#include "sync.hpp"

namespace lanebus::detail {

class HotTier {
 public:
  enum class State : std::uint8_t { Unknown, InProgress, Done };

  /// capacity entries of keys up to max_key bytes; entries older than ttl_ns
  /// count as unknown. REQUIRES: capacity >= 1.
  HotTier(std::uint32_t capacity, std::uint32_t max_key, std::int64_t ttl_ns)
      : max_key_(max_key),
        ttl_ns_(ttl_ns),
        buckets_(bucket_count(capacity)),
        set_(Set::bucket_traits(buckets_.data(), buckets_.size())) {
    nodes_.reserve(capacity);
    keys_.resize(static_cast<std::size_t>(capacity) * max_key);
    for (std::uint32_t i = 0; i < capacity; ++i) {
      nodes_.emplace_back();
      nodes_.back().key_data = keys_.data() + static_cast<std::size_t>(i) * max_key;
    }
    for (auto& n : nodes_) free_.push_back(n);
  }
  ~HotTier() {
    set_.clear();
    lru_.clear();
    free_.clear();
  }
  HotTier(const HotTier&) = delete;
  HotTier& operator=(const HotTier&) = delete;

  /// The cached state of `key` at time now_ns (Unknown when absent or expired).
  State get(std::string_view key, std::int64_t now_ns, std::int64_t* written_at = nullptr) EXCLUDES(mu_) {
    MutexLock l(&mu_);
    Node* n = find(key);
    if (n == nullptr) return State::Unknown;
    if (now_ns - n->written_at > ttl_ns_) {
      drop(n);
      return State::Unknown;
    }
    if (written_at) *written_at = n->written_at;
    return n->state;
  }

  /// Remember `key` as `state` (Unknown forgets it). Keys longer than
  /// max_key are not cached (the durable tier still answers for them).
  void put(std::string_view key, State state, std::int64_t written_at) EXCLUDES(mu_) {
    if (key.size() > max_key_) return;
    MutexLock l(&mu_);
    Node* n = find(key);
    if (state == State::Unknown) {
      if (n) drop(n);
      return;
    }
    if (n == nullptr) {
      if (free_.empty()) drop(&lru_.back());  // evict the least recently written
      n = &free_.front();
      free_.pop_front();
      std::memcpy(n->key_data, key.data(), key.size());
      n->key_len = static_cast<std::uint32_t>(key.size());
      set_.insert(*n);
    } else {
      lru_.erase(lru_.iterator_to(*n));
    }
    n->state = state;
    n->written_at = written_at;
    lru_.push_front(*n);
  }

  std::size_t size() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return set_.size();
  }

 private:
  struct Node : boost::intrusive::unordered_set_base_hook<>, boost::intrusive::list_base_hook<> {
    char* key_data = nullptr;
    std::uint32_t key_len = 0;
    State state = State::Unknown;
    std::int64_t written_at = 0;
    std::string_view key() const noexcept { return {key_data, key_len}; }
  };
  struct Hash {
    std::size_t operator()(std::string_view k) const noexcept {
      std::uint64_t h = 14695981039346656037ull;  // FNV-1a
      for (unsigned char c : k) h = (h ^ c) * 1099511628211ull;
      return static_cast<std::size_t>(h);
    }
    std::size_t operator()(const Node& n) const noexcept { return (*this)(n.key()); }
  };
  struct Eq {
    bool operator()(const Node& a, const Node& b) const noexcept { return a.key() == b.key(); }
    bool operator()(std::string_view a, const Node& b) const noexcept { return a == b.key(); }
    bool operator()(const Node& a, std::string_view b) const noexcept { return a.key() == b; }
  };
  using Set = boost::intrusive::unordered_set<Node, boost::intrusive::hash<Hash>, boost::intrusive::equal<Eq>,
                                              boost::intrusive::power_2_buckets<true>>;
  using List = boost::intrusive::list<Node>;

  static std::size_t bucket_count(std::uint32_t capacity) {
    std::size_t b = 8;
    while (b < capacity) b <<= 1;
    return b;
  }
  Node* find(std::string_view key) REQUIRES(mu_) {
    auto it = set_.find(key, Hash(), Eq());
    return it == set_.end() ? nullptr : &*it;
  }
  void drop(Node* n) REQUIRES(mu_) {
    set_.erase(set_.iterator_to(*n));
    lru_.erase(lru_.iterator_to(*n));
    free_.push_front(*n);
  }

  const std::uint32_t max_key_;
  const std::int64_t ttl_ns_;
  std::vector<Node> nodes_;   // fixed after construction (addresses stable)
  std::vector<char> keys_;    // key bytes, max_key per node
  std::vector<Set::bucket_type> buckets_;
  mutable Mutex mu_;
  Set set_ GUARDED_BY(mu_);
  List lru_ GUARDED_BY(mu_);   // most recently written first
  List free_ GUARDED_BY(mu_);  // unused nodes
};

}  // namespace lanebus::detail
