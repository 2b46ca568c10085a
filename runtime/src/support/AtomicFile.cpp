//===- AtomicFile.cpp - temporary file, fsync, rename ---------------------===//
//
// A save must never leave a half-written file under the final name: kill -9
// during a save used to leave a good checkpoint at 0 bytes (issue 17).
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Error.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <fcntl.h>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::rt;

namespace {

std::string folderOf(const std::string &path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos)
    return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

void writeAll(int fd, const uint8_t *p, size_t n, const std::string &path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      fail("error writing '", path, "': ", std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

/// MAPP_TEST_STALL_WRITE=SUBSTRING:MARKER (tests only): a write whose path
/// contains SUBSTRING stops halfway, creates MARKER and sleeps until killed,
/// so a test can kill -9 a save in progress deterministically. A '*' in
/// SUBSTRING stands for any text (temporaries carry the run id).
void testStall(const std::string &path) {
  const char *env = std::getenv("MAPP_TEST_STALL_WRITE");
  if (!env)
    return;
  std::string s = env;
  size_t colon = s.find(':');
  if (colon == std::string::npos || colon == 0)
    return;
  size_t at = 0;
  for (size_t b = 0; b <= colon;) {
    size_t e = std::min(s.find('*', b), colon);
    at = path.find(s.substr(b, e - b), at);
    if (at == std::string::npos)
      return;
    at += e - b;
    b = e + 1;
  }
  std::ofstream(s.substr(colon + 1)) << path << "\n";
  for (;;)
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

} // namespace

void mapp::rt::fsyncDir(const std::string &dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0)
    fail("cannot open folder '", dir, "': ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  // Some file systems refuse fsync on folders (EINVAL); the rename is then
  // as durable as they make it.
  if (rc != 0 && err != EINVAL)
    fail("fsync of folder '", dir, "': ", std::strerror(err));
}

void mapp::rt::writeFileAtomic(const std::string &path, const void *data,
                               size_t size,
                               const std::function<void()> &midway) {
  static std::atomic<uint64_t> counter{0};
  // Unique per process and call: rank threads may write side by side.
  std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" +
                    std::to_string(counter++);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail("cannot write '", path, "': ", std::strerror(errno));
  try {
    const uint8_t *p = static_cast<const uint8_t *>(data);
    size_t half = size / 2;
    writeAll(fd, p, half, path);
    if (midway)
      midway();
    testStall(path);
    writeAll(fd, p + half, size - half, path);
    if (::fsync(fd) != 0)
      fail("fsync of '", path, "': ", std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    fail("error writing '", path, "': ", std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    fail("cannot write '", path, "': rename: ", std::strerror(err));
  }
  fsyncDir(folderOf(path));
}
