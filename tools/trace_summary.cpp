// What `softverbs trace` prints (tools/trace_file.hpp): the per-QP summary, the
// matching records one per line, and a filtered trace.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <map>
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

void print_summary(const std::vector<TraceRecord>& records, const TraceFilter& filter, std::ostream& out) {
  // Groups in order: devices as they first appear, then the device's own track, QPs by number.
  std::vector<std::string> devices;
  std::map<std::tuple<size_t, uint64_t, std::string>, Group> groups;  // (device index, qpn, "QP"/"SRQ")
  std::map<uint64_t, double> posted_at;                                // WR id -> post time
  size_t matched = 0;
  double first = 0, last = 0;
  for (const TraceRecord& r : records) {
    if (r.ph == "M" || !filter.matches(r)) continue;
    if (!matched++) first = r.ts;
    last = std::max(last, r.ts);
    auto dev = std::find(devices.begin(), devices.end(), r.dev);
    if (dev == devices.end()) dev = devices.insert(devices.end(), r.dev);
    const size_t di = static_cast<size_t>(dev - devices.begin());
    const bool srq = r.args.count("srqn") > 0;
    const uint64_t num = srq ? *r.num("srqn") : r.qpn.value_or(0);
    Group& g = groups[{di, num, srq ? "SRQ" : r.qpn ? "QP" : ""}];
    const std::string opcode = r.arg("opcode");
    if (r.cat == "wr" && r.name.rfind("post_", 0) == 0) {
      ++g.posted[opcode];
      if (auto id = r.num("wr")) posted_at[*id] = r.ts;
    } else if (r.cat == "wr" && (r.name == "completion" || r.name == "retired")) {
      if (r.name == "retired")
        ++g.retired;
      else
        ++g.completions[r.arg("status")];
      auto id = r.num("wr");
      if (r.name == "completion" && id && posted_at.count(*id)) g.latencies.push_back(r.ts - posted_at[*id]);
    } else if (r.cat == "packet") {
      const std::string fault = r.arg("fault");
      if (!fault.empty() && fault != "none") ++g.faults[fault];
      if (r.arg("dir") == "rx") {
        ++g.received;
      } else {
        ++g.sent;
        const uint64_t psn = r.num("psn").value_or(0);
        // A request PSN sent again is a retransmission; a duplicate is the fault layer's copy.
        if (is_request(opcode) && fault != "duplicate" && !g.sent_psns.insert(psn).second) ++g.retransmitted;
      }
    } else if (r.cat == "timer") {
      ++g.timers[r.name];
    } else if (r.cat == "event") {
      ++g.events[r.name];
    } else if (r.cat == "verb") {
      ++g.verbs[r.name];
    }
  }
  out << matched << " records";
  if (matched) out << ", " << devices.size() << " device" << (devices.size() == 1 ? "" : "s") << ", " << us(first)
                   << " to " << us(last) << " us";
  out << "\n";
  for (auto& [key, g] : groups) {
    const auto& [di, num, what] = key;
    print_group(devices[di] + (what.empty() ? "" : " " + what + " " + std::to_string(num)), g, out);
  }
}

void print_records(const std::vector<TraceRecord>& records, const TraceFilter& filter, std::ostream& out) {
  for (const TraceRecord& r : records) {
    // Track names, flows and lifetimes carry nothing to read on their own.
    if (r.ph == "M" || r.args.empty() || !filter.matches(r)) continue;
    char ts[32];
    std::snprintf(ts, sizeof ts, "%12.3f", r.ts);
    out << ts << "  " << r.dev << "  " << (r.qpn ? "QP " + std::to_string(*r.qpn) : std::string("-")) << "  "
        << r.cat << "  " << r.name;
    for (const auto& [k, v] : r.args) {
      if (k == "dev" || k == "qpn") continue;
      out << " " << k << "=" << v.text;
    }
    out << "\n";
  }
}

void write_trace(const std::vector<TraceRecord>& records, const TraceFilter& filter, std::ostream& out) {
  out << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"softverbs\",\"format\":1},\"traceEvents\":[\n";
  bool any = false;
  for (const TraceRecord& r : records) {
    if (r.ph != "M" && !filter.matches(r)) continue;  // track names are kept: the tracks stay named
    out << (any ? ",\n" : "") << r.raw;
    any = true;
  }
  out << "\n]}\n";
}

}  // namespace softverbs::tools
