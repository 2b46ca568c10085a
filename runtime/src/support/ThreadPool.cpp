//===- ThreadPool.cpp -----------------------------------------------------===//
#include "mapp/rt/ThreadPool.h"

#include <algorithm>

using namespace mapp::rt;

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0)
    threads =
        static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  size_ = threads;
  for (int i = 1; i < size_; ++i)
    workers_.emplace_back([this, i] { workerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread &t : workers_)
    t.join();
}

static void partRange(int64_t n, int parts, int part, int64_t &b, int64_t &e) {
  b = n * part / parts;
  e = n * (part + 1) / parts;
}

void ThreadPool::workerLoop(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)> *job;
    int64_t n;
    int parts;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_)
        return;
      seen = generation_;
      job = job_;
      n = jobN_;
      parts = jobParts_;
    }
    if (id < parts) {
      int64_t b, e;
      partRange(n, parts, id, b, e);
      if (b < e) {
        try {
          (*job)(b, e);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu_);
          if (!workerError_)
            workerError_ = std::current_exception();
        }
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0)
        done_.notify_one();
    }
  }
}

void ThreadPool::parallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)> &fn) {
  if (n <= 0)
    return;
  grain = std::max<int64_t>(grain, 1);
  int parts =
      static_cast<int>(std::min<int64_t>(size_, (n + grain - 1) / grain));
  bool nested;
  {
    std::lock_guard<std::mutex> lock(mu_);
    nested = busy_;
    if (!nested && parts > 1) {
      busy_ = true;
      job_ = &fn;
      jobN_ = n;
      jobParts_ = parts;
      pending_ = size_ - 1;
      ++generation_;
    }
  }
  if (nested || parts <= 1) {
    fn(0, n);
    return;
  }
  wake_.notify_all();
  int64_t b, e;
  partRange(n, parts, 0, b, e);
  // Exceptions from the caller's share are rethrown after the workers finish,
  // since `fn` must outlive them.
  std::exception_ptr err;
  try {
    fn(b, e);
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  busy_ = false;
  job_ = nullptr;
  if (!err)
    err = workerError_;
  workerError_ = nullptr;
  lock.unlock();
  if (err)
    std::rethrow_exception(err);
}
