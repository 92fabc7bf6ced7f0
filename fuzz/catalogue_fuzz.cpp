// lanebus — MIT License.
// libFuzzer target: the catalogue and group/offset decoders of the durable
// store (lib/store/store_codec.hpp): topics, lanes, groups, cursors, in-flight
// claims and the layout record. The first byte picks the decoder.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "store_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::detail;
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 0: {
      // key = name up to the first NUL, value = the rest
      const auto nul = in.find('\0');
      const std::string_view name = nul == std::string_view::npos ? std::string_view() : in.substr(0, nul);
      const std::string_view value = nul == std::string_view::npos ? in : in.substr(nul + 1);
      TopicRef t;
      if (decode_topic_record(name, value, &t) && (t.id == 0 || t.lanes == 0 || t.lanes > 4096)) __builtin_trap();
      break;
    }
    case 1: {
      LaneRecord l;
      if (decode_lane_record(in, &l) && (l.first > l.next || l.count != l.next - l.first)) __builtin_trap();
      break;
    }
    case 2: {
      GroupRecord g;
      if (decode_group_record(in, &g) && g.group_id == 0) __builtin_trap();
      break;
    }
    case 3: {
      CursorRecord c;
      (void)decode_cursor_record(in, &c);
      break;
    }
    case 4: {
      InflightRecord r;
      if (decode_inflight_record(in, &r) && (r.attempt == 0 || r.state > 1)) __builtin_trap();
      break;
    }
    case 5: (void)check_layout_record(in); break;
  }
  return 0;
}
