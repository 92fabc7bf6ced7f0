// lanebus — MIT License.
// PayloadPool: the bus's size-classed blocks for in-memory payloads larger
// than a slot, and the helpers that place a payload (bytes or a typed
// object) in a slot or a block and recycle it when the slot is freed.
//
// Design notes
// - Why not malloc: the publish path must not allocate (tests/alloc_test.cpp)
//   and must bound memory. All blocks are mapped once, at Bus::open, from
//   BusOptions::memory_budget; publish takes a block with one CAS and the
//   worker that frees the slot gives it back with one more.
// - Classes: kClasses classes of 1 KiB × 4^i (1 KiB .. 16 MiB). The budget is
//   split evenly between them, so a class gets budget / kClasses / size
//   blocks (0 when its share is smaller than one block). doc/topics.md
//   "Payload sizes" has the arithmetic.
// - Each class is a Treiber stack of block indices like MessagePool's free
//   list: the head packs {tag:32, index:32}, the tag defeats ABA.
// - A block id packs the class in the top kClassBits bits and the block
//   index in the rest. It is stored after the keys, next to the payload's
//   address (the slot's header has no room left: message_pool.hpp).
//
// Invariants
// 1. A block is either on its class's free list or named by exactly one
//    slot's stored block id (the slot that holds its payload).
// 2. The slot's payload address (stored after its keys) points into that
//    block, or into the slot itself for an object placed inline.
// 3. recycle() runs exactly once per finally-freed slot, before the slot goes
//    back to its free list, and leaves the slot kInline.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <string_view>

#include <sys/mman.h>

#include "lanebus/typed.hpp"
#include "message_pool.hpp"

namespace lanebus::detail {

class PayloadPool {
 public:
  static constexpr std::uint32_t kClasses = 8;
  static constexpr std::uint32_t kClassBits = 4;
  static constexpr std::uint32_t kIndexMask = (1u << (32 - kClassBits)) - 1;
  static constexpr std::size_t kMinBlock = 1024;
  static constexpr std::size_t kMaxBlock = kMinBlock << (2 * (kClasses - 1));  // 16 MiB
  static constexpr std::uint32_t kNil = 0xffffffffu;

  static constexpr std::size_t class_bytes(std::uint32_t c) noexcept { return kMinBlock << (2 * c); }
  /// Blocks a class gets from `budget` bytes (capped by the index bits).
  static std::uint32_t blocks_for(std::size_t budget, std::uint32_t c) noexcept {
    std::size_t n = budget / kClasses / class_bytes(c);
    return static_cast<std::uint32_t>(n > kIndexMask ? kIndexMask : n);
  }

