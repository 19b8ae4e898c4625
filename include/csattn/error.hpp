// csattn::Error: the one exception type of the public API.
#pragma once
#include <stdexcept>
#include <string>

namespace csattn {

enum class ErrorKind {
  InvalidArgument,  // a value outside its allowed range or an inconsistent combination
  ShapeMismatch,    // a tensor with the wrong shape
  DTypeMismatch,    // a tensor with the wrong element type
  Io,               // a file that cannot be read or written, or is malformed
  Unsupported,      // a valid request this build or device cannot serve
  Internal,         // a broken invariant inside csattn (a bug)
};

const char* to_string(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message)
      : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws csattn::Error(kind, message) when cond is false. The message should name the
// argument, the value and what was expected.
inline void require(bool cond, ErrorKind kind, const std::string& message) {
  if (!cond) throw Error(kind, message);
}

}  // namespace csattn
