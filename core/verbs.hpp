// The vocabulary of core/verbs.def's columns: whether a verb is in every
// rdma-core (Need), how it reports failure (Fails), and the failure an
// unsupported verb gives in that convention.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>

namespace softverbs {

// Whether every rdma-core release exports the verb (IBVERBS_1.0 and 1.1).
enum class Need { required, optional };

// How a verb reports failure; the columns of core/verbs.def spell these names.
enum class Fails {
  errno_value,     // returns 0 or an errno value, errno untouched
  negative_errno,  // returns a count or size, or minus an errno value
  minus_one,       // returns -1 and sets errno
  null,            // returns NULL and sets errno
  zero,            // returns 0 and sets errno
  rereg_code,      // returns an IBV_REREG_MR_ERR_* code and sets errno
  answer,          // cannot fail: 0 or NULL is a valid answer, errno untouched
  nothing,         // returns void
};

// What a verb the provider does not offer gives, as rdma-core's
// libibverbs/dummy_ops.c answers for an op its provider left out: EOPNOTSUPP in
// the verb's convention (alloc_pd: NULL with errno EOPNOTSUPP; dealloc_pd:
// EOPNOTSUPP; rereg_mr: IBV_REREG_MR_ERR_INPUT with errno EOPNOTSUPP;
// query_qp_data_in_order: 0; unimport_pd: nothing).
template <Fails F, class R>
R unsupported() noexcept {
  if constexpr (F == Fails::errno_value) {
    return EOPNOTSUPP;
  } else if constexpr (F == Fails::negative_errno) {
    return -EOPNOTSUPP;
  } else if constexpr (F == Fails::minus_one) {
    errno = EOPNOTSUPP;
    return -1;
  } else if constexpr (F == Fails::null) {
    errno = EOPNOTSUPP;
    return nullptr;
  } else if constexpr (F == Fails::zero) {
    errno = EOPNOTSUPP;
    return 0;
  } else if constexpr (F == Fails::rereg_code) {
    errno = EOPNOTSUPP;
    return IBV_REREG_MR_ERR_INPUT;
  } else if constexpr (F == Fails::answer) {
    return R{};
  } else {
    static_assert(F == Fails::nothing);
  }
}

// Marks a generated body's parameters as used: `unused (a, b);` with a row's
// argument list.
template <class... T>
constexpr void unused(const T&...) noexcept {}

}  // namespace softverbs
