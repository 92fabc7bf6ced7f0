// lanebus — MIT License.
// MessagePool: a topic's pre-allocated message slots, a lock-free free list,
// and reference counts for fan-out (one slot shared by every group).
//
// Design notes
// - All memory is allocated once, at construction; alloc/release never touch
//   the heap. A slot is identified by a 32-bit index (lane rings carry indices).
// - The free list is a Treiber stack whose head packs {tag:32, index:32} in one
//   64-bit word; the tag changes on every push/pop, so a slot popped and pushed
//   back between a reader's load and CAS (ABA) makes the CAS fail.
//   Boost.Intrusive lists are not thread-safe, and a moodycamel queue of indices
//   would allocate a producer per new thread; a 64-bit CAS stack does neither.
// - Slots in use = allocated_ - freed_. The two counters live on separate
//   cache lines so publishers and workers do not bounce one line per message.
// - Workers free in batches (FreeChain): one CAS returns up to 32 slots as a
//   *chain*: the chain's first slot (free, its data unused) holds the count
//   and the indices of the others, and that one slot is pushed on a second
//   Treiber stack, `chains_`. Taking a chain is one CAS and one read of a
//   contiguous index array; taking 32 slots off the single-slot list is a
//   walk of 32 dependent links, each a cache line the freeing worker wrote
//   (the walk was 60 % of a publish on a 2-core VM, doc/performance.md).
// - Publishers take slots from a Magazine of their own (one per Publisher and
//   topic), refilled a chain at a time (else by walking the single-slot
//   list): a publish takes a slot with plain loads and stores. A magazine
//   holds at most capacity / 32 slots (at least 1), so the slots cached by
//   idle publishers cannot starve a busy one. Slots of a chain beyond what the
//   taker wants go on the single-slot list.
//
// Invariants
// 1. in_use() = allocated_ - freed_ - Σ magazine.held: slots that hold a
//    message or are being filled. (Slots of a chain being split, off both
//    stacks for a moment, were counted in freed_ and not yet in allocated_:
//    free, as they are.) Readers load freed_, then every held, then
//    allocated_; a refill raises allocated_ before held, a magazine's
//    return lowers held before freed_: so in_use() never underestimates.
// 2. A magazine's held is written by its owner only and equals its count.
#pragma once

#include <algorithm>
#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>

#include "lane_ring.hpp"
#include "prefetch.hpp"
#include "lanebus/message.hpp"

