/* softverbs control API: fault injection and transport counters.
 *
 * Exported by softverbs' libibverbs.so.1 under the version node SOFTVERBS_0.1,
 * next to rdma-core's own symbols. A test links against the library (or looks the
 * functions up with dlsym) and drives the fault layer of the emulated devices of
 * its own process. The scenario format is described in docs/faults.md; the same
 * text can be given in SOFTVERBS_FAULTS (a file) for unmodified programs. */
#ifndef SOFTVERBS_FAULTS_H
#define SOFTVERBS_FAULTS_H

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Adds the rules of a scenario given as TOML text. Returns 0, or -1 with errno
 * EINVAL and a message in err (if err is not NULL) when the text is malformed;
 * then no rule is added. */
int softverbs_faults_load(const char* toml_text, char* err, size_t err_len);
/* The same, from a file. */
int softverbs_faults_load_file(const char* path, char* err, size_t err_len);
/* Removes every rule. */
void softverbs_faults_clear(void);
/* Sets the seed of the rules' random streams (and restarts them). */
void softverbs_faults_seed(uint64_t seed);
/* Logs every decision to this file ("" or NULL stops). Returns 0 or -1/errno. */
int softverbs_faults_log(const char* path);
/* How many times the named rule fired. */
uint64_t softverbs_fault_hits(const char* rule_name);

/* What an emulated device's transport did. Fields are only ever added at the end;
 * pass sizeof(struct softverbs_counters). */
struct softverbs_counters {
  uint64_t tx_packets;
  uint64_t rx_packets;
  uint64_t rx_icrc_errors; /* dropped: ICRC mismatch (corrupted) */
  uint64_t rx_malformed;   /* dropped: not a valid RoCEv2 packet */
  uint64_t rx_unknown_qp;  /* dropped: no such QP */
  uint64_t rx_dropped;     /* dropped: wrong transport for the QP */
  uint64_t retransmits;    /* go-back-N restarts by requesters */
  uint64_t timeouts;       /* local ACK timeouts */
  uint64_t naks_sent;
  uint64_t naks_received;
  uint64_t rnr_naks_sent;
  uint64_t rnr_naks_received;
  uint64_t duplicates; /* duplicate requests and responses seen */
  uint64_t faults_dropped;
  uint64_t faults_duplicated;
  uint64_t faults_corrupted;
  uint64_t faults_delayed;
  uint64_t faults_reordered;
  uint64_t faults_naks_forged;
  uint64_t port_down_drops; /* packets lost because the port was down */
  uint64_t faults_verbs;    /* verb-level and timed fault actions carried out */
  /* The values behind the sysfs port counters (docs/compatibility.md, "Counters"). */
  uint64_t tx_bytes;            /* octets of the IPv4 datagrams sent (IP and UDP headers, BTH .. ICRC) */
  uint64_t rx_bytes;            /* ... and received */
  uint64_t tx_multicast;        /* packets sent to a multicast group */
  uint64_t rx_multicast;        /* packets received for DestQP 0xFFFFFF */
  uint64_t host_drops;          /* packets for a device of another process that stayed full */
  uint64_t link_downed;         /* times the port went down */
  uint64_t dup_requests;        /* duplicate requests the responder answered again */
  uint64_t out_of_seq_requests; /* requests the responder found out of sequence */
  uint64_t seq_naks_received;   /* PSN sequence error NAKs the requester received */
  uint64_t retry_exceeded;      /* send work requests failed with IBV_WC_RETRY_EXC_ERR */
  uint64_t rnr_retry_exceeded;  /* ... with IBV_WC_RNR_RETRY_EXC_ERR */
  uint64_t sends_completed;     /* send work requests completed successfully, signaled or not */
  uint64_t recvs_completed;     /* receive work requests completed successfully */
  uint64_t topology_loss_drops; /* packets sent that a link of the simulated fabric lost (SOFTVERBS_TOPOLOGY) */
  uint64_t topology_mtu_drops;  /* ... that were larger than its MTU */
  /* Of rx_packets: those a device of this process handed over without packet bytes
   * (the in-process fast path, docs/architecture.md "Progress, threads and speed"). */
  uint64_t rx_direct;
};

/* Fills *out (at most size bytes) for the emulated device of that name.
 * Returns 0, or -1 with errno ENODEV. */
int softverbs_device_counters(const char* device_name, struct softverbs_counters* out, size_t size);

/* Direct actions on emulated devices, the same as the scenario actions of the
 * same names (docs/faults.md). Each returns 0, or -1 with errno: ENODEV (no
 * emulated device of that name, or the object is not on an emulated device),
 * EINVAL (bad port or event). */

/* port_down / port_up: the port's state changes (ibv_query_port shows it), every
 * open context of the device gets IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE,
 * and while down the device sends and receives nothing. */
int softverbs_port_set_state(const char* device_name, uint8_t port_num, int active);
/* device_fatal: IBV_EVENT_DEVICE_FATAL on every open context, port down, every QP
 * in the error state (outstanding work flushed); creating resources fails with EIO
 * from then on. */
int softverbs_device_fatal(const char* device_name);
/* qp_error: the QP moves to the error state, its work requests are flushed and
 * IBV_EVENT_QP_FATAL is raised. */
int softverbs_qp_force_error(struct ibv_qp* qp);
/* Raises any async event on the context of ev's element: the caller fills
 * event_type and the element (qp, cq, srq, port_num; nothing for DEVICE_FATAL).
 * Port and device events go to every open context of the device. Only the event is
 * raised: no state changes (use the functions above for that). */
int softverbs_raise_async_event(struct ibv_context* context, const struct ibv_async_event* ev);

#ifdef __cplusplus
}
#endif

#endif
