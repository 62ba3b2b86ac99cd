// The receive-path harness (harness.hpp): two emulated devices, an RC and a UC
// QP on each, connected across them through the verbs API, memory regions with
// every combination of rights that matters over guarded buffers, and a packet
// capture of everything the devices send. Each input resets the QPs and the
// memory to a known state, injects its packets with Device::inject, and then
// checks what the packets did:
//   * bytes outside every region (guards) never change;
//   * a region without remote write or atomic rights never changes, and a
//     local sink changes only inside the scatter lists posted into it;
//   * bytes of regions without remote read rights never leave the device (the
//     capture is searched for every 8-byte window of them);
//   * every packet the devices send parses, with a good ICRC, and is
//     addressed to a live QP;
//   * every completion belongs to a work request posted in this round, once.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "emu/objects/objects.hpp"
#include "tests/fuzz/harness.hpp"
#include "tests/support/connect.hpp"
#include "tests/support/verbs.hpp"
#include "wire/headers.hpp"
#include "wire/icrc.hpp"
#include "wire/opcode.hpp"
#include "wire/packet.hpp"
#include "wire/psn.hpp"

namespace softverbs::fuzz {
namespace {

using namespace wire;
namespace testkit = softverbs::testkit;

constexpr std::size_t kGuard = 64;
constexpr std::size_t kMaxRecords = 48;
constexpr int kMaxSettleRounds = 64;
constexpr int kCqDepth = 256;

// ---------------------------------------------------------------------------
// Memory regions, the same set on each device.

enum RegionId : int {
  kRw,       // every right
  kRo,       // remote read only, not even local write
  kWo,       // remote write without remote read
  kAt,       // remote atomic without remote read or write
  kLocal,    // local write only
  kSink,     // local write only: receive buffers and read/atomic results
  kSrc,      // local read only: the payload of posted sends and writes
  kHigh,     // every remote right, I/O address at the top of the 64-bit space
  kForeign,  // every right, but in another protection domain
  kDead,     // every right, then deregistered
  kRdOnly,   // remote read and local write, no remote write
  kRegionCount
};

struct RegionSpec {
  const char* name;
  unsigned access;
  std::uint32_t len;
  bool may_change;  // anywhere in the region
};

constexpr unsigned kLw = IBV_ACCESS_LOCAL_WRITE;
constexpr unsigned kRW = IBV_ACCESS_REMOTE_WRITE;
constexpr unsigned kRR = IBV_ACCESS_REMOTE_READ;
constexpr unsigned kRA = IBV_ACCESS_REMOTE_ATOMIC;

constexpr RegionSpec kRegions[kRegionCount] = {
    {"rw", kLw | kRW | kRR | kRA, 1024, true},
    {"ro", kRR, 512, false},
    {"wo", kLw | kRW, 512, true},
    {"atomic", kLw | kRA, 64, true},
    {"local", kLw, 512, false},
    {"sink", kLw, 2048, false},
    {"src", 0, 1024, false},
    {"high", kLw | kRW | kRR, 256, true},
    {"foreign-pd", kLw | kRW | kRR | kRA, 512, false},
    {"deregistered", kLw | kRW | kRR | kRA, 256, false},
    {"read-only", kLw | kRR, 256, false},
};

// The bytes of src that posted sends and writes carry; the rest of it never
// leaves the device.
constexpr std::uint32_t kSrcSentBytes = 364;
// kHigh ends 8 bytes below 2^64.
constexpr std::uint64_t kHighEnd = 0xFFFF'FFFF'FFFF'FFF8ull;

// Byte ranges of the sink that posted work requests may write.
struct Range {
  std::uint32_t off, len;
};

// ---------------------------------------------------------------------------
// The outstanding requests posted on one RC QP each round (header byte 1).

struct RequestSpec {
  const char* name;
  ibv_wr_opcode opcode;
};

constexpr RequestSpec kRequests[] = {
    {"SEND 300", IBV_WR_SEND},
    {"WRITE_WITH_IMM 64", IBV_WR_RDMA_WRITE_WITH_IMM},
    {"READ 600", IBV_WR_RDMA_READ},
    {"CMP_SWAP", IBV_WR_ATOMIC_CMP_AND_SWP},
    {"FETCH_ADD", IBV_WR_ATOMIC_FETCH_AND_ADD},
    {"READ 64 into 2 SGEs", IBV_WR_RDMA_READ},
    {"SEND_WITH_INV 0", IBV_WR_SEND_WITH_INV},
};
constexpr int kRequestCount = sizeof kRequests / sizeof kRequests[0];

// Initial PSNs: the RC pair straddles the 24-bit wrap, the UC pair the half space.
constexpr std::uint32_t kSqPsn[4] = {0xFFFFF8, 0x000020, 0x7FFFFC, 0x800010};  // rc0, rc1, uc0, uc1

std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::uint64_t load64(const std::uint8_t* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

std::string hex(std::span<const std::uint8_t> b, std::size_t max = 64) {
  std::string s;
  char buf[4];
  for (std::size_t i = 0; i < b.size() && i < max; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", b[i]);
    s += buf;
  }
  if (b.size() > max) s += "...";
  return s;
}

// The harness' own scans are not instrumented for coverage: they would only
// teach the fuzzer the baseline bytes.
#if defined(__clang__)
#define SV_NO_COVERAGE __attribute__((no_sanitize("coverage")))
#else
#define SV_NO_COVERAGE
#endif

SV_NO_COVERAGE std::size_t first_difference(const std::uint8_t* a, const std::uint8_t* b, std::size_t len) {
  std::size_t i = 0;
  for (; i + 8 <= len; i += 8)
    if (load64(a + i) != load64(b + i)) break;
  for (; i < len; ++i)
    if (a[i] != b[i]) return i;
  return len;
}

// The offset of the first 8-byte window of `pkt` found in the sorted `secrets`,
// or pkt.size().
SV_NO_COVERAGE std::size_t find_secret(std::span<const std::uint8_t> pkt, const std::vector<std::uint64_t>& secrets) {
  for (std::size_t o = 0; o + 8 <= pkt.size(); ++o) {
    const std::uint64_t w = load64(pkt.data() + o);
    std::size_t lo = 0, hi = secrets.size();
    while (lo < hi) {
      const std::size_t mid = (lo + hi) / 2;
      if (secrets[mid] < w) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    if (lo < secrets.size() && secrets[lo] == w) return o;
  }
  return pkt.size();
}

[[noreturn]] void setup_failed(const char* what) {
  std::fprintf(stderr, "receive harness: setup failed: %s: %s\n", what, std::strerror(errno));
  std::abort();
}

// ---------------------------------------------------------------------------
// The capture of sent packets (SOFTVERBS_PCAP), read back incrementally.

class Capture {
 public:
  // The writer creates the file with the first packet sent; it is removed from
  // its directory once both sides hold it open.
  void expect(const std::string& dir, const std::string& path) {
    dir_ = dir;
    path_ = path;
  }

  void remove() {
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
  }

  // Calls f(src, dst, packet) for every complete record written since the last call.
  template <class F>
  void read_new(F&& f) {
    if (fd_ < 0) {
      fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) return;
      remove();
    }
    std::uint8_t chunk[65536];
    for (;;) {
      ssize_t n = ::pread(fd_, chunk, sizeof chunk, static_cast<off_t>(off_ + buf_.size()));
      if (n <= 0) break;
      buf_.insert(buf_.end(), chunk, chunk + n);
    }
    std::size_t at = 0;
    if (off_ == 0) {
      if (buf_.size() < 24) return;  // the global header
      at = 24;
    }
    constexpr std::size_t kFrame = 14 + 20 + 8;
    while (buf_.size() - at >= 16) {
      std::uint32_t incl;
      std::memcpy(&incl, buf_.data() + at + 8, 4);
      if (buf_.size() - at - 16 < incl) break;
      const std::uint8_t* rec = buf_.data() + at + 16;
      if (incl >= kFrame) {
        in_addr src, dst;
        std::memcpy(&src.s_addr, rec + 14 + 12, 4);
        std::memcpy(&dst.s_addr, rec + 14 + 16, 4);
        f(src, dst, std::span<const std::uint8_t>(rec + kFrame, incl - kFrame));
      }
      at += 16 + incl;
    }
    off_ += at;
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(at));
    // Give back what was read (the file only grows).
    if (off_ - punched_ > (1u << 20)) {
      const off_t upto = static_cast<off_t>(off_ & ~std::uint64_t{4095});
      ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, upto);
      punched_ = off_;
    }
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  std::uint64_t off_ = 0;
  std::uint64_t punched_ = 0;
  Bytes buf_;
};

// ---------------------------------------------------------------------------

struct Region {
  ibv_mr* mr = nullptr;
  std::uint8_t* mem = nullptr;  // inside the side's arena, kGuard bytes from either neighbour
  std::uint64_t iova = 0;
  std::uint32_t key = 0;
};

struct Side {
  emu::Device* dev = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_pd* pd2 = nullptr;
  ibv_cq* scq = nullptr;
  ibv_cq* rcq = nullptr;
  ibv_qp* rc = nullptr;
  ibv_qp* uc = nullptr;
  std::uint8_t* arena = nullptr;
  std::size_t arena_len = 0;
  Bytes baseline;
  std::array<Region, kRegionCount> regions{};
  std::vector<Range> fixed;  // arena bytes that never change: guards and protected regions
};

struct Posted {
  std::uint32_t qpn;
  bool recv;
  std::uint64_t len;  // receive: the scatter list's length
};

class Harness {
 public:
  static Harness& instance() {
    static Harness* h = new Harness;  // lives until exit, like the devices
    return *h;
  }

