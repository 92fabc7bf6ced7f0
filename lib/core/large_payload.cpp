// lanebus — MIT License.
// Payloads larger than a slot and typed objects on in-memory topics: the
// checks before publish takes a slot, the block taken under the topic's
// backpressure, and placing the payload (payload_pool.hpp has the layout).
#include "bus_impl.hpp"

namespace lanebus::detail {

// Hot-path refusals carry literal messages only: they allocate nothing.
Status check_large(const TopicImpl& t, const OutgoingMessage& m, const PayloadFill* fill, std::size_t extra) noexcept {
  const std::size_t keys = m.key.size() + m.idempotency_key.size() + extra;
  if (fill != nullptr && inline_object_offset(keys, *fill, t.options.slot_bytes) != 0) return Status();
  const std::size_t size = fill ? fill->size : m.payload.size();
  if (size > t.options.max_payload)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the payload exceeds the topic's max_payload (raise "
                                "TopicOptions::max_payload; in-memory payloads up to 16 MiB)");
  if (keys + (fill ? kObjectRef : kExternalRef) > t.options.slot_bytes)
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: key + idempotency key + the payload's block reference (12 bytes; 20 for a "
                                "typed object) exceed the topic's slot_bytes (raise TopicOptions::slot_bytes)");
  if (size > t.bus->payloads()->largest())
    return Status::from_literal(Code::PayloadTooLarge,
                                "publish: the payload is larger than the largest block of the bus's payload pool "
                                "(raise BusOptions::memory_budget; doc/topics.md \"Payload sizes\")");
  return Status();
}

Status place_large(TopicImpl& t, Slot* s, const OutgoingMessage& m, const PayloadFill* fill, std::uint32_t lane,
                   bool may_block) noexcept {
  std::uint32_t block = PayloadPool::kNil;
  const std::size_t keys = s->payload_offset();  // the keys and an extension block (delayed.hpp)
  if (fill == nullptr || inline_object_offset(keys, *fill, t.options.slot_bytes) == 0) {
    block = t.acquire_block(fill ? fill->size : m.payload.size(), lane, may_block);
    if (block == PayloadPool::kNil) {
      if (t.bus->closing()) return Status::from_literal(Code::ShutDown, "publish: the bus is shut down");
      t.refused.fetch_add(1, std::memory_order_relaxed);
      if (may_block && t.options.backpressure != Backpressure::FailFast)
        return Status::from_literal(Code::TimedOut,
                                    "publish: no payload block of the bus's memory_budget came free within "
                                    "block_timeout");
      return Status::from_literal(Code::WouldBlock,
                                  "publish: every payload block that fits is in use (BusOptions::memory_budget)");
    }
  }
  if (!place_payload(s, t.bus->payloads(), block, m.payload, fill, t.options.slot_bytes)) {
    if (block != PayloadPool::kNil) t.bus->payloads()->free(block);
    return Status::from_literal(Code::InvalidArgument,
                                "publish: constructing the typed object in the slot threw (nothing published)");
  }
  return Status();
}

}  // namespace lanebus::detail
