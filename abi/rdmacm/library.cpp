// The library-level exports of librdmacm.so.1: what rdma-core 44's librdmacm
// does itself, without its kernel CM, here over the CmProvider methods
// (core/cm_provider.hpp lists them): the event strings, the port getters, and
// rdma_create_qp/rdma_create_srq/rdma_join_multicast, which librdmacm/cma.c
// implements as its _ex forms with repacked arguments.
#include <endian.h>
#include <infiniband/ib.h>

#include <cstddef>
#include <cstring>

#include "abi/rdmacm/dispatch.hpp"

using softverbs::CmProvider;
using softverbs::abi::guarded;
namespace cm = softverbs::abi::cm;

// The names of rdma-core 44's table (cma.c, rdma_event_str), and its answer for
// any other value.
SV_EXPORT const char* rdma_event_str(enum rdma_cm_event_type event) {
  switch (event) {
    case RDMA_CM_EVENT_ADDR_RESOLVED:
      return "RDMA_CM_EVENT_ADDR_RESOLVED";
    case RDMA_CM_EVENT_ADDR_ERROR:
      return "RDMA_CM_EVENT_ADDR_ERROR";
    case RDMA_CM_EVENT_ROUTE_RESOLVED:
      return "RDMA_CM_EVENT_ROUTE_RESOLVED";
    case RDMA_CM_EVENT_ROUTE_ERROR:
      return "RDMA_CM_EVENT_ROUTE_ERROR";
    case RDMA_CM_EVENT_CONNECT_REQUEST:
      return "RDMA_CM_EVENT_CONNECT_REQUEST";
    case RDMA_CM_EVENT_CONNECT_RESPONSE:
      return "RDMA_CM_EVENT_CONNECT_RESPONSE";
    case RDMA_CM_EVENT_CONNECT_ERROR:
      return "RDMA_CM_EVENT_CONNECT_ERROR";
    case RDMA_CM_EVENT_UNREACHABLE:
      return "RDMA_CM_EVENT_UNREACHABLE";
    case RDMA_CM_EVENT_REJECTED:
      return "RDMA_CM_EVENT_REJECTED";
    case RDMA_CM_EVENT_ESTABLISHED:
      return "RDMA_CM_EVENT_ESTABLISHED";
    case RDMA_CM_EVENT_DISCONNECTED:
      return "RDMA_CM_EVENT_DISCONNECTED";
    case RDMA_CM_EVENT_DEVICE_REMOVAL:
      return "RDMA_CM_EVENT_DEVICE_REMOVAL";
    case RDMA_CM_EVENT_MULTICAST_JOIN:
      return "RDMA_CM_EVENT_MULTICAST_JOIN";
    case RDMA_CM_EVENT_MULTICAST_ERROR:
      return "RDMA_CM_EVENT_MULTICAST_ERROR";
    case RDMA_CM_EVENT_ADDR_CHANGE:
      return "RDMA_CM_EVENT_ADDR_CHANGE";
    case RDMA_CM_EVENT_TIMEWAIT_EXIT:
      return "RDMA_CM_EVENT_TIMEWAIT_EXIT";
  }
  return "UNKNOWN EVENT";
}

namespace {

// The port of a CM address in network order, as cma.c's ucma_get_port: the
// IP port, or for AF_IB the low 16 bits of the service id (the port of the
// RDMA_PS_* service id space, IBA Annex A11); 0 for anything else.
__be16 port_of(const sockaddr_storage& addr) {
  switch (addr.ss_family) {
    case AF_INET: {
      sockaddr_in in{};
      std::memcpy(&in, &addr, sizeof in);
      return in.sin_port;
    }
    case AF_INET6: {
      sockaddr_in6 in6{};
      std::memcpy(&in6, &addr, sizeof in6);
      return in6.sin6_port;
    }
    case AF_IB: {
      sockaddr_ib ib{};
      std::memcpy(&ib, &addr, sizeof ib);
      return htobe16(static_cast<uint16_t>(be64toh(ib.sib_sid)));
    }
    default:
      return 0;
  }
}

int fail(int err) {
  errno = err;
  return -1;
}

}  // namespace

