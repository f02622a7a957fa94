#include "thread_pool.h"

#include <atomic>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>

namespace drafter {

ThreadPool::ThreadPool(int32_t num_threads) {
  if (num_threads < 1 || num_threads > 1024) {
    throw std::invalid_argument("num_threads " + std::to_string(num_threads) +
                                " must be in [1, 1024]");
  }
  for (int32_t i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

namespace {

// Shared by the caller and helpers of one parallel_for; helpers may pick up
// their task after the loop is over, so it lives in a shared_ptr.
struct LoopState {
  int64_t n = 0;
  const std::function<void(int64_t)>* fn = nullptr;  // valid while done < n
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;
  std::exception_ptr error;  // first failure, guarded by mu

  void run() {
    for (int64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

}  // namespace

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (workers_.empty() || n <= 1) {  // nothing to share (n <= 0: nothing to run)
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto state = std::make_shared<LoopState>();
  state->n = n;
  state->fn = &fn;
  const int64_t helpers = std::min<int64_t>(workers_.size(), n - 1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t h = 0; h < helpers; ++h) tasks_.emplace_back([state] { state->run(); });
  }
  for (int64_t h = 0; h < helpers; ++h) cv_.notify_one();  // a worker per task
  state->run();
  std::unique_lock<std::mutex> lock(state->mu);
  state->cv.wait(lock, [&] { return state->done.load() == n; });
  if (state->error) std::rethrow_exception(state->error);
}

}  // namespace drafter
