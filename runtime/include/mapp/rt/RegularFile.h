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
/// not: "a FIFO, not a regular file" (`notRegular` set) or the system's
/// reason ("No such file or directory"). openFailure makes the sentence.
inline std::string whyNotRegularFile(const std::string &path,
                                     bool *notRegular = nullptr) {
  if (notRegular)
    *notRegular = false;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return std::strerror(errno);
  if (S_ISREG(st.st_mode))
    return "";
  if (notRegular)
    *notRegular = true;
  return std::string(fileKindName(st.st_mode)) + ", not a regular file";
}

/// Opens `path` for reading if it is a regular file: the descriptor, or -1
/// with `why` (and `notRegular`) set as whyNotRegularFile does. The open
/// cannot block (a FIFO without a writer would block open() itself):
/// O_NONBLOCK until fstat has shown a regular file, which the check and the
/// read then share.
inline int openRegularFile(const std::string &path, std::string &why,
                           bool *notRegular = nullptr) {
  if (notRegular)
    *notRegular = false;
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
    if (notRegular)
      *notRegular = true;
    ::close(fd);
    return -1;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

/// Reads all of the regular file `path` into `out` (std::string or a
/// vector of a byte type); false with `why` (and `notRegular`) set
/// otherwise.
template <typename Bytes>
bool readRegularFile(const std::string &path, Bytes &out, std::string &why,
                     bool *notRegular = nullptr) {
  int fd = openRegularFile(path, why, notRegular);
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

/// The one sentence of a failed open: "NOUN'PATH' is a FIFO, not a regular
/// file" when it is not a regular file, else "VERB NOUN'PATH' (WHY)"; `noun`
/// ends in a space when given ("vocab ").
inline std::string openFailure(const std::string &noun, const std::string &path,
                               const std::string &why, bool notRegular,
                               const std::string &verb = "cannot open") {
  if (notRegular)
    return noun + "'" + path + "' is " + why;
  return verb + " " + noun + "'" + path + "' (" + why + ")";
}

} // namespace mapp::rt

#endif
