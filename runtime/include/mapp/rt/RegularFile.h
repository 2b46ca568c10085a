//===- RegularFile.h - inputs are regular files -----------------*- C++ -*-===//
//
// Every reader of a named input (plans, checkpoints, safetensors, corpora,
// traces, probe stores, compiler inputs) takes regular files only: a FIFO
// named like a trace file blocked mapp-scan forever in open(), and a device
// or socket streams without end. Header-only and dependency-free (POSIX),
// so that the compiler and the tools may include it as well as the runtime.
//
//===----------------------------------------------------------------------===//
#ifndef MAPP_RT_REGULARFILE_H
#define MAPP_RT_REGULARFILE_H

#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace mapp::rt {

/// What a file of mode `mode` is, in words ("a FIFO", "a directory").
inline const char *fileKindName(mode_t mode) {
  if (S_ISDIR(mode))
    return "a directory";
  if (S_ISFIFO(mode))
    return "a FIFO";
  if (S_ISSOCK(mode))
    return "a socket";
  if (S_ISCHR(mode))
    return "a character device";
  if (S_ISBLK(mode))
    return "a block device";
  return "a special file";
}

/// "" when `path` (symlinks followed) names a regular file; otherwise why
/// not, in a phrase for "cannot open 'PATH' (WHY)": "a FIFO, not a regular
/// file", "No such file or directory".
inline std::string whyNotRegularFile(const std::string &path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return std::strerror(errno);
  if (!S_ISREG(st.st_mode))
    return std::string(fileKindName(st.st_mode)) + ", not a regular file";
  return "";
}

/// Opens `path` for reading if it is a regular file: the descriptor, or -1
/// with `why` set as whyNotRegularFile does. The open cannot block (a FIFO
/// without a writer would block open() itself): O_NONBLOCK until fstat has
/// shown a regular file, which the check and the read then share.
inline int openRegularFile(const std::string &path, std::string &why) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    why = std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    why = std::string(fileKindName(st.st_mode)) + ", not a regular file";
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

/// Reads all of the regular file `path` into `out` (std::string or a
/// vector of a byte type); false with `why` set otherwise.
template <typename Bytes>
bool readRegularFile(const std::string &path, Bytes &out, std::string &why) {
  int fd = openRegularFile(path, why);
  if (fd < 0)
    return false;
  out.clear();
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0)
    out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0)
      break;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      why = std::strerror(errno);
      ::close(fd);
      return false;
    }
    out.insert(out.end(), buf, buf + n);
  }
  ::close(fd);
  return true;
}

} // namespace mapp::rt

#endif
