// rsockets (rdma/rsocket.h) inside librdmacm.so.1: the state of one stream
// rsocket and the protocol it speaks (datagram rsockets: rs_dgram.hpp), shared by rs_conn.cpp (sockets,
// connection setup, teardown), rs_data.cpp (the data path, credits) and
// rs_poll.cpp (waiting, rpoll). Everything is built on the PUBLIC rdma_cm and
// verbs API (the exports of our own librdmacm.so.1 and libibverbs.so.1), so it
// runs over every CM provider, emu and hw alike.
//
// The protocol is rdma-core's (librdmacm/rsocket.c, version 1), so either end
// may be rdma-core's rsockets:
//  * Connection setup: the REQ and the REP carry RsConnData (40 bytes, its
//    numbers big-endian): the credits (receive WRs posted), the address and
//    rkey of the sender's 2-entry "target SGL" array (where the peer writes
//    buffer advertisements) and the first half of the receive buffer.
//  * Every message is an RDMA WRITE WITH IMMEDIATE; the 32-bit immediate is
//    op (bits 31..29) | data (28..0): DATA (payload length, written into the
//    advertised buffer), SGL (the credit limit: the receiver's sequence number
//    + its RQ size; when it also advertises a freed half of the receive
//    buffer, the write carries a 16-byte RsSge into the peer's target SGL),
//    IOMAP_SGL, CTRL (DISCONNECT 0, KEEPALIVE 1, SHUTDOWN 2).
//  * The receive buffer is used as a ring in two halves; the sender writes
//    into the advertised half at increasing offsets, never across it.
//  * Control messages use 4 send slots of their own (RS_QP_CTRL_SIZE); data
//    messages need a send WR, 2 KiB of send buffer (RS_SNDLOWAT), a credit
//    and room in the advertised half.
#pragma once

#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <sys/select.h>
#include <sys/socket.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

namespace softverbs::abi::rs {

// rdma-core's constants (rsocket.c).
inline constexpr uint32_t kOlapStart = 2048;     // RS_OLAP_START_SIZE
inline constexpr uint32_t kMaxTransfer = 65536;  // RS_MAX_TRANSFER
inline constexpr uint32_t kSndLowat = 2048;      // RS_SNDLOWAT
inline constexpr uint16_t kQpMinSize = 16;       // RS_QP_MIN_SIZE
inline constexpr uint16_t kQpMaxSize = 0xFFFE;   // RS_QP_MAX_SIZE
inline constexpr unsigned kQpCtrlSize = 4;       // RS_QP_CTRL_SIZE, a power of 2
inline constexpr int kConnRetries = 6;           // RS_CONN_RETRIES
inline constexpr int kSglSize = 2;               // RS_SGL_SIZE
inline constexpr uint16_t kDefInline = 64;
inline constexpr uint16_t kDefSqSize = 384;
inline constexpr uint16_t kDefRqSize = 384;
inline constexpr uint32_t kDefMem = 1 << 17;
inline constexpr uint32_t kDefWmem = 1 << 17;

enum Op : uint32_t { kOpData = 0, kOpWrite = 2, kOpSgl = 4, kOpIomapSgl = 6, kOpCtrl = 7 };
enum Ctrl : uint32_t { kCtrlDisconnect = 0, kCtrlKeepalive = 1, kCtrlShutdown = 2 };
constexpr uint32_t msg_set(uint32_t op, uint32_t data) { return (op << 29) | data; }
constexpr uint32_t msg_op(uint32_t imm) { return imm >> 29; }
constexpr uint32_t msg_data(uint32_t imm) { return imm & 0x1FFFFFFF; }
inline constexpr uint64_t kRecvFlag = uint64_t{1} << 63;  // wr_id of receives

// The wire structs (rdma-core's struct rs_sge, rs_iomap, rs_conn_data).
struct RsSge {
  uint64_t addr;
  uint32_t key;
  uint32_t length;
};
struct RsIomap {
  uint64_t offset;
  RsSge sge;
};
struct RsConnData {
  uint8_t version;   // 1
  uint8_t flags;     // kConnFlagNet: the sender's SGL updates are big-endian
  uint16_t credits;  // big-endian
  uint8_t reserved[3];
  uint8_t target_iomap_size;  // rs_value_to_scale(entries, 8)
  RsSge target_sgl;           // big-endian
  RsSge data_buf;             // big-endian
};
static_assert(sizeof(RsSge) == 16 && sizeof(RsIomap) == 24 && sizeof(RsConnData) == 40);
inline constexpr uint8_t kConnFlagNet = 1 << 0;
inline constexpr uint8_t kConnFlagIomap = 1 << 1;

// rdma-core's state bits: passive, connecting, connected, disconnected.
enum State : int {
  kInit = 0,
  kBound = 0x0001,
  kListening = 0x0002,
  kOpening = 0x0004,
  kResolvingAddr = kOpening | 0x0010,
  kResolvingRoute = kOpening | 0x0020,
  kConnecting = kOpening | 0x0040,
  kConnected = 0x0100,
  kWritable = 0x0200,
  kReadable = 0x0400,
  kConnectRdwr = kConnected | kReadable | kWritable,
  kConnectError = 0x0800,
  kDisconnected = 0x1000,
  kError = 0x2000,
};

// A connection request a listener has taken from its channel and not yet
// accepted (raccept); the event is acknowledged, its data kept here.
struct PendingRequest {
  rdma_cm_id* id;
  rdma_conn_param param;  // the request's, private data excluded
  RsConnData creq;
  bool valid;  // the private data was an rsocket's
};

struct Dgram;  // rs_dgram.hpp

struct Rsocket {
  std::mutex mu;
  std::shared_ptr<Dgram> dg;  // set for a datagram (SOCK_DGRAM) rsocket
  int index = -1;             // the descriptor: the fd of the socket's own CM channel
  int domain = AF_INET;
  rdma_event_channel* ch = nullptr;
  rdma_cm_id* id = nullptr;
  int state = kInit;
  int err = 0;  // SO_ERROR
  int fd_flags = 0;
  int retries = 0;
  sockaddr_storage dst{};
  uint64_t so_opts = 0, tcp_opts = 0, ipv6_opts = 0;
  unsigned keepalive_time = 0;
  std::vector<uint8_t> route;  // RDMA_ROUTE, used at the next connect

