// Devices: listing, names, GUIDs, indexes, open/close, and the device and port
// queries (device attributes, ports, GID and P_Key tables).
#include <arpa/inet.h>
#include <endian.h>
#include <poll.h>

#include <set>

#include "conformance.hpp"

namespace conformance {
namespace {

TEST(DeviceList, AtLeastOneDeviceIsListed) {
  int num = -1;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr) << "ibv_get_device_list failed: " << std::strerror(errno);
  ibv_free_device_list(list);
  EXPECT_GT(num, 0) << "ibv_get_device_list listed no device: the conformance suite has nothing to check";
  EXPECT_FALSE(device_names().empty()) << "no device was listed at startup";
}

class DeviceTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(DeviceTest);

// ---- list ---------------------------------------------------------------

TEST_P(DeviceTest, ListIsNullTerminatedAndCounted) {
  int num = -1;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr);
  int n = 0;
  while (list[n]) ++n;
  EXPECT_EQ(n, num);
  bool found = false;
  for (int i = 0; i < n; ++i) found |= GetParam() == ibv_get_device_name(list[i]);
  EXPECT_TRUE(found);
  ibv_free_device_list(list);
}

TEST_P(DeviceTest, ListAcceptsNullCount) {
  ibv_device** list = ibv_get_device_list(nullptr);
  ASSERT_NE(list, nullptr);
  bool found = false;
  for (int i = 0; list[i]; ++i) found |= list[i] == device_;
  EXPECT_TRUE(found) << "the device pointer differs between two lists";
  ibv_free_device_list(list);
}

TEST_P(DeviceTest, ListTwiceGivesTheSameDevicePointers) {
  int n1 = 0, n2 = 0;
  ibv_device** a = ibv_get_device_list(&n1);
  ibv_device** b = ibv_get_device_list(&n2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(n1, n2);
  for (int i = 0; i < n1; ++i) {
    SCOPED_TRACE(ibv_get_device_name(a[i]));
    bool same = false;
    for (int j = 0; j < n2; ++j) same |= a[i] == b[j];
    EXPECT_TRUE(same) << "a device of the first list is not in the second";
  }
  ibv_free_device_list(a);
  // The second list (and the device) stay valid after the first is freed.
  bool found = false;
  for (int j = 0; j < n2; ++j) found |= b[j] == device_;
  EXPECT_TRUE(found);
  ibv_free_device_list(b);
}

// ---- device identity ------------------------------------------------------

TEST_P(DeviceTest, NameMatches) {
  const char* name = ibv_get_device_name(device_);
  ASSERT_NE(name, nullptr);
  EXPECT_EQ(GetParam(), name);
  EXPECT_GT(std::strlen(name), 0u);
  EXPECT_LT(std::strlen(name), static_cast<size_t>(IBV_SYSFS_NAME_MAX));
  EXPECT_STREQ(device_->name, name);
}

TEST_P(DeviceTest, NodeAndTransportType) {
  EXPECT_EQ(device_->node_type, IBV_NODE_CA);
  // InfiniBand and RoCE devices both use the InfiniBand transport.
  EXPECT_EQ(device_->transport_type, IBV_TRANSPORT_IB);
}

TEST_P(DeviceTest, GuidIsNonZeroAndEqualsNodeGuid) {
  __be64 guid = ibv_get_device_guid(device_);
  EXPECT_NE(guid, 0u);
  EXPECT_EQ(guid, dattr_.node_guid) << "ibv_get_device_guid and ibv_query_device disagree";
}

TEST_P(DeviceTest, IndexIsNonNegativeAndUnique) {
  const int index = ibv_get_device_index(device_);
  EXPECT_GE(index, 0);
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  ASSERT_NE(list, nullptr);
  std::set<int> seen;
  for (int i = 0; i < num; ++i) EXPECT_TRUE(seen.insert(ibv_get_device_index(list[i])).second);
  ibv_free_device_list(list);
}

TEST_P(DeviceTest, OpenAndCloseMoreContexts) {
  ibv_context* a = ibv_open_device(device_);
  ASSERT_NE(a, nullptr) << std::strerror(errno);
  ibv_context* b = ibv_open_device(device_);
  ASSERT_NE(b, nullptr) << std::strerror(errno);
  EXPECT_NE(a, b);
  EXPECT_EQ(a->device, device_);
  EXPECT_EQ(b->device, device_);
  EXPECT_GE(a->async_fd, 0);
  EXPECT_NE(a->async_fd, b->async_fd);
  EXPECT_GE(a->num_comp_vectors, 1);
  // Objects of one context do not depend on another context.
  ibv_pd* pd = ibv_alloc_pd(a);
  ASSERT_NE(pd, nullptr);
  EXPECT_EQ(pd->context, a);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(a), 0);
  EXPECT_EQ(ibv_close_device(b), 0);
}

