#include "csattn/error.hpp"

namespace csattn {

const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "InvalidArgument";
    case ErrorKind::ShapeMismatch: return "ShapeMismatch";
    case ErrorKind::DTypeMismatch: return "DTypeMismatch";
    case ErrorKind::Io: return "Io";
    case ErrorKind::Unsupported: return "Unsupported";
    case ErrorKind::Internal: return "Internal";
  }
  // Only reachable with a value cast from an out-of-range integer.
  return "Unknown";
}

}  // namespace csattn
