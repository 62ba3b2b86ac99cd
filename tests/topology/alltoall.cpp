// All-to-all over the simulated fabric (docs/simulation.md, "A simulated
// fabric"): every device of the process is a node with one RC QP to each other
// node, and every node SENDs `rounds` messages of `bytes` to every other node.
// Prints the message count, the virtual time the exchange took (from the device
// clock before the first post, ibv_query_rt_values_ex, to the last completion's
// timestamp), the topology drops and retransmissions, and
// the wall time on a line of its own (the only line that changes from run to
// run under SOFTVERBS_CLOCK=virtual). Exit status 0 when every work request
// completed successfully.
//
//   topology_alltoall [BYTES [ROUNDS]]      (defaults: 4096 bytes, 1 round)
#include <softverbs/faults.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "tests/topology/fabric_nodes.hpp"

using namespace softverbs::topotest;

namespace {

// How long the exchange may take in wall time before the program gives up.
constexpr auto kWallLimit = std::chrono::seconds(120);

}  // namespace

int main(int argc, char** argv) {
  const uint32_t bytes = argc > 1 ? static_cast<uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 4096;
  const uint32_t rounds = argc > 2 ? static_cast<uint32_t>(std::strtoul(argv[2], nullptr, 10)) : 1;
  if (bytes == 0 || rounds == 0 || rounds > 64) {
    std::fprintf(stderr, "usage: %s [BYTES [ROUNDS (1..64)]]\n", argv[0]);
    return 2;
  }
  const auto wall0 = std::chrono::steady_clock::now();
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (!list || count < 2) {
    std::fprintf(stderr, "need at least 2 devices, have %d\n", count);
    return 2;
  }
  const size_t n = static_cast<size_t>(count);
  std::vector<std::unique_ptr<Node>> nodes;
  for (size_t i = 0; i < n; ++i) {
    nodes.push_back(std::make_unique<Node>());
    // One send and one receive completion per message to or from each peer;
    // the buffer holds one message per peer, received into and sent from.
    open_node(list[i], nodes.back().get(), static_cast<int>(2 * (n - 1) * rounds), (n - 1) * bytes);
  }
  // qp[i * n + j]: node i's QP to node j.
  std::vector<ibv_qp*> qp(n * n, nullptr);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      if (i != j) qp[i * n + j] = rc_qp(*nodes[i], rounds);
  softverbs::testkit::QpPath path;
  path.path_mtu = IBV_MTU_4096;
  for (size_t i = 0; i < n; ++i)
    for (size_t j = i + 1; j < n; ++j) connect_rc(*nodes[i], qp[i * n + j], *nodes[j], qp[j * n + i], path);
  const auto wall_connected = std::chrono::steady_clock::now();

  // The slot of peer j in node i's buffer.
  auto slot = [&](size_t i, size_t j) { return static_cast<uint32_t>((j < i ? j : j - 1) * bytes); };
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j)
      for (uint32_t r = 0; r < rounds && i != j; ++r)
        if (post_recv(qp[i * n + j], *nodes[i], j, slot(i, j), bytes)) die("ibv_post_recv");
  const uint64_t v0 = device_ns(nodes[0]->ctx);
  for (uint32_t r = 0; r < rounds; ++r)
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j)
        if (i != j && post_send(qp[i * n + j], *nodes[i], j, slot(i, j), bytes)) die("ibv_post_send");

  const uint64_t expected = 2ull * n * (n - 1) * rounds;  // sends and receives
  // The exchange ends at the last completion's timestamp: the program polls
  // the nodes' CQs in turn, and an empty poll lets virtual time move on while
  // another CQ holds completions, so the clock read after the loop may be
  // later (at the next ACK timer, which then finds nothing to do).
  uint64_t done = 0, failed = 0, last_ns = v0;
  while (done < expected && std::chrono::steady_clock::now() - wall0 < kWallLimit) {
    for (size_t i = 0; i < n; ++i) {
      ibv_poll_cq_attr pa{};
      int rc = ibv_start_poll(nodes[i]->cqx, &pa);
      if (rc == ENOENT) continue;
      if (rc) die("ibv_start_poll");
      do {
        ++done;
        last_ns = std::max(last_ns, ibv_wc_read_completion_wallclock_ns(nodes[i]->cqx));
        if (nodes[i]->cqx->status != IBV_WC_SUCCESS && failed++ < 5)
          std::fprintf(stderr, "%s: wr %" PRIu64 ": %s\n", nodes[i]->name.c_str(), nodes[i]->cqx->wr_id,
                       ibv_wc_status_str(nodes[i]->cqx->status));
      } while ((rc = ibv_next_poll(nodes[i]->cqx)) == 0);
      ibv_end_poll(nodes[i]->cqx);
      if (rc != ENOENT) die("ibv_next_poll");
    }
  }
  const uint64_t v1 = last_ns;
  const auto wall1 = std::chrono::steady_clock::now();

  uint64_t loss = 0, mtu = 0, retransmits = 0, timeouts = 0;
  for (const auto& node : nodes) {
    softverbs_counters c{};
    if (softverbs_device_counters(node->name.c_str(), &c, sizeof c) == 0) {
      loss += c.topology_loss_drops;
      mtu += c.topology_mtu_drops;
      retransmits += c.retransmits;
      timeouts += c.timeouts;
    }
  }
  const bool ok = done == expected && failed == 0;
  std::printf("nodes %zu, RC QPs %zu, messages %" PRIu64 " of %u bytes: %s\n", n, n * (n - 1),
              static_cast<uint64_t>(n * (n - 1) * rounds), bytes,
              ok                 ? "all completed"
              : done == expected ? "some failed"
                                 : "not all completed");
  std::printf("virtual time %" PRIu64 " ns, topology drops: loss %" PRIu64 ", mtu %" PRIu64 ", retransmits %" PRIu64
              ", timeouts %" PRIu64 "\n",
              v1 - v0, loss, mtu, retransmits, timeouts);
  std::printf("wall time %.3f s (setup %.3f s, exchange %.3f s)\n",
              std::chrono::duration<double>(wall1 - wall0).count(),
              std::chrono::duration<double>(wall_connected - wall0).count(),
              std::chrono::duration<double>(wall1 - wall_connected).count());
  for (ibv_qp* q : qp)
    if (q) ibv_destroy_qp(q);
  nodes.clear();
  ibv_free_device_list(list);
  return ok ? 0 : 1;
}
