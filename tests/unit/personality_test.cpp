// Vendor personality files (emu/device/personality.cpp): the shipped files parse,
// connectx.toml agrees with the built-in values of caps.hpp, and bad files give an
// error naming the line or key, never a crash.
#include "emu/device/personality.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace softverbs::emu {
namespace {

bool same(const Personality& a, const Personality& b) {
  return a.name == b.name && a.fw_ver == b.fw_ver && a.vendor_id == b.vendor_id &&
         a.vendor_part_id == b.vendor_part_id && a.hw_ver == b.hw_ver && a.max_mr_size == b.max_mr_size &&
         a.page_size_cap == b.page_size_cap && a.max_qp == b.max_qp && a.max_qp_wr == b.max_qp_wr &&
         a.max_sge == b.max_sge && a.max_sge_rd == b.max_sge_rd && a.max_cq == b.max_cq && a.max_cqe == b.max_cqe &&
         a.max_mr == b.max_mr && a.max_pd == b.max_pd && a.max_qp_rd_atom == b.max_qp_rd_atom &&
         a.max_res_rd_atom == b.max_res_rd_atom && a.max_qp_init_rd_atom == b.max_qp_init_rd_atom &&
         a.atomic_cap == b.atomic_cap && a.max_mw == b.max_mw && a.max_ah == b.max_ah &&
         a.max_mcast_grp == b.max_mcast_grp && a.max_mcast_qp_attach == b.max_mcast_qp_attach &&
         a.max_total_mcast_qp_attach == b.max_total_mcast_qp_attach && a.max_srq == b.max_srq &&
         a.max_srq_wr == b.max_srq_wr && a.max_srq_sge == b.max_srq_sge &&
         a.local_ca_ack_delay == b.local_ca_ack_delay && a.max_inline_data == b.max_inline_data &&
         a.queue_sizes_as_requested == b.queue_sizes_as_requested;
}

TEST(PersonalityTest, ConnectxFileMatchesTheBuiltInValues) {
  Personality p;
  std::string error;
  ASSERT_TRUE(load_personality("connectx", &p, &error)) << error;
  EXPECT_TRUE(same(p, builtin_personality()));
}

TEST(PersonalityTest, RxeFileCarriesRxesValues) {
  Personality p;
  std::string error;
  ASSERT_TRUE(load_personality("rxe", &p, &error)) << error;
  EXPECT_EQ(p.name, "rxe");
  EXPECT_EQ(p.vendor_id, 0xffffffu);
  EXPECT_EQ(p.vendor_part_id, 0u);
  EXPECT_EQ(p.max_sge, 32);
  EXPECT_EQ(p.max_cqe, 32767);
  EXPECT_EQ(p.max_qp_rd_atom, 128);
  EXPECT_EQ(p.max_mr_size, UINT64_MAX);
  EXPECT_TRUE(p.queue_sizes_as_requested);
}

TEST(PersonalityTest, AbsentKeysKeepTheBuiltInValues) {
  Personality p;
  std::string error;
  ASSERT_TRUE(parse_personality("name = \"tiny\"\n[device]\nmax_sge = 4\n", &p, &error)) << error;
  EXPECT_EQ(p.name, "tiny");
  EXPECT_EQ(p.max_sge, 4);
  EXPECT_EQ(p.max_qp_wr, builtin_personality().max_qp_wr);
}

TEST(PersonalityTest, BadFilesGiveAnErrorNamingTheLineOrKey) {
  struct Case {
    const char* text;
    const char* expect;  // a part of the message
  };
  const Case cases[] = {
      {"[device\nmax_sge = 4\n", "line 1"},                       // malformed TOML
      {"colour = \"red\"\n", "unknown top-level key 'colour'"},
      {"[device]\nmax_sges = 4\n", "line 2: unknown key device.max_sges"},
      {"[device]\nmax_sge = \"many\"\n", "device.max_sge must be an integer"},
      {"[device]\nmax_sge = 0\n", "device.max_sge must be an integer from 1"},
      {"[device]\nmax_qp = 4294967296\n", "device.max_qp"},
      {"[device]\nmax_qp = -1\n", "device.max_qp"},                // -1 is all ones for 64-bit keys only
      {"[device]\nmax_qp_rd_atom = 256\n", "max_qp_rd_atom"},
      {"[device]\nvendor_id = 0x1000000\n", "vendor_id"},
      {"[device]\nmax_sge = 4.5\n", "max_sge"},
      {"[device]\nmax_sge = \"4\"\n", "max_sge"},            // strings only for the 64-bit keys
      {"[device]\npage_size_cap = \"0x1g\"\n", "page_size_cap"},
      {"[device]\npage_size_cap = \"\"\n", "page_size_cap"},
      {"[device]\nmax_mr_size = \"0x10000000000000000\"\n", "max_mr_size"},
      {"[device]\natomic_cap = \"sometimes\"\n", "atomic_cap"},
      {"[device]\nfw_ver = 3\n", "fw_ver"},
      {"device = 3\n", "device must be a table"},
      {"[queues]\nwritten_back = \"rounded\"\n", "written_back"},
      {"[queues]\ndepth = 1\n", "unknown key queues.depth"},
      {"name = \"Bad Name\"\n", "name must be"},
      {"[device]\nmax_mcast_qp_attach = 10\nmax_total_mcast_qp_attach = 5\n", "max_total_mcast_qp_attach"},
      {"\xff\xfe\x00garbage", "line"},
  };
  for (const Case& c : cases) {
    Personality p;
    std::string error;
    EXPECT_FALSE(parse_personality(c.text, &p, &error)) << c.text;
    EXPECT_NE(error.find(c.expect), std::string::npos) << c.text << " gave: " << error;
  }
}

TEST(PersonalityTest, UnknownNamesAndUnreadablePathsAreErrors) {
  Personality p;
  std::string error;
  EXPECT_FALSE(load_personality("no-such-nic", &p, &error));
  EXPECT_NE(error.find("no personality 'no-such-nic'"), std::string::npos) << error;
  EXPECT_FALSE(load_personality("../etc", &p, &error));  // a path: unreadable as a file
  EXPECT_FALSE(load_personality("Rxe!", &p, &error));
  EXPECT_NE(error.find("neither a personality name"), std::string::npos) << error;
  EXPECT_FALSE(load_personality("/nonexistent/rxe.toml", &p, &error));
  EXPECT_NE(error.find("/nonexistent/rxe.toml: cannot be read"), std::string::npos) << error;
  EXPECT_FALSE(load_personality("", &p, &error));
}

TEST(PersonalityTest, APathNamesAFile) {
  char path[] = "/tmp/sv_personality_XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  FILE* f = fdopen(fd, "w");
  std::fputs("[device]\nmax_inline_data = 64\n[queues]\nwritten_back = \"requested\"\n", f);
  std::fclose(f);
  Personality p;
  std::string error;
  EXPECT_TRUE(load_personality(path, &p, &error)) << error;
  EXPECT_EQ(p.max_inline_data, 64u);
  EXPECT_TRUE(p.queue_sizes_as_requested);
  std::remove(path);
}

}  // namespace
}  // namespace softverbs::emu
