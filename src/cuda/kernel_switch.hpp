// The environment variables that force a kernel choice or pick a candidate kernel
// (CSATTN_ATTENTION, CSATTN_ATTENTION_BACKWARD, CSATTN_INDEXER, CSATTN_INDEXER_LOSS; README
// "On a Hopper GPU"):
// for benchmarks, A/B runs
// and bisecting. One reading rule for all of them, so a typo cannot silently measure the
// default kernel: unset or empty means the default, any value outside the allowed list throws.
#pragma once
#include <initializer_list>
#include <string>

namespace csattn::cuda {

// The variable's value, "" when unset or empty; throws csattn::Error (InvalidArgument) naming
// the variable, its value and the allowed ones otherwise. Call sites keep the result in a
// function-local static (read once per process: the choice must not change between the
// launches of one run).
std::string kernel_switch(const char* name, std::initializer_list<const char*> allowed);

}  // namespace csattn::cuda
