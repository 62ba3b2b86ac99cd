// This machine's limits, measured the way docs/limits.md describes,
// so that the emulator's numbers can be held against them in the same run:
//   - memcpy bandwidth at 4 KiB, 64 KiB and 1 MiB (cache-resident buffers);
//   - UDP loopback, plain sendto/recvfrom of 4 KiB datagrams (receiver's rate);
//   - UDP loopback, GSO sender (UDP_SEGMENT) + GRO receiver (UDP_GRO) with
//     4128-byte segments (one 4 KiB-MTU RoCEv2 frame each);
//   - UDP loopback ping-pong of 8 bytes between two threads that spin on
//     non-blocking recv (busy-poll), pinned to two CPUs: the round-trip time.
//
// Each figure is the median of --reps runs (default 3) of --seconds each
// (default 0.5; memcpy runs a fifth of that). Output: one line per figure,
// "key value unit", then a comment; perftest.sh reads the keys.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

namespace {

using Clock = std::chrono::steady_clock;

double g_seconds = 0.5;
int g_reps = 3;
bool g_pin = true;

// Unless --no-pin is given, and with at least two CPUs, the two spinning threads
// of the ping-pong run on CPUs 0 and 1. Left to the scheduler on a busy 2-CPU
// machine they often share one CPU, and the "round trip" becomes a time slice
// (8 ms medians were seen): that measures the scheduler, not the UDP path. The
// streaming measurements block in recv and are not pinned.
void pin_to(unsigned cpu) {
  if (!g_pin || std::thread::hardware_concurrency() < 2) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

double secs(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  if (v.empty()) return 0;
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "limits_bench: %s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// Prints the median of the samples, then (after the comment mark) the samples.
void print(const char* key, const std::vector<double>& samples, const char* unit, const char* what,
           double scale = 1) {
  std::printf("%-28s %12.4f %-6s # %s; runs:", key, median(samples) * scale, unit, what);
  for (double v : samples) std::printf(" %.4g", v * scale);
  std::printf("\n");
  std::fflush(stdout);
}

// ---- memcpy -------------------------------------------------------------------

double memcpy_gbps(size_t size) {
  std::vector<uint8_t> src(size, 1), dst(size, 2);
  const double budget = g_seconds / 5;
  uint64_t bytes = 0;
  auto t0 = Clock::now();
  Clock::time_point t1;
  do {
    for (int i = 0; i < 64; ++i) {
      std::memcpy(dst.data(), src.data(), size);
      asm volatile("" : : "r"(dst.data()), "r"(src.data()) : "memory");
    }
    bytes += 64 * size;
    t1 = Clock::now();
  } while (secs(t1 - t0) < budget);
  return static_cast<double>(bytes) / secs(t1 - t0) / 1e9;
}

// ---- UDP helpers ----------------------------------------------------------------

int udp_socket(sockaddr_in& bound) {
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) die("socket");
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)) die("bind");
  socklen_t len = sizeof bound;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len)) die("getsockname");
  return fd;
}

void connect_to(int fd, const sockaddr_in& peer) {
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&peer), sizeof peer)) die("connect");
}

void set_rcvtimeo(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

struct StreamResult {
  double pps;   // datagrams (segments) received per second
  double gbps;  // payload bytes received per second / 1e9
};

// A sender thread sends as fast as it can until the deadline; the receiver
// counts what arrives between its first datagram and the deadline (the excess
// the sender produces is dropped by the kernel and not counted).
StreamResult udp_stream(size_t datagram, bool gso_gro, size_t segment) {
  sockaddr_in ra{}, sa{};
  int rx = udp_socket(ra);
  int tx = udp_socket(sa);
  connect_to(tx, ra);
  set_rcvtimeo(rx, 50);
  if (gso_gro) {
    int seg = static_cast<int>(segment);
    if (setsockopt(tx, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg)) die("setsockopt(UDP_SEGMENT)");
    int on = 1;
    if (setsockopt(rx, SOL_UDP, UDP_GRO, &on, sizeof on)) die("setsockopt(UDP_GRO)");
  }
  std::atomic<bool> stop{false};
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(g_seconds + 0.05));
  uint64_t rx_bytes = 0, rx_segments = 0;
  Clock::time_point first{}, last{};
  std::thread receiver([&] {
    std::vector<uint8_t> buf(65536);
    char control[CMSG_SPACE(sizeof(int))];
    for (;;) {
      iovec iov{buf.data(), buf.size()};
      msghdr mh{};
      mh.msg_iov = &iov;
      mh.msg_iovlen = 1;
      mh.msg_control = control;
      mh.msg_controllen = sizeof control;
      ssize_t n = ::recvmsg(rx, &mh, 0);
      auto now = Clock::now();
      if (now >= deadline) break;
      if (n <= 0) {
        if (stop.load()) break;
        continue;
      }
      size_t seg = static_cast<size_t>(n);
      for (cmsghdr* c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
          int v;
          std::memcpy(&v, CMSG_DATA(c), sizeof v);
          seg = static_cast<size_t>(v);
        }
      if (first == Clock::time_point{}) {
        first = now;  // the clock starts at the first arrival; this one is not counted
        continue;
      }
      rx_bytes += static_cast<uint64_t>(n);
      rx_segments += (static_cast<size_t>(n) + seg - 1) / seg;
      last = now;
    }
  });
  std::thread sender([&] {
    const size_t per_call = gso_gro ? segment * std::min<size_t>(15, 65000 / segment) : datagram;
    std::vector<uint8_t> buf(per_call, 0xab);
    while (Clock::now() < deadline) {
      for (int i = 0; i < 16; ++i) {
        ssize_t n = ::send(tx, buf.data(), buf.size(), 0);
        if (n < 0 && errno != ENOBUFS && errno != EAGAIN && errno != ECONNREFUSED && errno != EINTR) die("send");
      }
    }
    stop.store(true);
  });
  sender.join();
  receiver.join();
  ::close(rx);
  ::close(tx);
  const double t = secs(last - first);
  if (t <= 0) return {0, 0};
  return {static_cast<double>(rx_segments) / t, static_cast<double>(rx_bytes) / t / 1e9};
}