TEST_P(DeviceTest, FixtureContextFields) {
  EXPECT_EQ(ctx_->device, device_);
  EXPECT_GE(ctx_->async_fd, 0);
  EXPECT_GE(ctx_->num_comp_vectors, 1);
  // The async event fd is a real, pollable descriptor with nothing pending.
  pollfd p{};
  p.fd = ctx_->async_fd;
  p.events = POLLIN;
  EXPECT_EQ(::poll(&p, 1, 0), 0);
}

// ---- query_device -------------------------------------------------------

TEST_P(DeviceTest, QueryDeviceLimitsAreSane) {
  ibv_device_attr a{};
  ASSERT_EQ(ibv_query_device(ctx_, &a), 0);
  EXPECT_NE(std::memchr(a.fw_ver, 0, sizeof a.fw_ver), nullptr) << "fw_ver is not NUL-terminated";
  EXPECT_NE(a.node_guid, 0u);
  EXPECT_GT(a.max_mr_size, 0u);
  EXPECT_NE(a.page_size_cap & 4096u, 0u) << "4 KiB pages are not supported";
  EXPECT_GT(a.max_qp, 0);
  EXPECT_GT(a.max_qp_wr, 0);
  EXPECT_GT(a.max_sge, 0);
  EXPECT_GT(a.max_sge_rd, 0);
  EXPECT_LE(a.max_sge_rd, a.max_sge);
  EXPECT_GT(a.max_cq, 0);
  EXPECT_GT(a.max_cqe, 0);
  EXPECT_GT(a.max_mr, 0);
  EXPECT_GT(a.max_pd, 0);
  EXPECT_GT(a.max_qp_rd_atom, 0);
  EXPECT_GT(a.max_qp_init_rd_atom, 0);
  EXPECT_GE(a.max_res_rd_atom, a.max_qp_rd_atom);
  EXPECT_GE(a.atomic_cap, IBV_ATOMIC_NONE);
  EXPECT_LE(a.atomic_cap, IBV_ATOMIC_GLOB);
  EXPECT_GT(a.max_ah, 0);
  EXPECT_GT(a.max_srq, 0);
  EXPECT_GT(a.max_srq_wr, 0);
  EXPECT_GT(a.max_srq_sge, 0);
  EXPECT_GT(a.max_pkeys, 0);
  EXPECT_GE(a.phys_port_cnt, 1);
  // The same answer every time.
  ibv_device_attr b{};
  ASSERT_EQ(ibv_query_device(ctx_, &b), 0);
  EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0);
}

TEST_P(DeviceTest, QueryDeviceExWithoutInput) {
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &ex), 0);
  EXPECT_EQ(std::memcmp(&ex.orig_attr, &dattr_, sizeof dattr_), 0)
      << "ibv_query_device_ex orig_attr differs from ibv_query_device";
  EXPECT_EQ(ex.phys_port_cnt_ex, dattr_.phys_port_cnt);
}

TEST_P(DeviceTest, QueryDeviceExWithZeroCompMask) {
  ibv_query_device_ex_input in{};
  in.comp_mask = 0;
  ibv_device_attr_ex ex{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, &in, &ex), 0);
  EXPECT_EQ(std::memcmp(&ex.orig_attr, &dattr_, sizeof dattr_), 0);
}

TEST_P(DeviceTest, QueryDeviceExRejectsInputCompMask) {
  ibv_query_device_ex_input in{};
  in.comp_mask = 1;
  ibv_device_attr_ex ex{};
  EXPECT_EQ(ibv_query_device_ex(ctx_, &in, &ex), EINVAL);
}

// ---- query_port -----------------------------------------------------------

