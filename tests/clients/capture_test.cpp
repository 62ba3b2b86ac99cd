// Packet captures (SOFTVERBS_PCAP) of unmodified programs, read back with tshark:
// every frame must decode as RoCEv2 ("RRoCE") without a malformed packet or an
// expert error, and the opcodes, PSNs, queue pairs and payload lengths must be those
// of the operations the programs performed. Both processes capture, each what it sent
// and received, so both files hold the same packets. The ICRC of every frame is
// recomputed here, as tshark does not check it.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/clients/program_pair.hpp"

namespace softverbs::test {
namespace {

constexpr const char* kTshark = "/usr/bin/tshark";
constexpr milliseconds kPairLimit{60000};
constexpr milliseconds kTsharkLimit{60000};

// IBTA opcodes (BTH), as tshark prints infiniband.bth.opcode.
enum Opcode : int {
  kRcSendFirst = 0,
  kRcSendMiddle = 1,
  kRcSendLast = 2,
  kRcWriteFirst = 6,
  kRcWriteMiddle = 7,
  kRcWriteLast = 8,
  kRcReadRequest = 12,
  kRcReadResponseFirst = 13,
  kRcReadResponseMiddle = 14,
  kRcReadResponseLast = 15,
  kRcAcknowledge = 17,
  kRcAtomicAcknowledge = 18,
  kRcCompareSwap = 19,
  kRcFetchAdd = 20,
  kUcSendFirst = 32,
  kUcSendMiddle = 33,
  kUcSendLast = 34,
};

// One frame of `tshark -T fields`.
struct Frame {
  int number = 0;
  std::string protocols, protocol_column, info;
  std::string src, dst;
  int sport = 0, dport = 0;
  int opcode = -1;
  uint32_t dest_qp = 0, psn = 0;
  std::optional<int> aeth_opcode;      // 0 ACK, 1 RNR NAK, 3 NAK
  std::optional<int> payload;          // data.len
  std::optional<uint64_t> dma_length;  // RETH
  std::optional<int> migreq;           // BTH MigReq
};

// CRC-32 of IEEE 802.3 (reflected, polynomial 0x04c11db7), chained as zlib's crc32():
// crc32(crc32(0, a), b) == crc32(0, a + b).
uint32_t crc32(uint32_t crc, const uint8_t* p, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

// The invariant CRC of a RoCEv2 packet over IPv4 (IBTA annex A17.4.2), computed here
// independently of the library: CRC-32 over 8 bytes of 0xff (the masked LRH), the
// IPv4 header with TOS, TTL and checksum set to all ones, the UDP header with its
// checksum set to all ones, the BTH with its reserved byte 4 set to all ones, and the
// rest of the packet up to the ICRC. It is sent least significant byte first.
uint32_t roce_v2_icrc(const uint8_t* ip, size_t ip_header_len, const uint8_t* udp, size_t udp_len) {
  std::vector<uint8_t> masked(8, 0xff);
  masked.insert(masked.end(), ip, ip + ip_header_len);
  masked[8 + 1] = 0xff;                    // TOS
  masked[8 + 8] = 0xff;                    // TTL
  masked[8 + 10] = masked[8 + 11] = 0xff;  // header checksum
  const size_t u = masked.size();
  masked.insert(masked.end(), udp, udp + 8 + 12);  // UDP header and BTH
  masked[u + 6] = masked[u + 7] = 0xff;            // UDP checksum
  masked[u + 8 + 4] = 0xff;                        // BTH reserved byte (resv8a)
  uint32_t crc = crc32(0, masked.data(), masked.size());
  return crc32(crc, udp + 8 + 12, udp_len - 8 - 12 - 4);
}

struct IcrcCheck {
  size_t frames = 0;
  std::vector<std::string> errors;  // one line per bad frame
};

// Reads a pcap file (microsecond or nanosecond, either byte order, Ethernet link
// type) and checks the framing and the ICRC of every RoCEv2 frame.
IcrcCheck check_icrcs(const std::string& file) {
  IcrcCheck result;
  std::ifstream in(file, std::ios::binary);
  std::vector<uint8_t> d((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto fail = [&](const std::string& e) {
    result.errors.push_back(e);
    return result;
  };
  if (d.size() < 24) return fail("shorter than a pcap header");
  uint32_t magic = static_cast<uint32_t>(d[0]) | d[1] << 8 | d[2] << 16 | static_cast<uint32_t>(d[3]) << 24;
  bool swapped;
  if (magic == 0xa1b2c3d4 || magic == 0xa1b23c4d)
    swapped = false;
  else if (magic == 0xd4c3b2a1 || magic == 0x4d3cb2a1)
    swapped = true;
  else
    return fail("not a pcap file");
  auto u32 = [&](size_t at) {
    uint32_t v =
        static_cast<uint32_t>(d[at]) | d[at + 1] << 8 | d[at + 2] << 16 | static_cast<uint32_t>(d[at + 3]) << 24;
    return swapped ? __builtin_bswap32(v) : v;
  };
  if (u32(20) != 1) return fail("link type " + std::to_string(u32(20)) + ", not Ethernet");
  size_t at = 24;
  while (at < d.size()) {
    if (at + 16 > d.size()) return fail("truncated record header");
    const size_t len = u32(at + 8), orig = u32(at + 12);
    at += 16;
    if (at + len > d.size()) return fail("truncated record");
    const uint8_t* f = d.data() + at;
    const std::string where = "frame " + std::to_string(++result.frames) + ": ";
    at += len;
    if (len != orig) {
      result.errors.push_back(where + "captured " + std::to_string(len) + " of " + std::to_string(orig) + " bytes");
      continue;
    }
    if (len < 14 + 20 + 8 + 12 + 4 || f[12] != 0x08 || f[13] != 0x00) {
      result.errors.push_back(where + "not Ethernet/IPv4 or too short");
      continue;
    }
    const uint8_t* ip = f + 14;
    const size_t ihl = (ip[0] & 0x0f) * 4u;
    const size_t ip_total = ip[2] << 8 | ip[3];
    if ((ip[0] >> 4) != 4 || ihl < 20 || ip[9] != 17 || 14 + ip_total != len) {
      result.errors.push_back(where + "bad IPv4 header or total length");
      continue;
    }
    const uint8_t* udp = ip + ihl;
    const size_t udp_len = udp[4] << 8 | udp[5];
    if (udp_len != ip_total - ihl || udp_len < 8 + 12 + 4) {
      result.errors.push_back(where + "bad UDP length");
      continue;
    }
    const uint8_t* icrc = udp + udp_len - 4;
    const uint32_t carried =
        static_cast<uint32_t>(icrc[0]) | icrc[1] << 8 | icrc[2] << 16 | static_cast<uint32_t>(icrc[3]) << 24;
    const uint32_t computed = roce_v2_icrc(ip, ihl, udp, udp_len);
    if (carried != computed) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "ICRC 0x%08x, expected 0x%08x", carried, computed);
      result.errors.push_back(where + buf);
    }
  }
  return result;
}

std::string opcode_list(const std::set<int>& s) {
  std::string out;
  for (int o : s) out += (out.empty() ? "" : ",") + std::to_string(o);
  return "{" + out + "}";
}

class Capture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(installed(kTshark, "tshark"));
    const char* tmpdir = std::getenv("TMPDIR");
    std::string t = std::string(tmpdir && *tmpdir ? tmpdir : "/tmp") + "/softverbs-capture-XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    char* made = ::mkdtemp(buf.data());
    ASSERT_NE(made, nullptr) << "mkdtemp " << t << ": " << std::strerror(errno);
    dir_ = made;
  }
  void TearDown() override {
    // Kept when the test failed: the captures are the evidence.
    if (!dir_.empty() && !HasFailure()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    } else if (!dir_.empty()) {
      std::cerr << "captures kept in " << dir_ << "\n";
    }
  }

