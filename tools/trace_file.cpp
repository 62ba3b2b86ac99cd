// Reading a trace (tools/trace_file.hpp): a small JSON parser and the records
// of the "traceEvents" array. The trace's own format is documented in
// docs/simulation.md; any Chrome trace event file in the JSON object form reads.
#include "tools/trace_file.hpp"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

namespace softverbs::tools {
namespace {

class Parser {
 public:
  Parser(const std::string& text, std::string* error) : s_(text), error_(error) {}

  bool document(JsonValue* out) {
    if (!value(out, 0)) return false;
    ws();
    return at_ == s_.size() || fail("end of input");
  }
  // A value, and where it starts and ends (for a record's raw text).
  bool value(JsonValue* out, int depth, size_t* begin = nullptr, size_t* end = nullptr) {
    if (depth > 64) return fail("less nesting");
    ws();
    if (begin) *begin = at_;
    bool ok = false;
    if (at_ >= s_.size()) return fail("a value");
    const char c = s_[at_];
    if (c == '{') {
      ok = object(out, depth);
    } else if (c == '[') {
      ok = array(out, depth);
    } else if (c == '"') {
      out->kind = JsonValue::Kind::string;
      ok = string(&out->text);
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      ok = number(out);
    } else if (word("true") || word("false")) {
      out->kind = JsonValue::Kind::boolean;
      out->boolean = c == 't';
      ok = true;
    } else if (word("null")) {
      out->kind = JsonValue::Kind::null;
      ok = true;
    } else {
      return fail("a value");
    }
    if (end) *end = at_;
    return ok;
  }

  // The document's object, with the elements of its "traceEvents" array
  // handed to `each` one at a time (with where each starts and ends) instead
  // of being kept: a trace may hold millions. False if it is not JSON;
  // *found says whether the array was there.
  bool stream_events(const std::function<void(const JsonValue&, size_t, size_t)>& each, bool* found) {
    *found = false;
    ws();
    if (at_ >= s_.size() || s_[at_] != '{') return fail("'{'");
    ++at_;
    ws();
    if (at_ < s_.size() && s_[at_] == '}') return ++at_, end_of_input();
    for (;;) {
      ws();
      std::string key;
      if (at_ >= s_.size() || s_[at_] != '"' || !string(&key)) return fail("a member name");
      ws();
      if (at_ >= s_.size() || s_[at_++] != ':') return fail("':'");
      ws();
      if (key == "traceEvents" && at_ < s_.size() && s_[at_] == '[') {
        *found = true;
        if (!events(each)) return false;
      } else {
        JsonValue ignored;
        if (!value(&ignored, 1)) return false;
      }
      ws();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == '}') return ++at_, end_of_input();
      return fail("',' or '}'");
    }
  }

 private:
  bool end_of_input() {
    ws();
    return at_ == s_.size() || fail("end of input");
  }
  bool events(const std::function<void(const JsonValue&, size_t, size_t)>& each) {
    ++at_;
    ws();
    if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
    for (;;) {
      JsonValue v;
      size_t b = 0, e = 0;
      if (!value(&v, 2, &b, &e)) return false;
      each(v, b, e);
      ws();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
      return fail("',' or ']'");
    }
  }

