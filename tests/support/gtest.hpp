// The kit's owners for GoogleTest suites: a destroy verb that fails when an
// owner goes out of scope is a test failure.
#pragma once

#include <gtest/gtest.h>

#include "tests/support/verbs.hpp"

namespace softverbs::testkit {

struct ExpectDestroyed {
  static void destroy_failed(int rc) {
    ADD_FAILURE() << "destroying a verbs object at scope exit failed (" << rc << ")";
  }
};

using Checked = Objects<ExpectDestroyed>;

}  // namespace softverbs::testkit
