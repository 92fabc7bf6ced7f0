// lanebus — MIT License.
// The slot recycle hook of payload_pool.hpp: out of line, called only for
// payloads that are not inline bytes.
#include "payload_pool.hpp"

namespace lanebus::detail {

// Invariant 3 of payload_pool.hpp: runs once per finally-freed slot.
void recycle_payload(Slot* s, PayloadPool* blocks) noexcept {
  if (s->kind == Slot::kObject) {
    const char* ref = s->data() + s->key_len + s->idem_len;
    char* obj;
    void (*destroy)(void*) noexcept;
    std::memcpy(&obj, ref, sizeof obj);
    std::memcpy(&destroy, ref + sizeof obj, sizeof destroy);
    if (destroy) destroy(obj);
  }
  if (s->ext != Slot::kNone) blocks->free(s->ext);
  s->kind = Slot::kInline;
  s->ext = Slot::kNone;
}

}  // namespace lanebus::detail
