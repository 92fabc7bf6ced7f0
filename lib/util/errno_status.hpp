// lanebus — MIT License.
// The one mapping of a failed system call on a file to a Status (epoch
// files, the lease table, wake.shm): `open "/x/y": No such file or directory`
// with the code the errno names.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>

#include "lanebus/status.hpp"
#include "quote.hpp"

namespace lanebus::detail {

/// PermissionDenied for EACCES, EPERM and ELOOP (a symlink where the file
/// is opened with O_NOFOLLOW: refused, and the message says so), DiskFull
/// for ENOSPC and EDQUOT, IOError for anything else.
inline Status errno_status(const char* call, std::string_view path, int err) {
  std::string msg = std::string(call) + " " + quoted(path) + ": " + std::strerror(err);
  if (err == EACCES || err == EPERM) return Status(Code::PermissionDenied, msg);
  if (err == ELOOP) return Status(Code::PermissionDenied, msg + " (the path is a symlink; refusing it)");
  if (err == ENOSPC || err == EDQUOT) return Status(Code::DiskFull, msg);
  return Status(Code::IOError, msg);
}

}  // namespace lanebus::detail
