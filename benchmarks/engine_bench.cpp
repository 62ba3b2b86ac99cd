// In-process engine benchmarks, written against the public verbs API only (and
// the test kit, tests/support/, which uses nothing else).
//
// Two emulated devices of this process (emu0, emu1) each get a PD, a CQ, a
// registered buffer and one RC QP; the QPs are connected to each other over
// RoCEv2 (GID index 1, the IPv4-mapped GID). Packets between the two devices go
// through the engine's in-process queue, not through a socket.
//
// Unless stated otherwise the benchmark thread polls both CQs, so protocol
// work on both sides runs inline in that thread (the progress thread may take
// part too, as it would in an application). Times are wall-clock.
//
// SOFTVERBS_DEVICES is set to 2 by main() unless the environment already sets
// it; it must then name at least two devices.
#include <benchmark/benchmark.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "benchmarks/bench_pair.hpp"
#include "tests/support/connect.hpp"
#include "tests/support/verbs.hpp"

namespace {

using softverbs::bench::fail;
using softverbs::bench::health;
using softverbs::bench::kStallLimit;
using softverbs::bench::stop;
using softverbs::bench::usable;

constexpr size_t kBufBytes = size_t{1} << 20;  // the largest message
constexpr int kCqDepth = 4096;
constexpr uint32_t kMaxSendWr = 1024;
constexpr uint32_t kMaxRecvWr = 1024;
constexpr uint32_t kMaxInline = 64;

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf;
  ibv_gid gid{};
  uint32_t posted_recvs = 0;  // receive WRs outstanding on qp
};

// The deep pair's send queue and CQ: room for the most outstanding WRs
// BM_OutstandingWr measures.
constexpr uint32_t kDeepSendWr = 4096;
constexpr int kDeepCqDepth = 8192;
constexpr size_t kDeepBufBytes = 4096;

// BM_MsgRate64BThreads's largest thread count, and its pairs' buffers.
constexpr int kMaxThreads = 2;
constexpr size_t kThreadBufBytes = 4096;

struct Fixture {
  ibv_device** list = nullptr;
  Side a, b;  // a: requester, b: responder
  // A second pair, in contexts of their own on the same two devices, with a
  // send queue of kDeepSendWr entries (BM_OutstandingWr).
  Side deep_a, deep_b;
  // BM_MsgRate64BThreads: a pair per thread, in contexts of their own.
  Side thread_a[kMaxThreads], thread_b[kMaxThreads];
  uint8_t max_rd_atomic = 1;
};

Fixture g;

