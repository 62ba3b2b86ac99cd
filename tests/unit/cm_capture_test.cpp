// The CM MADs as Wireshark reads them: one GMP of each message the codec
// carries (wire/cm_mad.hpp), written to a pcap with the capture writer
// (wire/pcap.hpp) over IPv4/UDP 4791 and decoded with `tshark -V`. The decode
// must be clean (no malformed packet, no expert error), Wireshark's InfiniBand
// CM dissector must name each message, and the fields it shows must be the
// values written. An independent reading of the layouts: Wireshark's dissector
// shares no code with the codec.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/process.hpp"
#include "tests/unit/fake_time.hpp"
#include "wire/cm_mad.hpp"
#include "wire/icrc.hpp"
#include "wire/pcap.hpp"

namespace softverbs::wire::cm {
namespace {

using namespace std::chrono_literals;

constexpr const char* kTshark = "/usr/bin/tshark";

// One GMP per message, in the order of the capture.
struct Sample {
  Message msg;
  std::uint64_t tid;
};

Gid v4(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
  return Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, a, b, c, d};
}

std::vector<Sample> samples() {
  std::vector<Sample> v;
  Req req;
  req.local_comm_id = 0x1A2B3C4D;
  req.service_id = service_id(0x0106, 7471);
  req.local_ca_guid = 0x0002C9FFFE000001ull;
  req.local_qpn = 0x000123;
  req.responder_resources = 4;
  req.initiator_depth = 3;
  req.remote_cm_response_timeout = 20;
  req.starting_psn = 0x0ABCDE;
  req.local_cm_response_timeout = 20;
  req.retry_count = 7;
  req.path_mtu = 3;
  req.rnr_retry_count = 6;
  req.max_cm_retries = 15;
  req.primary.local_gid = v4(10, 0, 0, 1);
  req.primary.remote_gid = v4(10, 0, 0, 2);
  req.primary.flow_label = 0x12345;
  req.primary.traffic_class = 0x28;
  req.primary.hop_limit = 64;
  req.primary.sl = 5;
  req.primary.subnet_local = true;
  req.primary.local_ack_timeout = 19;
  CmaHeader cma;
  cma.src_port = 45678;
  cma.src_addr = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 1};
  cma.dst_addr = Gid{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2};
  encode(cma, std::span<std::uint8_t, CmaHeader::kSize>(req.private_data.data(), CmaHeader::kSize));
  v.push_back({req, 0x0000000100000001ull});

  Mra mra;
  mra.local_comm_id = 0x5E6F7081;
  mra.remote_comm_id = 0x1A2B3C4D;
  mra.message_mraed = MsgKind::kReq;
  mra.service_timeout = 24;
  v.push_back({mra, 0x0000000100000001ull});

  Rej rej;
  rej.local_comm_id = 0x5E6F7081;
  rej.remote_comm_id = 0x1A2B3C4D;
  rej.message_rejected = MsgKind::kReq;
  rej.reason = RejReason::kConsumerDefined;
  v.push_back({rej, 0x0000000100000001ull});

  Rep rep;
  rep.local_comm_id = 0x5E6F7081;
  rep.remote_comm_id = 0x1A2B3C4D;
  rep.local_qpn = 0x000456;
  rep.starting_psn = 0x012345;
  rep.responder_resources = 3;
  rep.initiator_depth = 4;
  rep.target_ack_delay = 15;
  rep.rnr_retry_count = 7;
  rep.local_ca_guid = 0x0002C9FFFE000002ull;
  v.push_back({rep, 0x0000000100000001ull});

  Rtu rtu;
  rtu.local_comm_id = 0x1A2B3C4D;
  rtu.remote_comm_id = 0x5E6F7081;
  v.push_back({rtu, 0x0000000100000001ull});

  Dreq dreq;
  dreq.local_comm_id = 0x1A2B3C4D;
  dreq.remote_comm_id = 0x5E6F7081;
  dreq.remote_qpn = 0x000456;
  v.push_back({dreq, 0x0000000100000002ull});

  Drep drep;
  drep.local_comm_id = 0x5E6F7081;
  drep.remote_comm_id = 0x1A2B3C4D;
  v.push_back({drep, 0x0000000100000002ull});

  SidrReq sreq;
  sreq.request_id = 0x0BADCAFE;
  sreq.service_id = service_id(0x0111, 7472);
  v.push_back({sreq, 0x0000000100000003ull});

