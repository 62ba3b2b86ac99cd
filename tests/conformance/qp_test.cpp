// Queue pair creation, query and destruction.
#include <set>

#include "conformance.hpp"

namespace conformance {
namespace {

class QpTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(QpTest);

constexpr ibv_qp_type kTypes[] = {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD};

TEST_P(QpTest, CreateEachTypeWithSmallCaps) {
  Cq scq = make_cq();
  Cq rcq = make_cq();
  ASSERT_TRUE(scq && rcq);
  std::set<uint32_t> qpns;
  std::vector<Qp> qps;
  for (ibv_qp_type type : kTypes) {
    SCOPED_TRACE(qp_type_name(type));
    int tag = 0;
    ibv_qp_init_attr init{};
    init.qp_context = &tag;
    init.qp_type = type;
    init.send_cq = scq.get();
    init.recv_cq = rcq.get();
    init.cap.max_send_wr = 3;
    init.cap.max_recv_wr = 5;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 2;
    init.cap.max_inline_data = 16;
    init.sq_sig_all = 1;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    ASSERT_NE(qp, nullptr) << std::strerror(errno);
    qps.emplace_back(qp);
    observe(std::string("cap.") + qp_type_name(type),
            "send_wr=" + std::to_string(init.cap.max_send_wr) + " recv_wr=" + std::to_string(init.cap.max_recv_wr) +
                " send_sge=" + std::to_string(init.cap.max_send_sge) + " recv_sge=" +
                std::to_string(init.cap.max_recv_sge) + " inline=" + std::to_string(init.cap.max_inline_data));
    // The actual capabilities are written back, at least what was asked.
    EXPECT_GE(init.cap.max_send_wr, 3u);
    EXPECT_GE(init.cap.max_recv_wr, 5u);
    EXPECT_GE(init.cap.max_send_sge, 1u);
    EXPECT_GE(init.cap.max_recv_sge, 2u);
    EXPECT_GE(init.cap.max_inline_data, 16u);
    EXPECT_EQ(qp->context, ctx_);
    EXPECT_EQ(qp->qp_context, &tag);
    EXPECT_EQ(qp->pd, pd_);
    EXPECT_EQ(qp->send_cq, scq.get());
    EXPECT_EQ(qp->recv_cq, rcq.get());
    EXPECT_EQ(qp->srq, nullptr);
    EXPECT_EQ(qp->qp_type, type);
    EXPECT_EQ(qp->state, IBV_QPS_RESET);
    // QPN 0 and 1 are the special QPs; QPNs are 24 bits.
    EXPECT_GT(qp->qp_num, 1u);
    EXPECT_LE(qp->qp_num, 0xffffffu);
    EXPECT_TRUE(qpns.insert(qp->qp_num).second) << "QPN " << qp->qp_num << " handed out twice";
  }
}

TEST_P(QpTest, QueryReturnsTheCreationAttributes) {
  Cq scq = make_cq();
  Cq rcq = make_cq();
  ASSERT_TRUE(scq && rcq);
  for (ibv_qp_type type : kTypes) {
    SCOPED_TRACE(qp_type_name(type));
    int tag = 0;
    ibv_qp_init_attr init = qp_init_attr(type, scq.get());
    init.recv_cq = rcq.get();
    init.qp_context = &tag;
    init.sq_sig_all = 1;
    Qp qp = make_qp(init);
    ASSERT_TRUE(qp);
    ibv_qp_attr attr{};
    ibv_qp_init_attr q{};
    ASSERT_EQ(ibv_query_qp(qp.get(), &attr, IBV_QP_STATE | IBV_QP_CAP, &q), 0);
    EXPECT_EQ(attr.qp_state, IBV_QPS_RESET);
    EXPECT_EQ(q.qp_type, type);
    EXPECT_EQ(q.send_cq, scq.get());
    EXPECT_EQ(q.recv_cq, rcq.get());
    EXPECT_EQ(q.srq, nullptr);
    EXPECT_EQ(q.qp_context, &tag);
    EXPECT_EQ(q.sq_sig_all, 1);
    EXPECT_GE(q.cap.max_send_wr, init.cap.max_send_wr);
    EXPECT_GE(q.cap.max_recv_wr, init.cap.max_recv_wr);
    EXPECT_GE(q.cap.max_send_sge, init.cap.max_send_sge);
    EXPECT_GE(q.cap.max_recv_sge, init.cap.max_recv_sge);
    EXPECT_EQ(attr.cap.max_send_wr, q.cap.max_send_wr);
    EXPECT_EQ(attr.cap.max_recv_wr, q.cap.max_recv_wr);
  }
}

TEST_P(QpTest, QueryMatchesTheWrittenBackCaps) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq.get());
  init.cap.max_send_wr = 7;
  init.cap.max_recv_wr = 9;
  init.cap.max_inline_data = 32;
  ibv_qp* raw = ibv_create_qp(pd_, &init);
  ASSERT_NE(raw, nullptr) << std::strerror(errno);
  Qp qp(raw);
  ibv_qp_attr attr{};
  ibv_qp_init_attr q{};
  ASSERT_EQ(ibv_query_qp(qp.get(), &attr, IBV_QP_CAP, &q), 0);
  EXPECT_EQ(q.cap.max_send_wr, init.cap.max_send_wr);
  EXPECT_EQ(q.cap.max_recv_wr, init.cap.max_recv_wr);
  EXPECT_EQ(q.cap.max_send_sge, init.cap.max_send_sge);
  EXPECT_EQ(q.cap.max_recv_sge, init.cap.max_recv_sge);
  EXPECT_GE(q.cap.max_inline_data, 32u);
}