bool open_side(ibv_device* dev, Side& s, uint32_t max_send_wr = kMaxSendWr, int cq_depth = kCqDepth,
               size_t buf_bytes = kBufBytes) {
  s.ctx = ibv_open_device(dev);
  if (!s.ctx) return fail("ibv_open_device");
  s.pd = ibv_alloc_pd(s.ctx);
  if (!s.pd) return fail("ibv_alloc_pd");
  s.cq = ibv_create_cq(s.ctx, cq_depth, nullptr, nullptr, 0);
  if (!s.cq) return fail("ibv_create_cq");
  s.buf.assign(buf_bytes, 0x5a);
  s.mr = ibv_reg_mr(s.pd, s.buf.data(), s.buf.size(),
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (!s.mr) return fail("ibv_reg_mr");
  softverbs::testkit::QpShape shape;
  shape.max_send_wr = max_send_wr;
  shape.max_recv_wr = kMaxRecvWr;
  shape.max_inline_data = kMaxInline;
  ibv_qp_init_attr ia = softverbs::testkit::qp_init_attr(shape, s.cq, s.cq);
  s.qp = ibv_create_qp(s.pd, &ia);
  if (!s.qp) return fail("ibv_create_qp");
  if (ibv_query_gid(s.ctx, 1, 1, &s.gid)) return fail("ibv_query_gid(index 1)");
  return true;
}

// Both QPs to RTS towards each other: path MTU 4096, timeout 14 (67 ms),
// retry_cnt and rnr_retry 7, first PSNs 0.
bool connect_sides(Side& a, Side& b) {
  softverbs::testkit::QpPath p;
  p.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  p.path_mtu = IBV_MTU_4096;
  p.max_dest_rd_atomic = p.max_rd_atomic = g.max_rd_atomic;
  const softverbs::testkit::Connected r = softverbs::testkit::connect_pair(
      a.qp, softverbs::testkit::ah_to_gid(b.gid), b.qp, softverbs::testkit::ah_to_gid(a.gid), p);
  if (r) return true;
  errno = r.rc;
  return fail(std::string("modify_qp ") + r.step);
}

bool setup() {
  g.list = softverbs::bench::two_devices();
  if (!g.list) return false;
  if (!open_side(g.list[0], g.a) || !open_side(g.list[1], g.b)) return false;
  g.max_rd_atomic = softverbs::bench::max_rd_atomic_of(g.a.ctx);
  if (!g.max_rd_atomic || !connect_sides(g.a, g.b)) return false;
  if (!open_side(g.list[0], g.deep_a, kDeepSendWr, kDeepCqDepth, kDeepBufBytes) ||
      !open_side(g.list[1], g.deep_b, kDeepSendWr, kDeepCqDepth, kDeepBufBytes) || !connect_sides(g.deep_a, g.deep_b))
    return false;
  for (int t = 0; t < kMaxThreads; ++t)
    if (!open_side(g.list[0], g.thread_a[t], kMaxSendWr, kCqDepth, kThreadBufBytes) ||
        !open_side(g.list[1], g.thread_b[t], kMaxSendWr, kCqDepth, kThreadBufBytes) ||
        !connect_sides(g.thread_a[t], g.thread_b[t]))
      return false;
  return true;
}

void teardown() {
  std::vector<Side*> sides{&g.a, &g.b, &g.deep_a, &g.deep_b};
  for (int t = 0; t < kMaxThreads; ++t) sides.insert(sides.end(), {&g.thread_a[t], &g.thread_b[t]});
  for (Side* s : sides) {
    if (s->qp) ibv_destroy_qp(s->qp);
    if (s->mr) ibv_dereg_mr(s->mr);
    if (s->cq) ibv_destroy_cq(s->cq);
    if (s->pd) ibv_dealloc_pd(s->pd);
    if (s->ctx) ibv_close_device(s->ctx);
  }
  if (g.list) ibv_free_device_list(g.list);
}

// Posts `count` receive WRs of `len` bytes on s's QP (chained, one call).
bool post_recvs(Side& s, uint32_t count, uint32_t len) {
  if (!count) return true;
  thread_local std::vector<ibv_recv_wr> wrs;
  thread_local std::vector<ibv_sge> sges;
  wrs.assign(count, {});
  sges.assign(count, {});
  for (uint32_t i = 0; i < count; ++i) {
    sges[i] = {reinterpret_cast<uintptr_t>(s.buf.data()), len, s.mr->lkey};
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sges[i];
    wrs[i].num_sge = 1;
    wrs[i].next = i + 1 < count ? &wrs[i + 1] : nullptr;
  }
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(s.qp, wrs.data(), &bad)) return false;
  s.posted_recvs += count;
  return true;
}

// Polls a CQ, counting successful completions; false on an error completion.
bool poll(ibv_cq* cq, uint64_t& done, std::string& err) {
  ibv_wc wc[64];
  int n = ibv_poll_cq(cq, 64, wc);
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
    ++done;
  }
  return true;
}

