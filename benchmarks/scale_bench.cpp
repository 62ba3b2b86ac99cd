// In-process scale, atomics, UD and loss benchmarks, written against the public
// verbs API, the test kit (tests/support/) and the control API of
// include/softverbs/faults.h (fault rules and transport counters).
//
// Like engine_bench, two emulated devices of this process (emu0 -> emu1), packets
// through the engine's in-process queue, one thread polling both sides' CQs, times
// wall-clock. What they answer (docs/performance.md, targets P4-P6):
//   - does the message rate or bandwidth change with the number of QPs in use
//     (BM_QpScale) or of MRs the work is spread over (BM_MrScale)?
//   - how much memory does an idle, connected RC QP take (BM_IdleQpMemory)?
//   - the in-process rate of 8-byte atomics (BM_AtomicRate) and the bandwidth of
//     UD SENDs of one path MTU (BM_UdSendBw);
//   - RDMA WRITE bandwidth when 1 % of the packets are dropped against the same
//     stream without loss (BM_LossBw/1 vs /0).
//
// SOFTVERBS_DEVICES is set to 2 by main() unless the environment already sets it.
#include <benchmark/benchmark.h>
#include <infiniband/verbs.h>
#include <malloc.h>
#include <softverbs/faults.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/bench_pair.hpp"
#include "tests/support/connect.hpp"
#include "tests/support/verbs.hpp"

namespace {

namespace tk = softverbs::testkit;
using softverbs::bench::fail;
using softverbs::bench::health;
using softverbs::bench::kStallLimit;
using softverbs::bench::stop;
using softverbs::bench::usable;

constexpr int kCqDepth = 65536;
constexpr size_t kBufBytes = size_t{1} << 20;
// BM_MrScale's MRs are 64 KiB windows into a region of this size, at 4 KiB steps.
constexpr size_t kMrRegionBytes = size_t{16} << 20;
constexpr size_t kMrBytes = size_t{64} << 10;
constexpr unsigned kAccess =
    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

// One device's objects: a context, a PD, one CQ shared by every QP of the side,
// a 1 MiB buffer and the region BM_MrScale registers its MRs in.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<uint8_t> buf;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> region;
  std::vector<ibv_mr*> mrs;  // BM_MrScale's, grown on demand
  ibv_gid gid{};
  ibv_mtu active_mtu = IBV_MTU_1024;
};

struct Pair {
  ibv_qp* a = nullptr;  // on emu0, the requester
  ibv_qp* b = nullptr;  // on emu1, the responder
  uint32_t outstanding = 0;
};

struct Global {
  ibv_device** list = nullptr;
  Side a, b;
  std::vector<Pair> pairs;  // RC pairs, grown on demand (BM_QpScale uses the first N)
  uint8_t max_rd_atomic = 1;
} g;

bool open_side(ibv_device* dev, Side& s) {
  s.ctx = ibv_open_device(dev);
  if (!s.ctx) return fail("ibv_open_device");
  s.pd = ibv_alloc_pd(s.ctx);
  if (!s.pd) return fail("ibv_alloc_pd");
  s.cq = ibv_create_cq(s.ctx, kCqDepth, nullptr, nullptr, 0);
  if (!s.cq) return fail("ibv_create_cq");
  s.buf.assign(kBufBytes, 0x5a);
  s.mr = ibv_reg_mr(s.pd, s.buf.data(), s.buf.size(), kAccess);
  if (!s.mr) return fail("ibv_reg_mr");
  s.region.assign(kMrRegionBytes, 0);
  if (ibv_query_gid(s.ctx, 1, 1, &s.gid)) return fail("ibv_query_gid(index 1)");
  ibv_port_attr pa{};
  if (ibv_query_port(s.ctx, 1, &pa)) return fail("ibv_query_port");
  s.active_mtu = pa.active_mtu;
  return true;
}

// An RC QP of the given queue sizes on side s, sharing the side's CQ.
ibv_qp* make_rc(Side& s, uint32_t send_wr, uint32_t recv_wr) {
  tk::QpShape shape;
  shape.max_send_wr = send_wr;
  shape.max_recv_wr = recv_wr;
  shape.max_inline_data = 64;
  ibv_qp_init_attr ia = tk::qp_init_attr(shape, s.cq, s.cq);
  return ibv_create_qp(s.pd, &ia);
}