  std::vector<std::string> run(std::span<const std::uint8_t> input);
  std::string stats() const;
  void init();

 private:
  Harness() = default;

  void build_sides();
  void make_regions(Side& s, int index);
  void create_qps();
  void destroy_qps();
  bool reset_round(std::uint8_t scenario, std::uint8_t requests, std::uint8_t options);
  bool connect(int t, bool to_rts, ibv_mtu mtu);
  bool modify_state(ibv_qp* qp, ibv_qp_state st);
  void post_recvs(int t, std::uint8_t scenario);
  void post_requests(int t, std::uint8_t mask, std::uint8_t options);
  void inject(std::uint16_t ctl_bits, Bytes& pkt);
  void settle();
  void poll_cqs();
  void drain_async();
  void check_memory();
  void check_sent(std::span<const std::uint8_t> input);
  __attribute__((format(printf, 2, 3))) void fail(const char* fmt, ...);

  ibv_qp* qp(int t) { return t < 2 ? sides_[t & 1].rc : sides_[t & 1].uc; }
  Side& side_of(int t) { return sides_[t & 1]; }
  Side& peer_of(int t) { return sides_[(t & 1) ^ 1]; }
  std::uint32_t sq_psn(int t) const { return kSqPsn[t]; }
  std::uint32_t rq_psn(int t) const { return kSqPsn[t ^ 1]; }

