// lanebus — MIT License.
// libFuzzer target: the lanebus tool's argument parsers (tools/args.hpp). The
// input is split at NUL bytes into argv; the first byte picks the command.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "args.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace lanebus::tool;
  if (size == 0) return 0;
  std::vector<std::string> args{"cmd"};
  std::string cur;
  for (std::size_t i = 1; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(cur);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int argc = static_cast<int>(args.size());
  std::string error;
  if (data[0] % 3 == 0) {
    TailArgs t;
    const int rc = parse_tail_args(argc, argv.data(), &t, &error);
    if (rc != 0 && error.empty()) __builtin_trap();
    if (rc == 0 && (t.dir != args[1] || t.only_lane < -1)) __builtin_trap();
  } else if (data[0] % 3 == 1) {
    VerifyArgs v;
    const int rc = parse_verify_args(argc, argv.data(), &v, &error);
    if (rc != 0 && error.empty()) __builtin_trap();
    if (rc == 0 && v.dir.empty()) __builtin_trap();
  } else {
    std::uint64_t n = 0;
    if (parse_u64(args.back().c_str(), &n) && std::to_string(n) != args.back() &&
        args.back().find_first_not_of("0123456789") != std::string::npos) {
      __builtin_trap();
    }
  }
  return 0;
}