// Both QPs to RTS towards each other: path MTU 4096, timeout 14 (67 ms),
// retry_cnt and rnr_retry 7, max_rd_atomic as the device allows (at most 16).
bool connect(ibv_qp* a, ibv_qp* b) {
  tk::QpPath p;
  p.access = kAccess;
  p.path_mtu = IBV_MTU_4096;
  p.max_dest_rd_atomic = p.max_rd_atomic = g.max_rd_atomic;
  const tk::Connected r = tk::connect_pair(a, tk::ah_to_gid(g.b.gid), b, tk::ah_to_gid(g.a.gid), p);
  if (r) return true;
  errno = r.rc;
  return fail(std::string("modify_qp ") + r.step);
}

// Grows g.pairs to n connected RC pairs (send queue 256 each).
bool ensure_pairs(size_t n) {
  while (g.pairs.size() < n) {
    Pair p;
    p.a = make_rc(g.a, 256, 16);
    if (!p.a) return fail("ibv_create_qp (requester)");
    p.b = make_rc(g.b, 16, 16);
    if (!p.b) {
      ibv_destroy_qp(p.a);
      return fail("ibv_create_qp (responder)");
    }
    g.pairs.push_back(p);
    if (!connect(p.a, p.b)) return false;
  }
  return true;
}

// Grows both sides' MR lists to n: MR i is the 64 KiB window at 4 KiB * i
// (wrapping) of the side's region, so the MRs differ in address and key.
bool ensure_mrs(size_t n) {
  const size_t slots = (kMrRegionBytes - kMrBytes) / 4096;
  for (Side* s : {&g.a, &g.b}) {
    while (s->mrs.size() < n) {
      uint8_t* at = s->region.data() + (s->mrs.size() % slots) * 4096;
      ibv_mr* mr = ibv_reg_mr(s->pd, at, kMrBytes, kAccess);
      if (!mr) return fail("ibv_reg_mr (MR " + std::to_string(s->mrs.size()) + ")");
      s->mrs.push_back(mr);
    }
  }
  return true;
}

bool setup() {
  g.list = softverbs::bench::two_devices();
  if (!g.list) return false;
  if (!open_side(g.list[0], g.a) || !open_side(g.list[1], g.b)) return false;
  g.max_rd_atomic = softverbs::bench::max_rd_atomic_of(g.a.ctx);
  return g.max_rd_atomic && ensure_pairs(1);
}

void teardown() {
  for (Pair& p : g.pairs) {
    if (p.a) ibv_destroy_qp(p.a);
    if (p.b) ibv_destroy_qp(p.b);
  }
  for (Side* s : {&g.a, &g.b}) {
    for (ibv_mr* mr : s->mrs) ibv_dereg_mr(mr);
    if (s->mr) ibv_dereg_mr(s->mr);
    if (s->cq) ibv_destroy_cq(s->cq);
    if (s->pd) ibv_dealloc_pd(s->pd);
    if (s->ctx) ibv_close_device(s->ctx);
  }
  if (g.list) ibv_free_device_list(g.list);
}

// Polls a CQ; calls on(wc) for every successful completion. False on an error
// completion (err says which).
template <typename F>
bool poll(ibv_cq* cq, std::string& err, F&& on) {
  ibv_wc wc[64];
  const int n = ibv_poll_cq(cq, 64, wc);
  if (n < 0) {
    err = "ibv_poll_cq failed";
    return false;
  }
  for (int i = 0; i < n; ++i) {
    if (wc[i].status != IBV_WC_SUCCESS) {
      err = std::string("completion error: ") + ibv_wc_status_str(wc[i].status) + " (opcode " +
            std::to_string(wc[i].opcode) + ")";
      return false;
    }
    on(wc[i]);
  }
  return true;
}

// Watches a stream for progress; true once nothing has completed for `limit`.
struct StallWatch {
  std::chrono::steady_clock::duration limit = kStallLimit;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
  uint64_t seen = 0;
  size_t spins = 0;
  bool stalled(uint64_t completed) {
    if ((++spins & 1023) != 0) return false;
    const auto now = std::chrono::steady_clock::now();
    if (completed != seen) {
      seen = completed;
      last = now;
      return false;
    }
    return now - last > limit;
  }
};

