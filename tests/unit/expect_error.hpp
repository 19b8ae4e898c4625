// The tests' check of an error path: the call throws csattn::Error of the expected kind, and
// the message names what it must (the file, the tensor, the value, what was expected).
#pragma once
#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "csattn/error.hpp"

namespace csattn::testing_util {

// Runs `f`, expects a csattn::Error of `kind` whose message holds every one of `parts`.
template <class F>
void expect_error(F&& f, ErrorKind kind, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "no csattn::Error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << to_string(e.kind()) << ": " << e.what();
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "': " << e.what();
  }
}

template <class F>
void expect_error(F&& f, ErrorKind kind, const std::string& part) {
  expect_error(std::forward<F>(f), kind, {part});
}

}  // namespace csattn::testing_util