// A pipelined stream of one kind of work request from a to b, keeping `window`
// of them outstanding. Every WR is signaled; the benchmark thread also polls b's
// CQ (receives for SEND, empty for WRITE/READ, which still drives b's engine).
// Returns the number of WRs completed while the state loop ran; the counter
// cpu_ns_per_wr is the process's CPU time per work request.
uint64_t stream(benchmark::State& state, Side& a, Side& b, ibv_wr_opcode opcode, uint32_t size, uint32_t window,
                bool poll_b) {
  const bool is_send = opcode == IBV_WR_SEND;
  std::string err;
  if (is_send && b.posted_recvs < kMaxRecvWr && !post_recvs(b, kMaxRecvWr - b.posted_recvs, size)) {
    stop(state, "ibv_post_recv failed");
    return 0;
  }
  std::vector<ibv_send_wr> wrs(window);
  std::vector<ibv_sge> sges(window);
  for (uint32_t i = 0; i < window; ++i) {
    sges[i] = {reinterpret_cast<uintptr_t>(a.buf.data()), size, a.mr->lkey};
    ibv_send_wr& w = wrs[i];
    w = {};
    w.wr_id = i;
    w.sg_list = &sges[i];
    w.num_sge = 1;
    w.opcode = opcode;
    w.send_flags = IBV_SEND_SIGNALED | (is_send && size <= kMaxInline ? IBV_SEND_INLINE : 0);
    w.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf.data());
    w.wr.rdma.rkey = b.mr->rkey;
  }
  uint64_t posted = 0, completed = 0, received = 0;
  const std::clock_t cpu_start = std::clock();  // the process's CPU time: every thread's share of the work
  auto last_progress = std::chrono::steady_clock::now();
  uint64_t last_completed = 0;
  size_t spins = 0;
  bool ok = true;
  for (auto _ : state) {
    // Fill the window with one chained post.
    const uint64_t room = window - (posted - completed);
    if (room) {
      for (uint64_t i = 0; i < room; ++i) wrs[i].next = i + 1 < room ? &wrs[i + 1] : nullptr;
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(a.qp, wrs.data(), &bad)) {
        errno = rc;
        stop(state, std::string("ibv_post_send: ") + std::strerror(rc));
        ok = false;
        break;
      }
      posted += room;
    }
    if (!poll(a.cq, completed, err)) {
      stop(state, err);
      ok = false;
      break;
    }
    if (poll_b || is_send) {
      uint64_t before = received;
      if (!poll(b.cq, received, err)) {
        stop(state, err);
        ok = false;
        break;
      }
      if (is_send) {
        b.posted_recvs -= static_cast<uint32_t>(received - before);
        if (b.posted_recvs < kMaxRecvWr / 2 && !post_recvs(b, kMaxRecvWr - b.posted_recvs, size)) {
          stop(state, "ibv_post_recv failed");
          ok = false;
          break;
        }
      }
    }
    if ((++spins & 1023) == 0) {
      auto now = std::chrono::steady_clock::now();
      if (completed != last_completed) {
        last_completed = completed;
        last_progress = now;
      } else if (now - last_progress > kStallLimit) {
        stop(state, "stalled: no completion for 10 s (" + std::to_string(posted - completed) + " outstanding)");
        ok = false;
        break;
      }
    }
  }
  const uint64_t done = completed;
  // Drain what is still outstanding so the next benchmark starts clean. Every
  // acknowledged send has its receive completion queued by then.
  auto start = std::chrono::steady_clock::now();
  while (ok && (completed < posted || (is_send && received < completed))) {
    uint64_t before = received;
    if (!poll(a.cq, completed, err) || !poll(b.cq, received, err)) {
      stop(state, err);
      break;
    }
    if (is_send) b.posted_recvs -= static_cast<uint32_t>(received - before);
    if (std::chrono::steady_clock::now() - start > kStallLimit) {
      stop(state, "stalled while draining: " + std::to_string(posted - completed) + " WRs never completed");
      break;
    }
  }
  // The CPU time of the whole process per work request, from the first post to
  // the last completion, whichever thread spent it: what a work request costs,
  // whatever the machine's load does to the wall-clock rate.
  if (posted)
    state.counters["cpu_ns_per_wr"] =
        1e9 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC / static_cast<double>(posted);
  return done;
}

