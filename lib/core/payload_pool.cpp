// lanebus — MIT License.
// The slot recycle hook of payload_pool.hpp: out of line, called only for
// payloads that are not inline bytes.
#include "payload_pool.hpp"

namespace lanebus::detail {

// Invariant 3 of payload_pool.hpp: runs once per finally-freed slot.
void recycle_payload(Slot* s, PayloadPool* blocks) noexcept {
  const char* ref = s->data() + s->payload_offset();
  std::uint32_t block;
  const std::uint16_t kind = s->kind & Slot::kKindMask;
  if (kind == Slot::kInline) {  // an inline payload behind an extension block (message_pool.hpp)
    s->kind = Slot::kInline;
    return;
  }
  if (kind == Slot::kObject) {
    char* obj;
    void (*destroy)(void*) noexcept;
    std::memcpy(&obj, ref, sizeof obj);
    std::memcpy(&destroy, ref + sizeof obj, sizeof destroy);
    std::memcpy(&block, ref + sizeof obj + sizeof destroy, sizeof block);
    if (destroy) destroy(obj);
  } else {
    std::memcpy(&block, ref + sizeof(char*), sizeof block);  // kExternal
  }
  if (block != Slot::kNone) blocks->free(block);
  s->kind = Slot::kInline;
}

}  // namespace lanebus::detail