namespace lanebus::detail {

/// The header that starts every slot; key, idempotency key and payload follow it.
///
/// Layout: refs, lane, kind, key_len, idem_len, payload_len (16 bytes),
/// then the MessageHeader (40 bytes): 56 bytes, so the keys and payload
/// start in the slot's first cache line (slots start on a line: the pool's
/// memory and stride are multiples of 64). A message of a 6-byte key and a
/// 64-byte payload spans two lines, not three: one line fewer crosses from
/// the publishing core to the worker's and back per message
/// (doc/performance.md "The slot in two lines"). Nothing else lives in the
/// header: the slot's index is computed from its address
/// (MessagePool::index_of) and a block id is stored after the keys. Key and
/// idempotency key are stored in the slot (each at most kMaxKeyBytes); the
/// payload lives where `kind` says:
/// - kInline: right after the keys, in the slot;
/// - kExternal: in a size-classed block of the bus's PayloadPool
///   (payload_pool.hpp); the block's address and its id (class in the high
///   bits, index in the low bits) are stored after the keys;
/// - kObject: a constructed C++ object (typed topics, typed.hpp), in the slot
///   or in an external block, its address, destroy function and block id
///   (kNone: in the slot) stored after the keys; destroyed when the slot is
///   finally freed (MessagePool::recycle).
///
/// The extension block (delayed.hpp, doc/delays.md): a message with a due
/// time or an expiry sets kExtension in `kind` (`kind & kKindMask` is the
/// payload kind above) and carries a block right after the keys, before the
/// payload or its reference: [key][idempotency key][extension][payload or
/// reference]. The block starts with its own length (u16, the whole block),
/// then u16 flags, u32 reserved, i64 due time, i64 expiry (wall clock ns, 0
/// = none): 24 bytes today; later fields (message headers, trace context)
/// are appended and the length grows. A message without one pays nothing:
/// no bytes, and payload() and recycle() keep their one `kind != kInline`
/// branch (the extension takes the out-of-line side).
/// Copy `n` bytes where n is mostly a key's length (a few to a few dozen
/// bytes): up to 16 with two overlapping loads and stores, no call; longer
/// ones through memcpy. The publish paths' fill_slot (delayed.hpp).
inline void copy_short(char* d, const char* s, std::size_t n) noexcept {
  if (n >= 8) {
    if (n > 16) {
      std::memcpy(d, s, n);
      return;
    }
    std::uint64_t a, b;
    std::memcpy(&a, s, 8);
    std::memcpy(&b, s + n - 8, 8);
    std::memcpy(d, &a, 8);
    std::memcpy(d + n - 8, &b, 8);
  } else if (n >= 4) {
    std::uint32_t a, b;
    std::memcpy(&a, s, 4);
    std::memcpy(&b, s + n - 4, 4);
    std::memcpy(d, &a, 4);
    std::memcpy(d + n - 4, &b, 4);
  } else if (n != 0) {
    d[0] = s[0];
    d[n / 2] = s[n / 2];
    d[n - 1] = s[n - 1];
  }
}

/// Copy a payload (mostly tens of bytes): up to 64 with overlapping 16-byte
/// loads and stores, no call (a call to memcpy costs about 23 instructions for
/// 64 bytes); longer ones through memcpy.
inline void copy_payload(char* d, const char* s, std::size_t n) noexcept {
  if (n <= 16) {
    copy_short(d, s, n);
    return;
  }
  if (n > 64) {
    std::memcpy(d, s, n);
    return;
  }
  char a[16], b[16];
  if (n > 32) {
    char c[16], e[16];
    std::memcpy(a, s, 16);
    std::memcpy(b, s + 16, 16);
    std::memcpy(c, s + n - 32, 16);
    std::memcpy(e, s + n - 16, 16);
    std::memcpy(d, a, 16);
    std::memcpy(d + 16, b, 16);
    std::memcpy(d + n - 32, c, 16);
    std::memcpy(d + n - 16, e, 16);
    return;
  }
  std::memcpy(a, s, 16);
  std::memcpy(b, s + n - 16, 16);
  std::memcpy(d, a, 16);
  std::memcpy(d + n - 16, b, 16);
}

struct Slot {
  static constexpr std::uint16_t kInline = 0;
  static constexpr std::uint16_t kExternal = 1;
  static constexpr std::uint16_t kObject = 2;
  static constexpr std::uint16_t kKindMask = 0xff;
  static constexpr std::uint16_t kExtension = 0x100;
  static constexpr std::uint32_t kNone = 0xffffffffu;
  static constexpr std::size_t kMaxKeyBytes = 0xffff;

  std::atomic<std::uint32_t> refs{0};
  std::uint16_t lane = 0;
  std::uint16_t kind = kInline;
  std::uint16_t key_len = 0;
  std::uint16_t idem_len = 0;
  std::uint32_t payload_len = 0;
  MessageHeader header;

