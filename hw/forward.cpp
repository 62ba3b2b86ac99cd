// The generated pass-through of every core/verbs.def row (see hw/forward.hpp).
#include "hw/forward.hpp"

#include <type_traits>

namespace softverbs::hw {

// "(a, b)" -> ", a, b" and "()" -> "": a row's arguments after the function.
#define SV_HW_MORE_ARGS(...) __VA_OPT__(, ) __VA_ARGS__

// Generated from core/verbs.def: each row's method calls the real function of the
// same name, or, when the real library lacks it (an optional verb), the
// interface's default (Provider::<name>), which for a derived verb computes it
// from the others.
#define SV_VERB(name, symbol, version, need, fails, ret, params, args) \
  ret Forwarder::name params {                                         \
    if (!real().name) return Provider::name args;                      \
    return live().call(real().name SV_HW_MORE_ARGS args);              \
  }
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"

// The real symbols are looked up by name and cast to the row's type: that type
// must be the one rdma-core's header declares for the function.
#define SV_VERB(name, symbol, version, need, fails, ret, params, args) \
  static_assert(std::is_same_v<decltype(&::symbol), ret(*) params>,    \
                #symbol ": core/verbs.def row differs from its declaration");
#define SV_VERB_ADAPTED(...)
#include "core/verbs.def"

}  // namespace softverbs::hw
