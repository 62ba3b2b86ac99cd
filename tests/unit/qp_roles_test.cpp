// The transport roles' tables: the responder's error table (NAK code, receive
// WQE status, async event, UC drop), the completer's NAK-to-status table and
// the step names.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "emu/qp/completer.hpp"
#include "emu/qp/responder.hpp"

namespace softverbs::emu {
namespace {

using wire::NakCode;

// The tables are constexpr: the rules can be checked at compile time.
static_assert(resp_error_row(RespStep::execute) == nullptr);
static_assert(resp_error_row(RespStep::err_remote_access)->event == IBV_EVENT_QP_ACCESS_ERR);
static_assert(status_of_nak(NakCode::remote_access_error) == IBV_WC_REM_ACCESS_ERR);

constexpr RespStep kErrorSteps[] = {RespStep::err_op_seq, RespStep::err_invalid_request, RespStep::err_length,
                                    RespStep::err_local_protection, RespStep::err_remote_access};

TEST(ResponderErrors, EveryErrorStepHasOneRowAndNoOtherStepHasOne) {
  for (RespStep s : kErrorSteps) {
    const RespErrorRow* e = resp_error_row(s);
    ASSERT_NE(e, nullptr) << to_string(s);
    EXPECT_EQ(e->step, s);
  }
  for (int i = 0; i <= static_cast<int>(RespStep::done); ++i)
    EXPECT_EQ(resp_error_row(static_cast<RespStep>(i)), nullptr) << to_string(static_cast<RespStep>(i));
}

TEST(ResponderErrors, NakStatusAndEventPerError) {
  // IBTA 9.7.5.2: malformed requests and an opcode out of sequence are invalid
  // requests; a receive buffer too small is one too, reported locally as a
  // length error; buffers that cannot be written are a remote operational error.
  struct Want {
    RespStep step;
    NakCode nak;
    ibv_wc_status status;
    ibv_event_type event;
    bool uc_until_first;
  };
  const Want want[] = {
      {RespStep::err_op_seq, NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR, true},
      {RespStep::err_invalid_request, NakCode::invalid_request, IBV_WC_REM_INV_REQ_ERR, IBV_EVENT_QP_REQ_ERR, false},
      {RespStep::err_length, NakCode::invalid_request, IBV_WC_LOC_LEN_ERR, IBV_EVENT_QP_REQ_ERR, false},
      {RespStep::err_local_protection, NakCode::remote_operational_error, IBV_WC_LOC_PROT_ERR, IBV_EVENT_QP_REQ_ERR,
       false},
      {RespStep::err_remote_access, NakCode::remote_access_error, IBV_WC_REM_ACCESS_ERR, IBV_EVENT_QP_ACCESS_ERR,
       false},
  };
  for (const Want& w : want) {
    const RespErrorRow* e = resp_error_row(w.step);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(e->nak, w.nak) << to_string(w.step);
    EXPECT_EQ(e->recv_status, w.status) << to_string(w.step);
    EXPECT_EQ(e->event, w.event) << to_string(w.step);
    EXPECT_EQ(e->uc_drop_until_first, w.uc_until_first) << to_string(w.step);
  }
}

TEST(ResponderErrors, RequesterSeesTheStatusOfTheNakTheResponderSent) {
  // The two ends agree: each NAK the responder sends fails the requester's
  // WQE with the remote counterpart of the error.
  EXPECT_EQ(status_of_nak(resp_error_row(RespStep::err_invalid_request)->nak), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(status_of_nak(resp_error_row(RespStep::err_length)->nak), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(status_of_nak(resp_error_row(RespStep::err_local_protection)->nak), IBV_WC_REM_OP_ERR);
  EXPECT_EQ(status_of_nak(resp_error_row(RespStep::err_remote_access)->nak), IBV_WC_REM_ACCESS_ERR);
}

TEST(CompleterErrors, StatusOfNak) {
  EXPECT_EQ(status_of_nak(NakCode::invalid_request), IBV_WC_REM_INV_REQ_ERR);
  EXPECT_EQ(status_of_nak(NakCode::remote_access_error), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(status_of_nak(NakCode::remote_operational_error), IBV_WC_REM_OP_ERR);
  EXPECT_EQ(status_of_nak(NakCode::invalid_rd_request), IBV_WC_REM_INV_RD_REQ_ERR);
  // A sequence error is retried, never a completion status; reserved codes are
  // a bad response.
  EXPECT_EQ(status_of_nak(NakCode::psn_sequence_error), IBV_WC_BAD_RESP_ERR);
  EXPECT_EQ(status_of_nak(static_cast<NakCode>(0x7f)), IBV_WC_BAD_RESP_ERR);
}

TEST(RoleSteps, NamesAreDistinct) {
  std::set<std::string> resp, comp;
  for (int i = 0; i <= static_cast<int>(RespStep::err_remote_access); ++i)
    EXPECT_TRUE(resp.insert(std::string(to_string(static_cast<RespStep>(i)))).second) << i;
  for (int i = 0; i <= static_cast<int>(CompStep::done); ++i)
    EXPECT_TRUE(comp.insert(std::string(to_string(static_cast<CompStep>(i)))).second) << i;
  EXPECT_EQ(resp.count("unknown"), 0u);
  EXPECT_EQ(comp.count("unknown"), 0u);
}

}  // namespace
}  // namespace softverbs::emu
