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
// - in_use_ counts slots handed out; shutdown waits on it to drain.
#pragma once

#include <atomic>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>

#include "lanebus/message.hpp"

namespace lanebus::detail {

/// The header that starts every slot; key, idempotency key and payload follow it.
struct alignas(64) Slot {
  std::atomic<std::uint32_t> refs{0};
  std::atomic<std::uint32_t> next{0};  // free-list link (index), valid only while free
  std::uint32_t lane = 0;
  std::uint32_t key_len = 0;
  std::uint32_t idem_len = 0;
  std::uint32_t payload_len = 0;
  MessageHeader header;

  char* data() noexcept { return reinterpret_cast<char*>(this + 1); }
  const char* data() const noexcept { return reinterpret_cast<const char*>(this + 1); }
  std::string_view key() const noexcept { return {data(), key_len}; }
  std::string_view idempotency_key() const noexcept { return {data() + key_len, idem_len}; }
  std::string_view payload() const noexcept { return {data() + key_len + idem_len, payload_len}; }
};

class MessagePool {
 public:
  static constexpr std::uint32_t kNil = 0xffffffffu;

  MessagePool(std::uint32_t capacity, std::uint32_t slot_bytes)
      : capacity_(capacity),
        slot_bytes_(slot_bytes),
        stride_((sizeof(Slot) + slot_bytes + 63) / 64 * 64),
        memory_(static_cast<char*>(::operator new(stride_ * capacity, std::align_val_t(64)))) {
    for (std::uint32_t i = 0; i < capacity_; ++i) {
      Slot* s = new (memory_ + stride_ * i) Slot();
      s->next.store(i + 1 < capacity_ ? i + 1 : kNil, std::memory_order_relaxed);
    }
    head_.store(0, std::memory_order_relaxed);  // tag 0, index 0
  }

  ~MessagePool() {
    for (std::uint32_t i = 0; i < capacity_; ++i) at(i)->~Slot();
    ::operator delete(memory_, std::align_val_t(64));
  }

  MessagePool(const MessagePool&) = delete;
  MessagePool& operator=(const MessagePool&) = delete;

  Slot* at(std::uint32_t index) const noexcept {
    return reinterpret_cast<Slot*>(memory_ + stride_ * static_cast<std::size_t>(index));
  }
  std::uint32_t index_of(const Slot* s) const noexcept {
    return static_cast<std::uint32_t>((reinterpret_cast<const char*>(s) - memory_) / stride_);
  }

  /// A free slot, or nullptr when every slot is in use. Lock-free, no allocation.
  /// seq_cst on in_use_: shutdown's Dekker check (publish increments in_use_
  /// then reads `closing`; shutdown sets `closing` then reads in_use_).
  Slot* try_alloc() noexcept {
    std::uint64_t h = head_.load(std::memory_order_acquire);
    for (;;) {
      std::uint32_t idx = static_cast<std::uint32_t>(h);
      if (idx == kNil) return nullptr;
      // relaxed: `next` was written before the release CAS that pushed idx,
      // which our acquire load of head_ synchronised with.
      std::uint32_t next = at(idx)->next.load(std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | next;
      if (head_.compare_exchange_weak(h, nh, std::memory_order_acq_rel, std::memory_order_acquire)) {
        in_use_.fetch_add(1, std::memory_order_seq_cst);
        return at(idx);
      }
    }
  }

  /// Return a slot to the free list. REQUIRES: refs == 0, not already free.
  void free(Slot* s) noexcept {
    std::uint32_t idx = index_of(s);
    std::uint64_t h = head_.load(std::memory_order_relaxed);
    for (;;) {
      s->next.store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
      std::uint64_t nh = (((h >> 32) + 1) << 32) | idx;
      // release: publishes `next` and the slot's last contents to the next allocator.
      if (head_.compare_exchange_weak(h, nh, std::memory_order_release, std::memory_order_relaxed)) break;
    }
    in_use_.fetch_sub(1, std::memory_order_seq_cst);
  }

  /// Drop one reference; the last one frees the slot.
  void release(Slot* s) noexcept {
    // acq_rel: every reader's accesses to the slot happen before the free.
    if (s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) free(s);
  }

  std::uint32_t capacity() const noexcept { return capacity_; }
  std::uint32_t slot_bytes() const noexcept { return slot_bytes_; }
  std::int64_t in_use() const noexcept { return in_use_.load(std::memory_order_seq_cst); }

 private:
  const std::uint32_t capacity_;
  const std::uint32_t slot_bytes_;
  const std::size_t stride_;
  char* memory_;
  alignas(64) std::atomic<std::uint64_t> head_{0};
  alignas(64) std::atomic<std::int64_t> in_use_{0};
};

}  // namespace lanebus::detail