  SidrRep srep;
  srep.request_id = 0x0BADCAFE;
  srep.status = SidrStatus::kValid;
  srep.qpn = 0x000789;
  srep.service_id = service_id(0x0111, 7472);
  srep.qkey = 0x11223344;
  v.push_back({srep, 0x0000000100000003ull});
  return v;
}

// Writes the samples as GMPs from 10.0.0.1 to 10.0.0.2 (replies the other way).
void write_capture(const std::string& path) {
  fake::ManualClock clock;
  PcapWriter pcap(path);
  ASSERT_TRUE(pcap.ok()) << path;
  std::uint32_t psn = 0;
  for (const Sample& s : samples()) {
    const Attr a = attr_of(s.msg);
    const bool reply = a == Attr::kMra || a == Attr::kRej || a == Attr::kRep || a == Attr::kDrep || a == Attr::kSidrRep;
    Ipv4Flow flow;
    flow.saddr = reply ? std::array<std::uint8_t, 4>{10, 0, 0, 2} : std::array<std::uint8_t, 4>{10, 0, 0, 1};
    flow.daddr = reply ? std::array<std::uint8_t, 4>{10, 0, 0, 1} : std::array<std::uint8_t, 4>{10, 0, 0, 2};
    flow.sport = 0xD872;
    MadHeader h;
    h.tid = s.tid;
    std::array<std::uint8_t, kMadSize> mad{};
    encode(h, s.msg, mad);
    std::array<std::uint8_t, kGmpPacketSize> pkt{};
    const IcrcFlow f = flow;
    ASSERT_EQ(build_gmp(mad, psn++, pkt, &f), kGmpPacketSize);
    in_addr src{}, dst{};
    std::memcpy(&src.s_addr, flow.saddr.data(), 4);
    std::memcpy(&dst.s_addr, flow.daddr.data(), 4);
    pcap.write(clock, src, dst, flow.sport, pkt);
    clock.advance(1ms);
  }
}

// The text of each frame of `tshark -V`, its lines trimmed of indentation.
std::vector<std::vector<std::string>> frames_of(const std::string& out) {
  std::vector<std::vector<std::string>> frames;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("Frame ") && line.find(" bytes on wire") != std::string::npos) frames.emplace_back();
    const std::size_t first = line.find_first_not_of(' ');
    if (!frames.empty() && first != std::string::npos) frames.back().push_back(line.substr(first));
  }
  return frames;
}

// What tshark 4.0 must show of each sample, in capture order: the CM
// dissector's name for the message and the fields it decodes. Wireshark 4.0
// has no field dissectors for MRA, SIDR_REQ and SIDR_REP; their first data
// bytes are checked in the MAD's hex dump instead. Two REQ fields are not
// compared: Wireshark 4.0 reads the primary flow label from 3 bytes and the
// packet rate from data byte 88, not the top 20 bits of 88-91 and the low 6
// bits of 91 that IBTA Table 106 gives (tests/unit/cm_mad_test.cpp checks those).
const std::vector<std::vector<std::string>> kExpected = {
    {"CM ConnectRequest",
     "Attribute ID: 0x0010",
     "Local Communication ID: 0x1a2b3c4d",
     "IP CM ServiceID",
     "Prefix: 0000000001",
     "Protocol: 0x06",
     "Destination Port: 0x1d2f",
     "Local CA GUID: 0x0002c9fffe000001",
     "Local QPN: 0x000123",
     "Responder Resources: 0x04",
     "Initiator Depth: 0x03",
     "1010 0... = Remote CM Response Timeout: 0x14",
     ".... .00. = Transport Service Type: 0x0",
     "Starting PSN: 0x0abcde",
     "1010 0... = Local CM Response Timeout: 0x14",
     ".... .111 = Retry Count: 0x7",
     "Partition Key: 0xffff",
     "0011 .... = Path Packet Payload MTU: 0x3",
     ".... .110 = RNR Retry Count: 0x6",
     "1111 .... = Max CM Retries: 0xf",
     "Primary Local Port LID: 65535",
     "Primary Local Port GID: 10.0.0.1",
     "Primary Remote Port GID: 10.0.0.2",
     "Primary Traffic Class: 0x28",
     "Primary Hop Limit: 0x40",
     "0101 .... = Primary SL: 0x5",
     ".... 1... = Primary Subnet Local: 0x1",
     "1001 1... = Primary Local ACK Timeout: 0x13",
     "Alternate Local Port LID: 0",
     "IP CM Private Data",
     "0100 .... = IP CM IP Version: 0x4",
     "IP CM Source Port: 0xb26e",
     "IP CM Source IP: 10.0.0.1",
     "IP CM Destination IP: 10.0.0.2"},
    {"CM MsgRcptAck (Dissector Not Implemented)", "Attribute ID: 0x0011",
     "MAD Data Payload: 5e6f70811a2b3c4d00c0000000"},
    {"CM ConnectReject", "Attribute ID: 0x0012", "Local Communication ID: 0x5e6f7081",
     "Remote Communication ID: 0x1a2b3c4d", "00.. .... = Message REJected: 0x0", "Reason: 0x001c"},
    {"CM ConnectReply", "Attribute ID: 0x0013", "Local Communication ID: 0x5e6f7081",
     "Remote Communication ID: 0x1a2b3c4d", "Local QPN: 0x000456", "Starting PSN: 0x012345",
     "Responder Resources: 0x03", "Initiator Depth: 0x04", "0111 1... = Target ACK Delay: 0x0f",
     "111. .... = RNR Retry Count: 0x7", "Local CA GUID: 0x0002c9fffe000002"},
    {"CM ReadyToUse", "Attribute ID: 0x0014", "Local Communication ID: 0x1a2b3c4d",
     "Remote Communication ID: 0x5e6f7081"},
    {"CM DisconnectRequest", "Attribute ID: 0x0015", "Transaction ID: 0x0000000100000002",
     "Local Communication ID: 0x1a2b3c4d", "Remote Communication ID: 0x5e6f7081", "Remote QPN/EECN: 0x000456"},
    {"CM DisconnectReply", "Attribute ID: 0x0016", "Local Communication ID: 0x5e6f7081",
     "Remote Communication ID: 0x1a2b3c4d"},
    // RequestID, P_Key, reserved, ServiceID 0x0000000001111d30.
    {"CM ServiceIDResReq (Dissector Not Implemented)", "Attribute ID: 0x0017",
     "MAD Data Payload: 0badcafeffff00000000000001111d30"},
    // RequestID, Status 0, AdditionalInfoLength 0, QPN, ServiceID, Q_Key.
    {"CM ServiceIDResReqResp (Dissector Not Implemented)", "Attribute ID: 0x0018",
     "MAD Data Payload: 0badcafe0000000000078900000000000111"
     "1d3011223344"},
};

