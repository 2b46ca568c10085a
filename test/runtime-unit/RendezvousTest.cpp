//===- RendezvousTest.cpp - the NCCL id's rendezvous between processes ----===//
//
// CPU processes (fork) exchange a dummy 128-byte id through TCP and a file;
// known answers: every rank gets rank 0's bytes, a mismatched world and a
// rank that never comes fail naming them, a stray client is ignored. The
// MPI path runs under mpirun (ctest mapp-rendezvous-mpi-np*), skipped here.
//
//===----------------------------------------------------------------------===//
#include "mapp/rt/Comm.h"
#include "mapp/rt/Error.h"
#include "mapp/rt/Rendezvous.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <functional>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace mapp::rt;

namespace {

Blob dummyId() {
  Blob b(128);
  for (size_t i = 0; i < b.size(); ++i)
    b[i] = static_cast<uint8_t>(i * 37 + 11);
  return b;
}

/// A child process running `f`; its Error message comes back through a
/// pipe, its exit status is 0 when f returned true.
struct Child {
  pid_t pid;
  int fd;
};

Child forkRank(const std::function<bool()> &f) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    int code = 1;
    try {
      code = f() ? 0 : 1;
    } catch (const std::exception &e) {
      std::string m = e.what();
      (void)!::write(p[1], m.data(), m.size());
      code = 2;
    }
    ::_exit(code);
  }
  ::close(p[1]);
  return {pid, p[0]};
}

/// Exit status and error message of a child.
std::pair<int, std::string> finish(const Child &c) {
  std::string msg;
  char buf[512];
  ssize_t n;
  while ((n = ::read(c.fd, buf, sizeof buf)) > 0)
    msg.append(buf, static_cast<size_t>(n));
  ::close(c.fd);
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, msg};
}

/// A port nobody listens on now (the kernel's pick, released).
int freePort() {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
  ::close(s);
  return ntohs(a.sin_port);
}

template <typename F> std::string errorOf(F f) {
  try {
    f();
  } catch (const Error &e) {
    return e.what();
  }
  return "";
}

std::string freshPath(const std::string &name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("mapp-rdz-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

bool contains(const std::string &s, const std::string &part) {
  return s.find(part) != std::string::npos;
}

} // namespace

TEST(Rendezvous, TcpFourRanks) {
  int port = freePort();
  Blob id = dummyId();
  std::vector<Child> kids;
  for (int r = 1; r < 4; ++r)
    kids.push_back(forkRank([&, r] {
      return rendezvousTcp("127.0.0.1", port, r, 4, {}, 20) == id;
    }));
  EXPECT_EQ(rendezvousTcp("127.0.0.1", port, 0, 4, id, 20), id);
  for (const Child &c : kids)
    EXPECT_EQ(finish(c).first, 0);
}

TEST(Rendezvous, TcpStrayClientIsIgnored) {
  int port = freePort();
  Blob id = dummyId();
  // Garbage first, then the real rank 1 (which waits on `order` until the
  // stray client has spoken).
  int order[2];
  ASSERT_EQ(::pipe(order), 0);
  Child stray = forkRank([&] {
    struct Done {
      int fd;
      ~Done() { (void)!::write(fd, "x", 1); }
    } done{order[1]};
    for (int i = 0; i < 100; ++i) {
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        const char junk[] = "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxx";
        (void)!::write(s, junk, sizeof junk);
        ::usleep(200 * 1000);
        ::close(s);
        return true;
      }
      ::close(s);
      ::usleep(20 * 1000);
    }
    return false;
  });
  Child rank1 = forkRank([&] {
    char c;
    (void)!::read(order[0], &c, 1);
    return rendezvousTcp("127.0.0.1", port, 1, 2, {}, 20) == id;
  });
  ::close(order[0]);
  ::close(order[1]);
  EXPECT_EQ(rendezvousTcp("127.0.0.1", port, 0, 2, id, 20), id);
  EXPECT_EQ(finish(stray).first, 0);
  EXPECT_EQ(finish(rank1).first, 0);
}

TEST(Rendezvous, TcpSilentClientIsDropped) {
  // A client that connects and says nothing holds rank 0 at most 2 s; the
  // real rank 1, queued behind it, still gets the id.
  int port = freePort();
  Blob id = dummyId();
  int order[2];
  ASSERT_EQ(::pipe(order), 0);
  Child silent = forkRank([&] {
    for (int i = 0; i < 200; ++i) {
      int s = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        (void)!::write(order[1], "x", 1);
        ::sleep(10);
        ::close(s);
        return true;
      }
      ::close(s);
      ::usleep(20 * 1000);
    }
    return false;
  });
  Child rank1 = forkRank([&] {
    char c;
    (void)!::read(order[0], &c, 1);
    return rendezvousTcp("127.0.0.1", port, 1, 2, {}, 20) == id;
  });
  ::close(order[0]);
  ::close(order[1]);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rendezvousTcp("127.0.0.1", port, 0, 2, id, 20), id);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                 .count();
  // Not held until the silent client leaves (10 s): 2 s and some slack.
  EXPECT_LT(s, 8.0);
  EXPECT_EQ(finish(rank1).first, 0);
  ::kill(silent.pid, SIGKILL);
  finish(silent);
}

TEST(Rendezvous, TcpWorldMismatchFailsBothSides) {
  int port = freePort();
  Child rank1 = forkRank([&] {
    rendezvousTcp("127.0.0.1", port, 1, 3, {}, 20);
    return true;
  });
  std::string err = errorOf(
      [&] { rendezvousTcp("127.0.0.1", port, 0, 2, dummyId(), 20); });
  EXPECT_TRUE(contains(err, "is rank 1 of a world of 3, rank 0's world is 2"))
      << err;
  auto [status, msg] = finish(rank1);
  EXPECT_EQ(status, 2);
  EXPECT_TRUE(contains(msg, "rank 0's world is 2")) << msg;
}