// After a stream: polls both sides' CQs until the WRs still outstanding have
// completed (on_done counts them into `completed`), so the next benchmark
// starts clean; stops the benchmark on an error completion or a stall.
template <typename F>
void drain(benchmark::State& state, const uint64_t& completed, uint64_t posted, F&& on_done) {
  std::string err;
  const auto t0 = std::chrono::steady_clock::now();
  while (completed < posted) {
    if (!poll(g.a.cq, err, on_done) || !poll(g.b.cq, err, [](const ibv_wc&) {})) {
      stop(state, err);
      return;
    }
    if (std::chrono::steady_clock::now() - t0 > kStallLimit) {
      stop(state, "stalled while draining");
      return;
    }
  }
}

double cpu_seconds_since(std::clock_t start) { return static_cast<double>(std::clock() - start) / CLOCKS_PER_SEC; }

// ---------------------------------------------------------------------------

// Memory per idle RC QP: the heap in use (mallinfo2, every arena) and the
// resident set (/proc/self/statm) before and after creating 500 RC QP pairs
// (1000 QPs, send and receive queues of 128, connected to RTS and left idle),
// divided by the QPs. One iteration; the QPs are destroyed afterwards.
size_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

void BM_IdleQpMemory(benchmark::State& state) {
  if (!usable(state)) return;
  constexpr int kPairs = 500;
  for (auto _ : state) {
    const struct mallinfo2 heap0 = mallinfo2();
    const size_t rss0 = rss_bytes();
    std::vector<Pair> qps;
    qps.reserve(kPairs);
    for (int i = 0; i < kPairs; ++i) {
      Pair p{make_rc(g.a, 128, 128), make_rc(g.b, 128, 128)};
      if (!p.a || !p.b || !connect(p.a, p.b)) {
        if (p.a) ibv_destroy_qp(p.a);
        if (p.b) ibv_destroy_qp(p.b);
        stop(state, "creating idle QPs: " + (health.error.empty() ? std::string(std::strerror(errno)) : health.error));
        break;
      }
      qps.push_back(p);
    }
    const struct mallinfo2 heap1 = mallinfo2();
    const size_t rss1 = rss_bytes();
    const double n = 2.0 * static_cast<double>(qps.size());
    if (!qps.empty()) {
      state.counters["heap_bytes_per_qp"] =
          (static_cast<double>(heap1.uordblks + heap1.hblkhd) - static_cast<double>(heap0.uordblks + heap0.hblkhd)) / n;
      state.counters["rss_bytes_per_qp"] = (static_cast<double>(rss1) - static_cast<double>(rss0)) / n;
    }
    for (Pair& p : qps) {
      ibv_destroy_qp(p.a);
      ibv_destroy_qp(p.b);
    }
  }
}
BENCHMARK(BM_IdleQpMemory)->Iterations(1)->UseRealTime()->Unit(benchmark::kMillisecond);

// Message rate (64 B) or bandwidth (64 KiB) of signaled RDMA WRITEs against the
// number of RC QP pairs in use. WRs are posted one at a time, round-robin over the
// N pairs, keeping `window` outstanding in total (64 for 64 B, 32 for 64 KiB, as
// engine_bench's BM_MsgRate64B/64 and BM_WriteBw): only the number of QPs changes.
// All the QPs of a side share one CQ.
void BM_QpScale(benchmark::State& state) {
  if (!usable(state)) return;
  const auto nqp = static_cast<size_t>(state.range(0));
  const auto size = static_cast<uint32_t>(state.range(1));
  const uint32_t window = size <= 64 ? 64 : 32;
  if (!ensure_pairs(nqp)) {
    stop(state, health.error);
    return;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(g.a.buf.data()), size, g.a.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(g.b.buf.data());
  wr.wr.rdma.rkey = g.b.mr->rkey;
  uint64_t posted = 0, completed = 0;
  size_t next = 0;
  std::string err;
  StallWatch watch;
  const std::clock_t cpu0 = std::clock();
  auto on_done = [&](const ibv_wc& wc) {
    ++completed;
    --g.pairs[wc.wr_id].outstanding;
  };
  bool ok = true;
  for (auto _ : state) {
    for (uint64_t room = window - (posted - completed); room; --room) {
      Pair& p = g.pairs[next];
      wr.wr_id = next;
      next = next + 1 == nqp ? 0 : next + 1;
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(p.a, &wr, &bad)) {
        stop(state, std::string("ibv_post_send: ") + std::strerror(rc));
        ok = false;
        break;
      }
      ++p.outstanding;
      ++posted;
    }
    if (!ok) break;
    if (!poll(g.a.cq, err, on_done) || !poll(g.b.cq, err, [](const ibv_wc&) {})) {
      stop(state, err);
      ok = false;
      break;
    }
    if (watch.stalled(completed)) {
      stop(state, "stalled: no completion for 10 s");
      ok = false;
      break;
    }
  }
  const uint64_t done = completed;
  if (ok) drain(state, completed, posted, on_done);
  if (posted) state.counters["cpu_ns_per_wr"] = 1e9 * cpu_seconds_since(cpu0) / static_cast<double>(posted);
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetBytesProcessed(static_cast<int64_t>(done * size));
  state.SetLabel(std::to_string(nqp) + " QP pairs");
}
BENCHMARK(BM_QpScale)->ArgsProduct({{1, 4, 16, 64, 256, 1024}, {64, 65536}})->UseRealTime();