  char* data() noexcept { return reinterpret_cast<char*>(this + 1); }
  const char* data() const noexcept { return reinterpret_cast<const char*>(this + 1); }
  std::string_view key() const noexcept { return {data(), key_len}; }
  std::string_view idempotency_key() const noexcept { return {data() + key_len, idem_len}; }
  /// The payload bytes, wherever they live (see kind).
  std::string_view payload() const noexcept {
    const char* p = data() + key_len + idem_len;
    if (kind != kInline) [[unlikely]] {
      p += extension_len();
      if ((kind & kKindMask) != kInline)
        std::memcpy(static_cast<void*>(&p), static_cast<const void*>(p), sizeof(const char*));  // the stored address (unaligned)
    }
    return {p, payload_len};
  }
  /// Bytes of the extension block (0 without one).
  std::uint32_t extension_len() const noexcept {
    if ((kind & kExtension) == 0) return 0;
    std::uint16_t n;
    std::memcpy(&n, data() + key_len + idem_len, sizeof n);
    return n;
  }
  /// Offset in data() of the payload (kInline) or its reference (kExternal, kObject).
  std::uint32_t payload_offset() const noexcept { return std::uint32_t{key_len} + idem_len + extension_len(); }
};

static_assert(sizeof(Slot) == 56 && alignof(Slot) <= 8,
              "the slot header leaves 8 bytes of its first line to the keys and payload");

/// A publisher's private cache of free slots of one pool (invariant 2).
/// Owned by one thread at a time; registered with its pool while attached.
struct Magazine {
  static constexpr std::uint32_t kMax = 32;
  Slot* slots[kMax];
  std::uint32_t count = 0;              // owner-only
  std::atomic<std::uint32_t> held{0};   // == count, for in_use()
  // Owner-only: the lines (2..4) the owner's last message filled, set by
  // the paths whose messages may pass two lines (note_lines); the slots
  // taken ahead are prefetched that far.
  std::uint32_t lines = 2;
  void note_lines(std::size_t data_bytes) noexcept {
    lines = data_bytes <= 2 * 64 - sizeof(Slot)
                ? 2
                : static_cast<std::uint32_t>(std::min<std::size_t>((sizeof(Slot) + data_bytes + 63) / 64, 4));
  }
  Magazine* next = nullptr;             // the pool's list (MessagePool::mags_mu_)
  Magazine* prev = nullptr;
};

class PayloadPool;  // payload_pool.hpp
/// Destroy a kObject payload and free an external block (payload_pool.cpp).
void recycle_payload(Slot* s, PayloadPool* blocks) noexcept;

class MessagePool {
 public:
  static constexpr std::uint32_t kNil = 0xffffffffu;

  MessagePool(std::uint32_t capacity, std::uint32_t slot_bytes)
      : capacity_(capacity),
        slot_bytes_(slot_bytes),
        stride_((sizeof(Slot) + slot_bytes + 63) / 64 * 64),
        // ceil(2^64 / stride_); stride_ >= 64, so it fits 64 bits.
        stride_reciprocal_(~std::uint64_t{0} / stride_ + 1),
        memory_(static_cast<char*>(::operator new(stride_ * capacity, std::align_val_t(64)))),
        next_(new std::atomic<std::uint32_t>[capacity]) {
    for (std::uint32_t i = 0; i < capacity_; ++i) {
      new (memory_ + stride_ * i) Slot();
      next_[i].store(i + 1 < capacity_ ? i + 1 : kNil, std::memory_order_relaxed);
    }
    head_.store(0, std::memory_order_relaxed);  // tag 0, index 0
  }

  ~MessagePool() {
    for (std::uint32_t i = 0; i < capacity_; ++i) {
      recycle(at(i));  // payloads of slots never freed (a bus torn down mid-flight)
      at(i)->~Slot();
    }
    ::operator delete(memory_, std::align_val_t(64));
  }

  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;

  Slot* at(std::uint32_t index) const noexcept {
    return reinterpret_cast<Slot*>(memory_ + stride_ * static_cast<std::size_t>(index));
  }
  /// The slot's index: its offset divided by the stride, as a multiply by
  /// the stride's reciprocal (a 64-bit division is 15-40 cycles and the hot
  /// path needs 1-2 a message). Exact: the offset is index × stride, and
  /// with r = ceil(2^64 / stride) = (2^64 + e) / stride, 0 <= e < stride,
  /// offset × r = index × 2^64 + index × e, where index × e < index ×
  /// stride = offset < 2^64: the high half is the index.
  std::uint32_t index_of(const Slot* s) const noexcept {
    __extension__ typedef unsigned __int128 Wide;  // GCC and Clang; __extension__: -Wpedantic
    const auto offset = static_cast<std::uint64_t>(reinterpret_cast<const char*>(s) - memory_);
    return static_cast<std::uint32_t>((static_cast<Wide>(offset) * stride_reciprocal_) >> 64);
  }