  bool ready_ = false;
  bool trace_ = false;  // SOFTVERBS_FUZZ_TRACE: narrate each round on stderr
  std::uint8_t rnr_retry_ = 0;
  std::array<Side, 2> sides_{};
  Capture capture_;
  std::vector<std::uint64_t> secret_windows_;  // sorted
  std::unordered_set<std::uint32_t> live_qpns_;
  std::vector<Range> sink_writable_;
  std::unordered_map<std::uint64_t, Posted> posted_;
  std::uint64_t round_ = 0;
  std::uint64_t injected_ = 0;
  std::vector<std::string>* out_ = nullptr;

  // Statistics.
  std::uint64_t inputs_ = 0, completions_ok_ = 0, completions_err_ = 0, stale_completions_ = 0, sent_ = 0,
                qp_errors_ = 0, recreated_ = 0, settle_overruns_ = 0;
};

void Harness::fail(const char* fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (out_) out_->emplace_back(buf);
}

// ---------------------------------------------------------------------------
// Setup

void Harness::init() {
  if (ready_) return;
  // Two devices with default settings, no fault injection, no diagnostics.
  ::setenv("SOFTVERBS_DEVICES", "2", 1);
  for (const char* v :
       {"SOFTVERBS_LINK_LAYER", "SOFTVERBS_MTU", "SOFTVERBS_FAULTS", "SOFTVERBS_LOG", "SOFTVERBS_BACKEND"})
    ::unsetenv(v);
  // Everything the devices send is captured to a file read back after each input.
  std::string dir =
      ::access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp");
  dir += "/softverbs-fuzz-XXXXXX";
  if (!::mkdtemp(dir.data())) setup_failed("mkdtemp");
  const std::string pcap = dir + "/tx.pcap";
  ::setenv("SOFTVERBS_PCAP", pcap.c_str(), 1);
  capture_.expect(dir, pcap);
  // Removed once opened; also at exit, in case no packet was ever sent.
  std::atexit([] { Harness::instance().capture_.remove(); });
  trace_ = std::getenv("SOFTVERBS_FUZZ_TRACE") != nullptr;
  build_sides();
  create_qps();
  ready_ = true;
}

void Harness::build_sides() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n < 2) setup_failed("ibv_get_device_list: fewer than 2 devices");
  for (int i = 0; i < 2; ++i) {
    Side& s = sides_[i];
    s.dev = emu::DeviceRegistry::instance().find(list[i]);
    if (!s.dev) setup_failed("device not emulated");
    s.ctx = ibv_open_device(list[i]);
    if (!s.ctx) setup_failed("ibv_open_device");
    s.pd = ibv_alloc_pd(s.ctx);
    s.pd2 = ibv_alloc_pd(s.ctx);
    if (!s.pd || !s.pd2) setup_failed("ibv_alloc_pd");
    s.scq = ibv_create_cq(s.ctx, kCqDepth, nullptr, nullptr, 0);
    s.rcq = ibv_create_cq(s.ctx, kCqDepth, nullptr, nullptr, 0);
    if (!s.scq || !s.rcq) setup_failed("ibv_create_cq");
    make_regions(s, i);
  }
  ibv_free_device_list(list);

  // Every 8-byte window of what may never leave a device.
  for (Side& s : sides_) {
    for (int r = 0; r < kRegionCount; ++r) {
      const RegionSpec& spec = kRegions[r];
      const std::uint8_t* m = s.regions[r].mem;
      const bool unreadable = !(spec.access & kRR);
      for (std::uint32_t o = 0; o + 8 <= spec.len; ++o) {
        bool secret = unreadable;
        if (r == kSrc) secret = o >= kSrcSentBytes;  // the rest of src is sent by posted work
        if (r == kAt) secret = o % 8 != 0;           // an atomic returns aligned words only
        if (secret) secret_windows_.push_back(load64(m + o));
      }
    }
  }
  std::sort(secret_windows_.begin(), secret_windows_.end());
}