  explicit PayloadPool(std::size_t budget) {
    for (std::uint32_t c = 0; c < kClasses; ++c) {
      Class& k = classes_[c];
      k.count = blocks_for(budget, c);
      if (k.count == 0) continue;
      // mmap: the pages cost memory only once a block is first used (and
      // sanitizers do not shadow-poison a mapping). A failed mapping leaves
      // the class without blocks (publish then names memory_budget).
      void* m = ::mmap(nullptr, class_bytes(c) * k.count, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (m == MAP_FAILED) {
        k.count = 0;
        continue;
      }
      k.memory = static_cast<char*>(m);
      k.next.reset(new std::atomic<std::uint32_t>[k.count]);
      for (std::uint32_t i = 0; i < k.count; ++i)
        k.next[i].store(i + 1 < k.count ? i + 1 : kNil, std::memory_order_relaxed);
      k.head.store(0, std::memory_order_relaxed);
      reserved_ += class_bytes(c) * k.count;
    }
  }
  ~PayloadPool() {
    for (std::uint32_t c = 0; c < kClasses; ++c)
      if (classes_[c].memory) ::munmap(classes_[c].memory, class_bytes(c) * classes_[c].count);
  }
  PayloadPool(const PayloadPool&) = delete;
  PayloadPool& operator=(const PayloadPool&) = delete;

  /// Bytes of blocks allocated (at most the budget).
  std::size_t reserved_bytes() const noexcept { return reserved_; }
  /// The largest payload any block can hold (0: no blocks at all).
  std::size_t largest() const noexcept {
    for (std::uint32_t c = kClasses; c-- > 0;)
      if (classes_[c].count) return class_bytes(c);
    return 0;
  }
  std::uint32_t blocks(std::uint32_t c) const noexcept { return classes_[c].count; }
  std::uint32_t free_approx(std::uint32_t c) const noexcept {
    return classes_[c].count - static_cast<std::uint32_t>(classes_[c].in_use.load(std::memory_order_relaxed));
  }

  /// A free block of at least `n` bytes: the smallest class that fits, else
  /// a larger one. kNil when every block that could hold `n` is in use.
  /// Lock-free, no allocation.
  std::uint32_t try_alloc(std::size_t n) noexcept {
    for (std::uint32_t c = 0; c < kClasses; ++c) {
      if (class_bytes(c) < n || classes_[c].count == 0) continue;
      std::uint32_t i = pop(classes_[c]);
      if (i != kNil) return (c << (32 - kClassBits)) | i;
    }
    return kNil;
  }
  void free(std::uint32_t id) noexcept {
    Class& k = classes_[id >> (32 - kClassBits)];
    std::uint32_t i = id & kIndexMask;
    std::uint64_t h = k.head.load(std::memory_order_relaxed);
    for (;;) {
      k.next[i].store(static_cast<std::uint32_t>(h), std::memory_order_relaxed);
      // release: the link and the block's last use happen before its next allocation.
      if (k.head.compare_exchange_weak(h, (((h >> 32) + 1) << 32) | i, std::memory_order_release,
                                       std::memory_order_relaxed))
        break;
    }
    k.in_use.fetch_sub(1, std::memory_order_relaxed);  // relaxed: a gauge for stats and tests
  }
  char* at(std::uint32_t id) const noexcept {
    const Class& k = classes_[id >> (32 - kClassBits)];
    return k.memory + class_bytes(id >> (32 - kClassBits)) * static_cast<std::size_t>(id & kIndexMask);
  }

 private:
  struct Class {
    std::uint32_t count = 0;
    char* memory = nullptr;
    std::unique_ptr<std::atomic<std::uint32_t>[]> next;
    alignas(64) std::atomic<std::uint64_t> head{kNil};
    alignas(64) std::atomic<std::int64_t> in_use{0};
  };
  static std::uint32_t pop(Class& k) noexcept {
    std::uint64_t h = k.head.load(std::memory_order_acquire);
    for (;;) {
      std::uint32_t i = static_cast<std::uint32_t>(h);
      if (i == kNil) return kNil;
      // relaxed: written before the release CAS that pushed i (our acquire load).
      std::uint32_t next = k.next[i].load(std::memory_order_relaxed);
      if (k.head.compare_exchange_weak(h, (((h >> 32) + 1) << 32) | next, std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
        k.in_use.fetch_add(1, std::memory_order_relaxed);
        return i;
      }
    }
  }
  Class classes_[kClasses];
  std::size_t reserved_ = 0;
};

/// A typed topic's object, constructed in place instead of copied as bytes
/// (typed.hpp). `construct` returns false if the constructor threw.
using PayloadFill = ObjectFill;

/// Bytes after the keys that hold the payload's address and block id
/// (kExternal) or the object's address, destroy function and block id
/// (kObject; Slot::kNone when the object is in the slot).
inline constexpr std::size_t kExternalRef = sizeof(char*) + sizeof(std::uint32_t);
inline constexpr std::size_t kObjectRef = sizeof(char*) + sizeof(void (*)(void*)) + sizeof(std::uint32_t);

/// Where an object of `fill` goes in a slot with keys of `keys` bytes: its
/// offset in the slot's data area, or 0 when it does not fit there (it
/// then needs a block). The data area starts sizeof(Slot) bytes into a
/// slot that starts on a 64-byte line, so the offset aligns the object's
/// address, not the offset (alignof(T) <= 64, typed.hpp).
inline std::size_t inline_object_offset(std::size_t keys, const PayloadFill& fill, std::size_t slot_bytes) noexcept {
  const std::size_t start = sizeof(Slot) + keys + kObjectRef;  // from the slot's (aligned) start
  const std::size_t off = (start + fill.align - 1) / fill.align * fill.align - sizeof(Slot);
  return off + fill.size <= slot_bytes ? off : 0;
}

/// Put the payload in slot `s` whose keys are already written: `bytes` into
/// block `block` (kExternal), or the object of `fill` into the slot or the
/// block (kObject). REQUIRES: the keys plus the reference fit slot_bytes;
/// block != kNil when the payload does not fit the slot. Returns false (the
/// slot stays kInline, the block unused) if the object's constructor threw.
inline bool place_payload(Slot* s, PayloadPool* blocks, std::uint32_t block, std::string_view bytes,
                          const PayloadFill* fill, std::size_t slot_bytes) noexcept {
  char* ref = s->data() + s->payload_offset();
  const std::uint16_t ext = s->kind & Slot::kExtension;
  if (fill == nullptr) {
    char* dst = blocks->at(block);
    std::memcpy(dst, bytes.data(), bytes.size());
    std::memcpy(ref, &dst, sizeof dst);
    std::memcpy(ref + sizeof dst, &block, sizeof block);
    s->payload_len = static_cast<std::uint32_t>(bytes.size());
    s->kind = static_cast<std::uint16_t>(Slot::kExternal | ext);
    return true;
  }
  std::size_t off = inline_object_offset(s->payload_offset(), *fill, slot_bytes);
  char* dst = block == PayloadPool::kNil ? s->data() + off : blocks->at(block);
  if (!fill->construct(dst, fill->ctx)) return false;
  std::memcpy(ref, &dst, sizeof dst);
  std::memcpy(ref + sizeof dst, &fill->destroy, sizeof fill->destroy);
  const std::uint32_t id = block == PayloadPool::kNil ? Slot::kNone : block;
  std::memcpy(ref + sizeof dst + sizeof fill->destroy, &id, sizeof id);
  s->payload_len = static_cast<std::uint32_t>(fill->size);
  s->kind = static_cast<std::uint16_t>(Slot::kObject | ext);
  return true;
}

}  // namespace lanebus::detail