// A pipelined stream of signaled work requests on the first pair, `window`
// outstanding, posted as one chain per refill. fill(wr, k) sets up the k-th WR
// posted (its SGE, remote address, key, opcode). Returns the WRs completed while
// the state loop ran; sets cpu_ns_per_wr.
template <typename Fill>
uint64_t stream(benchmark::State& state, uint32_t window, Fill&& fill) {
  if (!ensure_pairs(1)) {
    stop(state, health.error);
    return 0;
  }
  Pair& p = g.pairs[0];
  std::vector<ibv_send_wr> wrs(window);
  std::vector<ibv_sge> sges(window);
  uint64_t posted = 0, completed = 0;
  std::string err;
  StallWatch watch;
  auto on_done = [&](const ibv_wc&) { ++completed; };
  const std::clock_t cpu0 = std::clock();
  bool ok = true;
  for (auto _ : state) {
    const uint64_t room = window - (posted - completed);
    if (room) {
      for (uint64_t i = 0; i < room; ++i) {
        wrs[i] = {};
        wrs[i].sg_list = &sges[i];
        wrs[i].num_sge = 1;
        wrs[i].send_flags = IBV_SEND_SIGNALED;
        fill(wrs[i], sges[i], posted + i);
        wrs[i].next = i + 1 < room ? &wrs[i + 1] : nullptr;
      }
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(p.a, wrs.data(), &bad)) {
        stop(state, std::string("ibv_post_send: ") + std::strerror(rc));
        ok = false;
        break;
      }
      posted += room;
    }
    if (!poll(g.a.cq, err, on_done) || !poll(g.b.cq, err, [](const ibv_wc&) {})) {
      stop(state, err);
      ok = false;
      break;
    }
    if (watch.stalled(completed)) {
      stop(state, "stalled: no completion for 10 s (" + std::to_string(posted - completed) + " outstanding)");
      ok = false;
      break;
    }
  }
  const uint64_t done = completed;
  if (ok) drain(state, completed, posted, on_done);
  if (posted) state.counters["cpu_ns_per_wr"] = 1e9 * cpu_seconds_since(cpu0) / static_cast<double>(posted);
  return done;
}

// Message rate (64 B) or bandwidth (64 KiB) of signaled RDMA WRITEs on one QP
// pair, the k-th WR using the local MR k mod N and the remote MR k mod N, for N
// registered MRs per side (64 KiB each). Window 64 (64 B) or 32 (64 KiB).
void BM_MrScale(benchmark::State& state) {
  if (!usable(state)) return;
  const auto nmr = static_cast<size_t>(state.range(0));
  const auto size = static_cast<uint32_t>(state.range(1));
  if (!ensure_mrs(nmr)) {
    stop(state, health.error);
    return;
  }
  const uint64_t done = stream(state, size <= 64 ? 64 : 32, [&](ibv_send_wr& w, ibv_sge& s, uint64_t k) {
    const ibv_mr* l = g.a.mrs[k % nmr];
    const ibv_mr* r = g.b.mrs[k % nmr];
    s = {reinterpret_cast<uintptr_t>(l->addr), size, l->lkey};
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(r->addr);
    w.wr.rdma.rkey = r->rkey;
  });
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetBytesProcessed(static_cast<int64_t>(done * size));
  state.SetLabel(std::to_string(nmr) + " MRs per side");
}
BENCHMARK(BM_MrScale)->ArgsProduct({{1, 10, 100, 1000, 10000}, {64, 65536}})->UseRealTime();

