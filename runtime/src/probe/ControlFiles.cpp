//===- ControlFiles.cpp - private token files, atomic control files -------===//
#include "mapp/rt/ControlFiles.h"
#include "mapp/rt/Error.h"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <vector>

using namespace mapp::rt;
using json = nlohmann::json;

namespace {

std::string errnoText() { return std::strerror(errno); }

void writeAllFd(int fd, const std::string &content, const std::string &path) {
  size_t off = 0;
  while (off < content.size()) {
    ssize_t n = ::write(fd, content.data() + off, content.size() - off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      fail("cannot write '", path, "': ", errnoText());
    off += static_cast<size_t>(n);
  }
}

} // namespace

std::string mapp::rt::randomToken() {
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    fail("cannot open /dev/urandom for a control token: ", errnoText());
  unsigned char bytes[32];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      ::close(fd);
      fail("cannot read /dev/urandom for a control token");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char *hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

bool mapp::rt::tokensEqual(const std::string &a, const std::string &b) {
  // Length is not secret (every token has 64 digits); the contents are.
  if (a.size() != b.size())
    return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

void mapp::rt::writePrivateFile(const std::string &path,
                                const std::string &content) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode))
      fail("'", path, "' exists and is not a regular file");
    if (::unlink(path.c_str()) != 0)
      fail("cannot replace the stale '", path, "': ", errnoText());
  }
  int fd = ::open(path.c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    fail("cannot create '", path, "' (O_EXCL): ", errnoText());
  try {
    if (::fchmod(fd, 0600) != 0)
      fail("cannot set mode 0600 on '", path, "': ", errnoText());
    writeAllFd(fd, content, path);
  } catch (...) {
    ::close(fd);
    ::unlink(path.c_str());
    throw;
  }
  ::close(fd);
}

std::string mapp::rt::readPrivateFile(const std::string &path, size_t cap) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    fail("cannot open '", path, "': ", errnoText(),
         errno == ELOOP ? " (a symlink: refused)" : "");
  struct stat st;
  std::string why;
  if (::fstat(fd, &st) != 0)
    why = errnoText();
  else if (!S_ISREG(st.st_mode))
    why = "not a regular file";
  else if (st.st_uid != ::geteuid())
    why = "owned by another user";
  else if (st.st_mode & 077)
    why = "readable or writable by group or others (want mode 0600)";
  else if (static_cast<size_t>(st.st_size) > cap)
    why = "larger than " + std::to_string(cap) + " bytes";
  if (!why.empty()) {
    ::close(fd);
    fail("refusing '", path, "': ", why);
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, &out[got], out.size() - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

void mapp::rt::replaceFileAtomically(const std::string &path,
                                     const std::string &content) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty())
    fail("'", path, "' names a folder, not a file");
  std::string tmpl = (dir.empty() ? std::string() : dir) + "/." + base +
                     ".XXXXXX";
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  // mkstemp: O_CREAT|O_EXCL, mode 0600, a name nobody can predict.
  int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0)
    fail("cannot create a temporary file beside '", path, "': ", errnoText());
  std::string tmp = name.data();
  try {
    writeAllFd(fd, content, tmp);
    if (::fsync(fd) != 0)
      fail("cannot sync '", tmp, "': ", errnoText());
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  ::close(fd);
  // rename replaces a link at `path` itself; it never writes through one.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string e = errnoText();
    ::unlink(tmp.c_str());
    fail("cannot replace '", path, "': ", e);
  }
}

std::string mapp::rt::formatControlCredentials(const ControlCredentials &c) {
  return json({{"port", c.port}, {"token", c.token}}).dump() + "\n";
}

ControlCredentials mapp::rt::readControlCredentials(const std::string &path) {
  std::string text = readPrivateFile(path);
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("port") ||
      !j["port"].is_number_integer() || !j.contains("token") ||
      !j["token"].is_string())
    fail("'", path, "' is not a control token file ({\"port\", \"token\"})");
  ControlCredentials c;
  int64_t port = j["port"].get<int64_t>();
  if (port < 1 || port > 65535)
    fail("'", path, "': port ", port, " out of range");
  c.port = static_cast<int>(port);
  c.token = j["token"].get<std::string>();
  if (c.token.size() != 64 ||
      c.token.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("'", path, "': the token must be 64 hex digits");
  return c;
}

std::string mapp::rt::defaultControlTokenFile(const std::string &db,
                                              int rank) {
  std::string f = db + ".control-token";
  return rank > 0 ? f + ".rank" + std::to_string(rank) : f;
}