// rdma-core reads any id's public route; a NULL id, which it would follow,
// has port 0 here.
SV_EXPORT __be16 rdma_get_src_port(struct rdma_cm_id* id) { return id ? port_of(id->route.addr.src_storage) : 0; }

SV_EXPORT __be16 rdma_get_dst_port(struct rdma_cm_id* id) { return id ? port_of(id->route.addr.dst_storage) : 0; }

// The plain attributes are the first members of the _ex ones, at the same
// offsets. comp_mask sits in the plain struct's tail padding, so it is set
// after the copy in, and the copy out (cma.c copies the same bytes) writes
// only padding there.
static_assert(offsetof(ibv_qp_init_attr_ex, sq_sig_all) == offsetof(ibv_qp_init_attr, sq_sig_all));
static_assert(offsetof(ibv_qp_init_attr_ex, comp_mask) >= offsetof(ibv_qp_init_attr, sq_sig_all) + sizeof(int));
static_assert(offsetof(ibv_srq_init_attr_ex, attr) == offsetof(ibv_srq_init_attr, attr));
static_assert(offsetof(ibv_srq_init_attr_ex, comp_mask) >= offsetof(ibv_srq_init_attr, attr) + sizeof(ibv_srq_attr));

// cma.c: the _ex attributes are the plain ones, with the PD given or else the
// id's (comp_mask PD only), through rdma_create_qp_ex (whose checks apply);
// what it changes (the capabilities, the CQs it made) is copied back.
SV_EXPORT int rdma_create_qp(struct rdma_cm_id* id, struct ibv_pd* pd, struct ibv_qp_init_attr* qp_init_attr) {
  return guarded(-1, [&]() -> int {
    CmProvider* p = cm::owner(id);
    if (!p || !qp_init_attr) return fail(EINVAL);
    ibv_qp_init_attr_ex ex{};
    std::memcpy(&ex, qp_init_attr, sizeof *qp_init_attr);
    ex.comp_mask = IBV_QP_INIT_ATTR_PD;
    ex.pd = pd ? pd : id->pd;
    const int rc = id->qp ? fail(EINVAL) : p->create_qp_ex(id, &ex);
    std::memcpy(qp_init_attr, &ex, sizeof *qp_init_attr);
    return rc;
  });
}

// cma.c: the SRQ type from the id's QP type (XRC for an XRC receive id, else
// basic) and the PD given (the provider takes the id's for NULL, as
// rdma_create_srq_ex does), through rdma_create_srq_ex.
SV_EXPORT int rdma_create_srq(struct rdma_cm_id* id, struct ibv_pd* pd, struct ibv_srq_init_attr* attr) {
  return guarded(-1, [&]() -> int {
    CmProvider* p = cm::owner(id);
    if (!p || !attr) return fail(EINVAL);
    ibv_srq_init_attr_ex ex{};
    std::memcpy(&ex, attr, sizeof *attr);
    ex.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD;
    ex.srq_type = id->qp_type == IBV_QPT_XRC_RECV ? IBV_SRQT_XRC : IBV_SRQT_BASIC;
    ex.pd = pd;
    const int rc = p->create_srq_ex(id, &ex);
    std::memcpy(attr, &ex, sizeof *attr);
    return rc;
  });
}

// cma.c: a full-member join of the address (after its own address check),
// which is what rdma_join_multicast_ex does with these attributes.
SV_EXPORT int rdma_join_multicast(struct rdma_cm_id* id, struct sockaddr* addr, void* context) {
  return guarded(-1, [&]() -> int {
    if (!cm::addrlen(addr)) return fail(EINVAL);
    CmProvider* p = cm::owner(id);
    if (!p) return fail(EINVAL);
    rdma_cm_join_mc_attr_ex attr{};
    attr.comp_mask = RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS;
    attr.join_flags = RDMA_MC_JOIN_FLAG_FULLMEMBER;
    attr.addr = addr;
    return p->join_multicast_ex(id, &attr, context);
  });
}