  Env env(const std::string& link = "") const {
    Env e = client_env().set("SOFTVERBS_LOG", "info").set("SOFTVERBS_PCAP", dir_ + "/cap-%p.pcap");
    if (!link.empty()) e.set("SOFTVERBS_LINK_LAYER", link);
    return e;
  }

  // Runs the pair; both must succeed with a clean device report and leave a capture.
  void run_programs(const std::vector<std::string>& args) {
    const Env e = env();
    pair_ = run_pair(
        [&](uint16_t port) {
          std::vector<std::string> v = args;
          v.insert(v.begin() + 1, {"-p", std::to_string(port)});
          return v;
        },
        e, e, kPairLimit);
    ASSERT_TRUE(pair_.both_succeeded()) << pair_.describe();
    ASSERT_TRUE(clean_device_report(pair_.server, "server", &server_dev_)) << pair_.describe();
    ASSERT_TRUE(clean_device_report(pair_.client, "client", &client_dev_)) << pair_.describe();
    for (const char* side : {"server", "client"}) {
      pid_t pid = std::string(side) == "server" ? pair_.server_pid : pair_.client_pid;
      std::string file = dir_ + "/cap-" + std::to_string(pid) + ".pcap";
      ASSERT_TRUE(std::filesystem::exists(file)) << side << " wrote no capture " << file << "\n" << pair_.describe();
      (std::string(side) == "server" ? server_file_ : client_file_) = file;
    }
  }

