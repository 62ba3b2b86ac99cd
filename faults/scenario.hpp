// Fault scenarios: the TOML text of docs/faults.md turned into rules. Used by
// the engine when a scenario is loaded, and by tools that only check one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "faults/rule.hpp"

namespace softverbs::faults {

struct Scenario {
  std::optional<uint64_t> seed;  // the `seed` key, if given
  std::vector<FaultRule> rules;  // in the order written
};

// Parses a scenario. `first_index` is the position the first rule will take
// among the rules already loaded (it names unnamed rules, "rule N"). Returns
// false with *error filled (a line number where the TOML is malformed) when the
// text is not a valid scenario.
bool parse_scenario(std::string_view toml_text, size_t first_index, Scenario* out, std::string* error);

// The name a scenario gives an async event type ("IBV_EVENT_QP_FATAL"), or its
// number if it has none: for messages about rules.
std::string event_name(int event);
// Likewise for the other named values a rule holds: ibv_wr_opcode (post_send),
// ibv_wc_opcode (completion), ibv_wc_status and errno, as a scenario writes them.
std::string wr_opcode_name(int opcode);
std::string wc_opcode_name(int opcode);
std::string wc_status_name(int status);
std::string errno_name(int error);

}  // namespace softverbs::faults