// Before measuring: one 1 MiB RDMA WRITE, one 1 MiB RDMA READ and one 4 KiB
// SEND, each checked byte for byte, so the benchmarks time a working data path.
bool verify_data() {
  Side& a = g.a;
  Side& b = g.b;
  auto run = [&](ibv_wr_opcode op, uint32_t len) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf.data()), len, a.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf.data());
    wr.wr.rdma.rkey = b.mr->rkey;
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(a.qp, &wr, &bad)) {
      health.error = std::string("data check: ibv_post_send: ") + std::strerror(rc);
      return false;
    }
    uint64_t sent = 0, received = 0;
    const uint64_t want_recv = op == IBV_WR_SEND ? 1 : 0;
    std::string err;
    auto start = std::chrono::steady_clock::now();
    while (sent < 1 || received < want_recv) {
      if (!poll(a.cq, sent, err) || !poll(b.cq, received, err)) {
        health.error = "data check: " + err;
        return false;
      }
      if (std::chrono::steady_clock::now() - start > kStallLimit) {
        health.error = "data check: no completion in 10 s";
        return false;
      }
    }
    if (op == IBV_WR_SEND) --b.posted_recvs;
    return true;
  };
  auto fill = [](std::vector<uint8_t>& v, uint32_t seed) {
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<uint8_t>((i * 131 + seed) ^ (i >> 12));
  };
  fill(a.buf, 7);
  std::fill(b.buf.begin(), b.buf.end(), 0);
  if (!run(IBV_WR_RDMA_WRITE, kBufBytes)) return false;
  if (b.buf != a.buf) {
    health.error = "data check: a 1 MiB RDMA WRITE delivered wrong data";
    return false;
  }
  fill(b.buf, 99);
  std::fill(a.buf.begin(), a.buf.end(), 0);
  if (!run(IBV_WR_RDMA_READ, kBufBytes)) return false;
  if (a.buf != b.buf) {
    health.error = "data check: a 1 MiB RDMA READ returned wrong data";
    return false;
  }
  fill(a.buf, 33);
  std::fill(b.buf.begin(), b.buf.end(), 0);
  if (!post_recvs(b, 1, 4096) || !run(IBV_WR_SEND, 4096)) return false;
  if (std::memcmp(a.buf.data(), b.buf.data(), 4096) != 0 || b.buf[4096] != 0) {
    health.error = "data check: a 4 KiB SEND delivered wrong data";
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------

// One 8-byte RC SEND round: ibv_post_send, then polling until the send
// completion (which needs the responder's ACK) and the receive completion.
// Arg 0: the benchmark thread polls both CQs (everything inline).
// Arg 1: it polls only the sender's CQ; the responder's side runs on the
// engine's progress thread (a cross-thread wake-up per request).
void BM_RcSendRound8B(benchmark::State& state) {
  if (!usable(state)) return;
  const bool poll_receiver = state.range(0) == 0;
  state.SetLabel(poll_receiver ? "poll both CQs" : "poll sender CQ only");
  Side& a = g.a;
  Side& b = g.b;
  if (b.posted_recvs < kMaxRecvWr && !post_recvs(b, kMaxRecvWr - b.posted_recvs, 64)) {
    stop(state, "ibv_post_recv failed");
    return;
  }
  ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf.data()), 8, a.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  std::string err;
  const std::clock_t cpu_start = std::clock();
  for (auto _ : state) {
    ibv_send_wr* bad = nullptr;
    if (int rc = ibv_post_send(a.qp, &wr, &bad)) {
      stop(state, std::string("ibv_post_send: ") + std::strerror(rc));
      return;
    }
    uint64_t sent = 0, received = 0;
    auto start = std::chrono::steady_clock::now();
    size_t spins = 0;
    while (sent == 0 || (poll_receiver && received == 0)) {
      if (!poll(a.cq, sent, err) || (poll_receiver && !poll(b.cq, received, err))) {
        stop(state, err);
        return;
      }
      if ((++spins & 1023) == 0 && std::chrono::steady_clock::now() - start > kStallLimit) {
        stop(state, "stalled: an 8-byte send did not complete in 10 s");
        return;
      }
    }
    if (!poll_receiver) {
      // The ACK follows the receive completion, so it is already queued.
      while (received == 0) {
        if (!poll(b.cq, received, err)) {
          stop(state, err);
          return;
        }
        if (std::chrono::steady_clock::now() - start > kStallLimit) {
          stop(state, "stalled: receive completion missing after the send completed");
          return;
        }
      }
    }
    --b.posted_recvs;
    if (b.posted_recvs < kMaxRecvWr / 2 && !post_recvs(b, kMaxRecvWr - b.posted_recvs, 64)) {
      stop(state, "ibv_post_recv failed");
      return;
    }
  }
  // As stream()'s: the process's CPU time per round (the CSV output needs
  // every benchmark to report the same counters).
  state.counters["cpu_ns_per_wr"] = 1e9 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC /
                                    static_cast<double>(std::max<int64_t>(1, state.iterations()));
}
BENCHMARK(BM_RcSendRound8B)->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMicrosecond);