void Harness::make_regions(Side& s, int index) {
  const std::size_t page = 4096;
  // kHigh sits at a page offset that makes its I/O range end at kHighEnd; the
  // others follow from the next page on, each between guards.
  std::size_t len = 2 * page;
  for (const RegionSpec& spec : kRegions) len += (spec.len + 2 * kGuard + 63) / 64 * 64;
  len = (len + page - 1) / page * page;
  s.arena = static_cast<std::uint8_t*>(std::aligned_alloc(page, len));
  if (!s.arena) setup_failed("aligned_alloc");
  s.arena_len = len;
  std::uint64_t seed = 0x5EED0000ull + static_cast<std::uint64_t>(index);
  for (std::size_t i = 0; i < len; i += 8) {
    const std::uint64_t w = splitmix(seed);
    std::memcpy(s.arena + i, &w, 8);
  }
  std::size_t at = page + kGuard;
  for (int r = 0; r < kRegionCount; ++r) {
    const RegionSpec& spec = kRegions[r];
    Region& reg = s.regions[r];
    if (r == kHigh) {
      reg.mem = s.arena + (kHighEnd - spec.len) % page;
      reg.iova = kHighEnd - spec.len;
    } else {
      reg.mem = s.arena + at;
      reg.iova = reinterpret_cast<std::uintptr_t>(reg.mem);
      at += (spec.len + 2 * kGuard + 63) / 64 * 64;
    }
    ibv_pd* pd = r == kForeign ? s.pd2 : s.pd;
    reg.mr = ibv_reg_mr_iova2(pd, reg.mem, spec.len, reg.iova, spec.access);
    if (!reg.mr) setup_failed(spec.name);
    reg.key = reg.mr->rkey;
    if (r == kDead) {
      if (ibv_dereg_mr(reg.mr) != 0) setup_failed("ibv_dereg_mr");
      reg.mr = nullptr;
    }
  }
  s.baseline.assign(s.arena, s.arena + len);
  // Everything but the regions that may change, and the sink (checked per round).
  std::vector<Range> open;
  for (int r = 0; r < kRegionCount; ++r)
    if (kRegions[r].may_change || r == kSink)
      open.push_back({static_cast<std::uint32_t>(s.regions[r].mem - s.arena), kRegions[r].len});
  std::sort(open.begin(), open.end(), [](const Range& a, const Range& b) { return a.off < b.off; });
  std::uint32_t from = 0;
  for (const Range& r : open) {
    if (r.off > from) s.fixed.push_back({from, r.off - from});
    from = r.off + r.len;
  }
  if (from < len) s.fixed.push_back({from, static_cast<std::uint32_t>(len - from)});
}

void Harness::create_qps() {
  for (Side& s : sides_) {
    for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UC}) {
      testkit::QpShape shape{type, 16, 8, 2, 2, 0, 0};  // no inline data, sq_sig_all 0
      ibv_qp_init_attr init = testkit::qp_init_attr(shape, s.scq, s.rcq);
      ibv_qp* q = ibv_create_qp(s.pd, &init);
      if (!q) setup_failed("ibv_create_qp");
      (type == IBV_QPT_RC ? s.rc : s.uc) = q;
    }
  }
  live_qpns_.clear();
  for (int t = 0; t < 4; ++t) live_qpns_.insert(qp(t)->qp_num);
}

void Harness::destroy_qps() {
  drain_async();
  for (Side& s : sides_) {
    for (ibv_qp** q : {&s.rc, &s.uc}) {
      if (*q && ibv_destroy_qp(*q) != 0) setup_failed("ibv_destroy_qp");
      *q = nullptr;
    }
  }
  poll_cqs();
}

bool Harness::modify_state(ibv_qp* q, ibv_qp_state st) {
  ibv_qp_attr a{};
  a.qp_state = st;
  return ibv_modify_qp(q, &a, IBV_QP_STATE) == 0;
}

// INIT -> RTR (-> RTS) for target t, towards its peer QP on the other device.
bool Harness::connect(int t, bool to_rts, ibv_mtu mtu) {
  ibv_qp* q = qp(t);
  testkit::QpPath p;
  p.path_mtu = mtu;
  p.rq_psn = rq_psn(t);
  p.sq_psn = sq_psn(t);
  p.max_dest_rd_atomic = p.max_rd_atomic = 16;
  p.min_rnr_timer = 1;
  p.timeout = 0;  // no retransmission timer: rounds stay deterministic
  p.retry_cnt = 1;
  p.rnr_retry = rnr_retry_;
  // The peer device's IPv4-mapped GID.
  ibv_gid dgid{};
  dgid.raw[10] = 0xff;
  dgid.raw[11] = 0xff;
  const in_addr pa = peer_of(t).dev->addr();
  std::memcpy(&dgid.raw[12], &pa.s_addr, 4);
  if (testkit::modify_to_rtr(q, qp(t ^ 1)->qp_num, testkit::ah_to_gid(dgid), p) != 0) return false;
  return !to_rts || testkit::modify_to_rts(q, p) == 0;
}

// Receive WQEs on target t, in an order and with a protection fault chosen by
// the scenario byte.
void Harness::post_recvs(int t, std::uint8_t scenario) {
  Side& s = side_of(t);
  struct Sg {
    int region;
    std::uint32_t off, len;
  };
  std::vector<std::vector<Sg>> wqes = {
      {{kSink, 1300, 300}},
      {{kSink, 1600, 64}, {kSink, 1700, 256}},
      {},  // the bad one, below
      {},  // no scatter list at all
      {{kSink, 0, 1024}},
  };
  // The bad one: no local write right, another PD, deregistered, or running
  // past the region's end.
  static constexpr Sg kBad[4] = {{kRo, 0, 128}, {kForeign, 0, 128}, {kDead, 0, 64}, {kSink, 2048 - 32, 48}};
  wqes[2] = {kBad[(scenario >> 3) & 3]};
  const int rot = (scenario >> 1) & 3;
  static constexpr int kHowMany[4] = {5, 2, 1, 0};  // few or none: receiver-not-ready paths
  for (int k = 0; k < kHowMany[(scenario >> 5) & 3]; ++k) {
    const auto& w = wqes[static_cast<std::size_t>((k + rot) % 5)];
    ibv_sge sge[2]{};
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const Region& reg = s.regions[w[i].region];
      sge[i].addr = reg.iova + w[i].off;
      sge[i].length = w[i].len;
      sge[i].lkey = reg.key;
      total += w[i].len;
      if (w[i].region == kSink && w[i].off + w[i].len <= kRegions[kSink].len)
        sink_writable_.push_back({w[i].off, w[i].len});
    }
    ibv_recv_wr wr{};
    wr.wr_id = (round_ << 16) | (static_cast<std::uint64_t>(t) << 8) | static_cast<std::uint64_t>(k);
    wr.sg_list = sge;
    wr.num_sge = static_cast<int>(w.size());
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp(t), &wr, &bad) == 0) posted_[wr.wr_id] = {qp(t)->qp_num, true, total};
  }
}

