// lanebus — MIT License.
// LaneRing: the bounded, allocation-free, linearizable FIFO that carries one
// lane of one consumer group (Vyukov's bounded MPMC queue).
//
// Design notes
// - Why not moodycamel here: moodycamel gives FIFO per producer only, and the
//   ordering contract is per key across threads ("if publish A returns before
//   publish B starts, every group sees A first"). A single ticket counter gives
//   exactly that: A's CAS on tail_ happens before B reads tail_, so A's position
//   is lower, and consumers take positions in order.
// - Several dequeuers may race (the lane's worker and a DropOldest publisher);
//   the algorithm is MPMC, so that is safe and the worker still sees order.
// - Capacity is a power of two fixed at construction; memory is allocated once.
//
// Invariants
// 1. cell[p & mask].seq == p      : free, may be written for position p.
// 2. cell[p & mask].seq == p + 1  : holds the value for position p.
// 3. A dequeuer of p stores seq = p + capacity, freeing the cell for p + capacity.
// 4. released_ <= every position whose cell is not yet freed: positions below
//    released_ + capacity are free for writing (the solo publisher's
//    free_until_ caches that bound).
// 5. push_solo / enqueue_bulk_solo may be used only by the one publisher that
//    holds its topic's solo ownership (bus_impl.hpp, "Solo publishers"): no
//    other enqueuer runs meanwhile, so tail_ needs no read-modify-write and a
//    cell needs no seq_cst store (the caller fences once before it reads the
//    lane's `scheduled` flag: the Dekker hand-off of bus_impl.hpp).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>

#include "prefetch.hpp"

