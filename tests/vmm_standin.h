// What the tests of mapped mode's GPU memory (tests/daemon/vmm_chunk_memory_test.cc,
// tests/client/cuda_lease_memory_test.cc) share: the CUDA driver stand-in loaded through the
// driver table, its knobs, and child processes that hold chunks.
#ifndef STASH_TESTS_VMM_STANDIN_H_
#define STASH_TESTS_VMM_STANDIN_H_

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/cuda_driver.h"
#include "common/descriptor_socket.h"
#include "common/unique_fd.h"

namespace stash::testing {

// Every knob of the stand-in (tests/cuda_standin/README.md); Standin::Reset clears them all.
inline const char* const kStandinKnobs[] = {
    "STASH_STANDIN_DEVICES",         "STASH_STANDIN_NO_VMM",          "STASH_STANDIN_NO_POSIX_FD",
    "STASH_STANDIN_NO_PEER",         "STASH_STANDIN_VRAM_BYTES",      "STASH_STANDIN_STREAMS",
    "STASH_STANDIN_STREAM_DELAY_US", "STASH_STANDIN_WAIT_TIMEOUT_MS",
};

// The stand-in, loaded once per process through CudaDriver::Load. Its registry (where the VRAM
// budget is counted across processes) is a folder of this process's own: ctest runs test
// processes side by side, and their budgets must not mix.
class Standin {
 public:
  static const CudaDriver* Driver() {
    static const CudaDriver* driver = [] {
      static char dir[] = "/tmp/stash-vmm-test-XXXXXX";
      if (mkdtemp(dir) == nullptr) std::abort();
      setenv("STASH_STANDIN_REGISTRY", dir, 1);
      static const pid_t owner = getpid();
      // Children leave with _exit and never get here; the test process removes the folder.
      std::atexit([] {
        if (getpid() != owner) return;
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      });
      auto loaded = CudaDriver::Load(STASH_CUDA_STANDIN_LIBRARY);
      if (!loaded.ok()) {
        ADD_FAILURE() << loaded.status().ToString();
        std::abort();
      }
      return loaded->release();  // process-wide, like CudaDriver::Get's
    }();
    return driver;
  }

  // Clears every knob, sets `knobs`, and runs cuInit(0), which reads them again.
  static const CudaDriver* Reset(
      const std::vector<std::pair<const char*, std::string>>& knobs = {}) {
    for (const char* knob : kStandinKnobs) unsetenv(knob);
    for (const auto& [name, value] : knobs) setenv(name, value.c_str(), 1);
    const CudaDriver* d = Driver();
    EXPECT_EQ(d->Init(0), CUDA_SUCCESS);
    return d;
  }

  // Bytes of stand-in device memory alive on `device` in every process of the registry.
  static long long DeviceBytesInUse(int device) {
    using Fn = long long (*)(int);
    static const auto fn =
        reinterpret_cast<Fn>(dlsym(Driver()->library, "stash_standin_device_bytes_in_use"));
    return fn != nullptr ? fn(device) : -2;
  }
};

// A child process and a socket to it (for descriptors and one-byte signals both ways).
class Child {
 public:
  // Forks; the child runs `body` with its end of the socket and exits with what it returns
  // (0 = passed). Never returns in the child.
  static std::unique_ptr<Child> Start(const std::function<int(int socket)>& body) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return nullptr;
    const pid_t pid = fork();
    if (pid < 0) return nullptr;
    if (pid == 0) {
      close(fds[0]);
      _exit(body(fds[1]));
    }
    close(fds[1]);
    return std::unique_ptr<Child>(new Child(pid, UniqueFd(fds[0])));
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  int socket() const { return socket_.get(); }
  pid_t pid() const { return pid_; }
  // The child's exit code, or 128 + its signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Kill() {
    kill(pid_, SIGKILL);
    Wait();
  }

 private:
  Child(pid_t pid, UniqueFd socket) : pid_(pid), socket_(std::move(socket)) {}
  pid_t pid_;
  UniqueFd socket_;
};

// One packet of `text` with `fds` (borrowed) on `socket`.
inline bool Send(int socket, const std::string& text, const std::vector<int>& fds = {}) {
  return SendPacket(socket, text, fds).ok();
}
// The next packet's text (its descriptors to `*fds`), or "" when the peer is gone.
inline std::string Receive(int socket, std::vector<UniqueFd>* fds = nullptr) {
  auto packet = ReceivePacket(socket);
  if (!packet.ok()) return "";
  if (fds != nullptr) *fds = std::move(packet->fds);
  return packet->bytes;
}

// Fills `bytes` at `p` with a pattern that depends on `seed` and the offset.
inline void FillPattern(uint8_t* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 4096) p[i] = static_cast<uint8_t>(seed + i / 4096);
  p[bytes - 1] = static_cast<uint8_t>(seed ^ 0x5a);
}
inline bool HasPattern(const uint8_t* p, uint64_t bytes, uint8_t seed) {
  for (uint64_t i = 0; i < bytes; i += 4096) {
    if (p[i] != static_cast<uint8_t>(seed + i / 4096)) return false;
  }
  return p[bytes - 1] == static_cast<uint8_t>(seed ^ 0x5a);
}
inline bool AllZero(const uint8_t* p, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace stash::testing

#endif  // STASH_TESTS_VMM_STANDIN_H_