TEST_P(DeviceTest, QueryPortEveryPortIsActiveAndConsistent) {
  for (uint8_t port = 1; port <= dattr_.phys_port_cnt; ++port) {
    SCOPED_TRACE("port " + std::to_string(port));
    ibv_port_attr a{};
    ASSERT_EQ(ibv_query_port(ctx_, port, &a), 0);
    EXPECT_EQ(a.state, IBV_PORT_ACTIVE);
    EXPECT_GE(a.max_mtu, IBV_MTU_256);
    EXPECT_LE(a.max_mtu, IBV_MTU_4096);
    EXPECT_GE(a.active_mtu, IBV_MTU_256);
    EXPECT_LE(a.active_mtu, a.max_mtu);
    EXPECT_GT(a.gid_tbl_len, 0);
    EXPECT_GT(a.pkey_tbl_len, 0);
    EXPECT_GT(a.max_msg_sz, 0u);
    observe("port" + std::to_string(port) + ".link_layer",
            a.link_layer == IBV_LINK_LAYER_ETHERNET     ? std::string("Ethernet")
            : a.link_layer == IBV_LINK_LAYER_INFINIBAND ? std::string("InfiniBand")
                                                        : std::to_string(a.link_layer));
    EXPECT_TRUE(a.link_layer == IBV_LINK_LAYER_ETHERNET || a.link_layer == IBV_LINK_LAYER_INFINIBAND)
        << "link_layer " << int(a.link_layer);
    if (a.link_layer == IBV_LINK_LAYER_INFINIBAND) {
      // An active IB port has a unicast LID.
      EXPECT_GE(a.lid, 1);
      EXPECT_LT(a.lid, 0xc000);
    }
  }
}

TEST_P(DeviceTest, QueryPortRejectsBadPortNumbers) {
  ibv_port_attr a{};
  EXPECT_EQ(ibv_query_port(ctx_, 0, &a), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, static_cast<uint8_t>(dattr_.phys_port_cnt + 1), &a), EINVAL);
  EXPECT_EQ(ibv_query_port(ctx_, 255, &a), EINVAL);
}

TEST_P(DeviceTest, QueryPortLegacyEntryPointWritesTheLegacyStruct) {
  // Binaries built before port_cap_flags2 call the exported symbol with the
  // 48-byte struct; nothing past it may be written.
  constexpr size_t kCompatSize = offsetof(ibv_port_attr, port_cap_flags2);
  unsigned char buf[sizeof(ibv_port_attr) + 16];
  std::memset(buf, 0xa5, sizeof buf);
  ASSERT_EQ((ibv_query_port)(ctx_, kPort, reinterpret_cast<_compat_ibv_port_attr*>(buf)), 0);
  EXPECT_EQ(std::memcmp(buf, &pattr_, kCompatSize), 0);
  for (size_t i = kCompatSize; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xa5) << "byte " << i << " was written";
}

// ---- GIDs -----------------------------------------------------------------

TEST_P(DeviceTest, QueryGidEveryIndex) {
  int non_empty = 0;
  for (int i = 0; i < pattr_.gid_tbl_len; ++i) {
    SCOPED_TRACE("gid index " + std::to_string(i));
    ibv_gid gid;
    std::memset(&gid, 0x5a, sizeof gid);
    // Every index below gid_tbl_len answers; an empty slot reads as zero.
    ASSERT_EQ(ibv_query_gid(ctx_, kPort, i, &gid), 0) << std::strerror(errno);
    ibv_gid_entry e{};
    int rc = ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(i), &e, 0);
    if (rc == 0) {
      ++non_empty;
      EXPECT_FALSE(gid_is_zero(gid)) << "a valid GID entry reads as zero";
      EXPECT_EQ(std::memcmp(&gid, &e.gid, sizeof gid), 0) << "ibv_query_gid and ibv_query_gid_ex disagree";
    } else {
      EXPECT_EQ(rc, ENODATA);
      EXPECT_TRUE(gid_is_zero(gid)) << "an empty GID slot must read as zero";
    }
  }
  EXPECT_GT(non_empty, 0) << "the GID table is empty";
}

