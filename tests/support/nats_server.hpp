// lanebus — MIT License.
// NatsServer: a real `nats-server -js` on a free loopback port with its own
// storage directory, for the bridge tests. Killed in the destructor (also when
// a check failed), and with the test process (PR_SET_PDEATHSIG).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "external_tool.hpp"

namespace lanebus::test {

/// The nats-server binary: $LANEBUS_NATS_SERVER, else the first nats-server on
/// PATH or in /usr/sbin, /usr/bin, /usr/local/bin; "" when there is none.
inline std::string nats_server_binary() { return find_tool("LANEBUS_NATS_SERVER", "nats-server"); }

/// True when a missing nats-server must fail the test (CI=true) instead of skipping it.
inline bool nats_server_required() { return tool_required(); }

class NatsServer {
 public:
  /// `storage`: the JetStream storage directory (kept across restart()).
  /// `config`: extra lines of a server config file (max_payload, authorization ...).
  NatsServer(std::string storage, std::string config = "") : storage_(std::move(storage)), config_(std::move(config)) {
    binary_ = nats_server_binary();
    port_ = free_loopback_port();
    ::mkdir(storage_.c_str(), 0700);
  }
  ~NatsServer() { kill9(); }
  NatsServer(const NatsServer&) = delete;
  NatsServer& operator=(const NatsServer&) = delete;

  bool available() const { return !binary_.empty(); }
  int port() const { return port_; }
  std::string url() const { return "nats://127.0.0.1:" + std::to_string(port_); }
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0; }

  /// Start the server and wait (up to 20 s) until it accepts connections.
  bool start() {
    if (binary_.empty() || port_ <= 0 || pid_ > 0) return false;
    const std::string conf = storage_ + "/server.conf";
    {
      std::ofstream f(conf, std::ios::trunc);
      f << "listen: 127.0.0.1:" << port_ << "\n";
      f << "jetstream { store_dir: \"" << storage_ << "\" }\n";
      f << config_ << "\n";
    }
    const std::string log = storage_ + "/server.log";
    std::vector<std::string> argv = {binary_, "-c", conf, "-l", log};
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      int devnull = ::open("/dev/null", O_RDWR);
      if (devnull >= 0) {
        ::dup2(devnull, 1);
        ::dup2(devnull, 2);
      }
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    if (pid < 0) return false;
    pid_ = pid;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;  // exited (bad config, port taken)
      }
      if (accepts()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill9();
    return false;
  }

  /// SIGKILL and reap (no-op when not running).
  void kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

  /// SIGTERM and reap.
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int st = 0;
    while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }

 private:
  bool accepts() const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port_));
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }

  std::string binary_;
  std::string storage_;
  std::string config_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace lanebus::test
