// lanebus — MIT License.
// Typed topics between the modules of a desktop application (doc/topics.md
// "Typed topics", "Payload sizes"):
// - the capture module publishes FrameCaptured, a 64 KiB trivially copyable
//   frame, on an in-memory topic: the frame is copied into a block of the
//   bus's payload pool, nothing is serialized and nothing is allocated;
// - the settings module publishes SettingsChanged, a struct with strings, on
//   a durable topic with a codec, so settings survive a restart;
// - the indexer module consumes both with typed handlers.
// The program checks what it prints and exits 1 if anything is off.
//
//   desktop_modules [DIR]     (default: a fresh directory under /tmp, removed at exit)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "lanebus/lanebus.hpp"

using namespace lanebus;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

// ---- the events ----

struct FrameCaptured {
  std::uint32_t camera = 0;
  std::uint32_t sequence = 0;
  std::uint32_t width = 0, height = 0;
  unsigned char pixels[64 * 1024 - 16];  // 64 KiB in all
};

struct SettingsChanged {
  std::string section;
  std::string key;
  std::string value;
};

// The durable topic stores bytes: the codec is "section\0key\0value".
template <>
struct lanebus::Codec<SettingsChanged> {
  static constexpr std::string_view name = "SettingsCodec";
  static Status encode(const SettingsChanged& s, std::string& out) {
    if (s.section.find('\0') != std::string::npos || s.key.find('\0') != std::string::npos)
      return Status(Code::InvalidArgument, "section and key must not contain NUL");
    out.clear();
    out.append(s.section).push_back('\0');
    out.append(s.key).push_back('\0');
    out.append(s.value);
    return Status();
  }
  static Status decode(std::string_view bytes, SettingsChanged& s) {
    std::size_t a = bytes.find('\0');
    std::size_t b = a == std::string_view::npos ? a : bytes.find('\0', a + 1);
    if (b == std::string_view::npos) return Status(Code::Corruption, "settings record without two NULs");
    s.section.assign(bytes.substr(0, a));
    s.key.assign(bytes.substr(a + 1, b - a - 1));
    s.value.assign(bytes.substr(b + 1));
    return Status();
  }
};

namespace {

template <typename Pred>
bool wait_for(Pred pred) {
  for (int i = 0; i < 20000 && !pred(); ++i) std::this_thread::sleep_for(1ms);
  return pred();
}

// ---- the modules ----

/// Owns the camera: fills frames and publishes them, keyed by camera.
class CaptureModule {
 public:
  explicit CaptureModule(TypedTopic<FrameCaptured> frames) : frames_(std::move(frames)) {}
  Status capture(std::uint32_t camera, std::uint32_t sequence) {
    frame_->camera = camera;
    frame_->sequence = sequence;
    frame_->width = 128;
    frame_->height = 127;
    std::memset(frame_->pixels, static_cast<int>(sequence & 0xff), sizeof frame_->pixels);
    return frames_.publish(*frame_);  // copied into a 64 KiB block; frame_ is reusable at once
  }

 private:
  TypedTopic<FrameCaptured> frames_;
  std::unique_ptr<FrameCaptured> frame_ = std::make_unique<FrameCaptured>();
};

/// Writes the user's settings; every change is an event other modules follow.
class SettingsModule {
 public:
  explicit SettingsModule(TypedTopic<SettingsChanged> changes) : changes_(std::move(changes)) {}
  Status set(std::string section, std::string key, std::string value) {
    return changes_.emplace(std::move(section), std::move(key), std::move(value));
  }

 private:
  TypedTopic<SettingsChanged> changes_;
};

/// Indexes frames and follows settings.
class Indexer {
 public:
  Status attach(Bus& bus, const TypedTopic<FrameCaptured>& frames, const TypedTopic<SettingsChanged>& settings) {
    auto f = bus.subscribe<FrameCaptured>(frames, "indexer", [this](const FrameCaptured& fr, const Delivery& d) {
      return on_frame(fr, d);
    });
    if (!f.ok()) return f.status();
    auto s = bus.subscribe<SettingsChanged>(settings, "indexer", [this](const SettingsChanged& c, const Delivery&) {
      std::lock_guard<std::mutex> lock(mu_);
      last_setting_ = c.section + "." + c.key + " = " + c.value;
      settings_seen_.fetch_add(1);
      return Outcome::ack();
    });
    if (!s.ok()) return s.status();
    subs_.push_back(std::move(*f));
    subs_.push_back(std::move(*s));
    return Status();
  }
  int frames() const { return frames_seen_.load(); }
  int settings() const { return settings_seen_.load(); }
  bool frames_intact() const { return intact_.load(); }
  std::string last_setting() {
    std::lock_guard<std::mutex> lock(mu_);
    return last_setting_;
  }

