// One side of the two-process RC tests in soak_test.cpp: a plain program, run twice
// by the test, each time with its own emulated device (SOFTVERBS_DEVICES). The two
// processes exchange their queue pair numbers, PSNs, GIDs, addresses and rkeys
// through a socketpair the test hands them (--fd); data only ever travels over RDMA.
//
//   soak_peer --role=soak --side=0|1 --fd=N --ops=N [--limit-s=S] [--stall-s=S]
//             [--drop=P --dup=P --reorder=P --fault-seed=N] [--timeout=T] [--credits=0]
//     Both sides run the same mix of RC operations against each other (SEND, RDMA
//     WRITE, RDMA WRITE with immediate, RDMA READ, FETCH_AND_ADD, CMP_AND_SWAP) with
//     the fault layer of this process dropping, duplicating and reordering the
//     packets its device sends. Checks every completion (status, order, opcode),
//     every received message (order, length, immediate, contents), every READ's
//     data, every atomic's returned value and the final atomic words. --credits=0
//     lets a side send without knowing that the peer has a receive posted.
//
//   soak_peer --role=victim --fd=N
//     Connects, posts receives and waits: the survivor kills it with SIGKILL.
//
//   soak_peer --role=survivor --fd=N --peer-pid=PID
//     Connects with timeout 12 and retry_cnt 3, starts large transfers, kills the
//     victim once the first of them completed, posts more, and checks that the
//     oldest unacknowledged request fails with IBV_WC_RETRY_EXC_ERR, everything
//     after it is flushed, the QP is in the error state, and the time this took.
//
//   soak_peer --role=rnr-sender --fd=N / --role=rnr-receiver --fd=N
//     Two SENDs to a receiver that posts its receives late (see run_rnr_sender).
//
//   soak_peer --role=lost-requester --fd=N / --role=lost-responder --fd=N
//     A FETCH_AND_ADD whose response is lost twice, during go-back-N rounds that each
//     end in a PSN sequence NAK (see run_lost_requester).
//
// Exit status 0 when every check passed; otherwise a line starting with "FAIL" on
// stderr says what went wrong. The last line on stdout is a summary of key=value
// pairs that the test reads.
//
// The roles live in peer_soak.cpp (soak) and peer_failures.cpp (the others); what
// they share, in peer.hpp and peer_common.cpp.
#include "tests/soak/peer.hpp"

#include <fcntl.h>

#include <string>

int main(int argc, char** argv) {
  using namespace soak_peer;
  parse_args(argc, argv);
  const int fd = static_cast<int>(arg_u64("fd", 3));
  CHECK(::fcntl(fd, F_GETFD) >= 0, "--fd=%d is not an open file descriptor", fd);
  const std::string role = arg("role");
  if (role == "soak") return run_soak(fd);
  if (role == "victim") return run_victim(fd);
  if (role == "survivor") return run_survivor(fd);
  if (role == "rnr-sender") return run_rnr_sender(fd);
  if (role == "rnr-receiver") return run_rnr_receiver(fd);
  if (role == "lost-requester") return run_lost_requester(fd);
  if (role == "lost-responder") return run_lost_responder(fd);
  fail("--role=soak|victim|survivor|rnr-sender|rnr-receiver|lost-requester|lost-responder is required (got '%s')",
       role.c_str());
}