// 8-byte atomics on one QP pair, max_rd_atomic (16) outstanding: arg 0 fetch and
// add, arg 1 compare and swap. items/s = atomics completed per second.
void BM_AtomicRate(benchmark::State& state) {
  if (!usable(state)) return;
  const bool cas = state.range(0) == 1;
  const uint64_t done = stream(state, g.max_rd_atomic, [&](ibv_send_wr& w, ibv_sge& s, uint64_t k) {
    s = {reinterpret_cast<uintptr_t>(g.a.buf.data() + 8 * (k % 64)), 8, g.a.mr->lkey};
    w.opcode = cas ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
    w.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(g.b.buf.data() + 8 * (k % 64));
    w.wr.atomic.rkey = g.b.mr->rkey;
    w.wr.atomic.compare_add = cas ? 0 : 1;
    w.wr.atomic.swap = 0;
  });
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetLabel(cas ? "compare and swap" : "fetch and add");
}
BENCHMARK(BM_AtomicRate)->Arg(0)->Arg(1)->UseRealTime();

// UD SENDs of one path MTU of payload (the port's active MTU) from a UD QP on emu0
// to one on emu1, `window` (64) sends outstanding. The rate counts what the
// receiver got (bytes_per_second); `lost` is what was sent and never received
// (a UD receiver without a posted receive drops the datagram).
void BM_UdSendBw(benchmark::State& state) {
  if (!usable(state)) return;
  constexpr uint32_t kWindow = 64, kRecvs = 1024, kGrh = 40;
  const uint32_t size = 128u << std::min(g.a.active_mtu, g.b.active_mtu);  // IBV_MTU_256 = 1
  tk::QpShape shape;
  shape.type = IBV_QPT_UD;
  shape.max_send_wr = kWindow;
  shape.max_recv_wr = kRecvs;
  ibv_qp_init_attr ia_a = tk::qp_init_attr(shape, g.a.cq, g.a.cq);
  ibv_qp_init_attr ia_b = tk::qp_init_attr(shape, g.b.cq, g.b.cq);
  ibv_qp* qa = ibv_create_qp(g.a.pd, &ia_a);
  ibv_qp* qb = ibv_create_qp(g.b.pd, &ia_b);
  ibv_ah_attr aha = tk::ah_to_gid(g.b.gid);
  ibv_ah* ah = qa && qb && tk::connect_ud_pair(qa, qb) ? ibv_create_ah(g.a.pd, &aha) : nullptr;
  auto cleanup = [&] {
    if (ah) ibv_destroy_ah(ah);
    if (qa) ibv_destroy_qp(qa);
    if (qb) ibv_destroy_qp(qb);
  };
  if (!ah) {
    stop(state, std::string("UD QPs or address handle: ") + std::strerror(errno));
    cleanup();
    return;
  }
  std::vector<ibv_recv_wr> rws(kRecvs);
  std::vector<ibv_sge> rsg(kRecvs);
  uint32_t posted_recvs = 0;
  auto post_recvs = [&]() {
    const uint32_t n = kRecvs - posted_recvs;
    if (!n) return true;
    for (uint32_t i = 0; i < n; ++i) {
      rsg[i] = {reinterpret_cast<uintptr_t>(g.b.buf.data()), size + kGrh, g.b.mr->lkey};
      rws[i] = {};
      rws[i].sg_list = &rsg[i];
      rws[i].num_sge = 1;
      rws[i].next = i + 1 < n ? &rws[i + 1] : nullptr;
    }
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qb, rws.data(), &bad)) return false;
    posted_recvs = kRecvs;
    return true;
  };
  ibv_sge sge{reinterpret_cast<uintptr_t>(g.a.buf.data()), size, g.a.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = qb->qp_num;
  wr.wr.ud.remote_qkey = tk::QpPath{}.qkey;
  uint64_t sent = 0, completed = 0, received = 0, written_off = 0;
  // Sent and neither received nor given up for lost (negative when a datagram
  // given up for lost arrives after all).
  auto backlog = [&] { return static_cast<int64_t>(sent) - static_cast<int64_t>(received + written_off); };
  std::string err;
  StallWatch watch{std::chrono::milliseconds(100)};
  auto on_send = [&](const ibv_wc&) { ++completed; };
  auto on_recv = [&](const ibv_wc&) {
    ++received;
    --posted_recvs;
  };
  bool ok = post_recvs();
  const std::clock_t cpu0 = std::clock();
  for (auto _ : state) {
    if (!ok) break;
    // Sends complete locally; the receiver's backlog is bounded by the window too.
    while (sent - completed < kWindow && backlog() < kWindow) {
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(qa, &wr, &bad)) {
        stop(state, std::string("ibv_post_send (UD): ") + std::strerror(rc));
        ok = false;
        break;
      }
      ++sent;
    }
    if (!ok || !poll(g.a.cq, err, on_send) || !poll(g.b.cq, err, on_recv) ||
        (posted_recvs < kRecvs / 2 && !post_recvs())) {
      if (ok) stop(state, err.empty() ? "ibv_post_recv failed" : err);
      ok = false;
      break;
    }
    // A lost datagram leaves sent - received stuck: after 100 ms without a
    // receive, stop waiting for what is missing (counted in `lost`).
    if (watch.stalled(received)) written_off += std::max<int64_t>(0, backlog());
  }
  const uint64_t got = received;  // what arrived while the state loop ran
  const auto t0 = std::chrono::steady_clock::now();
  while (ok && (completed < sent || received < sent) &&
         std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(500)) {
    if (!poll(g.a.cq, err, on_send) || !poll(g.b.cq, err, on_recv)) break;
  }
  if (sent) state.counters["cpu_ns_per_wr"] = 1e9 * cpu_seconds_since(cpu0) / static_cast<double>(sent);
  state.counters["lost"] = static_cast<double>(sent - std::min(sent, received));
  state.SetBytesProcessed(static_cast<int64_t>(got * size));
  state.SetItemsProcessed(static_cast<int64_t>(got));
  state.SetLabel("UD SEND " + std::to_string(size) + " B");
  cleanup();
}
BENCHMARK(BM_UdSendBw)->UseRealTime();