  // tshark -r FILE -V: a clean decode. Returns the number of frames.
  void check_verbose_decode(const std::string& file, size_t* frames) {
    ProcessResult r = run({kTshark, "-r", file, "-V"}, clean_env(), kTsharkLimit);
    ASSERT_TRUE(r.exited_with(0)) << r.command << "\n" << r.status() << "\n" << r.err;
    auto bad = lines_containing(r.out, {"Malformed", "Expert Info (Error"});
    EXPECT_TRUE(bad.empty()) << file << ": tshark reports errors:\n" << join_lines(bad);
    size_t n = 0, ib = 0;
    for (const std::string& line : lines_of(r.out)) {
      if (line.starts_with("Frame ") && line.find(" bytes on wire") != std::string::npos) ++n;
      if (line == "InfiniBand") ++ib;
    }
    EXPECT_EQ(ib, n) << file << ": every frame must have an InfiniBand layer";
    *frames = n;
  }

  // tshark -r FILE -T fields with the fields of Frame.
  void read_frames(const std::string& file, std::vector<Frame>* frames) {
    ProcessResult r = run({kTshark,
                           "-r",
                           file,
                           "-T",
                           "fields",
                           "-E",
                           "separator=/t",
                           "-E",
                           "occurrence=f",
                           "-e",
                           "frame.number",
                           "-e",
                           "frame.protocols",
                           "-e",
                           "_ws.col.Protocol",
                           "-e",
                           "_ws.col.Info",
                           "-e",
                           "ip.src",
                           "-e",
                           "ip.dst",
                           "-e",
                           "udp.srcport",
                           "-e",
                           "udp.dstport",
                           "-e",
                           "infiniband.bth.opcode",
                           "-e",
                           "infiniband.bth.destqp",
                           "-e",
                           "infiniband.bth.psn",
                           "-e",
                           "infiniband.aeth.syndrome.opcode",
                           "-e",
                           "data.len",
                           "-e",
                           "infiniband.reth.dmalen",
                           "-e",
                           "infiniband.bth.m"},
                          clean_env(), kTsharkLimit);
    ASSERT_TRUE(r.exited_with(0)) << r.command << "\n" << r.status() << "\n" << r.err;
    for (const std::string& line : lines_of(r.out)) {
      std::vector<std::string> f;
      std::istringstream in(line);
      for (std::string x; std::getline(in, x, '\t');) f.push_back(x);
      while (f.size() < 15) f.push_back("");
      Frame fr;
      try {
        fr.number = std::stoi(f[0]);
        fr.protocols = f[1];
        fr.protocol_column = f[2];
        fr.info = trim(f[3]);
        fr.src = f[4];
        fr.dst = f[5];
        fr.sport = f[6].empty() ? 0 : std::stoi(f[6]);
        fr.dport = f[7].empty() ? 0 : std::stoi(f[7]);
        fr.opcode = f[8].empty() ? -1 : std::stoi(f[8]);
        fr.dest_qp = f[9].empty() ? 0 : static_cast<uint32_t>(std::stoul(f[9], nullptr, 0));
        fr.psn = f[10].empty() ? 0 : static_cast<uint32_t>(std::stoul(f[10]));
        if (!f[11].empty()) fr.aeth_opcode = std::stoi(f[11]);
        if (!f[12].empty()) fr.payload = std::stoi(f[12]);
        if (!f[13].empty()) fr.dma_length = std::stoull(f[13], nullptr, 0);
        if (!f[14].empty()) fr.migreq = f[14] == "True" || f[14] == "1";
      } catch (const std::exception& e) {
        ADD_FAILURE() << file << ": cannot read tshark line '" << line << "': " << e.what();
        continue;
      }
      frames->push_back(fr);
    }
  }

