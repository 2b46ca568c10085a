//===- RankThreads.cpp - one thread per rank of a thread world ------------===//
#include "RankThreads.h"

#include "mapp/rt/Faults.h"

#include <mutex>
#include <thread>

using namespace mapp::rt;

RankThreadsEnd mapp::rt::runOnRankThreads(
    LocalWorld &world, const std::function<void(int rank)> &body) {
  int n = world.size();
  RankThreadsEnd end;
  end.errors.resize(n);
  std::mutex mu;
  auto failed = [&](int r, const std::string &what, bool crash = false) {
    {
      std::lock_guard<std::mutex> lk(mu);
      end.errors[r] = what;
      if (crash)
        end.crashed.push_back(r);
      if (end.firstFailed < 0)
        end.firstFailed = r;
    }
    world.abort(r, what);
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const RankCrashed &e) { // as if killed: the world learns it
        failed(r, e.what(), true);
      } catch (const std::exception &e) {
        failed(r, e.what());
      } catch (...) {
        failed(r, "unknown error");
      }
    });
  for (std::thread &t : threads)
    t.join();
  return end;
}
