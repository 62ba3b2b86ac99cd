// Automatic path migration of connected QPs (IBTA 17.2.8): the alternate path
// a consumer loads with IBV_QP_ALT_PATH, the migration state machine
// (MIGRATED -> REARM by the consumer, REARM -> ARMED by the BTH MigReq
// handshake, ARMED -> MIGRATED by the consumer or on a path failure), and the
// switch of the QP's addressing from the primary to the alternate path.
//
// The MigReq bit of every RC/UC packet a QP sends says where its state machine
// is: 1 while MIGRATED (also the state of a QP that never loaded an alternate
// path), 0 while REARM or ARMED. A QP in REARM that receives a packet with
// MigReq 0 knows its peer has rearmed too and becomes ARMED; an ARMED QP that
// receives a packet with MigReq 1 knows its peer has migrated and follows.
// Migration makes the alternate path the primary one (both then hold the same
// path, as after a migration on an HCA) and raises IBV_EVENT_PATH_MIG.
#include <cerrno>

#include "emu/objects/objects.hpp"
#include "emu/qp/qp.hpp"

namespace softverbs::emu {

int Qp::check_path_migration_locked(const ibv_qp_attr& attr, uint32_t mask, ibv_qp_state cur,
                                    ibv_qp_state next) {
  if (mask & IBV_QP_ALT_PATH) {
    // The alternate destination must be reachable by an emulated port, like
    // the primary one. The path MTU is the QP's for both paths (IBTA 17.2.8).
    in_addr alt{};
    if (!resolve_av(device(), attr.alt_ah_attr, &alt)) return EINVAL;
  }
  if (!(mask & IBV_QP_PATH_MIG_STATE)) return 0;
  const bool alt_path = alt_loaded_ || (mask & IBV_QP_ALT_PATH);
  switch (attr.path_mig_state) {
    case IBV_MIG_MIGRATED:
      // Migrating by request needs an armed QP that stays in RTS; anything
      // else is an immediate error (IBTA 17.2.8). MIGRATED on a QP already
      // there is no request at all: programs pass it at RTR->RTS to say
      // "no alternate path", and ConnectX accepts that.
      if (attr_.path_mig_state == IBV_MIG_MIGRATED) return 0;
      if (attr_.path_mig_state != IBV_MIG_ARMED || cur != IBV_QPS_RTS || next != IBV_QPS_RTS) return EINVAL;
      return 0;
    case IBV_MIG_REARM:
    case IBV_MIG_ARMED:
      // Arming without an alternate path would leave nowhere to migrate to.
      return alt_path ? 0 : EINVAL;
    default:
      return EINVAL;  // validate_qp_attr_values refuses other values first
  }
}

void Qp::apply_path_migration_locked(const ibv_qp_attr& attr, uint32_t mask) {
  if (mask & IBV_QP_ALT_PATH) {
    attr_.alt_ah_attr = attr.alt_ah_attr;
    attr_.alt_pkey_index = attr.alt_pkey_index;
    attr_.alt_port_num = attr.alt_port_num;
    attr_.alt_timeout = attr.alt_timeout;
    alt_loaded_ = true;
  }
  if (!(mask & IBV_QP_PATH_MIG_STATE)) return;
  switch (attr.path_mig_state) {
    case IBV_MIG_MIGRATED:
      if (attr_.path_mig_state == IBV_MIG_ARMED) migrate_locked();
      break;
    case IBV_MIG_REARM:
    case IBV_MIG_ARMED:
      // From here the QP sends MigReq 0 and waits for its peer's MigReq 0.
      // IBTA lets the consumer ask for REARM only; ARMED, which the ConnectX
      // drivers pass on too, is taken as the same request: arming without the
      // handshake would make a QP whose peer has not rearmed yet read the
      // peer's MigReq 1 as a migration.
      if (attr_.path_mig_state != IBV_MIG_ARMED) attr_.path_mig_state = IBV_MIG_REARM;
      break;
  }
}

void Qp::migrate_locked() {
  // The alternate path becomes the primary one; the alternate attributes stay
  // as they were, so both name the same path until a new one is loaded.
  attr_.ah_attr = attr_.alt_ah_attr;
  attr_.port_num = attr_.alt_port_num;
  attr_.pkey_index = attr_.alt_pkey_index;
  attr_.timeout = attr_.alt_timeout;
  attr_.path_mig_state = IBV_MIG_MIGRATED;
  alt_loaded_ = false;
  resolve_dest_locked();  // checked when the alternate path was loaded
  // The new path starts with the full retry budget.
  comp_.retry_left = attr_.retry_cnt;
  ibv_async_event ev{};
  ev.element.qp = ibv();
  ev.event_type = IBV_EVENT_PATH_MIG;
  context().post_async_event(ev);
}

bool Qp::migrate_on_path_failure_locked() {
  // The requester exhausted its retries on the primary path (IBTA 17.2.8: the
  // automatic trigger). Armed, the QP migrates and the caller retries on the
  // alternate path; with an alternate path loaded but not armed, migration is
  // not possible and the consumer is told so before the QP fails.
  if (attr_.path_mig_state == IBV_MIG_ARMED) {
    migrate_locked();
    return true;
  }
  if (alt_loaded_) {
    ibv_async_event ev{};
    ev.element.qp = ibv();
    ev.event_type = IBV_EVENT_PATH_MIG_ERR;
    context().post_async_event(ev);
  }
  return false;
}

void Qp::observe_migreq_locked(bool migreq) {
  if (attr_.path_mig_state == IBV_MIG_REARM && !migreq) {
    attr_.path_mig_state = IBV_MIG_ARMED;  // the peer has rearmed too
  } else if (attr_.path_mig_state == IBV_MIG_ARMED && migreq) {
    migrate_locked();  // the peer has migrated
  }
}

}  // namespace softverbs::emu