// In-process message rate: 64-byte inline SENDs, `window` outstanding, every one
// signaled. items/s = send completions per second.
void BM_MsgRate64B(benchmark::State& state) {
  if (!usable(state)) return;
  const uint32_t window = static_cast<uint32_t>(state.range(0));
  uint64_t done = stream(state, g.a, g.b, IBV_WR_SEND, 64, window, true);
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetLabel("window " + std::to_string(window));
}
BENCHMARK(BM_MsgRate64B)->Arg(16)->Arg(64)->UseRealTime();

// In-process RDMA WRITE bandwidth by message size (bytes/s of payload).
void BM_WriteBw(benchmark::State& state) {
  if (!usable(state)) return;
  const auto size = static_cast<uint32_t>(state.range(0));
  uint64_t done = stream(state, g.a, g.b, IBV_WR_RDMA_WRITE, size, 32, true);
  state.SetBytesProcessed(static_cast<int64_t>(done * size));
  state.SetItemsProcessed(static_cast<int64_t>(done));
}
BENCHMARK(BM_WriteBw)->RangeMultiplier(4)->Range(64, 1 << 20)->UseRealTime();

// In-process RDMA READ bandwidth by message size; the window is the QP's
// max_rd_atomic (reads in flight).
void BM_ReadBw(benchmark::State& state) {
  if (!usable(state)) return;
  const auto size = static_cast<uint32_t>(state.range(0));
  uint64_t done = stream(state, g.a, g.b, IBV_WR_RDMA_READ, size, g.max_rd_atomic, true);
  state.SetBytesProcessed(static_cast<int64_t>(done * size));
  state.SetItemsProcessed(static_cast<int64_t>(done));
}
BENCHMARK(BM_ReadBw)->RangeMultiplier(4)->Range(64, 1 << 20)->UseRealTime();

// The cost of one work request against how many are outstanding: 64-byte RDMA
// WRITEs, every one signaled, with `window` (1 ... 4096) posted and not yet
// completed, on the deep pair. The time per item should not grow with the
// window: no step of the engine walks the outstanding work requests.
void BM_OutstandingWr(benchmark::State& state) {
  if (!usable(state)) return;
  const auto window = static_cast<uint32_t>(state.range(0));
  uint64_t done = stream(state, g.deep_a, g.deep_b, IBV_WR_RDMA_WRITE, 64, window, true);
  state.SetItemsProcessed(static_cast<int64_t>(done));
  state.SetLabel("outstanding " + std::to_string(window));
}
BENCHMARK(BM_OutstandingWr)->RangeMultiplier(4)->Range(1, kDeepSendWr)->UseRealTime();

