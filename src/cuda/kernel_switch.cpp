#include "cuda/kernel_switch.hpp"

#include <cstdlib>

#include "csattn/error.hpp"

namespace csattn::cuda {

std::string kernel_switch(const char* name, std::initializer_list<const char*> allowed) {
  const char* v = std::getenv(name);
  const std::string value = v != nullptr ? v : "";
  if (value.empty()) return value;
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return value;
    list += list.empty() ? "" : ", ";
    list += a;
  }
  throw Error(ErrorKind::InvalidArgument, std::string(name) + "=" + value +
                                              " is not a kernel choice; allowed: " + list +
                                              " (or unset for the default)");
}

}  // namespace csattn::cuda
