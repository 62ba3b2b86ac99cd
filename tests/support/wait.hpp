// Bounded waits on verbs objects: for completions, a descriptor becoming
// readable, an async event, a completion event. Every wait ends by its timeout at
// the latest, so that a missing event fails a test instead of hanging it; none
// of them sleeps for a fixed time. Public verbs API only.
#pragma once

#include <infiniband/verbs.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

namespace softverbs::testkit {

// Polls cq until n completions were collected or timeout_ms passed (a device may
// generate completions, flushed ones included, from another thread). Returns what
// was collected; a negative poll result ends the wait.
inline std::vector<ibv_wc> poll_completions(ibv_cq* cq, int n, int timeout_ms) {
  std::vector<ibv_wc> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  ibv_wc wc[16];
  while (static_cast<int>(out.size()) < n) {
    const int want = std::min(16, n - static_cast<int>(out.size()));
    const int got = ibv_poll_cq(cq, want, wc);
    if (got < 0) break;
    out.insert(out.end(), wc, wc + got);
    if (got == 0) {
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::yield();
    }
  }
  return out;
}

// One completion within timeout_ms into *wc; false on timeout or a poll error.
inline bool wait_wc(ibv_cq* cq, ibv_wc* wc, int timeout_ms) {
  std::vector<ibv_wc> got = poll_completions(cq, 1, timeout_ms);
  if (got.empty()) return false;
  *wc = got[0];
  return true;
}

// True if fd becomes readable within timeout_ms.
inline bool wait_readable(int fd, int timeout_ms) {
  pollfd p{};
  p.fd = fd;
  p.events = POLLIN;
  for (;;) {
    int n = ::poll(&p, 1, timeout_ms);
    if (n < 0 && errno == EINTR) continue;
    return n == 1 && (p.revents & POLLIN);
  }
}

// The next async event of ctx within timeout_ms into *ev, not yet acknowledged
// (the caller calls ibv_ack_async_event). False if none came.
inline bool next_async_event(ibv_context* ctx, ibv_async_event* ev, int timeout_ms) {
  if (!wait_readable(ctx->async_fd, timeout_ms)) return false;
  return ibv_get_async_event(ctx, ev) == 0;
}

// The next completion event of channel within timeout_ms, acknowledged; its CQ,
// or null if none came.
inline ibv_cq* next_cq_event(ibv_comp_channel* channel, int timeout_ms) {
  if (!wait_readable(channel->fd, timeout_ms)) return nullptr;
  ibv_cq* cq = nullptr;
  void* cq_context = nullptr;
  if (ibv_get_cq_event(channel, &cq, &cq_context) != 0) return nullptr;
  ibv_ack_cq_events(cq, 1);
  return cq;
}

}  // namespace softverbs::testkit