// The in-process message rate with batching on every verb, from a to b:
// 64-byte inline RC SENDs posted as lists of kBatch work requests per
// ibv_post_send (a new list whenever kBatch have completed), up to `window`
// outstanding, completions polled kBatch at a time on both CQs, receives
// reposted as lists of kBatch. Returns the send completions while the state
// loop ran; sets cpu_ns_per_wr as stream() does, the process's CPU time shared
// out over the work requests of all the benchmark's threads.
uint64_t batch_rate(benchmark::State& state, Side& a, Side& b, uint32_t window) {
  constexpr uint32_t kBatch = 32;
  constexpr uint32_t kSize = 64;
  if (b.posted_recvs < kMaxRecvWr && !post_recvs(b, kMaxRecvWr - b.posted_recvs, kSize)) {
    stop(state, "ibv_post_recv failed");
    return 0;
  }
  std::vector<ibv_send_wr> wrs(kBatch);
  ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf.data()), kSize, a.mr->lkey};
  for (uint32_t i = 0; i < kBatch; ++i) {
    wrs[i] = {};
    wrs[i].wr_id = i;
    wrs[i].sg_list = &sge;
    wrs[i].num_sge = 1;
    wrs[i].opcode = IBV_WR_SEND;
    wrs[i].send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
    wrs[i].next = i + 1 < kBatch ? &wrs[i + 1] : nullptr;
  }
  auto poll_batch = [](ibv_cq* cq, uint64_t& done, std::string& err) {
    ibv_wc wc[kBatch];
    const int n = ibv_poll_cq(cq, kBatch, wc);
    if (n < 0) {
      err = "ibv_poll_cq failed";
      return false;
    }
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        err = std::string("completion error: ") + ibv_wc_status_str(wc[i].status);
        return false;
      }
    }
    done += static_cast<uint64_t>(n);
    return true;
  };
  uint64_t posted = 0, completed = 0, received = 0;
  std::string err;
  bool ok = true;
  const std::clock_t cpu_start = std::clock();
  auto last_progress = std::chrono::steady_clock::now();
  uint64_t last_completed = 0;
  size_t spins = 0;
  for (auto _ : state) {
    while (posted - completed + kBatch <= window) {
      ibv_send_wr* bad = nullptr;
      if (int rc = ibv_post_send(a.qp, wrs.data(), &bad)) {
        stop(state, std::string("ibv_post_send: ") + std::strerror(rc));
        ok = false;
        break;
      }
      posted += kBatch;
    }
    const uint64_t before = received;
    if (!ok || !poll_batch(a.cq, completed, err) || !poll_batch(b.cq, received, err)) {
      if (ok) stop(state, err);
      ok = false;
      break;
    }
    b.posted_recvs -= static_cast<uint32_t>(received - before);
    if (kMaxRecvWr - b.posted_recvs >= kBatch && !post_recvs(b, kBatch, kSize)) {
      stop(state, "ibv_post_recv failed");
      ok = false;
      break;
    }
    if ((++spins & 1023) == 0) {
      auto now = std::chrono::steady_clock::now();
      if (completed != last_completed) {
        last_completed = completed;
        last_progress = now;
      } else if (now - last_progress > kStallLimit) {
        stop(state, "stalled: no completion for 10 s");
        ok = false;
        break;
      }
    }
  }
  const uint64_t done = completed;
  // Drain what is outstanding, so the next benchmark starts clean.
  auto start = std::chrono::steady_clock::now();
  while (ok && (completed < posted || received < completed)) {
    const uint64_t before = received;
    if (!poll_batch(a.cq, completed, err) || !poll_batch(b.cq, received, err)) {
      stop(state, err);
      ok = false;
      break;
    }
    b.posted_recvs -= static_cast<uint32_t>(received - before);
    if (std::chrono::steady_clock::now() - start > kStallLimit) {
      stop(state, "stalled while draining");
      ok = false;
      break;
    }
  }
  // Each thread sees the whole process's CPU time over the same span (the
  // threads start and stop the state loop together): each reports its work
  // requests per nanosecond of it, the threads' figures are summed and the sum
  // inverted, so the counter is the process's CPU time per work request of any
  // thread however unevenly the threads shared the work.
  const double cpu_ns = 1e9 * static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  state.counters["cpu_ns_per_wr"] =
      benchmark::Counter(static_cast<double>(posted) / std::max(1.0, cpu_ns), benchmark::Counter::kInvert);
  return done;
}

// The in-process message rate with batching on every verb (batch_rate), one
// thread and one QP pair. items/s = send completions per second.
void BM_MsgRate64BBatch(benchmark::State& state) {
  if (!usable(state)) return;
  const auto window = static_cast<uint32_t>(state.range(0));
  state.SetItemsProcessed(static_cast<int64_t>(batch_rate(state, g.a, g.b, window)));
  state.SetLabel("lists of 32, window " + std::to_string(window));
}
BENCHMARK(BM_MsgRate64BBatch)->Arg(128)->Arg(512)->UseRealTime();

// The same with T threads, each driving a QP pair of its own (own contexts, CQs
// and buffers) between the same two devices: what the engine's message rate
// is across cores, as a NIC's is quoted over QPs and cores. items/s = the send
// completions of all threads per second of wall-clock time.
void BM_MsgRate64BThreads(benchmark::State& state) {
  if (!usable(state)) return;
  const int t = state.thread_index();
  const auto window = static_cast<uint32_t>(state.range(0));
  state.SetItemsProcessed(static_cast<int64_t>(batch_rate(state, g.thread_a[t], g.thread_b[t], window)));
  state.SetLabel(std::to_string(state.threads()) + (state.threads() == 1 ? " thread" : " threads") +
                 ", a QP pair each, lists of 32, window " + std::to_string(window));
}
BENCHMARK(BM_MsgRate64BThreads)->Arg(512)->Threads(1)->Threads(kMaxThreads)->UseRealTime();

}  // namespace

int main(int argc, char** argv) {
  return softverbs::bench::run_main(argc, argv, "engine_bench", setup, verify_data, teardown);
}
