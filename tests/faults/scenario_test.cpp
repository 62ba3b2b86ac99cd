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
  EXPECT_EQ(
      load(
          "seed = 3\n"
          "[[rule]]\nname = \"d\"\nprobability = 0.5\naction = \"drop\"\n"
          "[[rule]]\nclass = \"ack\"\nevery = 3\naction = \"duplicate\"\n"
          "[[rule]]\nopcode = \"RC_SEND_ONLY\"\nnth = 2\naction = \"corrupt\"\n"
          "[[rule]]\ndirection = \"tx\"\ndevice = \"fa\"\nqpn = 0x123\npsn = [1, 9]\naction = \"delay\"\ndelay_ms = 1\n"
          "[[rule]]\ncount = 4\naction = \"reorder\"\n"
          "[[rule]]\ndirection = \"rx\"\nclass = \"send\"\naction = \"nak\"\nsyndrome = \"remote_access_error\"\n"
          "[[rule]]\ncm = \"REQ\"\nnth = 1\naction = \"drop\"\n"
          "[[rule]]\ncm = \"sidr_rep\"\naction = \"delay\"\ndelay_ms = 2\n"
          "[[rule]]\ncm = \"REQ\"\ndirection = \"rx\"\naction = \"reject\"\nreason = 8\n"
          "[[rule]]\ncm = \"SIDR_REQ\"\ndirection = \"rx\"\naction = \"reject\"\n"),
      0)
      << err_;
  EXPECT_EQ(softverbs_fault_hits("d"), 0u);
}

TEST_F(Scenario, AcceptsEveryVerbAndTimedAction) {
  EXPECT_EQ(load("[[rule]]\nverb = \"post_send\"\nopcode = \"IBV_WR_RDMA_READ\"\nnth = 3\naction = \"fail\"\n"
                 "errno = \"ENOMEM\"\n"
                 "[[rule]]\nverb = \"post_recv\"\nqpn = 0x12\naction = \"fail\"\nerrno = 11\n"
                 "[[rule]]\nverb = \"completion\"\nopcode = \"IBV_WC_RECV\"\naction = \"status\"\n"
                 "status = \"IBV_WC_REM_ABORT_ERR\"\n"
                 "[[rule]]\nverb = \"completion\"\nevery = 2\naction = \"drop\"\n"
                 "[[rule]]\nverb = \"completion\"\naction = \"delay\"\ndelay_ms = 5\n"
                 "[[rule]]\nverb = \"async_event\"\non_event = \"IBV_EVENT_PORT_ERR\"\naction = \"drop\"\n"
                 "[[rule]]\nverb = \"post_send\"\naction = \"qp_error\"\ncount = 1\n"
                 "[[rule]]\nat_ms = 100\ndevice = \"x\"\naction = \"port_down\"\nduration_ms = 50\n"
                 "[[rule]]\nat_ms = 0\ndevice = \"x\"\naction = \"port_up\"\n"
                 "[[rule]]\nat_ms = 10\ndevice = \"x\"\naction = \"event\"\nevent = \"IBV_EVENT_SM_CHANGE\"\nport = 1\n"
                 "[[rule]]\nat_ms = 10\ndevice = \"x\"\nqpn = 5\naction = \"qp_error\"\n"
                 "[[rule]]\nat_ms = 60000\ndevice = \"x\"\naction = \"device_fatal\"\n"
                 "[[rule]]\nat_ms = 60000\ndevice = \"x\"\naction = \"failover\"\n"),
            0)
      << err_;
}

TEST_F(Scenario, RejectsMalformedVerbAndTimedRules) {
  struct Case {
    const char* text;
    const char* reason;
  } cases[] = {
      {"[[rule]]\nverb = \"post_poll\"\naction = \"fail\"\n", "verb must be"},
      {"[[rule]]\nverb = \"post_send\"\naction = \"fail\"\n", "needs errno"},
      {"[[rule]]\nverb = \"post_send\"\naction = \"fail\"\nerrno = \"EWHAT\"\n", "unknown errno"},
      {"[[rule]]\nverb = \"post_send\"\naction = \"drop\"\n", "does not apply"},
      {"[[rule]]\nverb = \"post_send\"\nopcode = \"IBV_WC_RECV\"\naction = \"qp_error\"\n", "unknown opcode"},
      {"[[rule]]\nverb = \"completion\"\naction = \"status\"\n", "needs status"},
      {"[[rule]]\nverb = \"completion\"\naction = \"status\"\nstatus = \"IBV_WC_OOPS\"\n", "unknown status"},
      {"[[rule]]\nverb = \"completion\"\naction = \"fail\"\nerrno = \"EIO\"\n", "does not apply"},
      {"[[rule]]\nverb = \"completion\"\nclass = \"send\"\naction = \"drop\"\n", "'class' does not apply"},
      {"[[rule]]\nverb = \"async_event\"\naction = \"event\"\nevent = \"IBV_EVENT_SM_CHANGE\"\n", "does not apply"},
      {"[[rule]]\nverb = \"post_recv\"\non_event = \"IBV_EVENT_SM_CHANGE\"\naction = \"qp_error\"\n",
       "'on_event' does not apply"},
      {"[[rule]]\nat_ms = 5\naction = \"drop\"\n", "does not apply to a timed rule"},
      {"[[rule]]\nat_ms = 5\nnth = 2\naction = \"port_down\"\n", "'nth' does not apply"},
      {"[[rule]]\nat_ms = 5\naction = \"qp_error\"\n", "needs qpn"},
      {"[[rule]]\nat_ms = 5\naction = \"event\"\n", "needs event"},
      {"[[rule]]\nat_ms = 5\naction = \"port_down\"\nport = 2\n", "port must be 1"},
      {"[[rule]]\naction = \"port_down\"\n", "does not apply to a packet rule"},
      {"[[rule]]\naction = \"drop\"\nerrno = \"EIO\"\n", "'errno' does not apply to a packet rule"},
  };
  for (const Case& c : cases) {
    errno = 0;
    EXPECT_EQ(load(c.text), -1) << c.text;
    EXPECT_EQ(errno, EINVAL) << c.text;
    EXPECT_NE(std::string(err_).find(c.reason), std::string::npos) << c.text << " -> " << err_;
  }
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
      {"[[rule]]\naction = \"drop\"\ncm = \"LAP\"\n", "cm must name a CM message"},
      {"[[rule]]\naction = \"drop\"\nqpn = 0x1000000\n", "qpn"},
      {"[[rule]]\naction = \"drop\"\npsn = [1]\n", "psn"},
      {"[[rule]]\naction = \"delay\"\n", "delay_ms"},
      {"[[rule]]\naction = \"nak\"\n", "direction"},
      {"[[rule]]\ndirection = \"rx\"\naction = \"reject\"\n", "cm = \"REQ\""},
      {"[[rule]]\ndirection = \"rx\"\ncm = \"REP\"\naction = \"reject\"\n", "cm = \"REQ\""},
      {"[[rule]]\ncm = \"REQ\"\naction = \"reject\"\n", "direction"},
      {"[[rule]]\ncm = \"REQ\"\ndirection = \"rx\"\naction = \"reject\"\nreason = 70000\n", "reason"},
      {"[[rule]]\nverb = \"post_send\"\naction = \"drop\"\nreason = 3\n", "reason"},
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
