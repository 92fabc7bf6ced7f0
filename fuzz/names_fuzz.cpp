// lanebus — MIT License.
// libFuzzer target: name validation (doc/topics.md) for topics/groups and leases.
// Property: no crash; an accepted name obeys the rule.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "lease_table.hpp"
#include "names.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::detail;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  if (check_name(in, "topic").ok()) {
    if (in.empty() || in.size() > kMaxNameBytes || in.front() == '.' || in.back() == '.' ||
        in.find("..") != std::string_view::npos) {
      __builtin_trap();
    }
    for (char c : in) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '.')) __builtin_trap();
    }
  }
  (void)validate_lease_name(in);
  (void)lease_name_hash(in);
  return 0;
}
