// Throws the allocator's out-of-memory error into PyTorch, which catches it as a std::exception
// and raises RuntimeError with the message (torch.cuda.OutOfMemoryError derives from it).
#include <cstddef>
#include <stdexcept>
#include <string>

namespace {
class CudaMemOutOfMemory : public std::runtime_error {
 public:
  explicit CudaMemOutOfMemory(const std::string& what) : std::runtime_error(what) {}
};
}  // namespace

extern "C" void cuda_mem_torch_throw(const char* message, std::size_t len) {
  throw CudaMemOutOfMemory(std::string(message, len));
}
