// softverbs control API for C++ tests: the fault layer and the transport
// counters of include/softverbs/faults.h, with exceptions for errors and a
// scenario that removes its rules when it goes out of scope.
//
//   softverbs::Scenario lossy(R"([[rule]]
//   probability = 0.05
//   action = "drop")");
//   ... traffic ...
//   EXPECT_GT(softverbs::counters("emu0").retransmits, 0u);
//
// Header-only: it calls the C functions, which the test links from softverbs'
// libibverbs.so.1.
#pragma once

#include <softverbs/faults.h>

#include <cerrno>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <system_error>

namespace softverbs {

// A malformed scenario: what() says where and why.
class ScenarioError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The rules of one scenario, loaded on construction. The destructor clears every
// rule of the fault layer (scenarios do not nest: the layer has one rule list).
class Scenario {
 public:
  explicit Scenario(const std::string& toml_text) {
    char err[512] = {};
    if (softverbs_faults_load(toml_text.c_str(), err, sizeof err) != 0) throw ScenarioError(err);
  }
  static Scenario from_file(const std::string& path) {
    Scenario s;
    char err[512] = {};
    if (softverbs_faults_load_file(path.c_str(), err, sizeof err) != 0) throw ScenarioError(err);
    return s;
  }
  Scenario(Scenario&& other) noexcept : active_(other.active_) { other.active_ = false; }
  Scenario& operator=(Scenario&&) = delete;
  Scenario(const Scenario&) = delete;
  Scenario& operator=(const Scenario&) = delete;
  ~Scenario() {
    if (active_) softverbs_faults_clear();
  }

  // How many times the named rule fired.
  uint64_t hits(const std::string& rule) const { return softverbs_fault_hits(rule.c_str()); }
  void seed(uint64_t s) const { softverbs_faults_seed(s); }

 private:
  Scenario() = default;
  bool active_ = true;
};

inline void throw_errno(const char* what) { throw std::system_error(errno, std::generic_category(), what); }

// The transport counters of an emulated device (std::system_error ENODEV if
// there is none of that name).
inline softverbs_counters counters(const std::string& device) {
  softverbs_counters c{};
  if (softverbs_device_counters(device.c_str(), &c, sizeof c) != 0) throw_errno("softverbs_device_counters");
  return c;
}

// Direct actions (docs/faults.md, "The control API").
inline void set_port_active(const std::string& device, bool active, uint8_t port = 1) {
  if (softverbs_port_set_state(device.c_str(), port, active ? 1 : 0) != 0) throw_errno("softverbs_port_set_state");
}
inline void device_fatal(const std::string& device) {
  if (softverbs_device_fatal(device.c_str()) != 0) throw_errno("softverbs_device_fatal");
}
inline void force_error(ibv_qp* qp) {
  if (softverbs_qp_force_error(qp) != 0) throw_errno("softverbs_qp_force_error");
}
inline void raise_event(ibv_context* context, const ibv_async_event& event) {
  if (softverbs_raise_async_event(context, &event) != 0) throw_errno("softverbs_raise_async_event");
}

}  // namespace softverbs
