// Reading a trace (tools/trace_file.hpp): the records of the "traceEvents"
// array, parsed with nlohmann::json. The trace's own format is documented in
// docs/simulation.md; any Chrome trace event file in the JSON object form reads.
//
// A trace may hold millions of records, so the file is not parsed as one
// document when its layout allows otherwise: core/trace.cpp writes a header
// line ending in "traceEvents":[, then one record per line (a ',' after all
// but the last), then the closing "]}". Such a file is parsed a line at a time;
// any other layout (a trace another tool wrote) is parsed whole.
#include "tools/trace_file.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace softverbs::tools {
namespace {

using nlohmann::json;

std::string text_of(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

std::optional<double> number_of(const json& v) {
  if (v.is_number()) return v.get<double>();
  return std::nullopt;
}

// A double as an unsigned integer: 0 where the conversion would be undefined.
uint64_t to_unsigned(double d) { return d >= 0 && d < 18446744073709551616.0 ? static_cast<uint64_t>(d) : 0; }

uint64_t unsigned_of(const json& v) {
  if (v.is_number_unsigned() || v.is_number_integer()) return v.get<uint64_t>();
  if (v.is_number_float()) return to_unsigned(v.get<double>());
  return 0;
}

// The records of one trace file, resolved against the tracks named so far.
class Reader {
 public:
  Reader(const std::string& path, const std::function<void(const TraceRecord&)>& each, std::string* error)
      : path_(path), each_(each), error_(error) {}

  // One element of "traceEvents" with its text as written; false (and
  // *error) if it is not an object.
  bool record(const json& e, std::string_view raw) {
    if (!e.is_object()) return fail("a trace record is not an object");
    r_ = TraceRecord{};
    for (const auto& [k, v] : e.items()) {
      if (k == "name") r_.name = text_of(v);
      else if (k == "cat") r_.cat = text_of(v);
      else if (k == "ph") r_.ph = text_of(v);
      else if (k == "ts") r_.ts = number_of(v).value_or(0);
      else if (k == "pid") r_.pid = unsigned_of(v);
      else if (k == "tid") r_.tid = unsigned_of(v);
      else if (k == "args" && v.is_object())
        for (const auto& [ak, av] : v.items()) r_.args.emplace_back(ak, TraceArg{text_of(av), number_of(av)});
    }
    r_.raw = raw;
    // Tracks: pid -> device, from the process_name records, which come before
    // the device's first record (core/trace.cpp); a tid is a QPN below 2^24.
    if (r_.ph == "M" && r_.name == "process_name") devices_[r_.pid] = r_.arg("name");
    bool has_dev = false;
    for (const auto& a : r_.args) has_dev = has_dev || a.first == "dev";
    r_.dev = has_dev ? r_.arg("dev") : devices_[r_.pid];
    r_.qpn = r_.num("qpn");
    if (!r_.qpn && r_.ph != "M" && r_.tid > 0 && r_.tid < (1u << 24)) r_.qpn = r_.tid;
    ++records_;
    each_(r_);
    return true;
  }

  bool fail(const std::string& what) {
    *error_ = path_ + ": " + what;
    return false;
  }
  size_t records() const { return records_; }

 private:
  const std::string& path_;
  const std::function<void(const TraceRecord&)>& each_;
  std::string* error_;
  std::map<uint64_t, std::string> devices_;
  TraceRecord r_;
  size_t records_ = 0;
};

// A parse error as "line L, column C: what" (nlohmann's text without its
// exception prefix); `line` replaces the line when a single line was parsed.
std::string describe(const json::parse_error& e, size_t line = 0) {
  std::string text = e.what();
  const size_t at = text.find(" at line ");
  if (at != std::string::npos) text = text.substr(at + 4);
  if (line) {
    const size_t comma = text.find(", column ");
    if (text.rfind("line ", 0) == 0 && comma != std::string::npos)
      text = "line " + std::to_string(line) + text.substr(comma);
  }
  return text;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

// A whole document: the object, its "traceEvents" array, each element.
bool read_whole(std::istream& in, Reader* reader) {
  json doc;
  try {
    doc = json::parse(in);
  } catch (const json::parse_error& e) {
    return reader->fail("not JSON: " + describe(e));
  }
  auto events = doc.is_object() ? doc.find("traceEvents") : doc.end();
  if (!doc.is_object() || events == doc.end() || !events->is_array())
    return reader->fail("not a trace (no \"traceEvents\" array)");
  for (const json& e : *events) {
    const std::string raw = e.dump();
    if (!reader->record(e, raw)) return false;
  }
  return true;
}

enum class LineResult { done, failed, other_layout };

// The layout core/trace.cpp writes, after its header line: one record per
// line, then a line starting with ']' that closes the array (and may carry
// more members of the object). other_layout if the first record does not
// fit on its line, before anything was handed on.
LineResult read_lines(std::istream& in, Reader* reader) {
  std::string line;
  size_t number = 1;
  while (std::getline(in, line)) {
    ++number;
    std::string_view t = trim(line);
    if (t.empty()) continue;
    if (t[0] == ']') {
      // The closing: what follows must end the document.
      std::ostringstream rest;
      rest << "{\"traceEvents\":[" << t << "\n" << in.rdbuf();
      if (json::accept(rest.str())) return LineResult::done;
      reader->fail("not JSON: after line " + std::to_string(number));
      return LineResult::failed;
    }
    if (t.back() == ',') t = trim(t.substr(0, t.size() - 1));
    json e;
    try {
      e = json::parse(t);
    } catch (const json::parse_error& err) {
      if (reader->records() == 0) return LineResult::other_layout;
      reader->fail("not JSON: " + describe(err, number));
      return LineResult::failed;
    }
    if (!reader->record(e, t)) return LineResult::failed;
  }
  reader->fail("not JSON: the \"traceEvents\" array is not closed");
  return LineResult::failed;
}

}  // namespace

std::string TraceRecord::arg(const std::string& key) const {
  for (const auto& [k, v] : args)
    if (k == key) return v.text;
  return std::string();
}

std::optional<uint64_t> TraceRecord::num(const std::string& key) const {
  for (const auto& [k, v] : args)
    if (k == key) return v.number ? std::optional<uint64_t>(to_unsigned(*v.number)) : std::nullopt;
  return std::nullopt;
}

bool read_trace(const std::string& path, const std::function<void(const TraceRecord&)>& each, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  error->clear();
  Reader reader(path, each, error);
  // The header line: the object up to the opening of "traceEvents" (closed
  // here to check it is one).
  std::string header;
  std::getline(in, header);
  const std::string_view h = trim(header);
  constexpr std::string_view kOpen = "\"traceEvents\":[";
  if (h.size() >= kOpen.size() && h.substr(h.size() - kOpen.size()) == kOpen) {
    const json head = json::parse(std::string(h) + "]}", nullptr, false);
    if (head.is_object()) {
      switch (read_lines(in, &reader)) {
        case LineResult::done: return error->empty();
        case LineResult::failed: return false;
        case LineResult::other_layout: break;
      }
    }
  }
  in.clear();
  in.seekg(0);
  return read_whole(in, &reader);
}

bool TraceFilter::matches(const TraceRecord& r) const {
  if (qp && r.qpn != qp) return false;
  if (!device.empty() && r.dev != device) return false;
  // The flow and lifetime records of work requests ("wr_life") belong to the wr kind.
  if (!kind.empty() && r.cat != kind && !(kind == "wr" && r.cat == "wr_life")) return false;
  if (from && r.ts < *from) return false;
  if (to && r.ts > *to) return false;
  return true;
}

}  // namespace softverbs::tools
