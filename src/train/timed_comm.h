// The TP group's communicator as the trainer hands it to the model: every call forwarded to
// the group, the blocking ones and the waits of point-to-point messages timed. Tensor
// parallelism's all-gathers and reduce-scatters run inside a layer; what the rank spends
// waiting for them (a blocking collective whole; an overlapped one's test() and wait() calls,
// model/tensor_parallel.h) is communication the step waits for, not compute: the step moves
// it from linear_s to comm_s (StepMetrics::tp_comm_s). Internal to the train layer.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "distca/comm/communicator.h"

namespace distca::train {

// Forwards to `inner` (which must outlive it). seconds(): wall time this rank spent in
// barrier() and all_to_all_v() - the calls every blocking collective of the base class
// (all_gather, broadcast, all_reduce_sum, ...) runs on, waits for a slower peer included -
// and in wait() and test() of its point-to-point exchanges (the overlapped TP collectives);
// bytes_sent(): what those all-to-alls and point-to-point sends sent to the other ranks (its
// own block excluded); calls(): how many barrier() and all_to_all_v() calls (one per blocking
// collective of the model's TP functions). start_all_to_all_v is forwarded untimed. Not thread-safe: one rank's
// thread; its exchanges must be completed before it is destroyed.
class TimedCommunicator final : public comm::Communicator {
 public:
  explicit TimedCommunicator(comm::Communicator& inner) : inner_(inner) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  Status barrier() override {
    ++calls_;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = inner_.barrier();
    add_time(t0);
    return st;
  }
  Status all_to_all_v(const comm::AllToAllV& a) override {
    for (size_t p = 0; p < a.send_counts.size(); ++p) {
      if (static_cast<int>(p) != rank()) bytes_ += static_cast<int64_t>(a.send_counts[p]);
    }
    ++calls_;
    const auto t0 = std::chrono::steady_clock::now();
    Status st = inner_.all_to_all_v(a);
    add_time(t0);
    return st;
  }
  Result<std::unique_ptr<comm::Exchange>> start_all_to_all_v(const comm::AllToAllV& a) override {
    return inner_.start_all_to_all_v(a);
  }
  Result<std::unique_ptr<comm::Exchange>> start_send(std::span<const std::byte> data, int peer, int tag,
                                                     const char* label = nullptr) override {
    if (peer != rank()) bytes_ += static_cast<int64_t>(data.size());
    return timed(inner_.start_send(data, peer, tag, label));
  }
  Result<std::unique_ptr<comm::Exchange>> start_recv(std::span<std::byte> data, int peer, int tag,
                                                     const char* label = nullptr) override {
    return timed(inner_.start_recv(data, peer, tag, label));
  }
  Result<std::vector<int64_t>> host_ids() override { return inner_.host_ids(); }
  void fail(const Status& cause) override { inner_.fail(cause); }

  double seconds() const { return seconds_; }
  int64_t bytes_sent() const { return bytes_; }
  int64_t calls() const { return calls_; }

 private:
  // An exchange whose test() and wait() add their time to the owner's seconds_.
  class TimedExchange final : public comm::Exchange {
   public:
    TimedExchange(TimedCommunicator& owner, std::unique_ptr<comm::Exchange> inner)
        : owner_(owner), inner_(std::move(inner)) {}
    Status wait() override {
      const auto t0 = std::chrono::steady_clock::now();
      Status st = inner_->wait();
      owner_.add_time(t0);
      return st;
    }
    bool test() override {
      const auto t0 = std::chrono::steady_clock::now();
      const bool done = inner_->test();
      owner_.add_time(t0);
      return done;
    }

   private:
    TimedCommunicator& owner_;
    std::unique_ptr<comm::Exchange> inner_;
  };
  Result<std::unique_ptr<comm::Exchange>> timed(Result<std::unique_ptr<comm::Exchange>> ex) {
    if (!ex.ok()) return ex;
    return std::unique_ptr<comm::Exchange>(new TimedExchange(*this, std::move(*ex)));
  }

  void add_time(std::chrono::steady_clock::time_point t0) {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  comm::Communicator& inner_;
  double seconds_ = 0;
  int64_t bytes_ = 0;
  int64_t calls_ = 0;
};

}  // namespace distca::train
