// The scenario format and the control API, without traffic.
#include <errno.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <softverbs/faults.h>

#include <string>

namespace {

class Scenario : public ::testing::Test {
 protected:
  void TearDown() override { softverbs_faults_clear(); }
  int load(const std::string& text) { return softverbs_faults_load(text.c_str(), err_, sizeof err_); }
  char err_[256] = {};
};

TEST_F(Scenario, AcceptsEveryAction) {
  EXPECT_EQ(load("seed = 3\n"
                 "[[rule]]\nname = \"d\"\nprobability = 0.5\naction = \"drop\"\n"
                 "[[rule]]\nclass = \"ack\"\nevery = 3\naction = \"duplicate\"\n"
                 "[[rule]]\nopcode = \"RC_SEND_ONLY\"\nnth = 2\naction = \"corrupt\"\n"
                 "[[rule]]\ndirection = \"tx\"\ndevice = \"fa\"\nqpn = 0x123\npsn = [1, 9]\naction = \"delay\"\ndelay_ms = 1\n"
                 "[[rule]]\ncount = 4\naction = \"reorder\"\n"
                 "[[rule]]\ndirection = \"rx\"\nclass = \"send\"\naction = \"nak\"\nsyndrome = \"remote_access_error\"\n"),
            0)
      << err_;
  EXPECT_EQ(softverbs_fault_hits("d"), 0u);
}

TEST_F(Scenario, RejectsMalformedScenariosWithAReason) {
  struct Case {
    const char* text;
    const char* reason;
  } cases[] = {
      {"[[rule]]\nprobability = 0.1\n", "'action' is required"},
      {"[[rule]]\naction = \"dorp\"\n", "unknown action"},
      {"[[rule]]\naction = \"drop\"\nprobability = 2\n", "probability"},
      {"[[rule]]\naction = \"drop\"\nopcode = \"RC_NOPE\"\n", "unknown opcode"},
      {"[[rule]]\naction = \"drop\"\nclass = \"bogus\"\n", "unknown class"},
      {"[[rule]]\naction = \"drop\"\nqpn = 0x1000000\n", "qpn"},
      {"[[rule]]\naction = \"drop\"\npsn = [1]\n", "psn"},
      {"[[rule]]\naction = \"delay\"\n", "delay_ms"},
      {"[[rule]]\naction = \"nak\"\n", "direction"},
      {"[[rule]]\naction = \"drop\"\nfoo = 1\n", "unknown key"},
      {"speed = 1\n", "unknown top-level key"},
      {"[[rule]\n", "line"},
  };
  for (const Case& c : cases) {
    errno = 0;
    EXPECT_EQ(load(c.text), -1) << c.text;
    EXPECT_EQ(errno, EINVAL) << c.text;
    EXPECT_NE(std::string(err_).find(c.reason), std::string::npos) << c.text << " -> " << err_;
  }
}

TEST_F(Scenario, CountersOfAnUnknownDeviceAreENODEV) {
  softverbs_counters c{};
  errno = 0;
  EXPECT_EQ(softverbs_device_counters("nosuch", &c, sizeof c), -1);
  EXPECT_EQ(errno, ENODEV);
  // The devices of this process exist once listed.
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_GE(n, 1);
  EXPECT_EQ(softverbs_device_counters(ibv_get_device_name(list[0]), &c, sizeof c), 0);
  ibv_free_device_list(list);
}

TEST_F(Scenario, LoadFileReportsAMissingFile) {
  EXPECT_EQ(softverbs_faults_load_file("/nonexistent/scenario.toml", err_, sizeof err_), -1);
  EXPECT_NE(std::string(err_).find("cannot read"), std::string::npos) << err_;
}

}  // namespace