  bool fail(const char* expected) {
    if (error_->empty()) *error_ = "offset " + std::to_string(at_) + ": expected " + expected;
    return false;
  }
  void ws() {
    while (at_ < s_.size() && (s_[at_] == ' ' || s_[at_] == '\n' || s_[at_] == '\r' || s_[at_] == '\t')) ++at_;
  }
  bool word(const char* w) {
    const size_t n = std::strlen(w);
    if (s_.compare(at_, n, w) != 0) return false;
    at_ += n;
    return true;
  }
  bool object(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::object;
    ++at_;
    ws();
    if (at_ < s_.size() && s_[at_] == '}') return ++at_, true;
    for (;;) {
      ws();
      std::string key;
      if (at_ >= s_.size() || s_[at_] != '"' || !string(&key)) return fail("a member name");
      ws();
      if (at_ >= s_.size() || s_[at_++] != ':') return fail("':'");
      out->members.emplace_back(std::move(key), JsonValue{});
      if (!value(&out->members.back().second, depth + 1)) return false;
      ws();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == '}') return ++at_, true;
      return fail("',' or '}'");
    }
  }
  bool array(JsonValue* out, int depth) {
    out->kind = JsonValue::Kind::array;
    ++at_;
    ws();
    if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
    for (;;) {
      out->items.emplace_back();
      if (!value(&out->items.back(), depth + 1)) return false;
      ws();
      if (at_ < s_.size() && s_[at_] == ',') {
        ++at_;
        continue;
      }
      if (at_ < s_.size() && s_[at_] == ']') return ++at_, true;
      return fail("',' or ']'");
    }
  }
  bool string(std::string* out) {
    ++at_;  // the opening quote
    while (at_ < s_.size()) {
      const char c = s_[at_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return fail("no control character in a string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (at_ >= s_.size()) break;
      const char e = s_[at_++];
      switch (e) {
        case '"': case '\\': case '/': *out += e; break;
        case 'b': *out += '\b'; break;
        case 'f': *out += '\f'; break;
        case 'n': *out += '\n'; break;
        case 'r': *out += '\r'; break;
        case 't': *out += '\t'; break;
        case 'u': {
          if (at_ + 4 > s_.size()) return fail("four hex digits");
          const unsigned long cp = std::strtoul(s_.substr(at_, 4).c_str(), nullptr, 16);
          at_ += 4;
          // Enough for the names a trace holds: ASCII as is, anything else as '?'.
          *out += cp < 0x80 ? static_cast<char>(cp) : '?';
          break;
        }
        default:
          return fail("an escape");
      }
    }
    return fail("'\"'");
  }
  bool number(JsonValue* out) {
    const size_t begin = at_;
    while (at_ < s_.size() && std::strchr("+-0123456789.eE", s_[at_])) ++at_;
    out->kind = JsonValue::Kind::number;
    out->text = s_.substr(begin, at_ - begin);
    char* end = nullptr;
    errno = 0;
    out->number = std::strtod(out->text.c_str(), &end);
    if (!end || *end || errno) return fail("a number");
    return true;
  }

  const std::string& s_;
  std::string* error_;
  size_t at_ = 0;
};

}  // namespace

const JsonValue* JsonValue::get(const std::string& key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

bool parse_json(const std::string& text, JsonValue* out, std::string* error) {
  error->clear();
  Parser p(text, error);
  return p.document(out);
}

std::string TraceRecord::arg(const std::string& key) const {
  for (const auto& [k, v] : args)
    if (k == key) return v.text;
  return std::string();
}

std::optional<uint64_t> TraceRecord::num(const std::string& key) const {
  for (const auto& [k, v] : args)
    if (k == key) return v.kind == JsonValue::Kind::number ? std::optional<uint64_t>(static_cast<uint64_t>(v.number))
                                                          : std::nullopt;
  return std::nullopt;
}

bool has_arg(const TraceRecord& r, const std::string& key) {
  for (const auto& a : r.args)
    if (a.first == key) return true;
  return false;
}

bool read_trace(const std::string& path, const std::function<void(const TraceRecord&)>& each, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  error->clear();
  Parser parser(text, error);
  // Tracks: pid -> device, from the process_name records, which come before
  // the device's first record (core/trace.cpp); a tid is a QPN below 2^24.
  std::map<uint64_t, std::string> devices;
  bool bad_record = false;
  TraceRecord r;
  auto convert = [&](const JsonValue& e, size_t begin, size_t end) {
    if (bad_record) return;
    if (e.kind != JsonValue::Kind::object) {
      bad_record = true;
      return;
    }
    r = TraceRecord{};
    for (const auto& [k, v] : e.members) {
      if (k == "name") r.name = v.text;
      else if (k == "cat") r.cat = v.text;
      else if (k == "ph") r.ph = v.text;
      else if (k == "ts") r.ts = v.number;
      else if (k == "pid") r.pid = static_cast<uint64_t>(v.number);
      else if (k == "tid") r.tid = static_cast<uint64_t>(v.number);
      else if (k == "args" && v.kind == JsonValue::Kind::object) r.args = v.members;
    }
    r.raw = std::string_view(text).substr(begin, end - begin);
    if (r.ph == "M" && r.name == "process_name") devices[r.pid] = r.arg("name");
    r.dev = has_arg(r, "dev") ? r.arg("dev") : devices[r.pid];
    r.qpn = r.num("qpn");
    if (!r.qpn && r.ph != "M" && r.tid > 0 && r.tid < (1u << 24)) r.qpn = r.tid;
    each(r);
  };
  bool found = false;
  if (!parser.stream_events(convert, &found)) {
    *error = path + ": not JSON: " + *error;
    return false;
  }
  if (!found) {
    *error = path + ": not a trace (no \"traceEvents\" array)";
    return false;
  }
  if (bad_record) {
    *error = path + ": a trace record is not an object";
    return false;
  }
  return true;
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
