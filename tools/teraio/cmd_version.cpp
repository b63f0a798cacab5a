#include <cstdio>

#include "command.hpp"
#include "teraio/io/device_copy.hpp"

namespace teraio::cli {
namespace {

int run_version(const std::vector<std::string>&) {
  std::printf("teraio %s (CUDA copies %s)\n", TERAIO_VERSION,
              io::cuda_compiled_in() ? "built in" : "not built");
  return 0;
}

const CommandRegistration kRegistration{"version", "print the version and build options", run_version};

}  // namespace
}  // namespace teraio::cli
