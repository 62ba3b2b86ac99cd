// The fault engine as the control API (include/softverbs/faults.h) sees it:
// loading scenarios, seeding, logging, hit counts. Implemented by faults/; the
// ABI layer reaches the engine through this interface only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace softverbs {

class FaultControl {
 public:
  virtual ~FaultControl() = default;
  // Parses a scenario (docs/faults.md) and adds its rules; false with *error
  // filled when it is malformed (then nothing is added).
  virtual bool load(std::string_view toml_text, std::string* error) = 0;
  virtual bool load_file(const std::string& path, std::string* error) = 0;
  virtual void clear() = 0;
  virtual void set_seed(uint64_t seed) = 0;
  // Where decisions are logged ("" stops). False with errno set on failure.
  virtual bool set_log(const std::string& path) = 0;
  // How many times the named rule fired (0 if there is none).
  virtual uint64_t hits(std::string_view rule_name) = 0;
};

// The process's fault engine.
FaultControl& fault_control();

}  // namespace softverbs
