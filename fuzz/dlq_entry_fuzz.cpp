// lanebus — MIT License.
// libFuzzer target: the DLQ entry and audit record decoders (lib/features/dlq.hpp).
// Property: no crash; encode(decode(x)) is a fixed point of decode+encode.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dlq.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (size >= 8) (void)check_dlq_audit_record(in.substr(0, 8), in.substr(8));
  auto e = decode_dlq_entry(in);
  if (!e.ok()) return 0;
  const std::string once = encode_dlq_entry(*e);
  auto e2 = decode_dlq_entry(once);
  if (!e2.ok() || encode_dlq_entry(*e2) != once) __builtin_trap();
  return 0;
}
