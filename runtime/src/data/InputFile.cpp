//===- InputFile.cpp - data files opened without hanging ------------------===//
#include "data/InputFile.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/RegularFile.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

using namespace mapp::rt;

InputFile::InputFile(const std::string &path, const std::string &prefix,
                     const std::string &noun)
    : path_(path), prefix_(prefix) {
  // The check every reader of a named input shares (mapp/rt/RegularFile.h).
  std::string why;
  bool notRegular = false;
  fd_ = openRegularFile(path, why, &notRegular);
  if (fd_ < 0)
    fail(prefix, openFailure(noun, path, why, notRegular));
  struct stat st;
  if (::fstat(fd_, &st) != 0) {
    int err = errno;
    ::close(fd_);
    fail(prefix, "cannot stat ", noun, "'", path, "' (", std::strerror(err),
         ")");
  }
  size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0)
    ::close(fd_);
}

size_t InputFile::readAt(uint64_t offset, void *buf, size_t n) const {
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(fd_, static_cast<char *>(buf) + got, n - got,
                        static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0)
      fail(prefix_, "cannot read '", path_, "' (", std::strerror(errno), ")");
    if (r == 0)
      break;
    got += static_cast<size_t>(r);
  }
  return got;
}

std::string InputFile::readAll(uint64_t cap) const {
  if (size_ > cap)
    fail(prefix_, "'", path_, "' is ", size_, " bytes, more than the ", cap,
         " this reader accepts");
  std::string s(static_cast<size_t>(size_), '\0');
  s.resize(readAt(0, s.data(), s.size()));
  return s;
}

bool mapp::rt::pathExists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}