 private:
  Outcome on_frame(const FrameCaptured& fr, const Delivery& d) {
    // The frame is the one in the block: read it in place, no copy.
    const auto expect = static_cast<unsigned char>(fr.sequence & 0xff);
    if (fr.pixels[0] != expect || fr.pixels[sizeof fr.pixels - 1] != expect || fr.width != 128 ||
        d.key() != (fr.camera == 0 ? "cam-0" : "cam-1"))
      intact_ = false;
    frames_seen_.fetch_add(1);
    return Outcome::ack();
  }

  std::vector<Subscription> subs_;
  std::atomic<int> frames_seen_{0}, settings_seen_{0};
  std::atomic<bool> intact_{true};
  std::mutex mu_;
  std::string last_setting_;
};

}  // namespace

int main(int argc, char** argv) {
  fs::path dir;
  const bool temporary = argc < 2;
  if (temporary) {
    char tmpl[] = "/tmp/lanebus-desktop-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return 1;
    dir = fs::path(tmpl);
  } else {
    dir = argv[1];
  }
  int rc = 0;
  {
    BusOptions o;
    o.name = "desktop";
    o.workers = 2;
    o.store.directory = (dir / "store").string();
    auto bus = Bus::open(o).value();

    // Frames: in memory, 4 lanes, keyed by camera.
    TypedTopicOptions<FrameCaptured> fo;
    fo.topic.lanes = 4;
    fo.topic.capacity = 64;
    fo.key_of = [](const FrameCaptured& f) { return f.camera == 0 ? std::string_view("cam-0") : "cam-1"; };
    auto frames = bus->create_topic<FrameCaptured>("ui.frames", fo).value();
    // Settings: durable, so they are there after a restart; needs Codec<SettingsChanged>.
    auto settings = bus->create_durable_topic<SettingsChanged>("ui.settings").value();

    Indexer indexer;
    if (Status s = indexer.attach(*bus, frames, settings); !s.ok()) {
      std::printf("attach: %s\n", s.to_string().c_str());
      return 1;
    }
    CaptureModule capture(frames);
    SettingsModule prefs(settings);

    constexpr int kFrames = 200;
    for (int i = 0; i < kFrames; ++i) {
      if (Status s = capture.capture(i % 2, static_cast<std::uint32_t>(i)); !s.ok()) {
        std::printf("capture: %s\n", s.to_string().c_str());
        rc = 1;
      }
    }
    if (!prefs.set("display", "theme", "dark").ok() || !prefs.set("capture", "fps", "30").ok()) rc = 1;
    Status bad = prefs.set(std::string("dis\0play", 8), "theme", "light");
    std::printf("a setting the codec refuses: %s\n", bad.to_string().c_str());
    if (bad.code() != Code::InvalidArgument) rc = 1;

    if (!wait_for([&] { return indexer.frames() == kFrames && indexer.settings() == 2; })) rc = 1;
    std::printf("indexer: %d frames of %zu bytes (intact: %s), %d settings, last: %s\n", indexer.frames(),
                sizeof(FrameCaptured), indexer.frames_intact() ? "yes" : "no", indexer.settings(),
                indexer.last_setting().c_str());
    if (!indexer.frames_intact() || indexer.last_setting() != "capture.fps = 30") rc = 1;

    // The frames topic takes only frames: the wrong type is a Conflict.
    auto wrong = bus->subscribe<SettingsChanged>(frames, "x", [](const SettingsChanged&, const Delivery&) {
      return Outcome::ack();
    });
    std::printf("subscribe<SettingsChanged> on ui.frames: %s\n", wrong.status().to_string().c_str());
    if (wrong.code() != Code::Conflict) rc = 1;
  }
  {
    // After a restart the settings are still in the store: a new group reads them from the start.
    BusOptions o;
    o.name = "desktop";
    o.workers = 1;
    o.store.directory = (dir / "store").string();
    auto bus = Bus::open(o).value();
    auto settings = bus->create_durable_topic<SettingsChanged>("ui.settings").value();
    std::atomic<int> n{0};
    std::string first;
    auto sub = bus->subscribe<SettingsChanged>(settings, "restarted", [&](const SettingsChanged& c, const Delivery&) {
                    if (n.load() == 0) first = c.section + "." + c.key + " = " + c.value;
                    n.fetch_add(1);
                    return Outcome::ack();
                  }).value();
    if (!wait_for([&] { return n.load() == 2; })) rc = 1;
    std::printf("after restart: %d settings replayed, first: %s\n", n.load(), first.c_str());
    if (first != "display.theme = dark") rc = 1;
  }
  if (temporary) fs::remove_all(dir);
  std::printf("%s\n", rc == 0 ? "OK" : "FAILED");
  return rc;
}