// Every GMP: UD SEND ONLY from QP1 to QP1 with the GSI Q_Key, version-2 CM Sends.
const std::vector<std::string> kEveryFrame = {
    "Opcode: Unreliable Datagram (UD) - SEND only (100)",
    "Partition Key: 65535",
    "Destination Queue Pair: 0x000001",
    "Queue Key: 0x0000000080010000",
    "Source Queue Pair: 0x00000001",
    "Base Version: 0x01",
    "Management Class: 0x07",
    "Class Version: 0x02",
    "Method: Send() (0x03)",
};

bool has_line(const std::vector<std::string>& frame, const std::string& want) {
  for (const std::string& line : frame)
    if (line == want || (want.starts_with("MAD Data Payload: ") && line.starts_with(want))) return true;
  return false;
}

TEST(CmCapture, TsharkDecodesEveryMessage) {
  ASSERT_EQ(::access(kTshark, X_OK), 0) << kTshark << " is not installed: apt-get install tshark";
  const std::string path = ::testing::TempDir() + "softverbs-cm-mads-" + std::to_string(::getpid()) + ".pcap";
  write_capture(path);
  if (HasFatalFailure()) return;
  const test::ProcessResult r = test::run({kTshark, "-r", path, "-V"}, test::Env::inherit(), 60000ms);
  ASSERT_TRUE(r.exited_with(0)) << r.describe();
  const std::vector<std::vector<std::string>> frames = frames_of(r.out);
  ASSERT_EQ(frames.size(), kExpected.size()) << r.out;
  for (std::size_t i = 0; i < frames.size(); ++i) {
    SCOPED_TRACE("frame " + std::to_string(i + 1));
    for (const std::string& line : frames[i]) {
      EXPECT_EQ(line.find("Malformed"), std::string::npos) << line;
      EXPECT_EQ(line.find("Expert Info (Error"), std::string::npos) << line;
    }
    for (const std::string& want : kEveryFrame) EXPECT_TRUE(has_line(frames[i], want)) << "missing: " << want;
    for (const std::string& want : kExpected[i]) EXPECT_TRUE(has_line(frames[i], want)) << "missing: " << want;
  }
  if (HasFailure())
    std::fprintf(stderr, "capture kept in %s\n", path.c_str());
  else
    std::remove(path.c_str());
}

}  // namespace
}  // namespace softverbs::wire::cm