TEST_P(QpTest, CreateWithSrq) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  Srq srq(softverbs::testkit::create_srq(pd_, 8));
  ASSERT_TRUE(srq);
  for (ibv_qp_type type : {IBV_QPT_RC, IBV_QPT_UD}) {
    SCOPED_TRACE(qp_type_name(type));
    Qp qp = make_qp(type, cq.get(), srq.get());
    ASSERT_TRUE(qp);
    EXPECT_EQ(qp->srq, srq.get());
    ibv_qp_attr attr{};
    ibv_qp_init_attr q{};
    ASSERT_EQ(ibv_query_qp(qp.get(), &attr, IBV_QP_CAP, &q), 0);
    EXPECT_EQ(q.srq, srq.get());
    // Receives go to the SRQ: the QP has no receive queue of its own.
    EXPECT_EQ(q.cap.max_recv_wr, 0u);
  }
}

TEST_P(QpTest, CreateRejectsCapsAboveTheDeviceLimits) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  struct Case {
    const char* what;
    void (*apply)(ibv_qp_cap&, const ibv_device_attr&);
  };
  const Case cases[] = {
      {"max_send_wr", [](ibv_qp_cap& c, const ibv_device_attr& d) { c.max_send_wr = uint32_t(d.max_qp_wr) + 1; }},
      {"max_recv_wr", [](ibv_qp_cap& c, const ibv_device_attr& d) { c.max_recv_wr = uint32_t(d.max_qp_wr) + 1; }},
      {"max_send_sge", [](ibv_qp_cap& c, const ibv_device_attr& d) { c.max_send_sge = uint32_t(d.max_sge) + 1; }},
      {"max_recv_sge", [](ibv_qp_cap& c, const ibv_device_attr& d) { c.max_recv_sge = uint32_t(d.max_sge) + 1; }},
      {"max_inline_data", [](ibv_qp_cap& c, const ibv_device_attr&) { c.max_inline_data = 1u << 20; }},
  };
  for (ibv_qp_type type : kTypes) {
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(qp_type_name(type)) + " " + c.what);
      ibv_qp_init_attr init = qp_init_attr(type, cq.get());
      c.apply(init.cap, dattr_);
      errno = 0;
      ibv_qp* qp = ibv_create_qp(pd_, &init);
      EXPECT_EQ(qp, nullptr);
      EXPECT_EQ(errno, EINVAL);
      if (qp) ibv_destroy_qp(qp);
    }
  }
}

TEST_P(QpTest, CreateAtTheDeviceLimits) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  // (The send queue is left small: a send WQE may take several basic blocks,
  // so ConnectX holds fewer than max_qp_wr send requests of a given shape.)
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq.get());
  init.cap.max_recv_wr = static_cast<uint32_t>(dattr_.max_qp_wr);
  Qp a = make_qp(init);
  EXPECT_TRUE(a);
  init = qp_init_attr(IBV_QPT_RC, cq.get());
  init.cap.max_recv_sge = static_cast<uint32_t>(dattr_.max_sge);
  Qp b = make_qp(init);
  EXPECT_TRUE(b);
}