// The outstanding requests of RC target t (its peer is not yet ready, so none is answered).
void Harness::post_requests(int t, std::uint8_t mask, std::uint8_t options) {
  Side& s = side_of(t);
  Side& p = peer_of(t);
  const Region& src = s.regions[kSrc];
  const Region& sink = s.regions[kSink];
  for (int i = 0; i < kRequestCount; ++i) {
    if (!(mask & (1u << i))) continue;
    ibv_sge sge[2]{};
    ibv_send_wr wr{};
    wr.wr_id = (round_ << 16) | (static_cast<std::uint64_t>(t) << 8) | 0x80 | static_cast<std::uint64_t>(i);
    wr.opcode = kRequests[i].opcode;
    wr.send_flags = (options & opt::unsignaled) ? 0 : IBV_SEND_SIGNALED;
    wr.sg_list = sge;
    wr.num_sge = 1;
    auto to_sink = [&](int k, std::uint32_t off, std::uint32_t len) {
      sge[k] = {sink.iova + off, len, sink.key};
      sink_writable_.push_back({off, len});
    };
    switch (i) {
      case 0:
        sge[0] = {src.iova, 300, src.key};
        break;
      case 1:
        sge[0] = {src.iova + 300, 64, src.key};
        wr.imm_data = htonl(0x12345678);
        wr.wr.rdma.remote_addr = p.regions[kRw].iova;
        wr.wr.rdma.rkey = p.regions[kRw].key;
        break;
      case 2:
        to_sink(0, 0, 600);
        wr.wr.rdma.remote_addr = p.regions[kRw].iova + 100;
        wr.wr.rdma.rkey = p.regions[kRw].key;
        break;
      case 3:
        if (options & opt::cas_into_ro) {
          sge[0] = {s.regions[kRo].iova, 8, s.regions[kRo].key};  // no local write right
        } else {
          to_sink(0, 1024, 8);
        }
        wr.wr.atomic.remote_addr = p.regions[kAt].iova;
        wr.wr.atomic.rkey = p.regions[kAt].key;
        wr.wr.atomic.compare_add = 1;
        wr.wr.atomic.swap = 2;
        break;
      case 4:
        to_sink(0, 1040, 8);
        wr.wr.atomic.remote_addr = p.regions[kAt].iova + 8;
        wr.wr.atomic.rkey = p.regions[kAt].key;
        wr.wr.atomic.compare_add = 5;
        break;
      case 5:
        to_sink(0, 1100, 32);
        if (options & opt::read_into_foreign) {
          sge[1] = {s.regions[kForeign].iova, 32, s.regions[kForeign].key};  // another PD
        } else {
          to_sink(1, 1200, 32);
        }
        wr.num_sge = 2;
        wr.wr.rdma.remote_addr = p.regions[kHigh].iova + 16;
        wr.wr.rdma.rkey = p.regions[kHigh].key;
        break;
      case 6:
        wr.num_sge = 0;
        wr.invalidate_rkey = p.regions[kRw].key;
        break;
    }
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp(t), &wr, &bad) == 0) posted_[wr.wr_id] = {qp(t)->qp_num, false, 0};
  }
}

// Brings every QP back to a known state: RESET, then the requester RC QP to RTS
// with its requests sent into a peer still in INIT (which drops them), then the
// rest to RTS, receive WQEs everywhere. Memory returns to its baseline.
bool Harness::reset_round(std::uint8_t scenario, std::uint8_t requests, std::uint8_t options) {
  ++round_;
  poll_cqs();
  drain_async();
  for (int t = 0; t < 4; ++t)
    if (!modify_state(qp(t), IBV_QPS_RESET)) return false;
  settle();
  poll_cqs();
  posted_.clear();
  sink_writable_.clear();
  for (Side& s : sides_) std::memcpy(s.arena, s.baseline.data(), s.arena_len);

  for (int t = 0; t < 4; ++t) {
    testkit::QpPath p;
    p.access = static_cast<unsigned>(t < 2 ? (kRW | kRR | kRA) : kRW);
    if (testkit::modify_to_init(qp(t), p) != 0) return false;
  }
  // An RNR NAK either fails the request at once, or makes the requester wait
  // for a timer that runs on the progress thread (not in step with the input).
  rnr_retry_ = (scenario & 0x80) ? 1 : 0;
  static constexpr ibv_mtu kMtus[4] = {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_4096};
  const ibv_mtu mtu = kMtus[(options >> 4) & 3];
  const int req = scenario & 1;  // the RC QP with requests outstanding
  if (!connect(req, true, mtu)) return false;
  post_requests(req, requests, options);
  settle();  // the peer, in INIT, drops them
  if (!connect(req ^ 1, !(options & opt::responder_rtr), mtu) || !connect(2, !(options & opt::uc_rtr), mtu) ||
      !connect(3, !(options & opt::uc_rtr), mtu))
    return false;
  for (int t = 0; t < 4; ++t) post_recvs(t, scenario);
  settle();
  drain_async();
  return true;
}