namespace lanebus::detail {

/// `Value`: what a cell carries (a slot index for a lane; DelayQueue's
/// staging ring carries the due time beside it). Trivially copyable.
template <class Value>
class BasicLaneRing {
 public:
  explicit BasicLaneRing(std::uint32_t capacity_pow2)
      : mask_(capacity_pow2 - 1), cells_(new_cells(capacity_pow2)) {
    for (std::uint64_t i = 0; i < capacity_pow2; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  /// False when full. Never allocates.
  bool try_enqueue(const Value& value) noexcept {
    std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      // acquire: pairs with the dequeuer's release that freed the cell.
      std::uint64_t seq = cell->seq.load(std::memory_order_acquire);
      std::int64_t diff = static_cast<std::int64_t>(seq) - static_cast<std::int64_t>(pos);
      if (diff == 0) {
        // relaxed: the cell's seq (acquire above / release below) orders the value.
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
    cell->value = value;
    // seq_cst (not just release): the publisher next reads the lane's
    // `scheduled` flag; this store must not be reordered after that load
    // (Dekker hand-off with the worker, see bus_impl.hpp).
    cell->seq.store(pos + 1, std::memory_order_seq_cst);
    return true;
  }

  /// try_enqueue for the topic's solo publisher (invariant 5): plain loads
  /// and stores, no locked instruction. Spins while the cell's previous
  /// dequeuer finishes its store (the ring cannot be full: see enqueue_bulk).
  void push_solo(const Value& value) noexcept {
    const std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    Cell* cell = &cells_[pos & mask_];
    wait_free(pos, cell);
    cell->value = value;
    cell->seq.store(pos + 1, std::memory_order_release);
    tail_.store(pos + 1, std::memory_order_relaxed);
    // The next cell, for writing (the worker's dequeue wrote it last).
    prefetch_for_write(&cells_[(pos + 1) & mask_]);
  }

  /// enqueue_bulk for the topic's solo publisher (invariant 5), without the
  /// closing fence (the caller fences before it reads the flag).
  void enqueue_bulk_solo(const Value* values, std::uint32_t count) noexcept {
    const std::uint64_t pos = tail_.load(std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < count; ++i) {
      Cell* cell = &cells_[(pos + i) & mask_];
      wait_free(pos + i, cell);
      cell->value = values[i];
      cell->seq.store(pos + i + 1, std::memory_order_release);
    }
    tail_.store(pos + count, std::memory_order_relaxed);
  }

  /// Append `count` values as one run of consecutive positions (publish_batch:
  /// one read-modify-write of tail_ for the run instead of one per value).
  /// REQUIRES: the ring cannot overflow — every entry pins a live pool slot and
  /// the ring has as many cells as the pool has slots, so a cell we claim is at
  /// most waiting for its previous dequeuer to finish its store (we spin).
  /// Ends with a seq_cst fence: the caller next reads the lane's `scheduled`
  /// flag, and every cell store must be visible before that load (the Dekker
  /// hand-off of bus_impl.hpp; one fence for the run instead of a seq_cst
  /// store per cell).
  void enqueue_bulk(const Value* values, std::uint32_t count) noexcept {
    const std::uint64_t pos = tail_.fetch_add(count, std::memory_order_relaxed);
    for (std::uint32_t i = 0; i < count; ++i) {
      Cell* cell = &cells_[(pos + i) & mask_];
      // acquire: pairs with the dequeuer's release that freed the cell.
      while (cell->seq.load(std::memory_order_acquire) != pos + i) std::this_thread::yield();
      cell->value = values[i];
      cell->seq.store(pos + i + 1, std::memory_order_release);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  /// False when empty (or when the oldest position is claimed but not yet written).
  bool try_dequeue(Value& value) noexcept {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell;
    for (;;) {
      cell = &cells_[pos & mask_];
      std::uint64_t seq = cell->seq.load(std::memory_order_acquire);
      std::int64_t diff = static_cast<std::int64_t>(seq) - static_cast<std::int64_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
      } else if (diff < 0) {
        return false;
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
    value = cell->value;
    // release: the value read above happens before an enqueuer reuses the cell.
    cell->seq.store(pos + mask_ + 1, std::memory_order_release);
    return true;
  }

  /// try_dequeue for a ring with one dequeuer at a time (the lane's owner;
  /// no DropOldest publisher): no CAS on head_.
  bool try_dequeue_single(Value& value) noexcept {
    std::uint64_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell = &cells_[pos & mask_];
    if (cell->seq.load(std::memory_order_acquire) != pos + 1) return false;
    value = cell->value;
    // relaxed: only the owner writes head_; hand-offs between owners go
    // through the run queue, which orders them.
    head_.store(pos + 1, std::memory_order_relaxed);
    cell->seq.store(pos + mask_ + 1, std::memory_order_release);
    released_.store(pos + 1, std::memory_order_release);
    return true;
  }

  /// try_dequeue_single that leaves the cell taken but not yet free: the
  /// worker frees the cells it took a line at a time (four cells), or all of
  /// them at once in release_taken. A worker that frees each cell as it
  /// takes it writes the line the publisher is filling, so in a stream each
  /// message moves that line twice between the cores; freed a line at a
  /// time, once (doc/performance.md "The slot in two lines").
  /// REQUIRES (the caller's rules, ephemeral_lane.cpp run_plain): call
  /// release_taken before the run ends and before a taken entry's slot can
  /// go back to the pool; only for an entry whose slot no other group holds.
  bool take_deferred(Value& value) noexcept {
    const std::uint64_t pos = head_.load(std::memory_order_relaxed);
    Cell* cell = &cells_[pos & mask_];
    if (cell->seq.load(std::memory_order_acquire) != pos + 1) return false;
    value = cell->value;
    head_.store(pos + 1, std::memory_order_relaxed);
    ++taken_;
    if (((pos + 1) & (kCellsPerLine - 1)) == 0) release_taken();
    return true;
  }

  /// Free the cells take_deferred took and left taken.
  void release_taken() noexcept {
    const std::uint64_t end = head_.load(std::memory_order_relaxed);
    // release: the values read happen before an enqueuer reuses the cells.
    for (std::uint64_t p = end - taken_; p < end; ++p) cells_[p & mask_].seq.store(p + mask_ + 1, std::memory_order_release);
    taken_ = 0;
    released_.store(end, std::memory_order_release);
  }

  /// The value `i` positions past the oldest, if it is there (a ring with one
  /// dequeuer, as try_dequeue_single): a batch is looked at before it is taken.
  bool peek_single(std::uint32_t i, Value& value) const noexcept {
    const std::uint64_t pos = head_.load(std::memory_order_relaxed) + i;
    const Cell& cell = cells_[pos & mask_];
    if (cell.seq.load(std::memory_order_acquire) != pos + 1) return false;
    value = cell.value;
    return true;
  }

  /// The value at position `pos` (at or past the oldest), if it is there: a
  /// ring with one dequeuer, as peek_single, for a run that knows its
  /// position (ephemeral_lane.cpp run_plain: head_ is not read again).
  bool peek_at(std::uint64_t pos, Value& value) const noexcept {
    const Cell& cell = cells_[pos & mask_];
    if (cell.seq.load(std::memory_order_acquire) != pos + 1) return false;
    value = cell.value;
    return true;
  }

  /// peek_at for the positions from `first` on, while they hold a value,
  /// at most `max`: each(i, value) for the i-th, which may end the run by
  /// returning false (the i-th is then not counted); returns how many. The
  /// ring's fields are read once (an acquire load per cell would make the
  /// compiler read them again per cell).
  template <class Each>
  std::uint32_t peek_each(std::uint64_t first, std::uint32_t max, Each&& each) const noexcept {
    const Cell* const cells = cells_.get();
    const std::uint64_t mask = mask_;
    std::uint32_t n = 0;
    for (; n < max; ++n) {
      const Cell& cell = cells[(first + n) & mask];
      if (cell.seq.load(std::memory_order_acquire) != first + n + 1 || !each(n, cell.value)) break;
    }
    return n;
  }

  /// Take every value below position `end` (seen by peek_at; one dequeuer)
  /// and leave their cells taken, not yet free: head_ moves (ready(),
  /// size_approx() and a steal's second look see them taken), free_taken
  /// frees the cells. Relaxed, as try_dequeue_single: only the owner
  /// writes head_.
  void take_to(std::uint64_t end) noexcept { head_.store(end, std::memory_order_relaxed); }

  /// Free the cells of positions [first, end), taken by take_to (one
  /// dequeuer; `first` is the first position whose cell is not free).
  /// A run frees them before it returns any of their slots to the pool
  /// (the rule of take_deferred).
  void free_taken(std::uint64_t first, std::uint64_t end) noexcept {
    // Locals, and a pointer walk to the ring's end and from its start: the
    // release stores would make the compiler load the members again per cell.
    Cell* const cells = cells_.get();
    const std::uint64_t mask = mask_;
    std::uint64_t p = first;
    while (p < end) {
      Cell* c = &cells[p & mask];
      Cell* const stop = c + std::min<std::uint64_t>(end - p, mask + 1 - (p & mask));
      // release: the values read happen before an enqueuer reuses the cells.
      for (; c != stop; ++c, ++p) c->seq.store(p + mask + 1, std::memory_order_release);
    }
    released_.store(end, std::memory_order_release);
  }

  /// Take the oldest `n` values, every one of them seen by peek_single.
  void advance_single(std::uint32_t n) noexcept {
    const std::uint64_t pos = head_.load(std::memory_order_relaxed);
    take_to(pos + n);
    free_taken(pos, pos + n);
  }

  /// True if the oldest position holds a value. seq_cst load: the worker's
  /// side of the Dekker hand-off (see bus_impl.hpp).
  bool ready() const noexcept {
    std::uint64_t pos = head_.load(std::memory_order_seq_cst);
    return cells_[pos & mask_].seq.load(std::memory_order_seq_cst) == pos + 1;
  }

  /// The position of the oldest entry (a steal's second look, scheduler.cpp).
  std::uint64_t head_position() const noexcept { return head_.load(std::memory_order_relaxed); }

  /// Entries claimed and not yet taken (approximate while others run).
  std::uint64_t size_approx() const noexcept {
    std::uint64_t t = tail_.load(std::memory_order_relaxed);
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    return t > h ? t - h : 0;
  }

  std::uint32_t capacity() const noexcept { return mask_ + 1; }

 private:
  // A lane's cell is 16 bytes, four to a line; a 16-byte value makes it
  // 32, two to a line. The array starts on a line.
  static_assert(std::is_trivially_copyable_v<Value> && sizeof(Value) <= 24);
  struct alignas(sizeof(Value) <= 8 ? 16 : 32) Cell {
    std::atomic<std::uint64_t> seq{0};
    Value value{};
  };
  static constexpr std::uint64_t kCellsPerLine = 64 / sizeof(Cell);
  struct CellsDelete {
    void operator()(Cell* c) const noexcept { ::operator delete[](c, std::align_val_t(64)); }
  };
  static Cell* new_cells(std::uint64_t n) {
    Cell* c = static_cast<Cell*>(::operator new[](n * sizeof(Cell), std::align_val_t(64)));
    for (std::uint64_t i = 0; i < n; ++i) new (&c[i]) Cell();
    return c;
  }
  /// The solo publisher's wait for the cell of `pos` to be free. Known
  /// free below free_until_ (released_ + capacity when last read), so in a
  /// stream the publisher writes the cell without reading it: a read would
  /// wait for the line the worker last wrote (73 % of route's samples in
  /// 1to1 before), a write goes through the store buffer. released_ is
  /// read once per about `capacity` appends; past it, the cell's seq
  /// decides, as for every other enqueuer.
  void wait_free(std::uint64_t pos, Cell* cell) noexcept {
    if (pos < free_until_.load(std::memory_order_relaxed)) return;
    // acquire: pairs with the dequeuer's release of released_; the cells
    // below it were freed, and their values read, before.
    const std::uint64_t until = released_.load(std::memory_order_acquire) + mask_ + 1;
    free_until_.store(until, std::memory_order_relaxed);
    if (pos < until) return;
    // acquire: pairs with the dequeuer's release that freed the cell.
    while (cell->seq.load(std::memory_order_acquire) != pos) std::this_thread::yield();
  }

  const std::uint64_t mask_;
  std::unique_ptr<Cell[], CellsDelete> cells_;
  alignas(64) std::atomic<std::uint64_t> tail_{0};  // written by publishers
  // Positions below it are known free (wait_free); the solo publisher's.
  std::atomic<std::uint64_t> free_until_{mask_ + 1};
  alignas(64) std::atomic<std::uint64_t> head_{0};  // written by the lane's worker (and droppers)
  std::uint64_t taken_ = 0;                         // owner-only: take_deferred's cells not yet freed
  // Every position below it was dequeued and its cell freed, by a ring's
  // one dequeuer (try_dequeue_single, take_deferred's release_taken,
  // advance_single); a ring with several dequeuers (try_dequeue, DropOldest)
  // leaves it behind, which only sends the publisher to the cells' seq.
  std::atomic<std::uint64_t> released_{0};
  [[maybe_unused]] char pad_[64 - 3 * sizeof(std::uint64_t)];
};

/// A lane's ring: slot indices.
using LaneRing = BasicLaneRing<std::uint32_t>;

}  // namespace lanebus::detail