TEST_P(QpTest, CreateUnsupportedTypes) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  // An XRC target QP needs an XRC domain (ibv_create_qp_ex); a raw packet QP
  // needs the device and CAP_NET_RAW. Providers answer EINVAL or EOPNOTSUPP
  // for a type they cannot create this way (the kernel says EPERM for raw
  // packet QPs without privilege); a device that does create one is fine.
  for (ibv_qp_type type : {IBV_QPT_XRC_RECV, IBV_QPT_RAW_PACKET}) {
    SCOPED_TRACE("qp_type " + std::to_string(type));
    ibv_qp_init_attr init = qp_init_attr(type, cq.get());
    errno = 0;
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    observe(type == IBV_QPT_XRC_RECV ? "ibv_create_qp.XRC_RECV" : "ibv_create_qp.RAW_PACKET", outcome(qp));
    if (type == IBV_QPT_XRC_RECV) {
      EXPECT_EQ(qp, nullptr);
    }
    if (qp) {
      EXPECT_EQ(ibv_destroy_qp(qp), 0);
      continue;
    }
    EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL || (type == IBV_QPT_RAW_PACKET && errno == EPERM))
        << std::strerror(errno);
  }
  // A value that is no QP type at all.
  ibv_qp_init_attr init = qp_init_attr(static_cast<ibv_qp_type>(77), cq.get());
  errno = 0;
  ibv_qp* qp = ibv_create_qp(pd_, &init);
  observe("ibv_create_qp.type_77", outcome(qp));
  EXPECT_EQ(qp, nullptr);
  EXPECT_TRUE(errno == EOPNOTSUPP || errno == EINVAL) << std::strerror(errno);
  if (qp) ibv_destroy_qp(qp);
}

// ibv_create_qp_ex with creation flags in comp_mask and no flag set is a plain
// creation (ConnectX, and every provider that takes the extended form).
TEST_P(QpTest, CreateQpExWithZeroCreateFlags) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  for (ibv_qp_type type : kTypes) {
    SCOPED_TRACE(qp_type_name(type));
    const ibv_qp_init_attr base = qp_init_attr(type, cq.get());
    ibv_qp_init_attr_ex attr{};
    std::memcpy(&attr, &base, sizeof base);
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    attr.pd = pd_;
    attr.create_flags = 0;
    Qp qp(ibv_create_qp_ex(ctx_, &attr));
    ASSERT_TRUE(qp) << std::strerror(errno);
    EXPECT_EQ(qp->qp_type, type);
    EXPECT_EQ(qp->pd, pd_);
    EXPECT_EQ(qp->send_cq, cq.get());
    EXPECT_EQ(move_to(qp.get(), IBV_QPS_RTS), 0);
  }
}

