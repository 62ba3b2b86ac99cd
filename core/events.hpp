// Which object an async event is about (the member of ibv_async_event::element
// that is valid), in one place for every layer.
#pragma once

#include <infiniband/verbs.h>

namespace softverbs {

enum class EventElement { qp, cq, srq, wq, port, device };

constexpr EventElement event_element(ibv_event_type type) {
  switch (type) {
    case IBV_EVENT_CQ_ERR:
      return EventElement::cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return EventElement::qp;
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_SRQ_LIMIT_REACHED:
      return EventElement::srq;
    case IBV_EVENT_WQ_FATAL:
      return EventElement::wq;
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      return EventElement::port;
    default:
      return EventElement::device;  // IBV_EVENT_DEVICE_FATAL
  }
}

}  // namespace softverbs
