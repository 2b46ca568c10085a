//===- ThreadPool.h - fork/join workers for kernels -------------*- C++ -*-===//
#ifndef MAPP_RT_THREADPOOL_H
#define MAPP_RT_THREADPOOL_H

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mapp::rt {

/// A fixed set of workers running one parallelFor at a time. The caller
/// thread takes part, so a pool of size 1 has no extra threads.
class ThreadPool {
public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  int size() const { return size_; }
  /// Calls fn(begin, end) over [0, n) split into contiguous ranges of at
  /// least `grain` items. Nested calls run serially on the calling thread.
  /// An exception thrown by any part is rethrown here after all parts end.
  void parallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)> &fn);

private:
  void workerLoop(int id);

  int size_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int64_t, int64_t)> *job_ = nullptr;
  int64_t jobN_ = 0;
  int jobParts_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  bool busy_ = false;
  std::exception_ptr workerError_;
};

} // namespace mapp::rt

#endif
