#include "fault_injection.hpp"

#include <cerrno>

namespace teraio::torch_binding {
namespace {

class FaultyBackend final : public io::IoBackend {
 public:
  FaultyBackend(std::unique_ptr<io::IoBackend> real, std::shared_ptr<FaultSwitch> faults)
      : real_(std::move(real)), faults_(std::move(faults)) {}
  std::string name() const override { return real_->name() + "+faults"; }
  void submit(const io::IoRequest& request, io::IoCompletion done) override {
    const bool fail = request.direction == io::IoDirection::kRead ? faults_->fail_reads.load()
                                                                  : faults_->fail_writes.load();
    if (fail) {
      done(-EIO);
      return;
    }
    real_->submit(request, std::move(done));
  }
  bool register_buffer(void* data, std::size_t size) override { return real_->register_buffer(data, size); }

 private:
  std::unique_ptr<io::IoBackend> real_;
  std::shared_ptr<FaultSwitch> faults_;
};

}  // namespace

std::unique_ptr<io::IoBackend> make_faulty_backend(std::unique_ptr<io::IoBackend> real,
                                                   std::shared_ptr<FaultSwitch> faults) {
  return std::make_unique<FaultyBackend>(std::move(real), std::move(faults));
}

}  // namespace teraio::torch_binding
