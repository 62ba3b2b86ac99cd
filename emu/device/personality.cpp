// Vendor personalities: the built-in ConnectX-like values, the TOML file format
// (docs/configuration.md, SOFTVERBS_PERSONALITY) and the lookup of a named file.
#include "emu/device/personality.hpp"

#define TOML_HEADER_ONLY 1
#include <dlfcn.h>
#include <toml++/toml.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <optional>
#include <climits>
#include <fstream>
#include <span>
#include <sstream>
#include <variant>

#include "emu/device/caps.hpp"

namespace softverbs::emu {
namespace {

// One integer key of a table: where it goes and the range it accepts.
struct IntKey {
  const char* name;
  std::variant<int Personality::*, uint32_t Personality::*, uint64_t Personality::*, uint8_t Personality::*,
               uint16_t Personality::*>
      field;
  uint64_t min;
  uint64_t max;
};

// A key whose value is one of a few words; set() stores the word's value.
struct Word {
  const char* word;
  int value;
};
struct ChoiceKey {
  const char* table;
  const char* name;
  Word words[4];
  void (*set)(Personality&, int);
};

// A boolean key (true/false).
struct BoolKey {
  const char* table;
  const char* name;
  bool Personality::*field;
};

constexpr uint64_t kIntMax = INT_MAX;

const IntKey kDeviceKeys[] = {
    {"vendor_id", &Personality::vendor_id, 0, 0xffffff},  // an IEEE OUI: 24 bits
    {"vendor_part_id", &Personality::vendor_part_id, 0, UINT32_MAX},
    {"hw_ver", &Personality::hw_ver, 0, UINT32_MAX},
    {"max_mr_size", &Personality::max_mr_size, 1, UINT64_MAX},
    {"page_size_cap", &Personality::page_size_cap, 1, UINT64_MAX},
    {"max_qp", &Personality::max_qp, 1, kIntMax},
    {"max_qp_wr", &Personality::max_qp_wr, 1, kIntMax},
    {"max_sge", &Personality::max_sge, 1, kIntMax},
    {"max_sge_rd", &Personality::max_sge_rd, 0, kIntMax},
    {"max_cq", &Personality::max_cq, 1, kIntMax},
    {"max_cqe", &Personality::max_cqe, 1, kIntMax},
    {"max_mr", &Personality::max_mr, 1, kIntMax},
    {"max_pd", &Personality::max_pd, 1, kIntMax},
    // The CM carries both in 8 bits (IBTA 12.7.25, Responder Resources).
    {"max_qp_rd_atom", &Personality::max_qp_rd_atom, 0, 255},
    {"max_res_rd_atom", &Personality::max_res_rd_atom, 0, kIntMax},
    {"max_qp_init_rd_atom", &Personality::max_qp_init_rd_atom, 0, 255},
    {"max_mw", &Personality::max_mw, 0, kIntMax},
    {"max_ah", &Personality::max_ah, 1, kIntMax},
    {"max_mcast_grp", &Personality::max_mcast_grp, 0, kIntMax},
    {"max_mcast_qp_attach", &Personality::max_mcast_qp_attach, 0, kIntMax},
    {"max_total_mcast_qp_attach", &Personality::max_total_mcast_qp_attach, 0, kIntMax},
    {"max_srq", &Personality::max_srq, 1, kIntMax},
    {"max_srq_wr", &Personality::max_srq_wr, 1, kIntMax},
    {"max_srq_sge", &Personality::max_srq_sge, 1, kIntMax},
    {"local_ca_ack_delay", &Personality::local_ca_ack_delay, 0, 31},  // 5 bits (IBTA 14.2.5.6)
    {"max_inline_data", &Personality::max_inline_data, 0, 1u << 20},
    {"device_cap_flags", &Personality::device_cap_flags, 0, UINT32_MAX},
    {"max_pkeys", &Personality::max_pkeys, 0, UINT16_MAX},
};

const IntKey kDeviceExKeys[] = {
    {"max_dm_size", &Personality::max_dm_size, 0, caps::kMaxDmSize},  // the device memory emulated devices hold
};

const IntKey kPortKeys[] = {
    // The GID table an emulated port fills holds a few entries; the rest read as zero.
    {"gid_tbl_len", &Personality::gid_tbl_len, 4, 4096},
    {"active_width", &Personality::active_width, 1, 255},
    {"active_speed", &Personality::active_speed, 1, 255},
    {"max_msg_sz", &Personality::max_msg_sz, 1, 1u << 31},
    {"max_vl_num", &Personality::max_vl_num, 1, 15},
};

constexpr int kLocProt = IBV_WC_LOC_PROT_ERR;
constexpr int kLocQpOp = IBV_WC_LOC_QP_OP_ERR;

const ChoiceKey kChoiceKeys[] = {
    {"queues", "written_back", {{"actual", 0}, {"requested", 1}}, [](Personality& p, int v) {
       p.queue_sizes_as_requested = v != 0;
     }},
    {"completions", "bad_lkey", {{"loc_prot_err", kLocProt}, {"loc_qp_op_err", kLocQpOp}}, [](Personality& p, int v) {
       p.bad_lkey = static_cast<ibv_wc_status>(v);
     }},
    {"completions",
     "recv_too_small_sender",
     {{"rem_inv_req_err", IBV_WC_REM_INV_REQ_ERR}, {"rem_op_err", IBV_WC_REM_OP_ERR}},
     [](Personality& p, int v) { p.recv_too_small_sender = static_cast<ibv_wc_status>(v); }},
    {"completions",
     "recv_too_small_receiver",
     {{"loc_len_err", IBV_WC_LOC_LEN_ERR}, {"loc_qp_op_err", kLocQpOp}},
     [](Personality& p, int v) { p.recv_too_small_receiver = static_cast<ibv_wc_status>(v); }},
    {"completions", "send_inv_of_region", {{"fail", 1}, {"complete", 0}}, [](Personality& p, int v) {
       p.send_inv_of_region_fails = v != 0;
     }},
    {"completions", "local_error", {{"immediate", 0}, {"in_order", 1}}, [](Personality& p, int v) {
       p.local_error_in_order = v != 0;
     }},
    {"events", "sq_drained", {{"when_asked", 0}, {"always", 1}}, [](Personality& p, int v) {
       p.sq_drained_always = v != 0;
     }},
    {"post", "before_rts", {{"queue", 0}, {"refuse", 1}}, [](Personality& p, int v) {
       p.before_rts_refused = v != 0;
     }},
    {"post", "bad_wr_on_refusal", {{"set", 1}, {"unset", 0}}, [](Personality& p, int v) {
       p.bad_wr_on_refusal = v != 0;
     }},
    {"qp", "uc_sqd_av", {{"accept", 0}, {"refuse", 1}}, [](Personality& p, int v) {
       p.uc_sqd_av_refused = v != 0;
     }},
    {"post", "unsupported_opcode", {{"fail", 0}, {"refuse", 1}}, [](Personality& p, int v) {
       p.unsupported_opcode_refused = v != 0;
     }},
    {"post", "misaligned_atomic", {{"fail", 0}, {"refuse", 1}}, [](Personality& p, int v) {
       p.misaligned_atomic_refused = v != 0;
     }},
    {"mr", "local_only_rkey", {{"key", 0}, {"zero", 1}}, [](Personality& p, int v) {
       p.local_only_rkey_zero = v != 0;
     }},
};

const BoolKey kBoolKeys[] = {
    {"queues", "srq_resize", &Personality::srq_resize},
    {"device_ex", "odp", &Personality::odp},
    {"device_ex", "completion_timestamps", &Personality::completion_timestamps},
    {"qp", "validate_attributes", &Personality::validate_qp_attributes},
    {"qp", "adaptive_retransmit", &Personality::adaptive_retransmit},
    {"completions", "grh_on_connected", &Personality::grh_on_connected},
    {"completions", "error_wakes_solicited", &Personality::error_wakes_solicited},
    {"completions", "flush_posted_in_error", &Personality::flush_posted_in_error},
    {"events", "qp_access_err", &Personality::event_qp_access_err},
    {"events", "last_wqe_reached", &Personality::event_last_wqe_reached},
};

// The tables a personality file has, in the order the error message lists them.
constexpr const char* kTables[] = {"device", "device_ex", "port", "queues", "qp", "completions", "events", "post", "mr"};

std::string at_line(const toml::node& n) {
  return "line " + std::to_string(n.source().begin.line) + ": ";
}

// An integer key's value. TOML integers are 64-bit signed, so the 64-bit keys
// (max_mr_size, page_size_cap) may also be written as a string holding a
// decimal or 0x number ("0xfffffffffffff000"), or as -1 for 2^64 - 1.
std::optional<uint64_t> wide_integer(const toml::node& v, bool wide) {
  if (auto i = v.value_exact<int64_t>()) {
    if (*i >= 0) return static_cast<uint64_t>(*i);
    if (wide && *i == -1) return UINT64_MAX;
    return std::nullopt;
  }
  auto s = v.value_exact<std::string>();
  if (!wide || !s) return std::nullopt;
  std::string_view text = *s;
  int base = 10;
  if (text.size() > 2 && text[0] == '0' && (text[1] == 'x' || text[1] == 'X')) {
    text.remove_prefix(2);
    base = 16;
  }
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value, base);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool set_int(const std::string& table, const std::string& key, const toml::node& v, const IntKey& spec,
             Personality* p, std::string* error) {
  std::optional<uint64_t> value = wide_integer(v, std::holds_alternative<uint64_t Personality::*>(spec.field));
  if (!value || *value < spec.min || *value > spec.max) {
    *error = at_line(v) + table + "." + key + " must be an integer from " + std::to_string(spec.min) + " to " +
             std::to_string(spec.max);
    return false;
  }
  std::visit([&](auto member) { p->*member = static_cast<std::remove_reference_t<decltype(p->*member)>>(*value); },
             spec.field);
  return true;
}

// The keys of [device] that are not integers.
bool set_device_special(const std::string& key, const toml::node& v, Personality* p, std::string* error,
                        bool* handled) {
  *handled = true;
  if (key == "fw_ver") {
    auto s = v.value<std::string>();
    if (!s || s->size() >= sizeof(ibv_device_attr{}.fw_ver)) {
      *error = at_line(v) + "device.fw_ver must be a string of at most 63 characters";
      return false;
    }
    p->fw_ver = *s;
    return true;
  }
  if (key == "atomic_cap") {
    auto s = v.value<std::string>();
    if (s && *s == "none") p->atomic_cap = IBV_ATOMIC_NONE;
    else if (s && *s == "hca") p->atomic_cap = IBV_ATOMIC_HCA;
    else if (s && *s == "glob") p->atomic_cap = IBV_ATOMIC_GLOB;
    else {
      *error = at_line(v) + "device.atomic_cap must be \"none\", \"hca\" or \"glob\"";
      return false;
    }
    return true;
  }
  *handled = false;
  return true;
}

// port.max_mtu: bytes, one of the five IBTA MTUs.
bool set_max_mtu(const toml::node& v, Personality* p, std::string* error) {
  const auto n = v.value_exact<int64_t>();
  for (ibv_mtu m : {IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096}) {
    if (n && *n == (int64_t{128} << m)) {
      p->max_mtu = m;
      return true;
    }
  }
  *error = at_line(v) + "port.max_mtu must be 256, 512, 1024, 2048 or 4096";
  return false;
}

// One key of one table: integer, word or boolean, as the tables above say.
bool parse_key(const std::string& table, const std::string& key, const toml::node& v, Personality* p,
               std::string* error) {
  if (table == "device") {
    bool handled = false;
    if (!set_device_special(key, v, p, error, &handled)) return false;
    if (handled) return true;
  }
  if (table == "port" && key == "max_mtu") return set_max_mtu(v, p, error);
  const std::span<const IntKey> ints = table == "device"      ? std::span<const IntKey>(kDeviceKeys)
                                       : table == "device_ex" ? std::span<const IntKey>(kDeviceExKeys)
                                       : table == "port"      ? std::span<const IntKey>(kPortKeys)
                                                              : std::span<const IntKey>();
  for (const IntKey& ik : ints)
    if (key == ik.name) return set_int(table, key, v, ik, p, error);
  for (const ChoiceKey& ck : kChoiceKeys) {
    if (table != ck.table || key != ck.name) continue;
    auto s = v.value_exact<std::string>();
    std::string allowed;
    for (const Word& w : ck.words) {
      if (!w.word) break;
      if (s && *s == w.word) {
        ck.set(*p, w.value);
        return true;
      }
      allowed += std::string(allowed.empty() ? "" : " or ") + "\"" + w.word + "\"";
    }
    *error = at_line(v) + table + "." + key + " must be " + allowed;
    return false;
  }
  for (const BoolKey& bk : kBoolKeys) {
    if (table != bk.table || key != bk.name) continue;
    auto b = v.value_exact<bool>();
    if (!b) {
      *error = at_line(v) + table + "." + key + " must be true or false";
      return false;
    }
    p->*bk.field = *b;
    return true;
  }
  *error = at_line(v) + "unknown key " + table + "." + key;
  return false;
}

bool parse_table(const std::string& table, const toml::table& t, Personality* p, std::string* error) {
  for (auto&& [k, v] : t)
    if (!parse_key(table, std::string(k.str()), v, p, error)) return false;
  return true;
}

bool valid_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

// The installed data directory, found from where this library lies (so that an
// installed tree can be moved): SV_PERSONALITY_DIR_FROM_LIB is relative to the
// library's directory.
std::string installed_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&installed_dir), &info) || !info.dli_fname) return {};
  std::string lib = info.dli_fname;
  size_t slash = lib.rfind('/');
  if (slash == std::string::npos) return {};
  return lib.substr(0, slash + 1) + SV_PERSONALITY_DIR_FROM_LIB;
}