// ---------------------------------------------------------------------------
// Per input

void Harness::settle() {
  for (int i = 0; i < kMaxSettleRounds; ++i) {
    const auto tx = [&] {
      std::uint64_t n = 0;
      for (Side& s : sides_) n += s.dev->counters().tx_packets.load();
      return n;
    };
    const std::uint64_t before = tx();
    for (Side& s : sides_) s.dev->progress(true);
    std::uint64_t rx = 0;
    for (Side& s : sides_) rx += s.dev->counters().rx_packets();
    // Every packet sent between the devices has been handled, and handling
    // them sent nothing new.
    if (rx - injected_ == before && tx() == before) return;
  }
  ++settle_overruns_;
}

void Harness::poll_cqs() {
  for (Side& s : sides_) {
    for (ibv_cq* cq : {s.scq, s.rcq}) {
      ibv_wc wc[16];
      int n;
      while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
        for (int i = 0; i < n; ++i) {
          const ibv_wc& w = wc[i];
          if (trace_)
            std::fprintf(stderr, "    completion qp 0x%06x wr_id 0x%llx %s opcode %d len %u\n", w.qp_num,
                         static_cast<unsigned long long>(w.wr_id), ibv_wc_status_str(w.status), w.opcode, w.byte_len);
          if (w.status == IBV_WC_SUCCESS) {
            ++completions_ok_;
          } else {
            ++completions_err_;
          }
          if ((w.wr_id >> 16) != round_) {
            ++stale_completions_;  // a timer of an earlier round (RNR wait) fired late
            continue;
          }
          auto it = posted_.find(w.wr_id);
          if (it == posted_.end()) {
            fail("completion for wr_id 0x%llx (status %s, qp 0x%x) that is not outstanding",
                 static_cast<unsigned long long>(w.wr_id), ibv_wc_status_str(w.status), w.qp_num);
            continue;
          }
          const Posted& p = it->second;
          if (w.qp_num != p.qpn)
            fail("completion for wr_id 0x%llx names qp 0x%x, posted on 0x%x", static_cast<unsigned long long>(w.wr_id),
                 w.qp_num, p.qpn);
          if (p.recv != ((w.opcode & IBV_WC_RECV) != 0) && w.status == IBV_WC_SUCCESS)
            fail("completion for wr_id 0x%llx on the wrong queue (opcode %d)", static_cast<unsigned long long>(w.wr_id),
                 w.opcode);
          if (p.recv && w.status == IBV_WC_SUCCESS && w.opcode == IBV_WC_RECV && w.byte_len > p.len)
            fail("receive completion of %u bytes into a %llu-byte scatter list", w.byte_len,
                 static_cast<unsigned long long>(p.len));
          posted_.erase(it);
        }
      }
    }
  }
}

void Harness::drain_async() {
  for (Side& s : sides_) {
    for (;;) {
      pollfd pfd{s.ctx->async_fd, POLLIN, 0};
      if (::poll(&pfd, 1, 0) != 1) break;
      ibv_async_event ev{};
      if (ibv_get_async_event(s.ctx, &ev) != 0) break;
      if (ev.event_type == IBV_EVENT_QP_REQ_ERR || ev.event_type == IBV_EVENT_QP_ACCESS_ERR ||
          ev.event_type == IBV_EVENT_QP_FATAL)
        ++qp_errors_;
      ibv_ack_async_event(&ev);
    }
  }
}