TEST_P(DeviceTest, EthernetPortHasIpv4MappedRoceV2Gid) {
  if (!is_ethernet()) GTEST_SKIP() << "InfiniBand port";
  ASSERT_GE(ipv4_gid_index_, 0) << "no IPv4-mapped RoCEv2 GID (::ffff:a.b.c.d) in the table";
  ibv_gid_type_sysfs type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1;
  ASSERT_EQ(ibv_query_gid_type(ctx_, kPort, static_cast<unsigned>(ipv4_gid_index_), &type), 0);
  EXPECT_EQ(type, IBV_GID_TYPE_SYSFS_ROCE_V2);
}

TEST_P(DeviceTest, QueryGidRejectsBadIndexAndPort) {
  ibv_gid gid{};
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, kPort, pattr_.gid_tbl_len, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, kPort, -1, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, 0, 0, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid(ctx_, static_cast<uint8_t>(dattr_.phys_port_cnt + 1), 0, &gid), -1);
  EXPECT_EQ(errno, EINVAL);
}

TEST_P(DeviceTest, QueryGidExFields) {
  for (int i = 0; i < pattr_.gid_tbl_len; ++i) {
    SCOPED_TRACE("gid index " + std::to_string(i));
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(i), &e, 0) != 0) continue;
    observe("gid_types", e.gid_type == IBV_GID_TYPE_IB        ? std::string("IB")
                         : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? std::string("RoCE v1")
                         : e.gid_type == IBV_GID_TYPE_ROCE_V2 ? std::string("RoCE v2")
                                                              : std::to_string(e.gid_type));
    EXPECT_EQ(e.gid_index, static_cast<uint32_t>(i));
    EXPECT_EQ(e.port_num, kPort);
    if (is_ethernet()) {
      EXPECT_TRUE(e.gid_type == IBV_GID_TYPE_ROCE_V1 || e.gid_type == IBV_GID_TYPE_ROCE_V2) << e.gid_type;
    } else {
      EXPECT_EQ(e.gid_type, IBV_GID_TYPE_IB);
    }
  }
}

TEST_P(DeviceTest, QueryGidExErrors) {
  ibv_gid_entry e{};
  EXPECT_EQ(ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(pattr_.gid_tbl_len), &e, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, kPort, UINT32_MAX, &e, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 0, 0, &e, 0), EINVAL);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, dattr_.phys_port_cnt + 1u, 0, &e, 0), EINVAL);
  // flags must be 0: the kernel answers EINVAL; rdma-core's sysfs fallback
  // (kernels without the GID ioctl) answers EOPNOTSUPP.
  int rc = ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(sgid_index_), &e, 1);
  observe("ibv_query_gid_ex.flags_1", errno_name(rc));
  EXPECT_TRUE(rc == EINVAL || rc == EOPNOTSUPP) << "rc " << rc;
  // An empty slot: ENODATA.
  bool empty_checked = false;
  for (int i = 0; i < pattr_.gid_tbl_len && !empty_checked; ++i) {
    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(ctx_, kPort, i, &gid), 0);
    if (!gid_is_zero(gid)) continue;
    EXPECT_EQ(ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(i), &e, 0), ENODATA) << "index " << i;
    empty_checked = true;
  }
}

TEST_P(DeviceTest, QueryGidTableListsEveryValidEntry) {
  std::vector<ibv_gid_entry> expected;
  for (uint8_t port = 1; port <= dattr_.phys_port_cnt; ++port) {
    ibv_port_attr pa{};
    ASSERT_EQ(ibv_query_port(ctx_, port, &pa), 0);
    for (int i = 0; i < pa.gid_tbl_len; ++i) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx_, port, static_cast<uint32_t>(i), &e, 0) == 0) expected.push_back(e);
    }
  }
  ASSERT_FALSE(expected.empty());
  std::vector<ibv_gid_entry> table(expected.size() + 8);
  ssize_t n = ibv_query_gid_table(ctx_, table.data(), table.size(), 0);
  ASSERT_EQ(n, static_cast<ssize_t>(expected.size()));
  for (const ibv_gid_entry& want : expected) {
    bool found = false;
    for (ssize_t i = 0; i < n; ++i) {
      const ibv_gid_entry& got = table[static_cast<size_t>(i)];
      if (got.port_num == want.port_num && got.gid_index == want.gid_index) {
        found = true;
        EXPECT_EQ(std::memcmp(&got.gid, &want.gid, sizeof got.gid), 0) << "index " << want.gid_index;
        EXPECT_EQ(got.gid_type, want.gid_type);
      }
    }
    EXPECT_TRUE(found) << "port " << want.port_num << " index " << want.gid_index << " missing";
  }
  // Exactly as many entries as there are valid ones fits too.
  EXPECT_EQ(ibv_query_gid_table(ctx_, table.data(), expected.size(), 0), static_cast<ssize_t>(expected.size()));
}