TEST(Rendezvous, TcpNeverArrivingRankIsNamed) {
  int port = freePort();
  Blob id = dummyId();
  Child rank2 = forkRank([&] {
    rendezvousTcp("127.0.0.1", port, 2, 4, {}, 20);
    return true;
  });
  // Ranks 1 and 3 never come.
  std::string err =
      errorOf([&] { rendezvousTcp("127.0.0.1", port, 0, 4, id, 2); });
  EXPECT_TRUE(contains(err, "timed out after 2 s: rank(s) 1, 3 of 4 never "
                            "arrived"))
      << err;
  auto [status, msg] = finish(rank2);
  EXPECT_EQ(status, 2);
  EXPECT_TRUE(contains(msg, "rank(s) 1, 3 of 4 never arrived")) << msg;
}

TEST(Rendezvous, TcpNoRankZero) {
  int port = freePort();
  std::string err =
      errorOf([&] { rendezvousTcp("127.0.0.1", port, 1, 2, {}, 1); });
  EXPECT_TRUE(contains(err, "rank 1 could not reach rank 0 at 127.0.0.1:" +
                                std::to_string(port)))
      << err;
}

TEST(Rendezvous, FileThreeRanks) {
  std::string path = freshPath("ok");
  Blob id = dummyId();
  std::vector<Child> kids;
  for (int r = 1; r < 3; ++r)
    kids.push_back(forkRank([&, r] {
      return rendezvousFile(path, r, 3, {}, 20) == id;
    }));
  EXPECT_EQ(rendezvousFile(path, 0, 3, id, 20), id);
  for (const Child &c : kids)
    EXPECT_EQ(finish(c).first, 0);
  // Nothing left for the next job.
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".arrived.1"));
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
}

TEST(Rendezvous, FileMismatchAndMissing) {
  std::string path = freshPath("bad");
  Child rank1 = forkRank([&] {
    rendezvousFile(path, 1, 3, {}, 20);
    return true;
  });
  std::string err =
      errorOf([&] { rendezvousFile(path, 0, 2, dummyId(), 20); });
  EXPECT_TRUE(contains(err, "rank 1 was started for a world of 3, rank 0 for "
                            "2"))
      << err;
  EXPECT_EQ(finish(rank1).first, 2);

  std::string lonely = freshPath("lonely");
  err = errorOf([&] { rendezvousFile(lonely, 0, 3, dummyId(), 1); });
  EXPECT_TRUE(contains(err, "rank(s) 1, 2 of 3 never arrived")) << err;
  EXPECT_FALSE(std::filesystem::exists(lonely));

  // An earlier job's marker does not count as rank 1 arriving.
  std::string leftover = freshPath("leftover");
  std::ofstream(leftover + ".arrived.1") << "2\n";
  err = errorOf([&] { rendezvousFile(leftover, 0, 2, dummyId(), 1); });
  EXPECT_TRUE(contains(err, "rank(s) 1 of 2 never arrived")) << err;

  std::string stale = freshPath("stale");
  std::ofstream(stale) << "x";
  err = errorOf([&] { rendezvousFile(stale, 0, 2, dummyId(), 1); });
  EXPECT_TRUE(contains(err, "exists (left by an earlier job?)")) << err;
  std::filesystem::remove_all(std::filesystem::path(stale).parent_path());
}

TEST(Rendezvous, PathAndTimeoutFromEnvironment) {
  std::map<std::string, std::string> v;
  EnvLookup env = [&v](const char *n) -> const char * {
    auto it = v.find(n);
    return it == v.end() ? nullptr : it->second.c_str();
  };
  LauncherEnv l;
  l.launcher = "torchrun";
  l.world = 2;
  EXPECT_EQ(rendezvousPath(l, env), "tcp");
  EXPECT_TRUE(contains(errorOf([&] { rendezvous(l, env, dummyId()); }),
                       "MASTER_PORT is not set"));
  v["MAPP_RENDEZVOUS_FILE"] = "/shared/job.id";
  EXPECT_EQ(rendezvousPath(l, env), "file");
  l.launcher = "mpi";
  EXPECT_EQ(rendezvousPath(l, env), "mpi"); // MPI is there: no file needed
  EXPECT_EQ(rendezvousTimeout(env), 300);
  v["MAPP_RENDEZVOUS_TIMEOUT"] = "2.5";
  EXPECT_EQ(rendezvousTimeout(env), 2.5);
  v["MAPP_RENDEZVOUS_TIMEOUT"] = "soon";
  EXPECT_TRUE(contains(errorOf([&] { rendezvousTimeout(env); }),
                       "MAPP_RENDEZVOUS_TIMEOUT='soon'"));
}

// Under mpirun only (ctest mapp-rendezvous-mpi-np*): MPI_COMM_WORLD carries
// rank 0's id to all.
TEST(RendezvousMpi, BroadcastsTheId) {
  if (!std::getenv("OMPI_COMM_WORLD_SIZE") || !haveMpiComm())
    GTEST_SKIP() << "not under mpirun";
  std::optional<LauncherEnv> l = detectLauncher(processEnv());
  ASSERT_TRUE(l);
  Blob id = dummyId();
  Blob got = rendezvous(*l, processEnv(), l->rank == 0 ? id : Blob{});
  EXPECT_EQ(got, id);
  mpiFinalize();
}
