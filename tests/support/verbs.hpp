// Owners for verbs objects, for every test suite and benchmark. Only the public
// verbs API is used (no softverbs header), so that code built on this kit runs
// against any libibverbs device: the conformance suite depends on that.
#pragma once

#include <infiniband/verbs.h>

#include <string>
#include <utility>

namespace softverbs::testkit {

// What an owner does when the destroy verb fails at scope exit: nothing by
// default (a test that must see the failure calls destroy() itself, or uses a
// Check that reports it, see tests/support/gtest.hpp).
struct NoCheck {
  static void destroy_failed(int /*rc*/) {}
};

// Owns one verbs object and destroys it when going out of scope. destroy() lets
// a test check the destroy call itself; on failure ownership is kept so that the
// object is destroyed again at scope exit (after the test removed the blocker).
template <class T, auto Destroy, class Check = NoCheck>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T* p) : p_(p) {}
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  Owned(Owned&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  ~Owned() { reset(); }

  T* get() const { return p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  T* release() { return std::exchange(p_, nullptr); }

  void reset(T* p = nullptr) {
    if (p_) {
      int rc = Destroy(p_);
      if (rc != 0) Check::destroy_failed(rc);
    }
    p_ = p;
  }

  // Calls the destroy verb and returns its result.
  int destroy() {
    int rc = Destroy(p_);
    if (rc == 0) p_ = nullptr;
    return rc;
  }

 private:
  T* p_ = nullptr;
};

// The owner types of every verbs object, for one Check.
template <class Check>
struct Objects {
  using Context = Owned<ibv_context, &ibv_close_device, Check>;
  using Pd = Owned<ibv_pd, &ibv_dealloc_pd, Check>;
  using Mr = Owned<ibv_mr, &ibv_dereg_mr, Check>;
  using Channel = Owned<ibv_comp_channel, &ibv_destroy_comp_channel, Check>;
  using Cq = Owned<ibv_cq, &ibv_destroy_cq, Check>;
  using Srq = Owned<ibv_srq, &ibv_destroy_srq, Check>;
  using Qp = Owned<ibv_qp, &ibv_destroy_qp, Check>;
  using Ah = Owned<ibv_ah, &ibv_destroy_ah, Check>;
};

using Context = Objects<NoCheck>::Context;
using Pd = Objects<NoCheck>::Pd;
using Mr = Objects<NoCheck>::Mr;
using Channel = Objects<NoCheck>::Channel;
using Cq = Objects<NoCheck>::Cq;
using Srq = Objects<NoCheck>::Srq;
using Qp = Objects<NoCheck>::Qp;
using Ah = Objects<NoCheck>::Ah;

// The list ibv_get_device_list() returns, freed at scope exit.
class DeviceList {
 public:
  DeviceList() : list_(ibv_get_device_list(&n_)) {
    if (!list_) n_ = 0;
  }
  DeviceList(const DeviceList&) = delete;
  DeviceList& operator=(const DeviceList&) = delete;
  ~DeviceList() {
    if (list_) ibv_free_device_list(list_);
  }

  explicit operator bool() const { return list_ != nullptr; }
  int size() const { return n_; }
  ibv_device* operator[](int i) const { return list_[i]; }
  std::string name(int i) const { return ibv_get_device_name(list_[i]); }
  // The device of that name, or null.
  ibv_device* find(const std::string& name) const {
    for (int i = 0; i < n_; ++i)
      if (name == ibv_get_device_name(list_[i])) return list_[i];
    return nullptr;
  }

 private:
  int n_ = 0;
  ibv_device** list_ = nullptr;
};

// Capabilities and queues of a QP, for qp_init_attr().
struct QpShape {
  ibv_qp_type type = IBV_QPT_RC;
  uint32_t max_send_wr = 16;
  uint32_t max_recv_wr = 16;
  uint32_t max_send_sge = 1;
  uint32_t max_recv_sge = 1;
  uint32_t max_inline_data = 0;
  int sq_sig_all = 0;
};

inline ibv_qp_init_attr qp_init_attr(const QpShape& s, ibv_cq* scq, ibv_cq* rcq, ibv_srq* srq = nullptr) {
  ibv_qp_init_attr a{};
  a.qp_type = s.type;
  a.send_cq = scq;
  a.recv_cq = rcq;
  a.srq = srq;
  a.cap.max_send_wr = s.max_send_wr;
  a.cap.max_recv_wr = s.max_recv_wr;
  a.cap.max_send_sge = s.max_send_sge;
  a.cap.max_recv_sge = s.max_recv_sge;
  a.cap.max_inline_data = s.max_inline_data;
  a.sq_sig_all = s.sq_sig_all;
  return a;
}

// An SRQ of max_wr receives of max_sge entries on pd, or null (errno set).
inline ibv_srq* create_srq(ibv_pd* pd, uint32_t max_wr, uint32_t max_sge = 1) {
  ibv_srq_init_attr a{};
  a.attr.max_wr = max_wr;
  a.attr.max_sge = max_sge;
  return ibv_create_srq(pd, &a);
}

}  // namespace softverbs::testkit
