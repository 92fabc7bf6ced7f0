// lanebus — MIT License.
// libFuzzer target: a `log` value (doc/storage-format.md): a message record
// (formats 1, 2 with times, 3 with message headers) or a record batch of them.
// Properties: no crash or over-read; a batch that splits is exactly its header
// and its records, back to back; a record that decodes re-encodes to a
// record that decodes to the same message (flags and reserved bytes are not
// kept, and a format-2 block longer than 24 bytes is read by its first 24, so
// the bytes may differ); a decoded header block iterates within itself.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "lanebus/message.hpp"
#include "store_codec.hpp"

namespace {
bool same(const lanebus::detail::StoredMessage& a, const lanebus::detail::StoredMessage& b) {
  return a.header.id == b.header.id && a.header.created_at_ns == b.header.created_at_ns &&
         a.header.correlation_id == b.header.correlation_id && a.header.fencing_token == b.header.fencing_token &&
         a.header.attempt == b.header.attempt && a.header.content_type == b.header.content_type &&
         a.header.schema_version == b.header.schema_version && a.index_ts_ns == b.index_ts_ns && a.key == b.key &&
         a.idempotency_key == b.idempotency_key && a.payload == b.payload && a.due_ns == b.due_ns &&
         a.expires_ns == b.expires_ns && a.headers == b.headers;
}
}  // namespace

namespace {
void check_record(std::string_view in) {
  using namespace lanebus::detail;
  StoredMessage m;
  if (!decode_log_record(in, "fuzz", 0, 0, &m).ok()) return;
  std::size_t bytes = 0, count = 0;
  for (lanebus::Header h : lanebus::HeadersView(m.headers)) {
    bytes += 3 + h.name.size() + h.value.size();
    ++count;
  }
  if (count != lanebus::HeadersView(m.headers).size() || (count != 0 && bytes + 4 != m.headers.size())) __builtin_trap();
  AppendRequest r;
  r.header = m.header;
  r.key = m.key;
  r.idempotency_key = m.idempotency_key;
  r.payload = m.payload;
  r.due_ns = m.due_ns;
  r.expires_ns = m.expires_ns;
  r.headers = m.headers;
  const std::string again = encode_log_record(r, m.index_ts_ns);
  StoredMessage m2;
  if (!decode_log_record(again, "fuzz", 0, 0, &m2).ok() || !same(m, m2)) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> records;
  if (!split_log_value(in, "fuzz", 0, 0, &records).ok()) return 0;
  if (records.size() == 1) {
    if (records[0].data() != in.data() || records[0].size() != in.size()) __builtin_trap();
  } else {
    // A batch: its 8-byte header, then the records back to back to its end.
    const char* at = in.data() + 8;
    for (std::string_view rec : records) {
      if (rec.data() != at) __builtin_trap();
      at += rec.size();
    }
    if (records.size() < 2 || at != in.data() + in.size()) __builtin_trap();
  }
  for (std::string_view rec : records) check_record(rec);
  return 0;
}