bool read_file(const std::string& path, std::string* text) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream os;
  os << in.rdbuf();
  if (in.bad()) return false;
  *text = os.str();
  return true;
}

std::atomic<const Personality*> g_active{nullptr};

}  // namespace

Personality builtin_personality() {
  Personality p;
  p.name = "connectx";
  p.fw_ver = caps::kFwVer;
  p.vendor_id = caps::kVendorId;
  p.vendor_part_id = caps::kVendorPartId;
  p.hw_ver = caps::kHwVer;
  p.max_mr_size = caps::kMaxMrSize;
  p.page_size_cap = caps::kPageSizeCap;
  p.max_qp = caps::kMaxQp;
  p.max_qp_wr = caps::kMaxQpWr;
  p.max_sge = caps::kMaxSge;
  p.max_sge_rd = caps::kMaxSgeRd;
  p.max_cq = caps::kMaxCq;
  p.max_cqe = caps::kMaxCqe;
  p.max_mr = caps::kMaxMr;
  p.max_pd = caps::kMaxPd;
  p.max_qp_rd_atom = caps::kMaxQpRdAtom;
  p.max_res_rd_atom = caps::kMaxResRdAtom;
  p.max_qp_init_rd_atom = caps::kMaxQpInitRdAtom;
  p.atomic_cap = caps::kAtomicCap;
  p.max_mw = caps::kMaxMw;
  p.max_ah = caps::kMaxAh;
  p.max_mcast_grp = caps::kMaxMcastGrp;
  p.max_mcast_qp_attach = caps::kMaxMcastQpAttach;
  p.max_total_mcast_qp_attach = caps::kMaxTotalMcastQpAttach;
  p.max_srq = caps::kMaxSrq;
  p.max_srq_wr = caps::kMaxSrqWr;
  p.max_srq_sge = caps::kMaxSrqSge;
  p.local_ca_ack_delay = caps::kLocalCaAckDelay;
  p.max_inline_data = caps::kMaxInlineData;
  p.device_cap_flags = caps::kDeviceCapFlags;
  p.max_pkeys = 0;  // the port's P_Key table: 1 on RoCE, 128 on InfiniBand
  p.odp = true;
  p.max_dm_size = caps::kMaxDmSize;
  p.completion_timestamps = true;
  p.max_mtu = caps::kMaxMtu;
  p.gid_tbl_len = caps::kGidTblLen;
  p.active_width = caps::kActiveWidth;
  p.active_speed = caps::kActiveSpeed;
  p.max_msg_sz = caps::kMaxMsgSz;
  p.max_vl_num = caps::kMaxVlNum;
  p.queue_sizes_as_requested = false;
  p.srq_resize = false;
  // The [completions], [events], [post] and [mr] defaults of the struct are
  // the IBTA's and ConnectX's.
  return p;
}

