// What `softverbs trace` prints (tools/trace_file.hpp): the per-QP summary, the
// matching records one per line, and a filtered trace.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tools/trace_file.hpp"

namespace softverbs::tools {
namespace {

// Everything the summary counts for one QP (or a device's own track).
struct Group {
  std::map<std::string, uint64_t> posted;  // opcode -> posts
  uint64_t sent = 0, received = 0, retransmitted = 0;
  std::set<uint64_t> sent_psns;             // request PSNs sent so far
  std::map<std::string, uint64_t> faults;   // fault action -> packets
  std::map<std::string, uint64_t> timers;   // "ack_timeout fired" -> count
  std::map<std::string, uint64_t> completions;  // status -> count
  uint64_t retired = 0;                     // unsignaled sends done
  std::map<std::string, uint64_t> events;   // event name -> count
  std::map<std::string, uint64_t> verbs;    // verb -> calls
  std::vector<double> latencies;            // post -> completion, us
};

// Request packets: the ones a requester sends and resends (not responses or ACKs).
bool is_request(const std::string& opcode) {
  for (const char* part : {"SEND", "WRITE", "READ_REQUEST", "COMPARE_SWAP", "FETCH_ADD"})
    if (opcode.find(part) != std::string::npos) return true;
  return false;
}

std::string join(const std::map<std::string, uint64_t>& m) {
  std::string out;
  for (const auto& [k, v] : m) out += (out.empty() ? "" : ", ") + k + " " + std::to_string(v);
  return out;
}

uint64_t count(const std::map<std::string, uint64_t>& m, const std::string& key) {
  auto it = m.find(key);
  return it == m.end() ? 0 : it->second;
}

// Nearest-rank percentile of sorted values.
double percentile(const std::vector<double>& sorted, double p) {
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size(), std::max<size_t>(rank, 1)) - 1];
}

std::string us(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f", v);
  return b;
}

void print_group(const std::string& title, Group& g, std::ostream& out) {
  out << title << ":\n";
  if (!g.verbs.empty()) out << "  verbs: " << join(g.verbs) << "\n";
  if (!g.posted.empty()) out << "  posted: " << join(g.posted) << "\n";
  if (g.sent || g.received)
    out << "  packets: sent " << g.sent << ", received " << g.received << ", retransmitted " << g.retransmitted
        << "\n";
  if (!g.faults.empty()) out << "  faults: " << join(g.faults) << "\n";
  if (!g.timers.empty()) {
    out << "  timers: " << join(g.timers) << "\n";
    out << "  timeouts: " << count(g.timers, "ack_timeout fired")
        << ", rnr waits: " << count(g.timers, "rnr_wait armed") << "\n";
  }
  if (!g.completions.empty() || g.retired) {
    out << "  completions: " << join(g.completions);
    if (g.retired) out << (g.completions.empty() ? "" : ", ") << "unsignaled " << g.retired;
    out << "\n";
  }
  if (!g.latencies.empty()) {
    std::sort(g.latencies.begin(), g.latencies.end());
    out << "  latency post->completion (us): n " << g.latencies.size() << ", p50 " << us(percentile(g.latencies, 50))
        << ", p90 " << us(percentile(g.latencies, 90)) << ", p99 " << us(percentile(g.latencies, 99)) << ", max "
        << us(g.latencies.back()) << "\n";
  }
  if (!g.events.empty()) out << "  events: " << join(g.events) << "\n";
}

}  // namespace

struct TraceSummary::State {
  TraceFilter filter;
  // Groups in order: devices as they first appear, then the device's own track, QPs by number.
  std::vector<std::string> devices;
  std::map<std::tuple<size_t, uint64_t, std::string>, Group> groups;  // (device index, number, "QP"/"SRQ"/"")
  std::map<uint64_t, double> posted_at;                                // WR id -> post time, until it completes
  size_t matched = 0;
  double first = 0, last = 0;
};

TraceSummary::TraceSummary(TraceFilter filter) : s_(std::make_unique<State>()) { s_->filter = std::move(filter); }
TraceSummary::~TraceSummary() = default;

