// Builds without NCCL (no CUDA toolkit, or no libnccl): the factory says why.
#include <string>

#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {

bool nccl_available() { return false; }

std::unique_ptr<Communicator> nccl_communicator(Communicator&, int) {
  throw Error(ErrorKind::Unsupported,
              "this build has no NCCL backend (configure with the CUDA toolkit and libnccl)");
}

}  // namespace csattn