  uint32_t sbuf_size = kDefWmem, rbuf_size = kDefMem;
  uint16_t sq_size = kDefSqSize, rq_size = kDefRqSize, sq_inline = kDefInline;
  uint16_t target_iomap_size = 0;

  // Verbs objects, made when the connection is set up.
  ibv_pd* pd = nullptr;
  bool own_pd = false;
  ibv_comp_channel* cq_ch = nullptr;
  ibv_cq* cq = nullptr;
  bool cq_armed = false;
  bool cm_connected = false;  // the CM connection exists (disconnect at close)
  uint8_t* sbuf = nullptr;
  ibv_mr* smr = nullptr;
  uint8_t* rbuf = nullptr;
  ibv_mr* rmr = nullptr;
  uint8_t* target_list = nullptr;
  ibv_mr* target_mr = nullptr;
  volatile RsSge* target_sgl = nullptr;  // written by the peer's RDMA writes

  // Sequence numbers and credits (rdma-core's names).
  unsigned ctrl_seqno = 0, ctrl_max_seqno = kQpCtrlSize;
  uint16_t sseq_no = 0, sseq_comp = 0, rseq_no = 0, rseq_comp = 0;
  int remote_sge = 1;
  RsSge remote_sgl{}, remote_iomap{};
  bool swap_sgl = false;
  int target_sge = 0;
  int rbuf_bytes_avail = 0, rbuf_free_offset = 0, rbuf_offset = 0;
  uint32_t sbuf_bytes_avail = 0;
  ibv_sge ssgl[2]{};
  int sqe_avail = 0;
  struct RMsg {
    uint32_t op, data;
  };
  std::vector<RMsg> rmsg;  // rq_size + 1 entries, a ring
  int rmsg_head = 0, rmsg_tail = 0;

  std::deque<PendingRequest> pending;  // listeners only