void Harness::inject(std::uint16_t c, Bytes& p) {
  const int t = c & ctl::target_mask;
  Side& s = side_of(t);
  Side& peer = peer_of(t);
  const bool rc = t < 2;
  if (p.size() >= Bth::kSize) {
    if (c & ctl::map_opcode) {
      static constexpr std::uint8_t kRcOps[] = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
                                                0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11,
                                                0x12, 0x13, 0x14, 0x16, 0x17, 0x24, 0x64, 0x1C};
      static constexpr std::uint8_t kUcOps[] = {0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26,
                                                0x27, 0x28, 0x29, 0x2A, 0x2B, 0x04, 0x11};
      p[0] = rc ? kRcOps[p[0] % sizeof kRcOps] : kUcOps[p[0] % sizeof kUcOps];
    }
    if (!(c & ctl::raw_bth)) p[1] &= 0xC0;  // TVer 0, PadCnt 0
    if (!(c & ctl::raw_qpn)) store_be24(&p[5], qp(t)->qp_num);
    const OpcodeInfo& op = opcode_info(p[0]);
    if (!(c & ctl::raw_psn)) {
      const std::uint32_t base = op.is_request ? rq_psn(t) : sq_psn(t);
      const auto delta = static_cast<std::int8_t>(p[11]);
      store_be24(&p[9], psn_add(base, static_cast<std::uint32_t>(static_cast<std::int32_t>(delta))));
    }
    if (!(c & ctl::raw_keys) && op.valid && p.size() >= op.header_len + kIcrcBytes) {
      // R_Key: one of this device's regions, the peer's rw region, or no region;
      // VA near that region, length up to a little beyond it.
      auto fix = [&](std::uint8_t* va_p, std::uint8_t* key_p, std::uint8_t* len_p, std::uint32_t slack) {
        const std::uint32_t pick = load_be32(key_p) % (kRegionCount + 2);
        std::uint64_t iova = 0;
        std::uint32_t len = 256;
        std::uint32_t key = 0;
        if (pick < kRegionCount) {
          iova = s.regions[pick].iova;
          len = kRegions[pick].len;
          key = s.regions[pick].key;
        } else if (pick == kRegionCount) {
          iova = peer.regions[kRw].iova;
          len = kRegions[kRw].len;
          key = peer.regions[kRw].key;
        }
        const std::uint64_t raw_va = load_be64(va_p);
        std::uint64_t va = iova + raw_va % (len + 2 * slack) - slack;
        if (!len_p && !((raw_va >> 32) & 1)) va &= ~std::uint64_t{7};  // atomics: mostly aligned
        store_be64(va_p, va);
        store_be32(key_p, key);
        if (len_p) store_be32(len_p, load_be32(len_p) % (len + 2 * slack + 1));
      };
      if (op.has(ext::reth)) {
        std::uint8_t* h = &p[header_offset(op, ext::reth)];
        fix(h, h + 8, h + 12, 64);
      }
      if (op.has(ext::atomic_eth)) {
        std::uint8_t* h = &p[header_offset(op, ext::atomic_eth)];
        fix(h, h + 8, nullptr, 32);
      }
    }
  }
  in_addr src = peer.dev->addr();
  if (c & ctl::foreign_src) src.s_addr = htonl(0xC0000201);  // 192.0.2.1, no device's
  const bool raw_icrc = (c & ctl::raw_icrc_a) && (c & ctl::raw_icrc_b);
  if (!raw_icrc) write_icrc(IcrcFlow{s.dev->flow(src, s.dev->addr())}, p);
  ++injected_;
  if (trace_) {
    PacketView v;
    const ParseError e = parse(p, v, IcrcFlow{s.dev->flow(src, s.dev->addr())});
    std::fprintf(stderr, "  inject -> %s%d qp 0x%06x: %s psn 0x%06x len %zu%s%s\n", rc ? "rc" : "uc", t & 1,
                 v.bth.dest_qp, v.op->name.data(), v.bth.psn, p.size(),
                 e == ParseError::ok ? "" : " parse: ", e == ParseError::ok ? "" : to_string(e).data());
  }
  s.dev->inject(src, p);
  settle();
  if (c & ctl::poll_after) poll_cqs();
}

void Harness::check_memory() {
  for (int i = 0; i < 2; ++i) {
    Side& s = sides_[i];
    // What may not change: the fixed segments, and the sink outside the
    // scatter lists posted into it this round.
    std::vector<Range> segs = s.fixed;
    std::vector<Range> open = sink_writable_;
    std::sort(open.begin(), open.end(), [](const Range& a, const Range& b) { return a.off < b.off; });
    const auto sink_at = static_cast<std::uint32_t>(s.regions[kSink].mem - s.arena);
    std::uint32_t from = 0;
    for (const Range& r : open) {
      if (r.off > from) segs.push_back({sink_at + from, r.off - from});
      from = std::max(from, r.off + r.len);
    }
    if (from < kRegions[kSink].len) segs.push_back({sink_at + from, kRegions[kSink].len - from});

    for (const Range& seg : segs) {
      const std::size_t d = first_difference(s.arena + seg.off, s.baseline.data() + seg.off, seg.len);
      if (d == seg.len) continue;
      const std::size_t off = seg.off + d;
      std::size_t end = off;
      while (end < seg.off + seg.len && s.arena[end] != s.baseline[end]) ++end;
      // The region the byte is in, or else the nearest one, to say which bounds were crossed.
      int near = 0;
      std::ptrdiff_t best = PTRDIFF_MAX;
      for (int k = 0; k < kRegionCount; ++k) {
        const std::ptrdiff_t b = s.regions[k].mem - s.arena;
        const auto o = static_cast<std::ptrdiff_t>(off);
        const std::ptrdiff_t dist =
            o >= b && o < b + kRegions[k].len ? -1 : std::min(std::abs(o - b), std::abs(o - b - kRegions[k].len));
        if (dist < best) {
          best = dist;
          near = k;
        }
      }
      const std::ptrdiff_t rel = static_cast<std::ptrdiff_t>(off) - (s.regions[near].mem - s.arena);
      if (best >= 0) {
        fail("device %d: %zu byte(s) changed outside every region, at offset %td from region %s (length %u)", i,
             end - off, rel, kRegions[near].name, kRegions[near].len);
      } else {
        fail("device %d: region %s (access 0x%x) changed at offset %td (%zu bytes)%s", i, kRegions[near].name,
             kRegions[near].access, rel, end - off, near == kSink ? ", outside the scatter lists posted into it" : "");
      }
    }
  }
}

