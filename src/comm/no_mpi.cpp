// Built when CMake found no MPI: the MPI backend reports that it is missing.
#include "csattn/comm.hpp"
#include "csattn/error.hpp"

namespace csattn {

bool mpi_available() { return false; }

std::unique_ptr<Communicator> mpi_world() {
  throw Error(ErrorKind::Unsupported,
              "this csattn was built without MPI (install libopenmpi-dev and reconfigure)");
}

}  // namespace csattn