bool parse_personality(std::string_view text, Personality* out, std::string* error) {
  toml::table doc;
  try {
    doc = toml::parse(text);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "line " << e.source().begin.line << ": " << e.description();
    *error = os.str();
    return false;
  }
  Personality p = builtin_personality();
  for (auto&& [k, v] : doc) {
    const std::string key(k.str());
    if (key == "name") {
      auto s = v.value<std::string>();
      if (!s || !valid_name(*s)) {
        *error = at_line(v) + "name must be a string of a-z, 0-9, '_' and '-'";
        return false;
      }
      p.name = *s;
    } else if (std::find(std::begin(kTables), std::end(kTables), key) != std::end(kTables)) {
      const toml::table* t = v.as_table();
      if (!t) {
        *error = at_line(v) + key + " must be a table ([" + key + "])";
        return false;
      }
      if (!parse_table(key, *t, &p, error)) return false;
    } else {
      *error = at_line(v) + "unknown top-level key '" + key +
               "' (name, [device], [device_ex], [port], [queues], [qp], [completions], [events], [post], [mr])";
      return false;
    }
  }
  // Limits that must agree with each other, or a verb would accept what the
  // device cannot hold.
  if (p.max_total_mcast_qp_attach < p.max_mcast_qp_attach) {
    *error = "device.max_total_mcast_qp_attach is below device.max_mcast_qp_attach";
    return false;
  }
  *out = std::move(p);
  return true;
}

