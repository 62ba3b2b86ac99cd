// `softverbs trace FILE` (docs/simulation.md, "The trace"): reads a trace that
// SOFTVERBS_TRACE wrote (Chrome trace event JSON), filters its records and
// summarises them per QP, or writes the matching records as a trace again.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace softverbs::tools {

// One argument of a record: its text (a string's value, a number as written)
// and, for a number, its value.
struct TraceArg {
  std::string text;
  std::optional<double> number;
};

// One record of the trace ("traceEvents" element).
struct TraceRecord {
  std::string name, cat, ph;
  double ts = 0;  // microseconds since the trace's first record
  uint64_t pid = 0, tid = 0;
  std::vector<std::pair<std::string, TraceArg>> args;
  std::string_view raw;  // the record as written, for a filtered trace (valid during the callback)
  // Resolved by read_trace: the device (args.dev, else the name of the pid's
  // track) and the QP (args.qpn, else the track's QPN; none on a device track).
  std::string dev;
  std::optional<uint64_t> qpn;

  // An argument as text ("" if absent) or as a number.
  std::string arg(const std::string& key) const;
  std::optional<uint64_t> num(const std::string& key) const;
};

// Calls `each` with every record of a trace file, in order, one at a time (a
// trace may hold millions); false with *error if it cannot be read or is not a
// trace (no "traceEvents" array of objects), possibly after some records. A
// trace in the layout core/trace.cpp writes (a header line ending in
// "traceEvents":[, one record per line) is read a line at a time; any other
// layout is read whole, and then a record's raw text is its JSON re-serialised.
bool read_trace(const std::string& path, const std::function<void(const TraceRecord&)>& each, std::string* error);

struct TraceFilter {
  std::optional<uint64_t> qp;
  std::string device;
  std::string kind;  // a category: packet, timer, wr, event, verb
  std::optional<double> from, to;  // microseconds, inclusive

  bool matches(const TraceRecord& r) const;
};

// The summary per QP (and per device for what belongs to no QP): add() every
// record, then print().
class TraceSummary {
 public:
  explicit TraceSummary(TraceFilter filter);
  ~TraceSummary();
  void add(const TraceRecord& r);
  void print(std::ostream& out);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// A matching record as one line (nothing for the others, and for track names,
// flows and lifetimes, which say nothing on their own).
void print_record(const TraceRecord& r, const TraceFilter& filter, std::ostream& out);

// A trace file of the matching records and every track name: begin(), add()
// each record, end().
void write_trace_begin(std::ostream& out);
void write_trace_add(const TraceRecord& r, const TraceFilter& filter, bool* first, std::ostream& out);
void write_trace_end(std::ostream& out);

}  // namespace softverbs::tools
