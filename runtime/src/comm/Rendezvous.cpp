//===- Rendezvous.cpp - rank 0's bootstrap blob over TCP or a file ---------===//
#include "mapp/rt/Rendezvous.h"
#include "mapp/rt/AtomicFile.h"
#include "mapp/rt/Error.h"

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

using namespace mapp::rt;

namespace {

using Clock = std::chrono::steady_clock;

constexpr char kMagic[8] = {'M', 'A', 'P', 'P', 'R', 'D', 'Z', '\0'};
constexpr uint32_t kVersion = 1;
constexpr size_t kMaxBlob = 1 << 16;
/// A greeting: magic, version, world, rank (host order: one build talks
/// to itself).
struct Hello {
  char magic[8];
  uint32_t version, world, rank;
};
/// Rank 0's reply: magic, status (0 = the blob follows, else a message),
/// length of what follows.
struct Reply {
  char magic[8];
  uint32_t status, length;
};

double secondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

std::string rankList(const std::vector<int> &ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size(); ++i)
    s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

class Fd {
public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd &&o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd &operator=(Fd &&o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Fd() {
    if (fd_ >= 0)
      ::close(fd_);
  }
  int get() const { return fd_; }

private:
  int fd_;
};

/// Reads exactly `n` bytes before `deadline`; false on EOF, error or time.
bool readAll(int fd, void *buf, size_t n, Clock::time_point deadline) {
  char *p = static_cast<char *>(buf);
  while (n) {
    double left = secondsLeft(deadline);
    if (left <= 0)
      return false;
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return false;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool writeAll(int fd, const void *buf, size_t n) {
  const char *p = static_cast<const char *>(buf);
  while (n) {
    ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR)
      continue;
    if (put <= 0)
      return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

bool sendReply(int fd, uint32_t status, const void *data, size_t n) {
  Reply r;
  std::memcpy(r.magic, kMagic, sizeof kMagic);
  r.status = status;
  r.length = static_cast<uint32_t>(n);
  return writeAll(fd, &r, sizeof r) && writeAll(fd, data, n);
}

/// The addresses of host:port (numeric or a name).
struct AddrInfo {
  addrinfo *list = nullptr;
  AddrInfo(const std::string &host, int port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    std::string service = std::to_string(port);
    if (int e = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list))
      fail("rendezvous: cannot resolve MASTER_ADDR '", host,
           "': ", gai_strerror(e));
  }
  ~AddrInfo() { ::freeaddrinfo(list); }
};

std::string peerName(const sockaddr_storage &a) {
  char host[NI_MAXHOST] = "?";
  ::getnameinfo(reinterpret_cast<const sockaddr *>(&a), sizeof a, host,
                sizeof host, nullptr, 0, NI_NUMERICHOST);
  return host;
}

/// Rank 0: accepts every other rank's greeting, then sends each the blob
/// (or, on failure, the reason).
Blob serveTcp(const std::string &addr, int port, int world, const Blob &blob,
              double timeoutS) {
  std::string where = addr + ":" + std::to_string(port);
  AddrInfo ai(addr, port, true);
  Fd lfd(::socket(ai.list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (lfd.get() < 0)
    fail("rendezvous: socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(lfd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(lfd.get(), ai.list->ai_addr, ai.list->ai_addrlen) != 0)
    fail("rendezvous: rank 0 cannot listen on ", where, ": ",
         std::strerror(errno), " (MASTER_ADDR must be an address of rank 0's "
         "host, MASTER_PORT a free port)");
  if (::listen(lfd.get(), world + 16) != 0)
    fail("rendezvous: listen on ", where, ": ", std::strerror(errno));
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeoutS));
  std::map<int, Fd> ranks; // arrived, by rank
  auto failAll = [&](const std::string &why) {
    for (auto &[r, fd] : ranks)
      sendReply(fd.get(), 1, why.data(), why.size());
    fail(why);
  };
  while (static_cast<int>(ranks.size()) < world - 1) {
    double left = secondsLeft(deadline);
    pollfd pfd{lfd.get(), POLLIN, 0};
    int r = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left * 1000) + 1) : 0;
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0) {
      std::vector<int> missing;
      for (int q = 1; q < world; ++q)
        if (!ranks.count(q))
          missing.push_back(q);
      failAll("rendezvous on " + where + " timed out after " +
              std::to_string(static_cast<int>(timeoutS)) + " s: rank(s) " +
              rankList(missing) + " of " + std::to_string(world) +
              " never arrived");
    }
    sockaddr_storage from{};
    socklen_t len = sizeof from;
    Fd cfd(::accept4(lfd.get(), reinterpret_cast<sockaddr *>(&from), &len,
                     SOCK_CLOEXEC));
    if (cfd.get() < 0)
      continue;
    // A stray client gets a short while to greet, then is dropped; rank 0
    // goes on waiting for the real ranks.
    Hello h{};
    auto greetBy = std::min(deadline, Clock::now() + std::chrono::seconds(2));
    if (!readAll(cfd.get(), &h, sizeof h, greetBy) ||
        std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 ||
        h.version != kVersion) {
      std::cerr << "mapp-run: rendezvous on " << where
                << ": ignored a connection from " << peerName(from)
                << " that is not a mapp rank of this version\n";
      continue;
    }
    int rank = static_cast<int>(h.rank);
    if (static_cast<int>(h.world) != world || rank < 1 || rank >= world) {
      std::string why = "rendezvous on " + where + ": a process from " +
                        peerName(from) + " is rank " + std::to_string(h.rank) +
                        " of a world of " + std::to_string(h.world) +
                        ", rank 0's world is " + std::to_string(world) +
                        " (every process must be started for the same world)";
      sendReply(cfd.get(), 1, why.data(), why.size());
      failAll(why);
    }
    if (ranks.count(rank)) {
      std::string why = "rendezvous on " + where + ": two processes claim "
                        "rank " + std::to_string(rank) + " (the second from " +
                        peerName(from) + ")";
      sendReply(cfd.get(), 1, why.data(), why.size());
      failAll(why);
    }
    ranks.emplace(rank, std::move(cfd));
  }
  for (auto &[r, fd] : ranks)
    if (!sendReply(fd.get(), 0, blob.data(), blob.size()))
      fail("rendezvous on ", where, ": rank ", r,
           " left before it got the id");
  return blob;
}

/// Ranks > 0: connect (retrying while rank 0 is not listening yet), greet,
/// and wait for rank 0's reply.
Blob joinTcp(const std::string &addr, int port, int rank, int world,
             double timeoutS) {
  std::string where = addr + ":" + std::to_string(port);
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(timeoutS));
  Fd fd;
  std::string lastError;
  while (true) {
    AddrInfo ai(addr, port, false);
    Fd s(::socket(ai.list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (s.get() >= 0 &&
        ::connect(s.get(), ai.list->ai_addr, ai.list->ai_addrlen) == 0) {
      fd = std::move(s);
      break;
    }
    lastError = std::strerror(errno);
    if (secondsLeft(deadline) <= 0)
      fail("rendezvous: rank ", rank, " could not reach rank 0 at ", where,
           " within ", static_cast<int>(timeoutS), " s (", lastError, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  Hello h;
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.world = static_cast<uint32_t>(world);
  h.rank = static_cast<uint32_t>(rank);
  if (!writeAll(fd.get(), &h, sizeof h))
    fail("rendezvous: rank ", rank, " lost ", where, " while greeting");
  // Rank 0 answers once every rank arrived or its own timeout passed.
  auto replyBy = deadline + std::chrono::seconds(30);
  Reply r{};
  if (!readAll(fd.get(), &r, sizeof r, replyBy))
    fail("rendezvous: rank ", rank, " got no answer from rank 0 at ", where,
         " (rank 0 ended or is not a mapp rank)");
  if (std::memcmp(r.magic, kMagic, sizeof kMagic) != 0 || r.length > kMaxBlob)
    fail("rendezvous: ", where, " answered rank ", rank,
         " with something that is not mapp's rendezvous");
  Blob body(r.length);
  if (!readAll(fd.get(), body.data(), body.size(), replyBy))
    fail("rendezvous: rank ", rank, ": ", where, " closed mid-answer");
  if (r.status != 0)
    fail(std::string(body.begin(), body.end()));
  return body;
}

bool exists(const std::string &path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string markerOf(const std::string &path, int rank) {
  return path + ".arrived." + std::to_string(rank);
}

/// File header: magic, version, world, length, then the blob.
struct FileHead {
  char magic[8];
  uint32_t version, world, length;
};

std::string slurp(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

} // namespace

Blob mapp::rt::rendezvousTcp(const std::string &addr, int port, int rank,
                             int world, const Blob &blob, double timeoutS) {
  if (blob.size() > kMaxBlob)
    fail("rendezvous: a blob of ", blob.size(), " bytes is too long");
  // World 1 still binds: the port is checked even where no peer comes.
  return rank == 0 ? serveTcp(addr, port, world, blob, timeoutS)
                   : joinTcp(addr, port, rank, world, timeoutS);
}

Blob mapp::rt::rendezvousFile(const std::string &path, int rank, int world,
                              const Blob &blob, double timeoutS) {
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(timeoutS));
  auto poll = [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };
  if (rank == 0) {
    if (exists(path))
      fail("rendezvous: MAPP_RENDEZVOUS_FILE '", path,
           "' exists (left by an earlier job?): remove it or name a fresh "
           "path per job, e.g. with $SLURM_JOB_ID");
    // Markers without PATH are an earlier job's (ranks write theirs only
    // after reading PATH).
    for (int r = 1; r < world; ++r)
      ::unlink(markerOf(path, r).c_str());
    std::string bytes(sizeof(FileHead) + blob.size(), '\0');
    FileHead h;
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.world = static_cast<uint32_t>(world);
    h.length = static_cast<uint32_t>(blob.size());
    std::memcpy(bytes.data(), &h, sizeof h);
    std::memcpy(bytes.data() + sizeof h, blob.data(), blob.size());
    writeFileAtomic(path, bytes.data(), bytes.size());
    std::vector<int> missing;
    std::string mismatch;
    while (true) {
      missing.clear();
      for (int r = 1; r < world && mismatch.empty(); ++r) {
        if (!exists(markerOf(path, r))) {
          missing.push_back(r);
          continue;
        }
        std::string theirs = slurp(markerOf(path, r));
        if (theirs != std::to_string(world) + "\n")
          mismatch = "rendezvous: rank " + std::to_string(r) +
                     " was started for a world of " +
                     theirs.substr(0, theirs.find('\n')) + ", rank 0 for " +
                     std::to_string(world);
      }
      if (missing.empty() || !mismatch.empty() || secondsLeft(deadline) <= 0)
        break;
      poll();
    }
    // The rendezvous is over either way: leave no file for the next job.
    ::unlink(path.c_str());
    for (int r = 1; r < world; ++r)
      ::unlink(markerOf(path, r).c_str());
    if (!mismatch.empty())
      fail(mismatch);
    if (!missing.empty())
      fail("rendezvous through '", path, "' timed out after ",
           static_cast<int>(timeoutS), " s: rank(s) ", rankList(missing),
           " of ", world, " never arrived");
    return blob;
  }
  while (true) {
    std::string bytes = exists(path) ? slurp(path) : std::string();
    FileHead h{};
    if (bytes.size() >= sizeof h) {
      std::memcpy(&h, bytes.data(), sizeof h);
      if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 ||
          h.version != kVersion ||
          bytes.size() != sizeof h + static_cast<size_t>(h.length))
        fail("rendezvous: '", path, "' is not a mapp rendezvous file");
      // Rank 0 learns our world from the marker (a mismatch fails there).
      // Atomic, so rank 0 never reads half a marker.
      std::string mine = std::to_string(world) + "\n";
      writeFileAtomic(markerOf(path, rank), mine.data(), mine.size());
      if (static_cast<int>(h.world) != world)
        fail("rendezvous: rank 0 wrote '", path, "' for a world of ", h.world,
             ", rank ", rank, " was started for ", world);
      return Blob(bytes.begin() + sizeof h, bytes.end());
    }
    if (secondsLeft(deadline) <= 0)
      fail("rendezvous: rank ", rank, " found no '", path,
           "' from rank 0 within ", static_cast<int>(timeoutS), " s");
    poll();
  }
}

std::string mapp::rt::rendezvousPath(const LauncherEnv &l,
                                     const EnvLookup &env) {
  if (l.launcher == "mpi")
    return "mpi";
  if (const char *f = env("MAPP_RENDEZVOUS_FILE"); f && *f)
    return "file";
  return "tcp";
}

double mapp::rt::rendezvousTimeout(const EnvLookup &env) {
  const char *v = env("MAPP_RENDEZVOUS_TIMEOUT");
  if (!v)
    return 300;
  char *end = nullptr;
  double s = std::strtod(v, &end);
  if (end == v || *end != '\0' || !(s > 0))
    fail("MAPP_RENDEZVOUS_TIMEOUT='", v, "' is not a positive number of "
         "seconds");
  return s;
}

Blob mapp::rt::rendezvous(const LauncherEnv &l, const EnvLookup &env,
                          const Blob &blob) {
  double timeoutS = rendezvousTimeout(env);
  std::string path = rendezvousPath(l, env);
  if (path == "mpi")
    return rendezvousMpi(l.rank, l.world, blob, timeoutS);
  if (path == "file")
    return rendezvousFile(env("MAPP_RENDEZVOUS_FILE"), l.rank, l.world, blob,
                          timeoutS);
  if (l.world == 1 && l.masterPort == 0)
    return blob; // nobody to tell
  if (l.masterPort == 0)
    fail(l.launcher, " launcher: MASTER_PORT is not set: the NCCL id travels "
         "over TCP to MASTER_ADDR:MASTER_PORT (or set MAPP_RENDEZVOUS_FILE to "
         "a path on a shared file system)");
  return rendezvousTcp(l.masterAddr, l.masterPort, l.rank, l.world, blob,
                       timeoutS);
}