bool load_personality(std::string_view spec, Personality* out, std::string* error) {
  std::string path;
  std::string text;
  if (spec.find('/') != std::string_view::npos) {
    path = spec;
    if (!read_file(path, &text)) {
      *error = path + ": cannot be read";
      return false;
    }
  } else {
    if (!valid_name(spec)) {
      *error = "'" + std::string(spec) + "' is neither a personality name ([a-z0-9_-]) nor a path";
      return false;
    }
    const std::string file = std::string(spec) + ".toml";
    std::string tried;
    for (const std::string& dir : {installed_dir(), std::string(SV_PERSONALITY_SOURCE_DIR)}) {
      if (dir.empty()) continue;
      path = dir + "/" + file;
      if (read_file(path, &text)) break;
      tried += (tried.empty() ? "" : ", ") + dir;
      path.clear();
    }
    if (path.empty()) {
      *error = "no personality '" + std::string(spec) + "' (looked for " + file + " in " + tried + ")";
      return false;
    }
  }
  std::string why;
  if (!parse_personality(text, out, &why)) {
    *error = path + ": " + why;
    return false;
  }
  return true;
}

const Personality& personality() noexcept {
  static const Personality* builtin = new Personality(builtin_personality());  // never destroyed
  const Personality* p = g_active.load(std::memory_order_acquire);
  return p ? *p : *builtin;
}

void set_personality(const Personality& p) {
  // Kept for the life of the process: devices and their objects read it.
  g_active.store(new Personality(p), std::memory_order_release);
}

}  // namespace softverbs::emu
