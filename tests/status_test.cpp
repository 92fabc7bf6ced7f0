// lanebus — MIT License.
// Status and Result: codes, messages, copies.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "lanebus/status.hpp"

using lanebus::Code;
using lanebus::Result;
using lanebus::Status;

TEST_CASE("an OK status has no message and prints OK") {
  Status s;
  CHECK(s.ok());
  CHECK(s.code() == Code::Ok);
  CHECK(s.message().empty());
  CHECK(s.to_string() == "OK");
}

TEST_CASE("a failed status names its code and cause") {
  Status s(Code::MapFull, "map size 64 MiB reached; raise BusOptions::map_size");
  CHECK_FALSE(s.ok());
  CHECK(s.to_string() == "MapFull: map size 64 MiB reached; raise BusOptions::map_size");
  Status copy = s;
  CHECK(copy.message() == s.message());
  CHECK(std::string(lanebus::to_string(Code::WouldBlock)) == "WouldBlock");
  CHECK(std::string(lanebus::to_string(static_cast<Code>(250))) == "Unknown");
}

TEST_CASE("every code has a distinct name") {
  std::set<std::string> names;
  for (int c = 0; c <= static_cast<int>(Code::Internal); ++c) {
    names.insert(lanebus::to_string(static_cast<Code>(c)));
  }
  CHECK(names.size() == static_cast<std::size_t>(Code::Internal) + 1);
  CHECK(names.count("Unknown") == 0);
}

TEST_CASE("Result holds a value or a status") {
  Result<int> good(42);
  REQUIRE(good.ok());
  CHECK(*good == 42);
  Result<int> bad(Code::NotFound, "topic \"x\" not found");
  CHECK_FALSE(bad.ok());
  CHECK(bad.code() == Code::NotFound);
  CHECK(bad.status().message() == "topic \"x\" not found");
}