TEST_P(DeviceTest, QueryGidTableErrors) {
  ibv_gid_entry probe[1];
  std::vector<ibv_gid_entry> table(static_cast<size_t>(pattr_.gid_tbl_len) * dattr_.phys_port_cnt + 1);
  ssize_t n = ibv_query_gid_table(ctx_, table.data(), table.size(), 0);
  ASSERT_GT(n, 0);
  // An array one entry too small: negative EINVAL.
  EXPECT_EQ(ibv_query_gid_table(ctx_, table.data(), static_cast<size_t>(n - 1), 0), -EINVAL);
  EXPECT_EQ(ibv_query_gid_table(ctx_, probe, 0, 0), -EINVAL);
  // flags != 0: EINVAL from the kernel, EOPNOTSUPP from the sysfs fallback.
  ssize_t rc = ibv_query_gid_table(ctx_, table.data(), table.size(), 1);
  observe("ibv_query_gid_table.flags_1", errno_name(static_cast<int>(rc)));
  EXPECT_TRUE(rc == -EINVAL || rc == -EOPNOTSUPP) << "rc " << rc;
}

TEST_P(DeviceTest, QueryGidTypeMatchesGidEntries) {
  for (int i = 0; i < pattr_.gid_tbl_len; ++i) {
    SCOPED_TRACE("gid index " + std::to_string(i));
    ibv_gid_type_sysfs type = static_cast<ibv_gid_type_sysfs>(7);
    ASSERT_EQ(ibv_query_gid_type(ctx_, kPort, static_cast<unsigned>(i), &type), 0);
    ibv_gid_entry e{};
    if (ibv_query_gid_ex(ctx_, kPort, static_cast<uint32_t>(i), &e, 0) != 0) {
      // Empty slots read as IB/RoCEv1.
      EXPECT_EQ(type, IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
      continue;
    }
    EXPECT_EQ(type, e.gid_type == IBV_GID_TYPE_ROCE_V2 ? IBV_GID_TYPE_SYSFS_ROCE_V2 : IBV_GID_TYPE_SYSFS_IB_ROCE_V1);
  }
  ibv_gid_type_sysfs type;
  errno = 0;
  EXPECT_EQ(ibv_query_gid_type(ctx_, kPort, static_cast<unsigned>(pattr_.gid_tbl_len), &type), -1);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_query_gid_type(ctx_, 0, 0, &type), -1);
  EXPECT_EQ(errno, EINVAL);
}

// ---- P_Keys ---------------------------------------------------------------

TEST_P(DeviceTest, QueryPkeyIndexZeroIsDefaultFullMember) {
  __be16 pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, kPort, 0, &pkey), 0);
  EXPECT_EQ(ntohs(pkey), 0xffff);
  EXPECT_NE(ntohs(pkey) & 0x8000, 0) << "index 0 must be a full member P_Key";
  for (int i = 1; i < pattr_.pkey_tbl_len; ++i) EXPECT_EQ(ibv_query_pkey(ctx_, kPort, i, &pkey), 0) << i;
}