// Creation flags the stack refuses, each with its errno: a bit libibverbs does
// not know, any flag on an RC or UC QP (the kernel's check_creation_flags), FCS
// scatter and VLAN stripping on a UD QP (raw packet QPs only), a source QPN on a
// QP that is not UD (mlx5).
TEST_P(QpTest, CreateQpExRefusesCreateFlags) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  struct Case {
    const char* what;
    ibv_qp_type type;
    uint32_t flags;
  };
  const Case cases[] = {
      {"unknown bit", IBV_QPT_UD, 1u << 20},
      {"SCATTER_FCS on RC", IBV_QPT_RC, IBV_QP_CREATE_SCATTER_FCS},
      {"BLOCK_SELF_MCAST_LB on RC", IBV_QPT_RC, IBV_QP_CREATE_BLOCK_SELF_MCAST_LB},
      {"PCI_WRITE_END_PADDING on UC", IBV_QPT_UC, IBV_QP_CREATE_PCI_WRITE_END_PADDING},
      {"SOURCE_QPN on RC", IBV_QPT_RC, IBV_QP_CREATE_SOURCE_QPN},
      {"CVLAN_STRIPPING on UD", IBV_QPT_UD, IBV_QP_CREATE_CVLAN_STRIPPING},
      {"SCATTER_FCS on UD", IBV_QPT_UD, IBV_QP_CREATE_SCATTER_FCS},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const ibv_qp_init_attr base = qp_init_attr(c.type, cq.get());
    ibv_qp_init_attr_ex attr{};
    std::memcpy(&attr, &base, sizeof base);
    attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
    attr.pd = pd_;
    attr.create_flags = c.flags;
    errno = 0;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &attr);
    EXPECT_EQ(qp, nullptr);
    EXPECT_EQ(errno, EINVAL) << std::strerror(errno);
    if (qp) ibv_destroy_qp(qp);
  }
  // Blocking multicast loopback on a UD QP is a device capability (ConnectX has
  // it): created, or EOPNOTSUPP.
  const ibv_qp_init_attr base = qp_init_attr(IBV_QPT_UD, cq.get());
  ibv_qp_init_attr_ex attr{};
  std::memcpy(&attr, &base, sizeof base);
  attr.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  attr.pd = pd_;
  attr.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
  errno = 0;
  ibv_qp* qp = ibv_create_qp_ex(ctx_, &attr);
  observe("ibv_create_qp_ex.ud_block_self_mcast_lb", outcome(qp));
  if (qp) {
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
  } else {
    EXPECT_EQ(errno, EOPNOTSUPP) << std::strerror(errno);
  }
}

TEST_P(QpTest, CreateRejectsCqsOfAnotherContext) {
  Cq own = make_cq();
  ASSERT_TRUE(own);
  Context other(ibv_open_device(device_));
  ASSERT_TRUE(other);
  // Several CQs in the other context, so the one used does not share a
  // per-context object number with an object of this context.
  std::vector<Cq> foreign;
  for (int i = 0; i < 4; ++i) {
    foreign.emplace_back(ibv_create_cq(other.get(), 4, nullptr, nullptr, 0));
    ASSERT_TRUE(foreign.back());
  }
  ibv_cq* theirs = foreign.back().get();
  for (ibv_qp_type type : kTypes) {
    SCOPED_TRACE(qp_type_name(type));
    for (int which = 0; which < 2; ++which) {
      ibv_qp_init_attr init = qp_init_attr(type, own.get());
      (which == 0 ? init.send_cq : init.recv_cq) = theirs;
      errno = 0;
      ibv_qp* qp = ibv_create_qp(pd_, &init);
      const int err = errno;
      EXPECT_EQ(qp, nullptr) << (which == 0 ? "send_cq" : "recv_cq") << " of another context accepted";
      // mlx5 checks the CQ in the library (EINVAL); the kernel's object lookup
      // of other providers does not find it (rxe: ENOENT).
      observe("qp.create_with_a_foreign_cq", errno_name(err));
      EXPECT_TRUE(err == EINVAL || err == ENOENT) << std::strerror(err);
      if (qp) ibv_destroy_qp(qp);
    }
  }
}

TEST_P(QpTest, Destroy) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  for (ibv_qp_type type : kTypes) {
    SCOPED_TRACE(qp_type_name(type));
    ibv_qp_init_attr init = qp_init_attr(type, cq.get());
    ibv_qp* qp = ibv_create_qp(pd_, &init);
    ASSERT_NE(qp, nullptr);
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
  }
  // Destroying in any state works.
  for (ibv_qp_state s : {IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QPS_ERR}) {
    SCOPED_TRACE(qp_state_name(s));
    Qp qp = make_qp(IBV_QPT_RC, cq.get());
    ASSERT_TRUE(qp);
    ASSERT_EQ(move_to(qp.get(), s), 0);
    EXPECT_EQ(qp.destroy(), 0);
  }
}

TEST_P(QpTest, ManyQpsHaveDistinctNumbers) {
  Cq cq = make_cq();
  ASSERT_TRUE(cq);
  std::vector<Qp> qps;
  std::set<uint32_t> qpns;
  for (int i = 0; i < 64; ++i) {
    qps.push_back(make_qp(kTypes[i % 3], cq.get()));
    ASSERT_TRUE(qps.back());
    EXPECT_TRUE(qpns.insert(qps.back()->qp_num).second);
  }
}

}  // namespace
}  // namespace conformance
