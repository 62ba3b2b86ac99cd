// perftest's benchmarks at their default sizes, over RC and UC with RoCEv2 (-x 1) and
// over RC with the InfiniBand link layer (LID addressing). Every size (-a) is in
// perftest_all_sizes_test.cpp. The checks are those of perftest_transfer.hpp.
#include "tests/clients/perftest_transfer.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace softverbs::test {
namespace {

TEST_P(PerftestTransfer, CompletesWithResults) { run_and_check(GetParam()); }

std::vector<PerftestCase> cases() {
  std::vector<PerftestCase> v;
  const std::vector<std::string> rc_base = {"-d", "emu0", "-x", "1"};
  auto with = [](std::vector<std::string> a, std::initializer_list<std::string> more) {
    a.insert(a.end(), more);
    return a;
  };
  struct Default {
    const char* program;
    uint64_t size, iters;
  };
  // perftest's defaults: 64 KiB for bandwidth, 2 bytes for latency, 8 for atomics;
  // 5000 iterations for ib_write_bw, 1000 for the others.
  const Default defaults[] = {{"ib_send_bw", 65536, 1000}, {"ib_write_bw", 65536, 5000}, {"ib_read_bw", 65536, 1000},
                              {"ib_atomic_bw", 8, 1000},   {"ib_send_lat", 2, 1000},     {"ib_write_lat", 2, 1000},
                              {"ib_read_lat", 2, 1000},    {"ib_atomic_lat", 8, 1000}};

  // RC over RoCEv2, default size and iterations.
  for (const Default& d : defaults)
    v.push_back(make_case(std::string("Rc_") + d.program, d.program, rc_base, Link::roce, {d.size}, d.iters));

  // The atomic tests have a fixed size: their other operation instead.
  for (const char* p : {"ib_atomic_bw", "ib_atomic_lat"})
    v.push_back(make_case(std::string("RcCompareSwap_") + p, p, with(rc_base, {"-A", "CMP_AND_SWAP", "-n", "200"}),
                          Link::roce, {8}, 200, "RC", "CMP_AND_SWAP"));

  // Many QPs at once (flow control): 16 RC QPs each keep their window of packets in
  // flight towards one receiving process; the receiver's socket buffer must absorb
  // them, or the transport must recover what it drops.
  for (auto [program, qps, iters] : {std::tuple{"ib_write_bw", 16, 2000}, std::tuple{"ib_send_bw", 8, 1000}}) {
    PerftestCase m = make_case(std::string("RcManyQps_") + program, program,
                               with(rc_base, {"-q", std::to_string(qps), "-n", std::to_string(iters)}), Link::roce,
                               {65536}, static_cast<uint64_t>(iters) * qps);  // perftest counts every QP's
    m.qps = static_cast<size_t>(qps);
    v.push_back(m);
  }

  // UC over RoCEv2. Nothing recovers a lost UC packet, and the server of
  // ib_send_bw waits for every message: the whole run must fit in what the server
  // can absorb without reading. 64 messages of 64 KiB stay below the server's 512
  // pre-posted receives and, as 1024 datagrams, below what its UDP receive buffer
  // holds while its progress thread is not scheduled; a full 128-deep send queue of
  // 64 KiB messages (2048 datagrams) is not, and drops datagrams then.
  v.push_back(
      make_case("Uc_ib_send_bw", "ib_send_bw", with(rc_base, {"-c", "UC", "-n", "64"}), Link::roce, {65536}, 64, "UC"));
  v.push_back(make_case("Uc_ib_write_bw", "ib_write_bw", with(rc_base, {"-c", "UC"}), Link::roce, {65536}, 5000, "UC"));
  v.push_back(make_case("Uc_ib_send_lat", "ib_send_lat", with(rc_base, {"-c", "UC"}), Link::roce, {2}, 1000, "UC"));
  v.push_back(make_case("Uc_ib_write_lat", "ib_write_lat", with(rc_base, {"-c", "UC"}), Link::roce, {2}, 1000, "UC"));

  // UD: ib_send_bw and ib_send_lat with datagrams of 2 KiB (within the MTU).
  v.push_back(make_case("Ud_ib_send_bw", "ib_send_bw", with(rc_base, {"-c", "UD", "-s", "2048", "-n", "500"}),
                        Link::roce, {2048}, 500, "UD"));
  v.push_back(make_case("Ud_ib_send_lat", "ib_send_lat", with(rc_base, {"-c", "UD", "-s", "2048", "-n", "500"}),
                        Link::roce, {2048}, 500, "UD"));

  // The ibv_wr_* post API (ibv_create_qp_ex with send ops flags, ibv_wr_start ..
  // ibv_wr_complete): perftest takes it for a ConnectX-6 part id, with the
  // ConnectX inline defaults in its latency tests.
  auto wr_api = [&](PerftestCase c) {
    c.vendor_part_id = "4123";
    v.push_back(std::move(c));
  };
  for (const Default& d : defaults) {
    if (std::string(d.program) == "ib_read_lat" || std::string(d.program) == "ib_atomic_lat") continue;
    wr_api(make_case(std::string("WrApi_") + d.program, d.program, with(rc_base, {"-n", "500"}), Link::roce, {d.size},
                     500));
  }
  wr_api(make_case("WrApiUc_ib_write_bw", "ib_write_bw", with(rc_base, {"-c", "UC", "-n", "500"}), Link::roce, {65536},
                   500, "UC"));
  wr_api(make_case("WrApiUd_ib_send_bw", "ib_send_bw", with(rc_base, {"-c", "UD", "-s", "2048", "-n", "500"}),
                   Link::roce, {2048}, 500, "UD"));

  // RC over the InfiniBand link layer: LID addressing, no -x.
  for (const Default& d : defaults)
    v.push_back(
        make_case(std::string("IbLid_") + d.program, d.program, {"-d", "emu0", "-n", "200"}, Link::ib, {d.size}, 200));
  return v;
}

INSTANTIATE_TEST_SUITE_P(Runs, PerftestTransfer, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<PerftestCase>& info) { return info.param.name; });

}  // namespace
}  // namespace softverbs::test
