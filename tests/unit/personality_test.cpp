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
         a.queue_sizes_as_requested == b.queue_sizes_as_requested && a.device_cap_flags == b.device_cap_flags &&
         a.max_pkeys == b.max_pkeys && a.odp == b.odp && a.max_dm_size == b.max_dm_size &&
         a.completion_timestamps == b.completion_timestamps && a.max_mtu == b.max_mtu &&
         a.gid_tbl_len == b.gid_tbl_len && a.active_width == b.active_width && a.active_speed == b.active_speed &&
         a.max_msg_sz == b.max_msg_sz && a.max_vl_num == b.max_vl_num && a.bad_lkey == b.bad_lkey &&
         a.recv_too_small_sender == b.recv_too_small_sender &&
         a.recv_too_small_receiver == b.recv_too_small_receiver &&
         a.send_inv_of_region_fails == b.send_inv_of_region_fails && a.grh_on_connected == b.grh_on_connected &&
         a.error_wakes_solicited == b.error_wakes_solicited && a.flush_posted_in_error == b.flush_posted_in_error &&
         a.local_error_in_order == b.local_error_in_order &&
         a.event_qp_access_err == b.event_qp_access_err && a.event_last_wqe_reached == b.event_last_wqe_reached &&
         a.sq_drained_always == b.sq_drained_always && a.before_rts_refused == b.before_rts_refused &&
         a.bad_wr_on_refusal == b.bad_wr_on_refusal && a.local_only_rkey_zero == b.local_only_rkey_zero && a.srq_resize == b.srq_resize &&
         a.validate_qp_attributes == b.validate_qp_attributes && a.uc_sqd_av_refused == b.uc_sqd_av_refused && a.adaptive_retransmit == b.adaptive_retransmit &&
         a.unsupported_opcode_refused == b.unsupported_opcode_refused &&
         a.misaligned_atomic_refused == b.misaligned_atomic_refused;
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
  EXPECT_EQ(p.device_cap_flags, 0x1a23c76u);
  EXPECT_TRUE(p.srq_resize);
  EXPECT_FALSE(p.validate_qp_attributes);
  EXPECT_EQ(p.max_pkeys, 64);
  EXPECT_FALSE(p.odp);
  EXPECT_EQ(p.max_dm_size, 0u);
  EXPECT_FALSE(p.completion_timestamps);
  EXPECT_EQ(p.gid_tbl_len, 1024);
  EXPECT_EQ(p.active_width, 1);
  EXPECT_EQ(p.max_msg_sz, 8u << 20);
  EXPECT_EQ(p.bad_lkey, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(p.recv_too_small_sender, IBV_WC_REM_OP_ERR);
  EXPECT_EQ(p.recv_too_small_receiver, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_FALSE(p.send_inv_of_region_fails);
  EXPECT_TRUE(p.grh_on_connected);
  EXPECT_FALSE(p.error_wakes_solicited);
  EXPECT_FALSE(p.flush_posted_in_error);
  EXPECT_TRUE(p.local_error_in_order);
  EXPECT_FALSE(p.event_qp_access_err);
  EXPECT_FALSE(p.event_last_wqe_reached);
  EXPECT_TRUE(p.sq_drained_always);
  EXPECT_TRUE(p.before_rts_refused);
  EXPECT_FALSE(p.bad_wr_on_refusal);
  EXPECT_TRUE(p.local_only_rkey_zero);
  EXPECT_TRUE(p.uc_sqd_av_refused);
  EXPECT_TRUE(p.unsupported_opcode_refused);
  EXPECT_TRUE(p.misaligned_atomic_refused);
  EXPECT_FALSE(p.adaptive_retransmit);
}

TEST(PersonalityTest, BehaviourKeysParse) {
  Personality p;
  std::string error;
  ASSERT_TRUE(parse_personality("[port]\nmax_mtu = 1024\ngid_tbl_len = 64\n[completions]\nbad_lkey = "
                                "\"loc_qp_op_err\"\ngrh_on_connected = true\nlocal_error = \"in_order\"\n[events]\nsq_drained = \"always\"\n"
                                "[post]\nbefore_rts = \"refuse\"\nunsupported_opcode = \"refuse\"\nmisaligned_atomic = \"refuse\"\n[mr]\nlocal_only_rkey = \"zero\"\n"
                                "[device_ex]\nodp = false\nmax_dm_size = 0\n[qp]\nuc_sqd_av = \"refuse\"\n",
                                &p, &error))
      << error;
  EXPECT_EQ(p.max_mtu, IBV_MTU_1024);
  EXPECT_EQ(p.gid_tbl_len, 64);
  EXPECT_EQ(p.bad_lkey, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_TRUE(p.grh_on_connected);
  EXPECT_TRUE(p.local_error_in_order);
  EXPECT_TRUE(p.sq_drained_always);
  EXPECT_TRUE(p.before_rts_refused);
  EXPECT_TRUE(p.local_only_rkey_zero);
  EXPECT_FALSE(p.odp);
  EXPECT_EQ(p.max_dm_size, 0u);
  EXPECT_TRUE(p.uc_sqd_av_refused);
  EXPECT_TRUE(p.unsupported_opcode_refused);
  EXPECT_TRUE(p.misaligned_atomic_refused);
  // Untouched tables keep the built-in (ConnectX) behaviour.
  EXPECT_TRUE(p.event_qp_access_err);
  EXPECT_TRUE(p.flush_posted_in_error);
  EXPECT_EQ(p.recv_too_small_receiver, IBV_WC_LOC_LEN_ERR);
}

// scripts/divergence.py personality's output for the rxe report fixture
// (tests/report/report_test.py checks the script gives exactly this file) loads,
// and carries what the report observed.
TEST(PersonalityTest, SeededFileLoads) {
  Personality p;
  std::string error;
  ASSERT_TRUE(load_personality(SV_SEEDED_PERSONALITY, &p, &error)) << error;
  Personality rxe;
  ASSERT_TRUE(load_personality("rxe", &rxe, &error)) << error;
  EXPECT_EQ(p.name, "rxe-seeded");
  EXPECT_EQ(p.max_sge, rxe.max_sge);
  EXPECT_EQ(p.device_cap_flags, rxe.device_cap_flags);
  EXPECT_EQ(p.gid_tbl_len, rxe.gid_tbl_len);
  EXPECT_EQ(p.bad_lkey, rxe.bad_lkey);
  EXPECT_EQ(p.recv_too_small_sender, rxe.recv_too_small_sender);
  EXPECT_TRUE(p.queue_sizes_as_requested);
  EXPECT_TRUE(p.before_rts_refused);
  EXPECT_TRUE(p.local_only_rkey_zero);
  EXPECT_TRUE(p.srq_resize);
  // Not observed by the suite: the built-in value.
  EXPECT_TRUE(p.event_qp_access_err);
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
      {"[device]\ndevice_cap_flags = 0x100000000\n", "device.device_cap_flags must be an integer"},
      {"[device]\nmax_pkeys = 65536\n", "device.max_pkeys"},
      {"[device_ex]\nodp = \"yes\"\n", "line 2: device_ex.odp must be true or false"},
      {"[device_ex]\nmax_dm_size = 1048576\n", "device_ex.max_dm_size must be an integer from 0 to 131072"},
      {"[device_ex]\ncompletion_timestamps = 1\n", "device_ex.completion_timestamps"},
      {"[device_ex]\nclock = 1\n", "unknown key device_ex.clock"},
      {"[port]\nmax_mtu = 1500\n", "port.max_mtu must be 256, 512, 1024, 2048 or 4096"},
      {"[port]\ngid_tbl_len = 2\n", "port.gid_tbl_len must be an integer from 4"},
      {"[port]\nactive_width = 0\n", "port.active_width"},
      {"[port]\nmax_msg_sz = 0\n", "port.max_msg_sz"},
      {"[port]\nmax_vl_num = 16\n", "port.max_vl_num"},
      {"[completions]\nbad_lkey = \"loc_len_err\"\n",
       "completions.bad_lkey must be \"loc_prot_err\" or \"loc_qp_op_err\""},
      {"[completions]\nrecv_too_small_sender = 3\n", "completions.recv_too_small_sender"},
      {"[completions]\nrecv_too_small_receiver = \"x\"\n", "completions.recv_too_small_receiver"},
      {"[completions]\nsend_inv_of_region = true\n", "completions.send_inv_of_region"},
      {"[completions]\ngrh_on_connected = \"true\"\n", "completions.grh_on_connected must be true or false"},
      {"[completions]\nerror_wakes_solicited = 0\n", "completions.error_wakes_solicited"},
      {"[completions]\nflush_posted_in_error = 1\n", "completions.flush_posted_in_error"},
      {"[completions]\nlocal_error = \"later\"\n", "completions.local_error"},
      {"[events]\nqp_access_err = \"no\"\n", "events.qp_access_err"},
      {"[events]\nlast_wqe_reached = 2\n", "events.last_wqe_reached"},
      {"[events]\nsq_drained = \"never\"\n", "events.sq_drained must be \"when_asked\" or \"always\""},
      {"[post]\nbefore_rts = \"drop\"\n", "post.before_rts"},
      {"[post]\nbad_wr_on_refusal = false\n", "post.bad_wr_on_refusal"},
      {"[post]\nunsupported_opcode = \"post\"\n", "post.unsupported_opcode must be \"fail\" or \"refuse\""},
      {"[post]\nmisaligned_atomic = true\n", "post.misaligned_atomic"},
      {"[mr]\nlocal_only_rkey = 0\n", "mr.local_only_rkey"},
      {"[mr]\nodp = false\n", "unknown key mr.odp"},
      {"[queues]\nsrq_resize = \"yes\"\n", "queues.srq_resize must be true or false"},
      {"[qp]\nvalidate_attributes = 0\n", "qp.validate_attributes must be true or false"},
      {"[qp]\nuc_sqd_av = false\n", "qp.uc_sqd_av"},
      {"[qp]\nvalidate = true\n", "unknown key qp.validate"},
      {"port = 1\n", "port must be a table"},
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