  // Both captures decode cleanly, hold the same packets, all RoCEv2 between the two
  // devices; returns the server's frames.
  void decode_both(std::vector<Frame>* out) {
    std::set<std::tuple<std::string, int, uint32_t>> seen[2];
    int i = 0;
    for (const std::string& file : {server_file_, client_file_}) {
      SCOPED_TRACE(file);
      size_t verbose_frames = 0;
      ASSERT_NO_FATAL_FAILURE(check_verbose_decode(file, &verbose_frames));
      std::vector<Frame> frames;
      ASSERT_NO_FATAL_FAILURE(read_frames(file, &frames));
      ASSERT_FALSE(frames.empty()) << "empty capture";
      EXPECT_EQ(frames.size(), verbose_frames);
      // tshark does not verify the ICRC: it is checked here.
      IcrcCheck icrc = check_icrcs(file);
      EXPECT_EQ(icrc.frames, frames.size());
      EXPECT_TRUE(icrc.errors.empty()) << icrc.errors.size() << " bad frames:\n" << join_lines(icrc.errors);
      for (const Frame& f : frames) {
        EXPECT_TRUE(f.protocols.starts_with("eth:ethertype:ip:udp:infiniband"))
            << "frame " << f.number << ": " << f.protocols;
        EXPECT_EQ(f.protocol_column, "RRoCE") << "frame " << f.number;
        EXPECT_EQ(f.dport, 4791) << "frame " << f.number;
        EXPECT_GE(f.opcode, 0) << "frame " << f.number << " has no BTH opcode";
        bool s_to_c = f.src == server_dev_.address && f.dst == client_dev_.address;
        bool c_to_s = f.src == client_dev_.address && f.dst == server_dev_.address;
        EXPECT_TRUE(s_to_c || c_to_s) << "frame " << f.number << ": " << f.src << " -> " << f.dst << " is not between "
                                      << server_dev_.address << " and " << client_dev_.address;
        seen[i].insert({f.src, f.opcode, f.psn});
      }
      if (i == 0) *out = frames;
      ++i;
    }
    EXPECT_EQ(seen[0], seen[1]) << "the two captures do not hold the same packets";
  }

  // The first transmission of each packet from src, in capture order.
  static std::vector<Frame> first_from(const std::vector<Frame>& frames, const std::string& src,
                                       const std::set<int>& opcodes) {
    std::vector<Frame> v;
    std::set<std::pair<int, uint32_t>> seen;
    for (const Frame& f : frames)
      if (f.src == src && opcodes.count(f.opcode) && seen.insert({f.opcode, f.psn}).second) v.push_back(f);
    return v;
  }

  static std::set<int> opcodes_of(const std::vector<Frame>& frames) {
    std::set<int> s;
    for (const Frame& f : frames) s.insert(f.opcode);
    return s;
  }

  // Messages of `size` bytes in packets of `mtu`: first/middle/last opcodes with
  // consecutive PSNs from `src` to QP `dest_qp`, `messages` times.
  static void expect_multi_packet_messages(const std::vector<Frame>& data, uint32_t size, uint32_t mtu, size_t messages,
                                           int first, int middle, int last, uint32_t dest_qp, const std::string& what) {
    const size_t per = (size + mtu - 1) / mtu;
    ASSERT_EQ(data.size(), messages * per) << what << ": packets (first transmissions)";
    for (size_t k = 0; k < data.size(); ++k) {
      const Frame& f = data[k];
      const size_t at = k % per;
      int want = at == 0 ? first : at == per - 1 ? last : middle;
      EXPECT_EQ(f.opcode, want) << what << ": packet " << k << " (frame " << f.number << ", " << f.info << ")";
      EXPECT_EQ(f.psn, (data[0].psn + k) & 0xffffff) << what << ": PSNs must be consecutive, packet " << k;
      EXPECT_EQ(f.dest_qp, dest_qp) << what << ": frame " << f.number;
      uint32_t len = at == per - 1 ? size - mtu * static_cast<uint32_t>(per - 1) : mtu;
      EXPECT_EQ(f.payload.value_or(-1), static_cast<int>(len)) << what << ": payload of frame " << f.number;
    }
  }

