// rdmacm-utils' rstream, riostream, rcopy and udpong, unmodified, between two
// processes through the launcher (`softverbs run --`), each with a device of
// its own: stream rsockets over the emulated CM and RC QPs (udpong: datagram
// rsockets over UD QPs), rdma-core's rsockets protocols on both ends. The
// server's header line (printed once it listens) is the signal to start the
// client; stdbuf makes it line-buffered so it arrives at once.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "tests/clients/clients.hpp"
#include "tests/support/process.hpp"

namespace softverbs::test {
namespace {

constexpr milliseconds kRstreamLimit{60000};

struct RstreamRun {
  ProcessResult server, client;
  bool listened = false;
  bool ok() const { return listened && server.exited_with(0) && client.exited_with(0); }
  std::string describe() const {
    return std::string(listened ? "" : "(the server never listened)\n") + "=== server ===\n" + server.describe() +
           "\n=== client ===\n" + client.describe();
  }
};

Env device_env(const char* spec) { return client_env().set("SOFTVERBS_DEVICES", spec); }

// program is rstream or riostream: the same options.
RstreamRun run_pair_of(const char* program, const std::vector<std::string>& server_args,
                       const std::vector<std::string>& client_args, const char* server_ip, const char* client_ip) {
  RstreamRun r;
  std::vector<std::string> sargv = {kLauncher, "run", "--", "stdbuf", "-oL", program, "-b", server_ip};
  sargv.insert(sargv.end(), server_args.begin(), server_args.end());
  const Env senv = device_env((std::string("rss@") + server_ip).c_str());
  Process server(sargv, senv, shown_env(senv));
  const auto server_deadline = Clock::now() + kRstreamLimit;
  r.listened = server.wait_for_output("usec/xfer", kRstreamLimit);
  if (!r.listened) {
    r.server = server.wait(milliseconds(5000));
    return r;
  }
  std::vector<std::string> cargv = {kLauncher, "run", "--", program, "-s", server_ip};
  cargv.insert(cargv.end(), client_args.begin(), client_args.end());
  const Env cenv = device_env((std::string("rsc@") + client_ip).c_str());
  Process client(cargv, cenv, shown_env(cenv));
  BothResult both = wait_both(client, Clock::now() + kRstreamLimit, server, server_deadline, milliseconds(5000));
  r.client = std::move(both.a);
  r.server = std::move(both.b);
  return r;
}

RstreamRun run_rstream(const std::vector<std::string>& server_args, const std::vector<std::string>& client_args,
                       const char* server_ip, const char* client_ip) {
  return run_pair_of("rstream", server_args, client_args, server_ip, client_ip);
}

TEST(Rstream, CustomSizeBlockingPair) {
  if (auto ok = installed("/usr/bin/rstream", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  RstreamRun r = run_rstream({"-S", "4096", "-C", "100", "-T", "b", "-T", "v"},
                             {"-S", "4096", "-C", "100", "-T", "b", "-T", "v"}, "127.0.0.74", "127.0.0.75");
  ASSERT_TRUE(r.ok()) << r.describe();
  EXPECT_NE(r.client.out.find("custom"), std::string::npos) << r.describe();
  EXPECT_EQ(r.client.out.find("verification failed"), std::string::npos) << r.describe();
  EXPECT_EQ(r.server.out.find("verification failed"), std::string::npos) << r.describe();
}

// rpoll before every call, addresses through rdma_getaddrinfo (RDMA_ROUTE),
// transfers larger than the 1 MiB buffers rstream asks for.
TEST(Rstream, AsyncPollWithLargeTransfers) {
  if (auto ok = installed("/usr/bin/rstream", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  RstreamRun r =
      run_rstream({"-S", "1500000", "-C", "10", "-T", "a", "-T", "r", "-T", "v"},
                  {"-S", "1500000", "-C", "10", "-T", "a", "-T", "r", "-T", "v"}, "127.0.0.76", "127.0.0.77");
  ASSERT_TRUE(r.ok()) << r.describe();
}

// rstream's default: O_NONBLOCK sockets (a non-blocking connect finished by
// rpoll and SO_ERROR) and MSG_DONTWAIT calls in a loop.
TEST(Rstream, NonBlockingSmallMessages) {
  if (auto ok = installed("/usr/bin/rstream", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  RstreamRun r = run_rstream({"-S", "64", "-C", "500", "-T", "n"}, {"-S", "64", "-C", "500", "-T", "n"}, "127.0.0.78",
                             "127.0.0.79");
  ASSERT_TRUE(r.ok()) << r.describe();
}

// riostream: each side maps its buffer (riomap, RDMA_IOMAPSIZE 1) and the
// other riowrites into it, while the reader spins on the buffer's last byte.
TEST(Riostream, BlockingAndPollingPairs) {
  if (auto ok = installed("/usr/bin/riostream", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  for (const char* mode : {"b", "a"}) {
    const std::vector<std::string> args = {"-S", "300000", "-C", "20", "-T", mode, "-T", "v"};
    RstreamRun r = run_pair_of("riostream", args, args, "127.0.0.82", "127.0.0.83");
    ASSERT_TRUE(r.ok()) << "-T " << mode << "\n" << r.describe();
    EXPECT_NE(r.client.out.find("custom"), std::string::npos) << r.describe();
  }
}

// rcopy copies a file through rsockets to a server that runs until killed.
TEST(Rcopy, CopiesAFileToTheServer) {
  if (auto ok = installed("/usr/bin/rcopy", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  const std::string src = ::testing::TempDir() + "rcopy_src_" + std::to_string(::getpid());
  const std::string dst = src + ".copy";
  std::string data(1 << 21, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 2654435761u >> 13);
  std::ofstream(src, std::ios::binary) << data;
  ::unlink(dst.c_str());

  const Env senv = device_env("rcs@127.0.0.80");
  Process server({kLauncher, "run", "--", "stdbuf", "-oL", "rcopy"}, senv, shown_env(senv));
  ASSERT_TRUE(server.wait_for_output("waiting for connection", kRstreamLimit))
      << server.wait(milliseconds(1000)).describe();
  const Env cenv = device_env("rcc@127.0.0.81");
  ProcessResult client = run_client({kLauncher, "run", "--", "rcopy", src, "127.0.0.80:" + dst}, cenv, kRstreamLimit);
  ASSERT_TRUE(client.exited_with(0)) << client.describe();
  EXPECT_NE(client.out.find("done"), std::string::npos) << client.describe();
  // The server closes the file before it waits for the next connection.
  ASSERT_TRUE(server.wait_for_output("closing...done", kRstreamLimit)) << server.wait(milliseconds(1000)).describe();
  std::ifstream in(dst, std::ios::binary);
  const std::string copied((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(copied == data) << "copied " << copied.size() << " of " << data.size() << " bytes";
  ::unlink(src.c_str());
  ::unlink(dst.c_str());
}

// Whether any process listens on TCP port `port` (/proc/net/tcp, tcp6: the
// local address ends in ":PORT" in hex, state 0A).
bool tcp_port_listened(uint16_t port) {
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, ":%04X", port);
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string sl, local, remote, state;
      fields >> sl >> local >> remote >> state;
      if (state == "0A" && local.size() >= 5 && local.compare(local.size() - 5, 5, suffix) == 0) return true;
    }
  }
  return false;
}

// Whether some socket is bound to UDP port `port` (/proc/net/udp, udp6).
bool udp_port_bound(uint16_t port) {
  char suffix[8];
  std::snprintf(suffix, sizeof suffix, ":%04X", port);
  for (const char* file : {"/proc/net/udp", "/proc/net/udp6"}) {
    std::ifstream in(file);
    for (std::string line; std::getline(in, line);) {
      std::istringstream fields(line);
      std::string sl, local;
      fields >> sl >> local;
      if (local.size() >= 5 && local.compare(local.size() - 5, 5, suffix) == 0) return true;
    }
  }
  return false;
}

// udpong: datagram rsockets (UD QPs, the first datagram over UDP) between
// two processes. The server answers clients until it is killed; it prints
// nothing before the first login, so its bound UDP port is the signal. Each
// client run is a custom one (-C/-S): udpong's default suite repeats an echo
// whose reply is late by more than 1 ms, and on a loaded machine the
// duplicates it makes keep it busy for minutes.
TEST(Udpong, ClientRunsAgainstOneServer) {
  if (auto ok = installed("/usr/bin/udpong", "rdmacm-utils"); !ok) GTEST_SKIP() << ok.message();
  constexpr const char* kServer = "127.0.0.86";
  constexpr uint16_t kPort = 7481;
  const Env senv = device_env((std::string("uds@") + kServer).c_str());
  Process server({kLauncher, "run", "--", "stdbuf", "-oL", "udpong", "-b", kServer, "-p", std::to_string(kPort)}, senv,
                 shown_env(senv));
  ASSERT_TRUE(server.wait_until([&] { return udp_port_bound(kPort); }, kRstreamLimit))
      << server.wait(milliseconds(1000)).describe();
  const Env cenv = device_env("udc@127.0.0.87");
  const std::vector<std::vector<std::string>> runs = {
      {"-C", "200", "-S", "1000"},            // non-blocking sends, the server counts
      {"-C", "50", "-S", "2000", "-T", "e"},  // echoed, near the 2040-byte limit
      {"-C", "50", "-S", "64", "-T", "b"},    // blocking calls
      {"-C", "50", "-S", "512", "-T", "a"}};  // rpoll before every call
  for (const auto& args : runs) {
    std::vector<std::string> argv = {kLauncher, "run", "--", "udpong", "-s", kServer, "-p", std::to_string(kPort)};
    argv.insert(argv.end(), args.begin(), args.end());
    ProcessResult client = run_client(argv, cenv, kRstreamLimit);
    ASSERT_TRUE(client.exited_with(0)) << client.describe() << "\n=== server ===\n" << server.snapshot().describe();
    EXPECT_NE(client.out.find("custom"), std::string::npos) << client.describe();
  }
  EXPECT_TRUE(server.wait_for_output("client login from 127.0.0.87", kRstreamLimit)) << server.snapshot().describe();
}

// `softverbs run --rsockets`: a Python TCP pair whose sockets are rsockets
// (librspreload.so). The server never listens on a TCP port.
TEST(Rspreload, PythonTcpPairOverRsockets) {
  if (auto ok = installed("/usr/bin/python3", "python3"); !ok) GTEST_SKIP() << ok.message();
  const char* script = R"(
import socket, sys
port = int(sys.argv[3])
if sys.argv[1] == 's':
    l = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind((sys.argv[2], port)); l.listen(1)
    print('listening', flush=True)
    c, a = l.accept()
    data = b''
    while len(data) < 1000192:
        d = c.recv(65536)
        if not d: break
        data += d
    c.sendall(data[::-1][:1000])
    print('server got', len(data), 'from', a[0], flush=True)
    c.close(); l.close()
else:
    c = socket.create_connection((sys.argv[2], port))
    c.sendall(bytes(range(256)) * 3907)
    back = b''
    while len(back) < 1000:
        d = c.recv(1000)
        if not d: break
        back += d
    print('client got', len(back), back[:2].hex(), flush=True)
    c.close()
)";
  const Env senv = device_env("rps@127.0.0.84");
  Process server({kLauncher, "run", "--rsockets", "--", "python3", "-c", script, "s", "127.0.0.84", "7479"}, senv,
                 shown_env(senv));
  ASSERT_TRUE(server.wait_for_output("listening", kRstreamLimit)) << server.wait(milliseconds(1000)).describe();
  EXPECT_FALSE(tcp_port_listened(7479)) << "the server listens on TCP: no rsocket";
  const Env cenv = device_env("rpc@127.0.0.85");
  ProcessResult client = run_client(
      {kLauncher, "run", "--rsockets", "--", "python3", "-c", script, "c", "127.0.0.84", "7479"}, cenv, kRstreamLimit);
  ProcessResult s = server.wait(kRstreamLimit);
  ASSERT_TRUE(client.exited_with(0)) << client.describe() << s.describe();
  ASSERT_TRUE(s.exited_with(0)) << s.describe();
  EXPECT_NE(client.out.find("client got 1000 fffe"), std::string::npos) << client.describe();
  EXPECT_NE(s.out.find("server got 1000192 from 127.0.0.85"), std::string::npos) << s.describe();
}

// `softverbs run --rsockets` with UDP: the sockets are datagram rsockets. The
// client never binds, so plain UDP would send from 127.0.0.1; a datagram
// rsocket sends from its device's address, which the server reports.
TEST(Rspreload, PythonUdpPairOverRsockets) {
  if (auto ok = installed("/usr/bin/python3", "python3"); !ok) GTEST_SKIP() << ok.message();
  const char* script = R"(
import socket, sys
port = int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if sys.argv[1] == 's':
    s.bind((sys.argv[2], port))
    print('bound', flush=True)
    for n in range(20):
        d, a = s.recvfrom(4096)
        s.sendto(d[::-1], a)
    print('server echoed 20, last from', a[0], flush=True)
else:
    s.connect((sys.argv[2], port))
    back = b''
    for i in range(20):
        s.send(b'abc%02d' % i)
        back += s.recv(4096)
    print('client got', len(back), back[:5].decode(), flush=True)
)";
  const Env senv = device_env("rus@127.0.0.88");
  Process server({kLauncher, "run", "--rsockets", "--", "python3", "-c", script, "s", "127.0.0.88", "7483"}, senv,
                 shown_env(senv));
  ASSERT_TRUE(server.wait_for_output("bound", kRstreamLimit)) << server.wait(milliseconds(1000)).describe();
  const Env cenv = device_env("ruc@127.0.0.89");
  ProcessResult client = run_client(
      {kLauncher, "run", "--rsockets", "--", "python3", "-c", script, "c", "127.0.0.88", "7483"}, cenv, kRstreamLimit);
  ProcessResult s = server.wait(kRstreamLimit);
  ASSERT_TRUE(client.exited_with(0)) << client.describe() << s.describe();
  ASSERT_TRUE(s.exited_with(0)) << s.describe();
  EXPECT_NE(client.out.find("client got 100 00cba"), std::string::npos) << client.describe();
  EXPECT_NE(s.out.find("server echoed 20, last from 127.0.0.89"), std::string::npos) << s.describe();
}

}  // namespace
}  // namespace softverbs::test