  // riomap: the peer's target_iomap_size slots we may fill (mr == NULL: free),
  // the slots not yet advertised, mappings of ours the peer cannot write, and
  // the peer's advertised mappings (written by its RDMA writes).
  struct IoMapping {
    uint64_t offset = 0;
    ibv_mr* mr = nullptr;
  };
  std::vector<IoMapping> iomap_slots;
  std::deque<int> iomap_queue;
  std::vector<ibv_mr*> local_maps;
  volatile RsIomap* target_iomap = nullptr;
  unsigned iomap_updates = 0, iomap_seen = 0;  // IOMAP_SGL messages received
};

using RsPtr = std::shared_ptr<Rsocket>;

// ---- rs_conn.cpp ----
RsPtr lookup(int index);
void insert(const RsPtr& rs);
int create(int domain, int type, int protocol);
int bind(Rsocket& rs, const sockaddr* addr);
int listen(Rsocket& rs, int backlog);
int accept(const RsPtr& rs, sockaddr* addr, socklen_t* addrlen);
// Advances a connection being set up by the CM events waiting (blocking until
// it is set up when `block`); 0 once connected, else -1 with errno
// (EINPROGRESS while it goes on). Called with rs.mu held.
int do_connect(Rsocket& rs, std::unique_lock<std::mutex>& lk, bool block);
int connect(Rsocket& rs, const sockaddr* addr, socklen_t len);
// Handles the CM events waiting on a connected socket's channel (DISCONNECTED).
void process_cm(Rsocket& rs);
// Takes the connection requests waiting on a listener's channel.
void take_requests(Rsocket& rs);
int close(int index);

// ---- rs_data.cpp ----
int poll_cq(Rsocket& rs);
void update_credits(Rsocket& rs);
bool can_send(const Rsocket& rs);
bool have_rdata(const Rsocket& rs);
ssize_t recv(Rsocket& rs, std::unique_lock<std::mutex>& lk, void* buf, size_t len, int flags);
ssize_t sendv(Rsocket& rs, std::unique_lock<std::mutex>& lk, const iovec* iov, int iovcnt, int flags);
int shutdown(Rsocket& rs, std::unique_lock<std::mutex>& lk, int how);
int post_ctrl(Rsocket& rs, uint32_t msg);

// The send side's building blocks, shared with riowrite (rs_iomap.cpp).
int post_send(Rsocket& rs, ibv_send_wr& wr);
int post_write_msg(Rsocket& rs, ibv_sge* sgl, int nsge, uint32_t msg, int flags, uint64_t addr, uint32_t rkey);
uint32_t sbuf_left(const Rsocket& rs);
bool conn_can_send(const Rsocket& rs);
void copy_iov(uint8_t* dst, const iovec*& iov, size_t& offset, size_t len);
int stage(Rsocket& rs, const iovec*& cur, size_t& offset, uint32_t len);
void staged(Rsocket& rs, int nsge, uint32_t len);

// ---- rs_iomap.cpp ----
off_t iomap(Rsocket& rs, void* buf, size_t len, int prot, off_t offset);
int iounmap(Rsocket& rs, void* buf, size_t len);
// Advertises the queued mappings (before any data, as rdma-core does).
int send_iomaps(Rsocket& rs, std::unique_lock<std::mutex>& lk, int flags);
ssize_t iowrite(Rsocket& rs, std::unique_lock<std::mutex>& lk, const void* buf, size_t count, off_t offset, int flags);
void free_iomaps(Rsocket& rs);

// ---- rs_keepalive.cpp ----
// Starts (or re-times, or with !on stops) the socket's keepalives, every
// `seconds`. Called with rs->mu held.
int keepalive(const RsPtr& rs, bool on, unsigned seconds);

// ---- rs_poll.cpp ----
using Test = bool (*)(const Rsocket&);
// Processes completions until test(rs) holds; EWOULDBLOCK when `nonblock`
// and it does not; otherwise waits on the CQ and CM channels with rs.mu
// released. 0 or -1 with errno.
int get_comp(Rsocket& rs, std::unique_lock<std::mutex>& lk, bool nonblock, Test test);
// Takes every completion event waiting on the socket's CQ channel.
void drain_cq_events(Rsocket& rs);
bool nonblocking(const Rsocket& rs, int flags);
int poll(pollfd* fds, nfds_t nfds, int timeout);
int select(int nfds, fd_set* readfds, fd_set* writefds, fd_set* exceptfds, timeval* tv);

}  // namespace softverbs::abi::rs
