// Sharing a context's objects (ibv_import_device(3), ibv_import_pd(3),
// ibv_import_mr(3)) and enhanced connection establishment on QPs
// (ibv_query_ece(3), ibv_set_ece(3)), with rdma-core's errnos.
//
// Import: the context's cmd_fd, a dup of it, or a copy received over
// SCM_RIGHTS gives a second context sharing the objects and their numbers. On
// an emulated device (vendor id 0x53f5) another process's import of the fd
// fails with EOPNOTSUPP: its objects live in the engine of the process that made
// them; a kernel device imports there too.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "datapath.hpp"

namespace conformance {
namespace {

constexpr uint32_t kEmuVendorId = 0x53f5;

// Sends fd to ourselves over a socket pair: the received fd is another
// descriptor of the same open file, as another process would receive it.
int pass_fd(int fd) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -1;
  char byte = 'x';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = ctl;
  m.msg_controllen = sizeof ctl;
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  int got = -1;
  if (::sendmsg(sv[0], &m, 0) == 1) {
    msghdr r{};
    alignas(cmsghdr) char rctl[CMSG_SPACE(sizeof(int))] = {};
    r.msg_iov = &iov;
    r.msg_iovlen = 1;
    r.msg_control = rctl;
    r.msg_controllen = sizeof rctl;
    if (::recvmsg(sv[1], &r, MSG_CMSG_CLOEXEC) == 1 && CMSG_FIRSTHDR(&r))
      std::memcpy(&got, CMSG_DATA(CMSG_FIRSTHDR(&r)), sizeof got);
  }
  ::close(sv[0]);
  ::close(sv[1]);
  return got;
}

class ImportTest : public DataPathTest {
 protected:
  void SetUp() override {
    DataPathTest::SetUp();
    if (HasFatalFailure()) return;
    if (ctx_->cmd_fd < 0) GTEST_SKIP() << "the context has no command fd";
  }
  bool emulated() const { return dattr_.vendor_id == kEmuVendorId; }
  // A context imported from a dup of the fixture's cmd_fd (the import owns it).
  Context imported() {
    const int fd = ::dup(ctx_->cmd_fd);
    EXPECT_GE(fd, 0);
    errno = 0;
    Context c(ibv_import_device(fd));
    EXPECT_TRUE(c) << errno_name(errno);
    if (!c) ::close(fd);
    return c;
  }
};
CONFORMANCE_INSTANTIATE(ImportTest);

TEST_P(ImportTest, ImportedContextSharesObjects) {
  Context ctx2 = imported();
  ASSERT_TRUE(ctx2);
  EXPECT_NE(ctx2.get(), ctx_);
  EXPECT_EQ(ctx2->device, ctx_->device);
  errno = 0;
  ibv_pd* pd2 = ibv_import_pd(ctx2.get(), pd_->handle);
  ASSERT_NE(pd2, nullptr) << errno_name(errno);
  EXPECT_EQ(pd2->context, ctx2.get());
  EXPECT_EQ(pd2->handle, pd_->handle);
  // A region registered through the imported PD is in the same protection
  // domain; one imported by number carries the keys and length, no address.
  Region src;
  ASSERT_NO_FATAL_FAILURE(make_region(4096, kAllAccess, &src));
  errno = 0;
  ibv_mr* mr2 = ibv_import_mr(pd2, src.mr->handle);
  ASSERT_NE(mr2, nullptr) << errno_name(errno);
  EXPECT_EQ(mr2->lkey, src.mr->lkey);
  EXPECT_EQ(mr2->rkey, src.mr->rkey);
  EXPECT_EQ(mr2->length, src.mr->length);
  EXPECT_EQ(mr2->addr, nullptr);
  EXPECT_EQ(mr2->pd, pd2);
  EXPECT_EQ(mr2->handle, src.mr->handle);
  Buffer buf(4096);
  Mr other(ibv_reg_mr(pd2, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  ASSERT_TRUE(other) << errno_name(errno);
  // The PD is in use through either struct.
  EXPECT_EQ(ibv_dealloc_pd(pd2), EBUSY);
  other.reset();
  ibv_unimport_mr(mr2);
  ibv_unimport_pd(pd2);
  // The originals are untouched.
  Mr again(ibv_reg_mr(pd_, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  EXPECT_TRUE(again) << errno_name(errno);
}

TEST_P(ImportTest, ImportErrnos) {
  Context ctx2 = imported();
  ASSERT_TRUE(ctx2);
  Cq cq = make_cq();
  // A number no object has: ENOENT; another type's: EINVAL (the kernel's lookup).
  errno = 0;
  EXPECT_EQ(ibv_import_pd(ctx2.get(), 0x7fffff), nullptr);
  EXPECT_EQ(errno, ENOENT);
  errno = 0;
  EXPECT_EQ(ibv_import_pd(ctx2.get(), cq->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(ibv_import_mr(pd_, pd_->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // An fd that names no context: EINVAL, as rdma-core's for a non-device fd.
  const int efd = ::eventfd(0, EFD_CLOEXEC);
  ASSERT_GE(efd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(efd), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ::close(efd);
  errno = 0;
  EXPECT_EQ(ibv_import_device(-1), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_P(ImportTest, FdPassedOverScmRights) {
  const int fd = pass_fd(ctx_->cmd_fd);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  Context ctx2(ibv_import_device(fd));
  ASSERT_TRUE(ctx2) << errno_name(errno);
  ibv_pd* pd2 = ibv_import_pd(ctx2.get(), pd_->handle);
  ASSERT_NE(pd2, nullptr) << errno_name(errno);
  ibv_unimport_pd(pd2);
}

// Destroying through the imported struct destroys the object (ibv_import_mr(3));
// the other struct then only fails its lookups, and is released by unimport.
TEST_P(ImportTest, DestroyThroughTheImport) {
  Context ctx2 = imported();
  ASSERT_TRUE(ctx2);
  ibv_pd* pd = ibv_alloc_pd(ctx_);
  ASSERT_NE(pd, nullptr);
  Buffer buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_pd* pd2 = ibv_import_pd(ctx2.get(), pd->handle);
  ASSERT_NE(pd2, nullptr) << errno_name(errno);
  ibv_mr* mr2 = ibv_import_mr(pd2, mr->handle);
  ASSERT_NE(mr2, nullptr) << errno_name(errno);
  EXPECT_EQ(ibv_dereg_mr(mr2), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  // The objects are gone for their first structs too.
  EXPECT_NE(ibv_dereg_mr(mr), 0);
  Mr none(ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE));
  EXPECT_FALSE(none);
  ibv_unimport_mr(mr);
  ibv_unimport_pd(pd);
}

// Another process cannot reach an emulated context's objects.
TEST_P(ImportTest, AnotherProcess) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::alarm(10);  // bounds the parent's wait: a stuck child dies
    errno = 0;
    ibv_context* c = ibv_import_device(::dup(ctx_->cmd_fd));
    ::_exit(c ? 0 : (errno == EOPNOTSUPP ? 1 : 2));
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  observe("import_in_child", WEXITSTATUS(status) == 0 ? "imported" : "refused");
  if (emulated()) {
    EXPECT_EQ(WEXITSTATUS(status), 1) << "expected EOPNOTSUPP";
  } else {
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
}

// ---- enhanced connection establishment ---------------------------------------------

class EceTest : public VerbsTest {};
CONFORMANCE_INSTANTIATE(EceTest);

TEST_P(EceTest, QuerySetAndModify) {
  Cq cq = make_cq();
  Qp qp = make_qp(IBV_QPT_RC, cq.get());
  ASSERT_TRUE(qp);
  ibv_ece ece{};
  ece.comp_mask = 7;
  int rc = ibv_query_ece(qp.get(), &ece);
  if (rc == EOPNOTSUPP) GTEST_SKIP() << "no ECE on this device";
  ASSERT_EQ(rc, 0);
  EXPECT_NE(ece.vendor_id, 0u);
  EXPECT_EQ(ece.comp_mask, 0u);
  observe("ece_vendor_id", ece.vendor_id);
  observe("ece_options", ece.options);
  if (dattr_.vendor_id == kEmuVendorId) {
    EXPECT_EQ(ece.vendor_id, kEmuVendorId);
    EXPECT_EQ(ece.options, 0u);
  }
  const uint32_t vendor = ece.vendor_id;
  // libibverbs: no vendor id is EOPNOTSUPP; then the provider's checks: a
  // comp_mask or another vendor's id is EINVAL. Each sets errno too.
  ibv_ece bad{};
  errno = 0;
  EXPECT_EQ(ibv_set_ece(qp.get(), &bad), EOPNOTSUPP);
  EXPECT_EQ(errno, EOPNOTSUPP);
  bad.vendor_id = vendor;
  bad.comp_mask = 1;
  errno = 0;
  EXPECT_EQ(ibv_set_ece(qp.get(), &bad), EINVAL);
  EXPECT_EQ(errno, EINVAL);
  bad.comp_mask = 0;
  bad.vendor_id = vendor ^ 0x1;
  EXPECT_EQ(ibv_set_ece(qp.get(), &bad), EINVAL);
  // Accepted options are offered at the next modify; until then the QP
  // reports none, and after it what the device settled on.
  ibv_ece set{};
  set.vendor_id = vendor;
  set.options = 0xffffffff;
  ASSERT_EQ(ibv_set_ece(qp.get(), &set), 0);
  ibv_ece now{};
  ASSERT_EQ(ibv_query_ece(qp.get(), &now), 0);
  EXPECT_EQ(now.vendor_id, vendor);
  EXPECT_EQ(now.options, 0u);
  ASSERT_EQ(modify_min(qp.get(), IBV_QPS_INIT), 0);
  ASSERT_EQ(ibv_query_ece(qp.get(), &now), 0);
  observe("ece_settled", now.options);
  if (dattr_.vendor_id == kEmuVendorId) {
    EXPECT_EQ(now.options, 0u);
  }
}

}  // namespace
}  // namespace conformance
