// lanebus — MIT License.
// Status: code names and message formatting.
#include "lanebus/status.hpp"

namespace lanebus {

const char* to_string(Code code) noexcept {
  switch (code) {
    case Code::Ok: return "OK";
    case Code::InvalidArgument: return "InvalidArgument";
    case Code::InvalidName: return "InvalidName";
    case Code::PayloadTooLarge: return "PayloadTooLarge";
    case Code::Conflict: return "Conflict";
    case Code::WouldBlock: return "WouldBlock";
    case Code::TimedOut: return "TimedOut";
    case Code::QuotaExceeded: return "QuotaExceeded";
    case Code::ShutDown: return "ShutDown";
    case Code::NotFound: return "NotFound";
    case Code::Busy: return "Busy";
    case Code::MapFull: return "MapFull";
    case Code::DiskFull: return "DiskFull";
    case Code::PermissionDenied: return "PermissionDenied";
    case Code::Corruption: return "Corruption";
    case Code::VersionTooNew: return "VersionTooNew";
    case Code::IOError: return "IOError";
    case Code::StaleToken: return "StaleToken";
    case Code::FenceViolation: return "FenceViolation";
    case Code::Incompatible: return "Incompatible";
    case Code::SchemaViolation: return "SchemaViolation";
    case Code::Internal: return "Internal";
  }
  return "Unknown";
}

Status::Status(Code code, std::string_view message)
    : code_(code), message_(message.empty() ? nullptr : std::make_unique<std::string>(message)) {}

Status::Status(const Status& other)
    : code_(other.code_),
      literal_(other.literal_),
      message_(other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) {
    code_ = other.code_;
    literal_ = other.literal_;
    message_ = other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr;
  }
  return *this;
}

std::string_view Status::message() const noexcept {
  if (message_) return *message_;
  return literal_ ? std::string_view(literal_) : std::string_view();
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string s = lanebus::to_string(code_);
  if (std::string_view m = message(); !m.empty()) {
    s += ": ";
    s += m;
  }
  return s;
}

}  // namespace lanebus
