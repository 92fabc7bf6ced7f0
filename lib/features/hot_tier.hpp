// lanebus — MIT License.
// HotTier: the in-memory front of an idempotency table (doc/idempotency.md). A bounded
// cache of (key → state, written_at) with a TTL, in pre-allocated nodes linked
// into a Boost.Intrusive hash set (lookup) and list (LRU order).
//
// It only ever answers "known done" / "known in progress by this process" /
// "unknown": a miss (or an expired entry) sends the caller to the durable
// tier, so evicting early is always safe, never a duplicate.
//
// Design notes
// - Memory grows with use, up to a bound. It starts with
//   min(kInitialEntries, capacity) nodes; an insert that finds no free node,
//   and whose least recently written entry is still within the TTL, adds a
//   block as large as everything so far (doubling, capped at `capacity`) and
//   rehashes into a bucket array twice as large. Once `capacity` nodes exist,
//   or once the working set of one TTL fits in what exists, inserts recycle
//   nodes (expired or least recently written) and never allocate again.
// - Lookups (get) never allocate. Nothing ever shrinks.
// - Each node carries max_key bytes of key storage, so the footprint is
//   entries × (sizeof(Node) + max_key) + buckets × sizeof(bucket): with the
//   defaults (max_key 512) 581,632 bytes at start (1,024 entries) and
//   37,224,448 bytes at the bound (65,536 entries) on LP64.
// - Growing uses new(std::nothrow): when memory is short the tier simply
//   evicts instead of growing (it is a cache), and never throws.
//
// Invariants (under mu_):
//  1. Every node of every block is in exactly one of: free_, or both set_
//     and lru_.
//  2. entries_ == sum of block sizes <= capacity_; buckets_ holds
//     bucket_count_ >= min(entries_, 8) buckets, a power of two.
#pragma once

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/unordered_set.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>
#include <vector>

#include "hash.hpp"
#include "sync.hpp"

namespace lanebus::detail {

class HotTier {
 public:
  enum class State : std::uint8_t { Unknown, InProgress, Done };

  /// Nodes allocated at construction (fewer if capacity is smaller).
  static constexpr std::uint32_t kInitialEntries = 1024;

  /// Up to `capacity` entries of keys up to max_key bytes; entries older
  /// than ttl_ns count as unknown. REQUIRES: capacity >= 1.
  HotTier(std::uint32_t capacity, std::uint32_t max_key, std::int64_t ttl_ns)
      : capacity_(capacity),
        max_key_(max_key),
        ttl_ns_(ttl_ns),
        bucket_count_(bucket_count(std::min(kInitialEntries, capacity))),
        buckets_(new Set::bucket_type[bucket_count_]),
        set_(Set::bucket_traits(buckets_.get(), bucket_count_)) {
    MutexLock l(&mu_);
    blocks_.reserve(40);  // doubling from 1 to 2^32 entries takes at most 33 blocks
    if (!add_block(std::min(kInitialEntries, capacity))) throw std::bad_alloc();  // like any constructor allocation
  }
  ~HotTier() {
    MutexLock l(&mu_);
    set_.clear();
    lru_.clear();
    free_.clear();
  }
  HotTier(const HotTier&) = delete;
  HotTier& operator=(const HotTier&) = delete;

  /// The cached state of `key` at time now_ns (Unknown when absent or
  /// expired). Never allocates.
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