  // The QPN a pingpong side printed as its "local address".
  static uint32_t pingpong_qpn(const std::string& out) {
    static const std::regex local(R"(^  local address: +LID 0x[0-9a-f]+, QPN 0x([0-9a-f]{6}),.*$)");
    for (const std::string& line : lines_of(out)) {
      std::smatch m;
      if (std::regex_match(line, m, local)) return static_cast<uint32_t>(std::stoul(m[1], nullptr, 16));
    }
    return 0;
  }
  // The QPN a perftest side printed as its "local address".
  static uint32_t perftest_qpn(const std::string& out) {
    static const std::regex local(R"(^ local address: LID \S+ QPN 0x([0-9a-f]+) .*$)");
    for (const std::string& line : lines_of(out)) {
      std::smatch m;
      if (std::regex_match(line, m, local)) return static_cast<uint32_t>(std::stoul(m[1], nullptr, 16));
    }
    return 0;
  }

  std::string dir_;
  PairResult pair_;
  DeviceReport server_dev_, client_dev_;
  std::string server_file_, client_file_;
};

// ibv_rc_pingpong -s 5000 -m 1024 -n 5: each side sends 5 messages of five packets
// (Send First, three Send Middle, Send Last: 1024 * 4 + 904 bytes), and acknowledges
// the other's.
TEST_F(Capture, RcPingpongSendsAndAcknowledges) {
  ASSERT_TRUE(installed("/usr/bin/ibv_rc_pingpong", "ibverbs-utils"));
  constexpr uint32_t kSize = 5000, kMtu = 1024, kIters = 5;
  ASSERT_NO_FATAL_FAILURE(run_programs({"/usr/bin/ibv_rc_pingpong", "-g", "1", "-s", std::to_string(kSize), "-n",
                                        std::to_string(kIters), "-m", std::to_string(kMtu)}));
  std::vector<Frame> frames;
  ASSERT_NO_FATAL_FAILURE(decode_both(&frames));
  const std::string& sa = server_dev_.address;
  const std::string& ca = client_dev_.address;
  const uint32_t server_qpn = pingpong_qpn(pair_.server.out), client_qpn = pingpong_qpn(pair_.client.out);
  ASSERT_NE(server_qpn, 0u) << pair_.describe();
  ASSERT_NE(client_qpn, 0u) << pair_.describe();

  EXPECT_EQ(opcodes_of(frames), (std::set<int>{kRcSendFirst, kRcSendMiddle, kRcSendLast, kRcAcknowledge}))
      << "opcodes " << opcode_list(opcodes_of(frames));
  std::set<std::string> names;
  for (const Frame& f : frames) names.insert(f.info.substr(0, f.info.find(" QP=")));
  EXPECT_EQ(names, (std::set<std::string>{"RC Send First", "RC Send Middle", "RC Send Last", "RC Acknowledge"}));

  const std::set<int> sends = {kRcSendFirst, kRcSendMiddle, kRcSendLast};
  for (const auto& [from, to, to_qpn, peer_qpn] :
       {std::tuple{ca, sa, server_qpn, client_qpn}, std::tuple{sa, ca, client_qpn, server_qpn}}) {
    const std::string what = from + " -> " + to;
    std::vector<Frame> data = first_from(frames, from, sends);
    ASSERT_NO_FATAL_FAILURE(expect_multi_packet_messages(data, kSize, kMtu, kIters, kRcSendFirst, kRcSendMiddle,
                                                         kRcSendLast, to_qpn, what));
    // The receiver acknowledges: ACK syndromes (no NAK), for PSNs it received,
    // the last one included (the sender's last send completed).
    std::set<uint32_t> data_psns;
    for (const Frame& f : data) data_psns.insert(f.psn);
    std::vector<Frame> acks = first_from(frames, to, {kRcAcknowledge});
    ASSERT_FALSE(acks.empty()) << what << ": no acknowledgement";
    EXPECT_LE(acks.size(), data.size()) << what;
    bool last_acked = false;
    for (const Frame& a : acks) {
      EXPECT_EQ(a.dest_qp, peer_qpn) << what << ": ack frame " << a.number;
      EXPECT_EQ(a.aeth_opcode.value_or(-1), 0) << what << ": ack frame " << a.number << " is not an ACK";
      EXPECT_TRUE(data_psns.count(a.psn)) << what << ": ack frame " << a.number << " for PSN " << a.psn;
      last_acked = last_acked || a.psn == data.back().psn;
    }
    EXPECT_TRUE(last_acked) << what << ": the last PSN " << data.back().psn << " was never acknowledged";
  }
  // No alternate path was loaded: both QPs are in the MIGRATED state, and every
  // packet says so with MigReq set (IBTA 17.2.8).
  for (const Frame& f : frames) EXPECT_EQ(f.migreq, std::optional<int>(1)) << "frame " << f.number;
  // Plausible totals: 2 * 25 data packets plus at least one acknowledgement each way,
  // at most one per data packet, in each file.
  EXPECT_GE(frames.size(), 2u * kIters * 5 + 2);
  if (server_dev_.counter("retransmits") + client_dev_.counter("retransmits") == 0) {
    EXPECT_LE(frames.size(), 2u * 2 * kIters * 5);
  }
}

// ibv_uc_pingpong: the same messages with UC opcodes, and nothing acknowledged.
TEST_F(Capture, UcPingpongSendsWithoutAcknowledgements) {
  ASSERT_TRUE(installed("/usr/bin/ibv_uc_pingpong", "ibverbs-utils"));
  constexpr uint32_t kSize = 5000, kMtu = 1024, kIters = 5;
  ASSERT_NO_FATAL_FAILURE(run_programs({"/usr/bin/ibv_uc_pingpong", "-g", "1", "-s", std::to_string(kSize), "-n",
                                        std::to_string(kIters), "-m", std::to_string(kMtu)}));
  std::vector<Frame> frames;
  ASSERT_NO_FATAL_FAILURE(decode_both(&frames));
  const uint32_t server_qpn = pingpong_qpn(pair_.server.out), client_qpn = pingpong_qpn(pair_.client.out);
  EXPECT_EQ(opcodes_of(frames), (std::set<int>{kUcSendFirst, kUcSendMiddle, kUcSendLast}))
      << "opcodes " << opcode_list(opcodes_of(frames));
  EXPECT_EQ(frames.size(), 2u * kIters * 5) << "UC: exactly the data, once";
  const std::set<int> sends = {kUcSendFirst, kUcSendMiddle, kUcSendLast};
  const std::string& sa = server_dev_.address;
  const std::string& ca = client_dev_.address;
  ASSERT_NO_FATAL_FAILURE(expect_multi_packet_messages(first_from(frames, ca, sends), kSize, kMtu, kIters, kUcSendFirst,
                                                       kUcSendMiddle, kUcSendLast, server_qpn, ca + " -> " + sa));
  ASSERT_NO_FATAL_FAILURE(expect_multi_packet_messages(first_from(frames, sa, sends), kSize, kMtu, kIters, kUcSendFirst,
                                                       kUcSendMiddle, kUcSendLast, client_qpn, sa + " -> " + ca));
}

// ib_write_bw -s 5000 -m 1024 -n 5: RDMA Write First (with a RETH for the whole
// 5000 bytes), Middle, Last, acknowledged by the server.
TEST_F(Capture, PerftestRdmaWrite) {
  ASSERT_TRUE(installed("/usr/bin/ib_write_bw", "perftest"));
  ASSERT_NO_FATAL_FAILURE(
      run_programs({"/usr/bin/ib_write_bw", "-d", "emu0", "-x", "1", "-s", "5000", "-m", "1024", "-n", "5"}));
  std::vector<Frame> frames;
  ASSERT_NO_FATAL_FAILURE(decode_both(&frames));
  EXPECT_EQ(opcodes_of(frames), (std::set<int>{kRcWriteFirst, kRcWriteMiddle, kRcWriteLast, kRcAcknowledge}))
      << "opcodes " << opcode_list(opcodes_of(frames));
  const std::string& ca = client_dev_.address;
  std::vector<Frame> writes = first_from(frames, ca, {kRcWriteFirst, kRcWriteMiddle, kRcWriteLast});
  ASSERT_NO_FATAL_FAILURE(expect_multi_packet_messages(writes, 5000, 1024, 5, kRcWriteFirst, kRcWriteMiddle,
                                                       kRcWriteLast, perftest_qpn(pair_.server.out), "writes"));
  for (const Frame& f : writes) {
    if (f.opcode == kRcWriteFirst) {
      EXPECT_EQ(f.dma_length.value_or(0), 5000u) << "RETH DMA length, frame " << f.number;
    }
  }
  EXPECT_FALSE(first_from(frames, server_dev_.address, {kRcAcknowledge}).empty()) << "no acknowledgement";
}

// ib_read_bw -s 5000 -m 1024 -n 5: one RDMA Read Request (RETH: 5000 bytes) per read,
// answered by Read Response First, Middle, Last.
TEST_F(Capture, PerftestRdmaRead) {
  ASSERT_TRUE(installed("/usr/bin/ib_read_bw", "perftest"));
  ASSERT_NO_FATAL_FAILURE(
      run_programs({"/usr/bin/ib_read_bw", "-d", "emu0", "-x", "1", "-s", "5000", "-m", "1024", "-n", "5"}));
  std::vector<Frame> frames;
  ASSERT_NO_FATAL_FAILURE(decode_both(&frames));
  EXPECT_EQ(opcodes_of(frames),
            (std::set<int>{kRcReadRequest, kRcReadResponseFirst, kRcReadResponseMiddle, kRcReadResponseLast}))
      << "opcodes " << opcode_list(opcodes_of(frames));
  std::vector<Frame> requests = first_from(frames, client_dev_.address, {kRcReadRequest});
  EXPECT_EQ(requests.size(), 5u);
  for (const Frame& f : requests) {
    EXPECT_EQ(f.dma_length.value_or(0), 5000u) << "RETH DMA length, frame " << f.number;
    EXPECT_EQ(f.dest_qp, perftest_qpn(pair_.server.out)) << "frame " << f.number;
  }
  std::vector<Frame> responses =
      first_from(frames, server_dev_.address, {kRcReadResponseFirst, kRcReadResponseMiddle, kRcReadResponseLast});
  ASSERT_NO_FATAL_FAILURE(expect_multi_packet_messages(responses, 5000, 1024, 5, kRcReadResponseFirst,
                                                       kRcReadResponseMiddle, kRcReadResponseLast,
                                                       perftest_qpn(pair_.client.out), "read responses"));
  for (const Frame& f : responses) {
    if (f.opcode != kRcReadResponseMiddle) {
      EXPECT_EQ(f.aeth_opcode.value_or(-1), 0) << "read response First/Last carry an ACK AETH, frame " << f.number;
    }
  }
}

// ib_atomic_bw -n 5, both operations: the request and an Atomic Acknowledge each.
TEST_F(Capture, PerftestAtomics) {
  ASSERT_TRUE(installed("/usr/bin/ib_atomic_bw", "perftest"));
  for (const auto& [type, opcode] :
       {std::pair{"FETCH_AND_ADD", int{kRcFetchAdd}}, std::pair{"CMP_AND_SWAP", int{kRcCompareSwap}}}) {
    SCOPED_TRACE(type);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_NO_FATAL_FAILURE(run_programs({"/usr/bin/ib_atomic_bw", "-d", "emu0", "-x", "1", "-A", type, "-n", "5"}));
    std::vector<Frame> frames;
    ASSERT_NO_FATAL_FAILURE(decode_both(&frames));
    EXPECT_EQ(opcodes_of(frames), (std::set<int>{opcode, kRcAtomicAcknowledge}))
        << "opcodes " << opcode_list(opcodes_of(frames));
    std::vector<Frame> requests = first_from(frames, client_dev_.address, {opcode});
    std::vector<Frame> acks = first_from(frames, server_dev_.address, {kRcAtomicAcknowledge});
    EXPECT_EQ(requests.size(), 5u);
    EXPECT_EQ(acks.size(), requests.size());
    for (size_t k = 0; k < requests.size(); ++k)
      EXPECT_EQ(requests[k].psn, (requests[0].psn + k) & 0xffffff) << "PSNs must be consecutive";
  }
}

}  // namespace
}  // namespace softverbs::test