void TraceSummary::add(const TraceRecord& r) {
  State& s = *s_;
  if (r.ph == "M" || !s.filter.matches(r)) return;
  if (!s.matched++) s.first = r.ts;
  s.last = std::max(s.last, r.ts);
  auto dev = std::find(s.devices.begin(), s.devices.end(), r.dev);
  if (dev == s.devices.end()) dev = s.devices.insert(s.devices.end(), r.dev);
  const size_t di = static_cast<size_t>(dev - s.devices.begin());
  const std::optional<uint64_t> srqn = r.num("srqn");
  Group& g = s.groups[{di, srqn ? *srqn : r.qpn.value_or(0), srqn ? "SRQ" : r.qpn ? "QP" : ""}];
  const std::string opcode = r.arg("opcode");
  if (r.cat == "wr" && r.name.rfind("post_", 0) == 0) {
    ++g.posted[opcode];
    if (auto id = r.num("wr")) s.posted_at[*id] = r.ts;
  } else if (r.cat == "wr" && (r.name == "completion" || r.name == "retired")) {
    if (r.name == "retired")
      ++g.retired;
    else
      ++g.completions[r.arg("status")];
    auto id = r.num("wr");
    auto posted = id ? s.posted_at.find(*id) : s.posted_at.end();
    if (posted != s.posted_at.end()) {
      if (r.name == "completion") g.latencies.push_back(r.ts - posted->second);
      s.posted_at.erase(posted);
    }
  } else if (r.cat == "packet") {
    const std::string fault = r.arg("fault");
    if (!fault.empty() && fault != "none") ++g.faults[fault];
    if (r.arg("dir") == "rx") {
      ++g.received;
    } else {
      ++g.sent;
      const uint64_t psn = r.num("psn").value_or(0);
      // A request PSN a QP sends again is a retransmission; a duplicate is the
      // fault layer's copy. (Packets of no known QP, on a device's track, mix QPs.)
      if (r.qpn && is_request(opcode) && fault != "duplicate" && !g.sent_psns.insert(psn).second) ++g.retransmitted;
    }
  } else if (r.cat == "timer") {
    ++g.timers[r.name];
  } else if (r.cat == "event") {
    ++g.events[r.name];
  } else if (r.cat == "verb") {
    ++g.verbs[r.name];
  }
}

void TraceSummary::print(std::ostream& out) {
  State& s = *s_;
  out << s.matched << " records";
  if (s.matched)
    out << ", " << s.devices.size() << " device" << (s.devices.size() == 1 ? "" : "s") << ", " << us(s.first)
        << " to " << us(s.last) << " us";
  out << "\n";
  for (auto& [key, g] : s.groups) {
    const auto& [di, num, what] = key;
    print_group(s.devices[di] + (what.empty() ? "" : " " + what + " " + std::to_string(num)), g, out);
  }
}

void print_record(const TraceRecord& r, const TraceFilter& filter, std::ostream& out) {
  // Track names, flows and lifetimes carry nothing to read on their own.
  if (r.ph == "M" || r.args.empty() || !filter.matches(r)) return;
  char ts[32];
  std::snprintf(ts, sizeof ts, "%12.3f", r.ts);
  out << ts << "  " << r.dev << "  " << (r.qpn ? "QP " + std::to_string(*r.qpn) : std::string("-")) << "  " << r.cat
      << "  " << r.name;
  // Arguments by name, so that a line reads the same whatever the writer's order.
  std::vector<std::pair<std::string, std::string>> args;
  for (const auto& [k, v] : r.args)
    if (k != "dev" && k != "qpn") args.emplace_back(k, v.text);
  std::sort(args.begin(), args.end());
  for (const auto& [k, v] : args) out << " " << k << "=" << v;
  out << "\n";
}

void write_trace_begin(std::ostream& out) {
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"softverbs\",\"format\":1},\"traceEvents\":[\n";
}

void write_trace_add(const TraceRecord& r, const TraceFilter& filter, bool* first, std::ostream& out) {
  if (r.ph != "M" && !filter.matches(r)) return;  // track names are kept: the tracks stay named
  out << (*first ? "" : ",\n") << r.raw;
  *first = false;
}

void write_trace_end(std::ostream& out) { out << "\n]}\n"; }

}  // namespace softverbs::tools
