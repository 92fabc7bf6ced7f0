// lanebus — MIT License.
// TempDir: a fresh directory per test, removed afterwards (kept when LANEBUS_KEEP_TMP is set).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace lanebus::test {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lanebus-test-XXXXXX").string();
    char* made = mkdtemp(tmpl.data());
    path_ = made != nullptr ? std::string(made) : std::string();
  }
  ~TempDir() {
    if (std::getenv("LANEBUS_KEEP_TMP") == nullptr && !path_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(path_, ec);
    }
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace lanebus::test