  /// A free slot, or nullptr when every slot is in use. Lock-free, no allocation.
  /// seq_cst on allocated_: shutdown's Dekker check (publish increments
  /// allocated_ then reads `closing`; shutdown sets `closing` then reads
  /// in_use()).
  Slot* try_alloc() noexcept {
    std::uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      std::uint32_t idx = static_cast<std::uint32_t>(h);
      if (idx == kNil) {
        Slot* s[Magazine::kMax];  // take_chain may write up to kMax (GCC's -Warray-bounds cannot see it won't)
        return take_chain(s, 1) == 1 ? s[0] : nullptr;
      }
      // relaxed: `next` was written before the release CAS that pushed idx,
      // which our acquire load of head_ synchronised with.
      std::uint32_t next = next_[idx].load(std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | next;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_acq_rel, std::memory_order_acquire)) {
        allocated_.fetch_add(1, std::memory_order_seq_cst);
        return at(idx);
      }
    }
  }

  /// Up to `want` free slots taken with one CAS (publish_batch): walks `want`
  /// links from the head and swings the head past them. The tag makes the CAS
  /// fail if anyone pushed or popped meanwhile, so a successful CAS means the
  /// walked links were the stack's. Returns how many it took (0: none free).
  /// Lock-free, no allocation; seq_cst on allocated_ as in try_alloc.
  std::uint32_t try_alloc_bulk(Slot** out, std::uint32_t want) noexcept {
    if (want == 0) return 0;
    std::uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      std::uint32_t idx = static_cast<std::uint32_t>(h);
      if (idx == kNil) return take_chain(out, want);
      std::uint32_t got = 0;
      std::uint32_t next = idx;
      // Links may be stale if the stack changes under us (the CAS then fails);
      // they are always kNil or a valid index, so the walk stays in bounds.
      while (got < want && next != kNil) {
        out[got++] = at(next);
        next = next_[next].load(std::memory_order_relaxed);
      }
      std::uint64_t nh = (((h >> 32) + 1) << 32) | next;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_acq_rel, std::memory_order_acquire)) {
        allocated_.fetch_add(got, std::memory_order_seq_cst);
        return got;
      }
    }
  }

  /// try_alloc_bulk until `want` slots are taken or none is free: a worker
  /// frees chains of up to Magazine::kMax slots and try_alloc_bulk takes one
  /// at a time (publish_batch's chunks of 64 were 26 slots on average:
  /// doc/performance.md, eighth round). Returns how many it took.
  std::uint32_t try_alloc_up_to(Slot** out, std::uint32_t want) noexcept {
    std::uint32_t got = 0;
    while (got < want) {
      const std::uint32_t k = try_alloc_bulk(out + got, want - got);
      if (k == 0) break;
      got += k;
    }
    prefetch_refill();  // the next chunk's first chain, while this one fills
    return got;
  }

  /// Return a chain of `count` slots linked through `next` (first..last).
  void free_chain(Slot* first, Slot* last, std::uint32_t count) noexcept {
    push_singles(index_of(first), index_of(last));
    freed_.fetch_add(count, std::memory_order_seq_cst);
  }

  /// Return the `n` free slots of indices members[0..n) as one chain (design
  /// notes): the first slot holds the count and the others' indices, copied
  /// at once. REQUIRES: 1 <= n <= chain_max().
  void free_run(const std::uint32_t* members, std::uint32_t n) noexcept {
    if (chain_max_ < 2) {
      for (std::uint32_t i = 0; i + 1 < n; ++i) next_[members[i]].store(members[i + 1], std::memory_order_relaxed);
      push_singles(members[0], members[n - 1]);
      freed_.fetch_add(n, std::memory_order_seq_cst);
      return;
    }
    Slot* head = at(members[0]);
    char* d = head->data();
    std::memcpy(d, &n, sizeof n);
    std::memcpy(d + 4, members + 1, 4 * static_cast<std::size_t>(n - 1));
    const std::uint32_t idx = members[0];
    std::uint64_t h = chains_.load(std::memory_order_relaxed);
    for (;;) {
      next_[idx].store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | idx;
      // release: publishes the chain's contents and the slots' last contents.
      if (chains_.compare_exchange_weak(h, nh, std::memory_order_release, std::memory_order_relaxed)) break;
    }
    freed_.fetch_add(n, std::memory_order_seq_cst);
  }
  /// The most slots one chain holds (free_run), at least 1.
  std::uint32_t chain_max() const noexcept { return chain_max_; }

  /// Up to `want` slots off one chain (one CAS); the chain's other slots go
  /// on the single-slot list. 0 when no chain is free. seq_cst on allocated_
  /// as in try_alloc.
  std::uint32_t take_chain(Slot** out, std::uint32_t want) noexcept {
    std::uint64_t h = chains_.load(std::memory_order_acquire);
    std::uint32_t idx;
    for (;;) {
      idx = static_cast<std::uint32_t>(h);
      if (idx == kNil) return 0;
      // relaxed: as in try_alloc (a stale link only makes the CAS fail).
      std::uint32_t next = next_[idx].load(std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | next;
      if (chains_.compare_exchange_weak(h, nh, std::memory_order_acq_rel, std::memory_order_acquire)) break;
    }
    Slot* head = at(idx);
    const char* d = head->data();
    std::uint32_t n;
    std::memcpy(&n, d, sizeof n);
    std::uint32_t members[Magazine::kMax];
    for (std::uint32_t i = 1; i < n; ++i) std::memcpy(&members[i], d + 4 * i, 4);
    const std::uint32_t got = std::min(n, want);
    out[0] = head;
    for (std::uint32_t i = 1; i < got; ++i) out[i] = at(members[i]);
    allocated_.fetch_add(got, std::memory_order_seq_cst);
    if (got < n) {
      // The rest, already counted in freed_, onto the single-slot list.
      for (std::uint32_t i = got; i + 1 < n; ++i) next_[members[i]].store(members[i + 1], std::memory_order_relaxed);
      push_singles(members[got], members[n - 1]);
    }
    return got;
  }

  /// Return a slot to the free list. REQUIRES: no group holds it (refs is
  /// 0, or the count a timed publish set before routing it), not already
  /// free. A free slot's refs are not read: route sets them.
  void free(Slot* s) noexcept {
    recycle(s);
    free_chain(s, s, 1);
  }

  /// The bus's external payload blocks (payload_pool.hpp), set once before
  /// the topic is published to.
  void attach_payloads(PayloadPool* blocks) noexcept { payloads_ = blocks; }
  PayloadPool* payloads() const noexcept { return payloads_; }
  /// Hook for a slot that is finally free: its object is destroyed and its
  /// external block freed. One load and a branch for inline payloads.
  void recycle(Slot* s) noexcept {
    if (s->kind != Slot::kInline) recycle_payload(s, payloads_);
  }

  /// Drop one reference; true if it was the last (the caller then frees the slot).
  static bool unref(Slot* s) noexcept {
    // A sole owner needs no read-modify-write: nobody else can touch the count.
    // acquire: pairs with the releasing decrement of the other holders.
    if (s->refs.load(std::memory_order_acquire) == 1) return true;
    // acq_rel: every holder's accesses to the slot happen before the free.
    return s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1;
  }

  /// Drop one reference; the last one frees the slot.
  void release(Slot* s) noexcept {
    if (unref(s)) free(s);
  }

  /// Free-list links live beside the slots, not in them: a worker freeing a
  /// slot then only reads the slot's lines, so the publisher that reuses it
  /// does not have to pull a modified line from the worker's cache.
  void link(Slot* s, Slot* next) noexcept {
    next_[index_of(s)].store(next ? index_of(next) : kNil, std::memory_order_relaxed);
  }

  /// Start counting `m`'s cached slots in in_use(). `m` must be empty.
  void attach(Magazine* m) noexcept {
    std::lock_guard l(mags_mu_);
    m->prev = nullptr;
    m->next = mags_;
    if (mags_ != nullptr) mags_->prev = m;
    mags_ = m;
  }
  /// Give `m`'s cached slots back to the free list and stop counting it.
  void detach(Magazine* m) noexcept {
    const std::uint32_t n = m->count;
    m->count = 0;
    m->held.store(0, std::memory_order_release);  // before freed_ grows (invariant 1)
    if (n > 0) {
      for (std::uint32_t i = 0; i + 1 < n; ++i) link(m->slots[i], m->slots[i + 1]);
      free_chain(m->slots[0], m->slots[n - 1], n);
    }
    std::lock_guard l(mags_mu_);
    (m->prev != nullptr ? m->prev->next : mags_) = m->next;
    if (m->next != nullptr) m->next->prev = m->prev;
    m->next = m->prev = nullptr;
  }
  /// A slot from `m`, refilled from the free list when empty; nullptr when
  /// no slot is free. Owner thread only; no atomic read-modify-write unless
  /// it refills. The slot counts in in_use() from here on.
  /// How many publishes ahead take() asks for a slot's lines. Measured on
  /// the 2-vCPU EPYC VM (doc/performance.md, eighth round), `bench/hotpath
  /// --stream 1` in the placement where the cores sit far apart: 2 ahead
  /// ran 10.6-11.6 M msg/s, 4 to 8 ahead 14.5-17.6 M, 12 and 16 ahead
  /// 10-12 M (a refill then asks for that many slots at once); in the near
  /// placement every distance ran 25-27 M.
  static constexpr std::uint32_t kWriteAhead = 6;
  /// A slot's first two lines (its header, the keys and a short payload), for writing.
  static void prefetch_slot(const Slot* s) noexcept {
    prefetch_for_write(s);
    prefetch_for_write(reinterpret_cast<const char*>(s) + 64);
  }
  /// prefetch_slot, and the lines past the second that the magazine's last
  /// message filled (Magazine::lines: a 64-byte payload behind a due time
  /// reaches a third line, which was written cold).
  static void prefetch_slot(const Slot* s, const Magazine& m) noexcept {
    prefetch_slot(s);
    for (std::uint32_t l = 2; l < m.lines; ++l) prefetch_for_write(reinterpret_cast<const char*>(s) + 64 * l);
  }
  /// Refill an empty magazine; false when the pool has no free slot.
  /// Out of line: the publish that inlines take() keeps its registers.
  [[gnu::noinline]] bool refill(Magazine& m) noexcept {
    // Whole chains while they come (a worker's short runs free short ones),
    // else the single-slot list.
    std::uint32_t got = 0;
    while (got < magazine_size_) {
      const std::uint32_t k = take_chain(m.slots + got, magazine_size_ - got);
      if (k == 0) break;
      got += k;
    }
    if (got == 0) got = try_alloc_bulk(m.slots, magazine_size_);
    if (got == 0) return false;
    m.count = got;
    // release, after allocated_ grew: a reader that sees this held sees the refill.
    m.held.store(got, std::memory_order_release);
    // The slots of the next kWriteAhead publishes (this one's is asked for
    // too late to help, but costs nothing to ask).
    for (std::uint32_t i = 1; i <= kWriteAhead && i <= got; ++i) prefetch_slot(m.slots[got - i], m);
    return true;
  }
  /// The lines the magazine's next refill reads first (take_chain): the
  /// chain list's head, the first chain's link and its count and members,
  /// all written last by a worker freeing them. Asked for kRefillAhead
  /// publishes before the refill, so it does not wait out three round trips
  /// between the cores one after another. A hint: the chain may be gone by then.
  static constexpr std::uint32_t kRefillAhead = 8;
  void prefetch_refill() const noexcept {
    const auto idx = static_cast<std::uint32_t>(chains_.load(std::memory_order_relaxed));
    if (idx == kNil) return;
    __builtin_prefetch(&next_[idx]);
    __builtin_prefetch(at(idx)->data());
  }
  Slot* take(Magazine& m) noexcept {
    if (m.count == 0 && !refill(m)) [[unlikely]] return nullptr;
    if (m.count == kRefillAhead) prefetch_refill();
    --m.count;
    m.held.store(m.count, std::memory_order_relaxed);
    // The slot of the publish kWriteAhead places on, for writing: its lines
    // were last read by a worker, so taking them back costs a round trip
    // between the cores, longer than one publish where the cores sit far
    // apart. (The ones in between were asked for by the publishes before.)
    if (m.count >= kWriteAhead) prefetch_slot(m.slots[m.count - kWriteAhead], m);
    return m.slots[m.count];
  }
  std::uint32_t magazine_size() const noexcept { return magazine_size_; }

  std::uint32_t capacity() const noexcept { return capacity_; }
  std::uint32_t slot_bytes() const noexcept { return slot_bytes_; }
  std::int64_t in_use() const noexcept {
    // freed_, then held, then allocated_ (invariant 1): never an underestimate.
    std::lock_guard l(mags_mu_);
    const std::uint64_t f = freed_.load(std::memory_order_seq_cst);
    std::uint64_t held = 0;
    for (const Magazine* m = mags_; m != nullptr; m = m->next) held += m->held.load(std::memory_order_acquire);
    const std::uint64_t a = allocated_.load(std::memory_order_seq_cst);
    return static_cast<std::int64_t>(a - f - held);
  }

 private:
  /// Link first..last (already linked through next_) onto the single-slot list.
  void push_singles(std::uint32_t first, std::uint32_t last) noexcept {
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      next_[last].store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | first;
      // release: publishes `next` links and the slots' last contents to the next allocator.
      if (head_.compare_exchange_weak(h, nh, std::memory_order_release, std::memory_order_relaxed)) break;
    }
  }

  const std::uint32_t capacity_;
  const std::uint32_t slot_bytes_;
  const std::size_t stride_;
  const std::uint64_t stride_reciprocal_;  // index_of
  // A chain's count and indices fit the head slot's data (stride_ - sizeof(Slot) bytes).
  const std::uint32_t chain_max_ = static_cast<std::uint32_t>(
      std::min<std::size_t>(Magazine::kMax, (stride_ - sizeof(Slot)) / 4));
  const std::uint32_t magazine_size_ = std::max<std::uint32_t>(1, std::min<std::uint32_t>(Magazine::kMax, capacity_ / 32));
  char* memory_;
  PayloadPool* payloads_ = nullptr;
  std::unique_ptr<std::atomic<std::uint32_t>[]> next_;  // free-list links, by slot index
  alignas(64) std::atomic<std::uint64_t> head_{0};    // single slots
  alignas(64) std::atomic<std::uint64_t> chains_{kNil};  // chains (free_run), tag 0
  alignas(64) std::atomic<std::uint64_t> allocated_{0};  // publishers
  alignas(64) std::atomic<std::uint64_t> freed_{0};      // workers
  mutable std::mutex mags_mu_;
  Magazine* mags_ = nullptr;  // attached magazines (mags_mu_)
};