// RDMA WRITE bandwidth, 64 KiB, 32 outstanding (as engine_bench's BM_WriteBw),
// on one QP pair: arg 0 without loss, arg 1 with a fault rule dropping 1 % of
// the packets the devices send (include/softverbs/faults.h, direction "tx", so
// each packet is at risk once; seed 1). Counters: the requester's retransmissions (go-back-N restarts), local ACK
// timeouts and PSN sequence NAKs received during the run.
void BM_LossBw(benchmark::State& state) {
  if (!usable(state)) return;
  const bool lossy = state.range(0) == 1;
  constexpr uint32_t kSize = 65536;
  softverbs_counters c0{};
  const char* dev = ibv_get_device_name(g.a.ctx->device);
  softverbs_device_counters(dev, &c0, sizeof c0);
  if (lossy) {
    char msg[256] = "";
    softverbs_faults_seed(1);
    if (softverbs_faults_load("[[rule]]\nname = \"bench-drop-1pct\"\ndirection = \"tx\"\nprobability = 0.01\naction = \"drop\"\n", msg,
                              sizeof msg)) {
      stop(state, std::string("softverbs_faults_load: ") + msg);
      return;
    }
  }
  const uint64_t done = stream(state, 32, [&](ibv_send_wr& w, ibv_sge& s, uint64_t) {
    s = {reinterpret_cast<uintptr_t>(g.a.buf.data()), kSize, g.a.mr->lkey};
    w.opcode = IBV_WR_RDMA_WRITE;
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(g.b.buf.data());
    w.wr.rdma.rkey = g.b.mr->rkey;
  });
  if (lossy) {
    state.counters["dropped"] = static_cast<double>(softverbs_fault_hits("bench-drop-1pct"));
    softverbs_faults_clear();
  }
  softverbs_counters c1{};
  softverbs_device_counters(dev, &c1, sizeof c1);
  state.counters["retransmits"] = static_cast<double>(c1.retransmits - c0.retransmits);
  state.counters["timeouts"] = static_cast<double>(c1.timeouts - c0.timeouts);
  state.counters["seq_naks"] = static_cast<double>(c1.seq_naks_received - c0.seq_naks_received);
  state.SetBytesProcessed(static_cast<int64_t>(done * kSize));
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetLabel(lossy ? "1 % of packets dropped" : "no loss");
}
BENCHMARK(BM_LossBw)->Arg(0)->Arg(1)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  return softverbs::bench::run_main(argc, argv, "scale_bench", setup, nullptr, teardown);
}