// ---- busy-poll ping-pong -------------------------------------------------------

struct RttResult {
  double median_us, mean_us;
};

RttResult udp_pingpong(size_t size) {
  sockaddr_in aa{}, ba{};
  int a = udp_socket(aa);
  int b = udp_socket(ba);
  connect_to(a, ba);
  connect_to(b, aa);
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    pin_to(1);
    std::vector<uint8_t> buf(std::max<size_t>(size, 64));
    while (!stop.load(std::memory_order_relaxed)) {
      ssize_t n = ::recv(b, buf.data(), buf.size(), MSG_DONTWAIT);
      if (n > 0) ::send(b, buf.data(), static_cast<size_t>(n), 0);
    }
  });
  std::vector<double> rtts;
  std::thread pinger([&] {
    pin_to(0);
    std::vector<uint8_t> msg(size, 0x11), in(std::max<size_t>(size, 64));
    rtts.reserve(1 << 20);
    // The first tenth of the time warms up (not recorded); on a busy machine the
    // run is extended, up to three times, until it has 1000 samples.
    const auto t_start = Clock::now();
    const auto dur = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(g_seconds));
    const auto t_warm = t_start + dur / 10;
    for (;;) {
      auto t0 = Clock::now();
      if (t0 >= t_start + 3 * dur || (t0 >= t_start + dur && rtts.size() >= 1000)) break;
      if (::send(a, msg.data(), msg.size(), 0) < 0) die("send");
      ssize_t n;
      auto give_up = t0 + std::chrono::milliseconds(200);  // a lost datagram: try again
      while ((n = ::recv(a, in.data(), in.size(), MSG_DONTWAIT)) < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) die("recv");
        if (Clock::now() > give_up) break;
      }
      auto t1 = Clock::now();
      if (n < 0 || t0 < t_warm) continue;
      rtts.push_back(secs(t1 - t0) * 1e6);
    }
  });
  pinger.join();
  stop.store(true);
  echo.join();
  ::close(a);
  ::close(b);
  if (rtts.empty()) return {0, 0};
  double sum = 0;
  for (double r : rtts) sum += r;
  return {median(rtts), sum / static_cast<double>(rtts.size())};
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) {
      g_seconds = std::atof(argv[++i]);
    } else if (a == "--no-pin") {
      g_pin = false;
    } else if (a == "--reps" && i + 1 < argc) {
      g_reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--reps N] [--no-pin]\n", argv[0]);
      return 2;
    }
  }
  std::printf("# limits_bench: medians of %d runs of %.2f s each; %u CPUs; ping-pong threads %s\n", g_reps, g_seconds,
              std::thread::hardware_concurrency(),
              g_pin && std::thread::hardware_concurrency() >= 2 ? "pinned to CPUs 0 and 1" : "not pinned");

  struct Mem {
    size_t size;
    const char* key;
  } mems[] = {{4096, "memcpy_4k_gbps"}, {65536, "memcpy_64k_gbps"}, {1 << 20, "memcpy_1m_gbps"}};
  for (const Mem& m : mems) {
    std::vector<double> v;
    for (int r = 0; r < g_reps; ++r) v.push_back(memcpy_gbps(m.size));
    print(m.key, v, "GB/s", "memcpy between two cache-resident buffers");
  }

  {
    std::vector<double> pps, gbps;
    for (int r = 0; r < g_reps; ++r) {
      StreamResult s = udp_stream(4096, false, 0);
      pps.push_back(s.pps / 1e6);
      gbps.push_back(s.gbps);
    }
    print("udp_plain_4k_mpps", pps, "Mpps", "UDP loopback, plain send/recv, 4096 B datagrams");
    print("udp_plain_4k_gbps", gbps, "GB/s", "the same, payload bytes");
  }
  {
    std::vector<double> pps, gbps;
    for (int r = 0; r < g_reps; ++r) {
      StreamResult s = udp_stream(0, true, 4128);
      pps.push_back(s.pps / 1e6);
      gbps.push_back(s.gbps);
    }
    print("udp_gso_gro_4128_mpps", pps, "Mpps", "UDP loopback, GSO sender + GRO receiver, 4128 B segments");
    print("udp_gso_gro_4128_gbps", gbps, "GB/s", "the same, payload bytes");
  }
  {
    std::vector<double> med, mean;
    for (int r = 0; r < g_reps; ++r) {
      RttResult p = udp_pingpong(8);
      med.push_back(p.median_us);
      mean.push_back(p.mean_us);
    }
    print("udp_busypoll_rtt_8b_us", med, "us", "UDP loopback ping-pong, 8 B, two spinning threads: median RTT");
    print("udp_busypoll_rtt_8b_mean_us", mean, "us", "the same: mean RTT");
    print("udp_busypoll_half_rtt_8b_us", med, "us", "half the median RTT (one-way latency)", 0.5);
  }
  return 0;
}