/// A worker's batch of slots to free with one CAS (a chain, free_run): up
/// to chain_max() slots, and at most an eighth of the pool (a small pool's
/// slots do not wait in a chain). A worker keeps one across lane runs
/// (WorkerLocal, scheduler.cpp) and flushes it when it goes idle or binds it
/// to another pool; a chain of its own (run_lane off a worker) flushes when
/// it goes out of scope.
class FreeChain {
 public:
  FreeChain() noexcept = default;
  explicit FreeChain(MessagePool& pool) noexcept { bind(pool); }
  ~FreeChain() { flush(); }
  FreeChain(const FreeChain&) = delete;
  FreeChain& operator=(const FreeChain&) = delete;

  /// Free into `pool` from now on (flushes slots of another pool first).
  void bind(MessagePool& pool) noexcept {
    if (pool_ == &pool) return;
    flush();
    pool_ = &pool;
    max_ = std::max<std::uint32_t>(1, std::min(pool.chain_max(), pool.capacity() / 8));
  }
  void release(Slot* s) noexcept { release(s, pool_->index_of(s)); }
  /// release for each of `n` slots whose indices the caller has (a batch
  /// handler's acked span: the ring's values): no index_of per slot.
  void release_span(Slot* const* slots, const std::uint32_t* indices, std::uint32_t n) noexcept {
    for (std::uint32_t i = 0; i < n; ++i) release(slots[i], indices[i]);
  }
  void flush() noexcept {
    if (count_ == 0) return;
    if (ring_ != nullptr) ring_->release_taken();
    pool_->free_run(members_, count_);
    count_ = 0;
  }
  bool empty() const noexcept { return count_ == 0; }
  /// While set, a flush frees the cells `ring` took and left taken
  /// (LaneRing::take_deferred) before it returns slots: no slot goes back
  /// to the pool while its ring cell is still taken.
  void defer_cells_of(LaneRing* ring) noexcept { ring_ = ring; }

 private:
  /// Drop the reference to slot `s` (pool index `index`); the last one
  /// puts it in the chain.
  void release(Slot* s, std::uint32_t index) noexcept {
    if (!MessagePool::unref(s)) return;
    pool_->recycle(s);
    members_[count_] = index;
    if (++count_ == max_) flush();
  }

  LaneRing* ring_ = nullptr;
  MessagePool* pool_ = nullptr;
  std::uint32_t max_ = 1;
  std::uint32_t count_ = 0;
  std::uint32_t members_[Magazine::kMax];  // the slots' indices (free_run)
};

}  // namespace lanebus::detail
