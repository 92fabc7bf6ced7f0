// lanebus — MIT License.
// libFuzzer target: the message record decoder (doc/storage-format.md, `log` values).
// Property: no crash or over-read; a record that decodes re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "store_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  StoredMessage m;
  if (!decode_log_record(in, "fuzz", 0, 0, &m).ok()) return 0;
  AppendRequest r;
  r.header = m.header;
  r.key = m.key;
  r.idempotency_key = m.idempotency_key;
  r.payload = m.payload;
  // Flags and reserved bytes are not kept by the decoder: compare past them.
  const std::string again = encode_log_record(r, m.index_ts_ns);
  if (again.size() != in.size() || again.substr(16, again.size() - 20) != in.substr(16, in.size() - 20)) __builtin_trap();
  return 0;
}