  /// Remember `key` as `state`, written at `written_at`, at time now_ns
  /// (Unknown, or an entry already past the TTL, forgets it). Keys longer
  /// than max_key are not cached (the durable tier still answers for them).
  /// May allocate a block while fewer than `capacity` entries exist (see the
  /// design notes); never throws.
  void put(std::string_view key, State state, std::int64_t written_at, std::int64_t now_ns) EXCLUDES(mu_) {
    if (key.size() > max_key_) return;
    MutexLock l(&mu_);
    Node* n = find(key);
    if (state == State::Unknown || now_ns - written_at > ttl_ns_) {
      if (n) drop(n);
      return;
    }
    if (n == nullptr) {
      if (free_.empty()) {
        Node& oldest = lru_.back();
        // Recycle an expired entry before growing: memory follows the working
        // set of one TTL, not the number of keys ever seen.
        if (now_ns - oldest.written_at > ttl_ns_ || !grow()) drop(&oldest);
      }
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

  /// Forget `key` (it is Unknown afterwards). Never allocates.
  void forget(std::string_view key) EXCLUDES(mu_) { put(key, State::Unknown, 0, 0); }

  /// Entries cached now.
  std::size_t size() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return set_.size();
  }
  /// Nodes allocated (cached + free); grows up to capacity.
  std::uint32_t entries() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return entries_;
  }
  /// Bytes held: nodes with their key storage, and the bucket array.
  std::size_t footprint_bytes() const EXCLUDES(mu_) {
    MutexLock l(&mu_);
    return footprint(entries_, bucket_count_, max_key_);
  }
  /// What footprint_bytes() is with `entries` nodes (the bucket array is the
  /// smallest power of two >= entries, at least 8).
  static std::size_t footprint_at(std::uint32_t entries, std::uint32_t max_key) {
    return footprint(entries, bucket_count(entries), max_key);
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
      return static_cast<std::size_t>(fnv1a64(k));
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
  struct Block {
    std::unique_ptr<Node[]> nodes;
    std::unique_ptr<char[]> keys;  // max_key bytes per node
    std::uint32_t count = 0;
  };

  static std::size_t bucket_count(std::uint32_t entries) {
    std::size_t b = 8;
    while (b < entries) b <<= 1;
    return b;
  }
  static std::size_t footprint(std::uint32_t entries, std::size_t buckets, std::uint32_t max_key) {
    return std::size_t{entries} * (sizeof(Node) + max_key) + buckets * sizeof(Set::bucket_type);
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
  // Adds `count` free nodes. False (nothing changed) when memory is short.
  bool add_block(std::uint32_t count) REQUIRES(mu_) {
    Block b;
    b.nodes.reset(new (std::nothrow) Node[count]);
    b.keys.reset(new (std::nothrow) char[std::size_t{count} * max_key_]);
    if (!b.nodes || !b.keys) return false;
    b.count = count;
    for (std::uint32_t i = 0; i < count; ++i) {
      b.nodes[i].key_data = b.keys.get() + std::size_t{i} * max_key_;
      free_.push_back(b.nodes[i]);
    }
    blocks_.push_back(std::move(b));  // reserved: never reallocates
    entries_ += count;
    return true;
  }
  // Doubles the nodes (capped at capacity_) and rehashes into a bucket array
  // to match. False when at the bound or when memory is short.
  bool grow() REQUIRES(mu_) {
    if (entries_ >= capacity_) return false;
    const std::uint32_t add = std::min(entries_, capacity_ - entries_);
    const std::size_t want = bucket_count(entries_ + add);
    std::unique_ptr<Set::bucket_type[]> bigger;
    if (want > bucket_count_) {
      bigger.reset(new (std::nothrow) Set::bucket_type[want]);
      if (!bigger) return false;
    }
    if (!add_block(add)) return false;
    if (bigger) {
      set_.rehash(Set::bucket_traits(bigger.get(), want));
      buckets_ = std::move(bigger);  // the old array is freed: the set no longer uses it
      bucket_count_ = want;
    }
    return true;
  }

  const std::uint32_t capacity_;
  const std::uint32_t max_key_;
  const std::int64_t ttl_ns_;
  mutable Mutex mu_;
  std::vector<Block> blocks_ GUARDED_BY(mu_);  // node addresses are stable (each block is its own array)
  std::uint32_t entries_ GUARDED_BY(mu_) = 0;
  // Replaced only by grow(), under mu_; set in the constructor before any
  // other thread can see the tier. Declared before set_, so it outlives it.
  std::size_t bucket_count_;
  std::unique_ptr<Set::bucket_type[]> buckets_;
  Set set_ GUARDED_BY(mu_);
  List lru_ GUARDED_BY(mu_);   // most recently written first
  List free_ GUARDED_BY(mu_);  // unused nodes
};

}  // namespace lanebus::detail
