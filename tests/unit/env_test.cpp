// core/env: its table of variables agrees with docs/configuration.md ("Library
// variables": one `### ` heading or table row per variable, and nothing else), and
// each accessor reads its variable once (docs/configuration.md: a later setenv has
// no effect).
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>

#include "core/env.hpp"

namespace {

using softverbs::env::Var;

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// The variable names (`UPPER_CASE` in backquotes) of `text`.
std::set<std::string> names_in(const std::string& text) {
  static const std::regex name("`([A-Z][A-Z0-9]*_[A-Z0-9_]*)`");
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), name), end; it != end; ++it) out.insert((*it)[1]);
  return out;
}

// For each `## ` section of the markdown file, the variables named by its `### `
// headings and by the first cell of its table rows (code blocks skipped), with the
// line that names each.
std::map<std::string, std::map<std::string, int>> documented_variables(const char* path) {
  std::ifstream in(path);
  EXPECT_TRUE(in) << "cannot read " << path;
  std::map<std::string, std::map<std::string, int>> out;
  std::string line, section;
  bool code = false;
  for (int n = 1; std::getline(in, line); ++n) {
    if (starts_with(line, "```")) code = !code;
    if (code) continue;
    if (starts_with(line, "## ")) {
      section = line.substr(3);
      out[section];
    } else if (starts_with(line, "### ")) {
      for (const std::string& v : names_in(line)) out[section].emplace(v, n);
    } else if (starts_with(line, "|")) {
      std::string first = line.substr(1, line.find('|', 1) - 1);
      for (const std::string& v : names_in(first)) out[section].emplace(v, n);
    }
  }
  return out;
}

TEST(Env, TableMatchesConfigurationDoc) {
  const auto docs = documented_variables(SV_CONFIGURATION_MD);
  const std::string kSection = "Library variables";
  ASSERT_TRUE(docs.count(kSection)) << SV_CONFIGURATION_MD << " has no '## " << kSection << "' section";

  std::set<std::string> in_table;
  for (const auto& v : softverbs::env::variables()) {
    EXPECT_TRUE(in_table.insert(v.name).second) << v.name << " appears twice in core/env.cpp";
    EXPECT_TRUE(*v.meaning && *v.fallback) << v.name << ": meaning and default must be given";
    EXPECT_EQ(v.doc_section, kSection) << v.name << ": every library variable belongs in '## " << kSection << "'";
    EXPECT_TRUE(docs.at(kSection).count(v.name))
        << v.name << " is in core/env.cpp's table but has no `### ` heading or table row in "
        << SV_CONFIGURATION_MD << ", section '## " << kSection << "'";
  }
  for (const auto& [name, line] : docs.at(kSection))
    EXPECT_TRUE(in_table.count(name)) << SV_CONFIGURATION_MD << ":" << line << ": " << name
                                      << " is documented as a library variable but core/env.cpp does not list it";
}

TEST(Env, AccessorsCoverTheTableInOrder) {
  const auto vars = softverbs::env::variables();
  ASSERT_EQ(vars.size(), static_cast<size_t>(Var::kAdaptiveRetransmit) + 1);  // the last Var
  for (size_t i = 0; i < vars.size(); ++i) EXPECT_EQ(static_cast<size_t>(vars[i].var), i) << vars[i].name;
}

// Two variables nothing else reads in this test program.
TEST(Env, ReadOnceAtFirstUse) {
  ASSERT_EQ(::setenv("SOFTVERBS_FAULT_LOG", "first", 1), 0);
  ASSERT_NE(softverbs::env::fault_log(), nullptr);
  EXPECT_STREQ(softverbs::env::fault_log(), "first");
  ASSERT_EQ(::setenv("SOFTVERBS_FAULT_LOG", "second", 1), 0);
  EXPECT_STREQ(softverbs::env::fault_log(), "first");
  ASSERT_EQ(::unsetenv("SOFTVERBS_FAULT_LOG"), 0);
  EXPECT_STREQ(softverbs::env::fault_log(), "first");

  ASSERT_EQ(::unsetenv("SOFTVERBS_FAULT_SEED"), 0);
  EXPECT_EQ(softverbs::env::fault_seed(), nullptr);
  ASSERT_EQ(::setenv("SOFTVERBS_FAULT_SEED", "7", 1), 0);
  EXPECT_EQ(softverbs::env::fault_seed(), nullptr);
}

TEST(Env, EmptyIsNotUnset) {
  ASSERT_EQ(::setenv("SOFTVERBS_PCAP", "", 1), 0);
  ASSERT_NE(softverbs::env::pcap(), nullptr);
  EXPECT_STREQ(softverbs::env::pcap(), "");
}

}  // namespace