TEST_P(DeviceTest, QueryPkeyPastTheTable) {
  // rdma-core reads the P_Key table from sysfs: an index past the table (or a
  // port that does not exist) has no file, so -1 with errno ENOENT.
  __be16 pkey = 0;
  errno = 0;
  EXPECT_EQ(ibv_query_pkey(ctx_, kPort, pattr_.pkey_tbl_len, &pkey), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_query_pkey(ctx_, kPort, -1, &pkey), -1);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_query_pkey(ctx_, 0, 0, &pkey), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_P(DeviceTest, GetPkeyIndex) {
  EXPECT_EQ(ibv_get_pkey_index(ctx_, kPort, htons(0xffff)), 0);
  // A P_Key not in the table: the scan runs off its end (-1, ENOENT).
  errno = 0;
  EXPECT_EQ(ibv_get_pkey_index(ctx_, kPort, htons(0xabcd)), -1);
  EXPECT_EQ(errno, ENOENT);
}

// What the device reports, as observations only (never a failure): the
// attributes a personality file holds (docs/simulation.md, "Vendor
// personalities"), which `scripts/divergence.py personality` turns into one.
class DeviceAttributesTest : public VerbsCqTest {};

TEST_P(DeviceAttributesTest, Observed) {
  const ibv_device_attr& d = dattr_;
  observe("device.fw_ver", d.fw_ver);
  const std::pair<const char*, uint64_t> device[] = {
      {"vendor_id", d.vendor_id}, {"vendor_part_id", d.vendor_part_id}, {"hw_ver", d.hw_ver},
      {"max_mr_size", d.max_mr_size}, {"page_size_cap", d.page_size_cap}, {"max_qp", uint64_t(d.max_qp)},
      {"max_qp_wr", uint64_t(d.max_qp_wr)}, {"device_cap_flags", d.device_cap_flags},
      {"max_sge", uint64_t(d.max_sge)}, {"max_sge_rd", uint64_t(d.max_sge_rd)}, {"max_cq", uint64_t(d.max_cq)},
      {"max_cqe", uint64_t(d.max_cqe)}, {"max_mr", uint64_t(d.max_mr)}, {"max_pd", uint64_t(d.max_pd)},
      {"max_qp_rd_atom", uint64_t(d.max_qp_rd_atom)}, {"max_res_rd_atom", uint64_t(d.max_res_rd_atom)},
      {"max_qp_init_rd_atom", uint64_t(d.max_qp_init_rd_atom)}, {"max_mw", uint64_t(d.max_mw)},
      {"max_ah", uint64_t(d.max_ah)}, {"max_mcast_grp", uint64_t(d.max_mcast_grp)},
      {"max_mcast_qp_attach", uint64_t(d.max_mcast_qp_attach)},
      {"max_total_mcast_qp_attach", uint64_t(d.max_total_mcast_qp_attach)}, {"max_srq", uint64_t(d.max_srq)},
      {"max_srq_wr", uint64_t(d.max_srq_wr)}, {"max_srq_sge", uint64_t(d.max_srq_sge)},
      {"max_pkeys", d.max_pkeys}, {"local_ca_ack_delay", d.local_ca_ack_delay},
  };
  for (const auto& [name, value] : device) observe(std::string("device.") + name, value);
  observe("device.atomic_cap", d.atomic_cap == IBV_ATOMIC_NONE  ? "none"
                               : d.atomic_cap == IBV_ATOMIC_HCA ? "hca"
                                                                : "glob");
  observe("port.max_mtu", 128u << pattr_.max_mtu);
  observe("port.gid_tbl_len", pattr_.gid_tbl_len);
  observe("port.active_width", unsigned(pattr_.active_width));
  observe("port.active_speed", unsigned(pattr_.active_speed));
  observe("port.max_msg_sz", pattr_.max_msg_sz);
  observe("port.max_vl_num", unsigned(pattr_.max_vl_num));
  ibv_device_attr_ex ex{};
  if (ibv_query_device_ex(ctx_, nullptr, &ex) == 0) {
    observe("device_ex.odp_general_caps", ex.odp_caps.general_caps);
    observe("device_ex.max_dm_size", ex.max_dm_size);
    observe("device_ex.hca_core_clock", ex.hca_core_clock);
  }
  // The receive depth create writes back and the one query reports, for 5 asked.
  ibv_qp_init_attr init = qp_init_attr(IBV_QPT_RC, cq_.get());
  init.cap.max_recv_wr = 5;
  Qp qp(ibv_create_qp(pd_, &init));  // make_qp takes a copy: the written-back caps are here
  if (qp) {
    ibv_qp_attr attr{};
    ibv_qp_init_attr queried{};
    if (ibv_query_qp(qp.get(), &attr, IBV_QP_CAP, &queried) == 0) {
      observe("queues.created_max_recv_wr", init.cap.max_recv_wr);
      observe("queues.queried_max_recv_wr", queried.cap.max_recv_wr);
    }
  }
}

CONFORMANCE_INSTANTIATE(DeviceAttributesTest);

}  // namespace
}  // namespace conformance