void Harness::check_sent(std::span<const std::uint8_t> input) {
  capture_.read_new([&](in_addr src, in_addr dst, std::span<const std::uint8_t> pkt) {
    ++sent_;
    PacketView v;
    const IcrcFlow flow{sides_[0].dev->flow(src, dst)};
    const ParseError e = parse(pkt, v, flow);
    if (trace_)
      std::fprintf(stderr, "    sent dev%d -> qp 0x%06x: %s psn 0x%06x payload %zu%s\n",
                   src.s_addr == sides_[0].dev->addr().s_addr ? 0 : 1, v.bth.dest_qp, v.op->name.data(), v.bth.psn,
                   v.payload.size(),
                   v.has(ext::aeth) ? (v.aeth.is_ack()   ? " ACK"
                                       : v.aeth.is_nak() ? " NAK"
                                                         : " RNR")
                                    : "");
    if (e != ParseError::ok) {
      fail("a device sent a packet that does not parse (%s): %s", to_string(e).data(), hex(pkt).c_str());
      return;
    }
    if (!live_qpns_.count(v.bth.dest_qp))
      fail("a device sent %s to QPN 0x%06x, which is no live QP", v.op->name.data(), v.bth.dest_qp);
    for (std::size_t o = 0; (o += find_secret(pkt.subspan(o), secret_windows_)) + 8 <= pkt.size(); ++o) {
      // The input itself may carry those bytes (written, then read back).
      const auto* b = pkt.data() + o;
      if (std::search(input.begin(), input.end(), b, b + 8) != input.end()) continue;
      fail("a device sent bytes of a region without remote read rights: %s at packet byte %zu (%s)", v.op->name.data(),
           o, hex(pkt.subspan(o, 8)).c_str());
      return;
    }
  });
}

std::vector<std::string> Harness::run(std::span<const std::uint8_t> input) {
  std::vector<std::string> out;
  out_ = &out;
  init();
  ++inputs_;
  const std::uint8_t scenario = input.size() > 0 ? input[0] : 0;
  const std::uint8_t requests = input.size() > 1 ? input[1] : 0x7F;
  const std::uint8_t options = input.size() > 2 ? input[2] : 0;
  // Packets sent after the previous input was checked (by a timer of the
  // progress thread) are checked first; a violation among them belongs to
  // an earlier input, which the message says.
  check_sent(input);
  for (std::string& v : out) v = "(after an earlier input) " + v;
  if (trace_)
    std::fprintf(stderr, "round %llu: scenario 0x%02x requests 0x%02x options 0x%02x\n",
                 static_cast<unsigned long long>(round_ + 1), scenario, requests, options);
  if (!reset_round(scenario, requests, options)) {
    // A QP refused a transition: start again from new QPs.
    ++recreated_;
    destroy_qps();
    create_qps();
    if (!reset_round(scenario, requests, options)) {
      fail("the QPs cannot be brought back to RTS after a reset");
      out_ = nullptr;
      return out;
    }
  }
  check_sent(input);
  if (trace_) std::fprintf(stderr, "  (reset done)\n");

  std::size_t at = kReceiveHeaderBytes;
  for (std::size_t records = 0; at + kRecordHeaderBytes <= input.size() && records < kMaxRecords; ++records) {
    const std::uint16_t c = static_cast<std::uint16_t>(input[at] | (input[at + 1] << 8));
    std::size_t len = static_cast<std::size_t>(input[at + 2] | (input[at + 3] << 8));
    at += kRecordHeaderBytes;
    len = std::min(len, input.size() - at);
    Bytes pkt(input.begin() + static_cast<std::ptrdiff_t>(at), input.begin() + static_cast<std::ptrdiff_t>(at + len));
    at += len;
    inject(c, pkt);
    if (trace_) check_sent(input);
  }
  settle();
  poll_cqs();
  drain_async();
  check_memory();
  check_sent(input);
  out_ = nullptr;
  return out;
}

std::string Harness::stats() const {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "inputs %llu, packets injected %llu, sent %llu, completions ok %llu / error %llu (stale %llu), "
                "QP errors %llu, QPs recreated %llu, settle overruns %llu",
                static_cast<unsigned long long>(inputs_), static_cast<unsigned long long>(injected_),
                static_cast<unsigned long long>(sent_), static_cast<unsigned long long>(completions_ok_),
                static_cast<unsigned long long>(completions_err_), static_cast<unsigned long long>(stale_completions_),
                static_cast<unsigned long long>(qp_errors_), static_cast<unsigned long long>(recreated_),
                static_cast<unsigned long long>(settle_overruns_));
  std::string s = buf;
  for (int i = 0; i < 2; ++i) {
    if (!sides_[i].dev) continue;
    const auto& c = sides_[i].dev->counters();
    std::snprintf(
        buf, sizeof buf,
        "; device %d: rx %llu icrc_err %llu malformed %llu unknown_qp %llu dropped %llu naks %llu "
        "rnr %llu dup %llu",
        i, static_cast<unsigned long long>(c.rx_packets()),
        static_cast<unsigned long long>(c.rx_icrc_errors.load()),
        static_cast<unsigned long long>(c.rx_malformed.load()), static_cast<unsigned long long>(c.rx_unknown_qp.load()),
        static_cast<unsigned long long>(c.rx_dropped.load()), static_cast<unsigned long long>(c.naks_sent.load()),
        static_cast<unsigned long long>(c.rnr_naks_sent.load()), static_cast<unsigned long long>(c.duplicates.load()));
    s += buf;
  }
  return s;
}

}  // namespace

std::vector<std::string> check_receive(std::span<const std::uint8_t> input) { return Harness::instance().run(input); }

std::string receive_stats() { return Harness::instance().stats(); }

}  // namespace softverbs::fuzz
