// Names of verbs enumerations for messages: QP states and types, completion and
// work-request opcodes. Completion statuses and async events have their names in
// the verbs API itself (ibv_wc_status_str, ibv_event_type_str).
#pragma once

#include <infiniband/verbs.h>

namespace softverbs::testkit {

inline const char* qp_state_name(ibv_qp_state s) {
  switch (s) {
    case IBV_QPS_RESET:
      return "RESET";
    case IBV_QPS_INIT:
      return "INIT";
    case IBV_QPS_RTR:
      return "RTR";
    case IBV_QPS_RTS:
      return "RTS";
    case IBV_QPS_SQD:
      return "SQD";
    case IBV_QPS_SQE:
      return "SQE";
    case IBV_QPS_ERR:
      return "ERR";
    default:
      return "?";
  }
}

inline const char* qp_type_name(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC:
      return "RC";
    case IBV_QPT_UC:
      return "UC";
    case IBV_QPT_UD:
      return "UD";
    default:
      return "?";
  }
}

inline const char* wc_opcode_name(ibv_wc_opcode op) {
  switch (op) {
    case IBV_WC_SEND:
      return "SEND";
    case IBV_WC_RDMA_WRITE:
      return "RDMA_WRITE";
    case IBV_WC_RDMA_READ:
      return "RDMA_READ";
    case IBV_WC_COMP_SWAP:
      return "COMP_SWAP";
    case IBV_WC_FETCH_ADD:
      return "FETCH_ADD";
    case IBV_WC_BIND_MW:
      return "BIND_MW";
    case IBV_WC_LOCAL_INV:
      return "LOCAL_INV";
    case IBV_WC_RECV:
      return "RECV";
    case IBV_WC_RECV_RDMA_WITH_IMM:
      return "RECV_RDMA_WITH_IMM";
    default:
      return "?";
  }
}

}  // namespace softverbs::testkit
