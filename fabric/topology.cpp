// The topology file (docs/simulation.md "A simulated fabric") and the links'
// run-time state: serialisation and seeded loss per directed link.
#include "fabric/topology.hpp"

#define TOML_HEADER_ONLY 1
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace softverbs::fabric {
namespace {

std::string line_of(const toml::node& n) { return "line " + std::to_string(n.source().begin.line); }

// A number (integer or float) from a key; nullopt with a message when present but wrong.
bool get_number(const toml::table& t, const char* key, double lo, double hi, std::optional<double>* out,
                std::string* error) {
  const toml::node* n = t.get(key);
  if (!n) return true;
  std::optional<double> v;
  if (auto i = n->value_exact<int64_t>()) v = static_cast<double>(*i);
  if (auto f = n->value_exact<double>()) v = *f;
  if (!v || !std::isfinite(*v) || *v < lo || *v > hi) {
    std::ostringstream os;
    os << line_of(*n) << ": '" << key << "' must be a number from " << lo << " to " << hi;
    *error = os.str();
    return false;
  }
  *out = v;
  return true;
}

// The link keys of a [default] or [[link]] table, applied over *p.
bool parse_props(const toml::table& t, LinkProps* p, std::string* error) {
  std::optional<double> latency, bandwidth, loss, mtu;
  // Up to 10 s of latency and 10 Tb/s: beyond both, a value is a typo.
  if (!get_number(t, "latency_us", 0, 1e7, &latency, error) ||
      !get_number(t, "bandwidth_gbps", 0, 1e4, &bandwidth, error) || !get_number(t, "loss", 0, 1, &loss, error) ||
      !get_number(t, "mtu", 0, 4096, &mtu, error))
    return false;
  if (mtu) {
    const double m = *mtu;
    if (m != 0 && m != 256 && m != 512 && m != 1024 && m != 2048 && m != 4096) {
      *error = line_of(*t.get("mtu")) + ": 'mtu' must be an IB MTU (256, 512, 1024, 2048, 4096) or 0 (no limit)";
      return false;
    }
    p->mtu = static_cast<uint32_t>(m);
  }
  if (latency) p->latency_ns = static_cast<uint64_t>(std::llround(*latency * 1000));
  if (bandwidth) p->bandwidth_bps = static_cast<uint64_t>(std::llround(*bandwidth * 1e9));
  if (loss) p->loss = *loss;
  return true;
}

bool only_keys(const toml::table& t, std::initializer_list<std::string_view> keys, const char* what,
               std::string* error) {
  for (auto&& [k, v] : t) {
    if (std::find(keys.begin(), keys.end(), k.str()) == keys.end()) {
      std::string list;
      for (std::string_view s : keys) list += (list.empty() ? "" : ", ") + std::string(s);
      *error = line_of(v) + ": unknown key '" + std::string(k.str()) + "' in " + what + " (" + list + ")";
      return false;
    }
  }
  return true;
}

// A name as SOFTVERBS_DEVICES writes it: no separators of that grammar.
bool valid_name(std::string_view s) {
  return !s.empty() && s.size() < 64 && s != "*" && s.find_first_of(",@/ \t") == std::string_view::npos;
}

bool parse_nodes(const toml::node& n, Topology* t, std::string* error) {
  if (auto count = n.value_exact<int64_t>()) {
    if (*count < 1 || *count > static_cast<int64_t>(Topology::kMaxNodes)) {
      *error = line_of(n) + ": 'nodes' must be from 1 to " + std::to_string(Topology::kMaxNodes);
      return false;
    }
    // The names SOFTVERBS_DEVICES=N gives.
    for (int64_t i = 0; i < *count; ++i) t->nodes.push_back("emu" + std::to_string(i));
    return true;
  }
  const toml::array* a = n.as_array();
  if (!a || a->empty() || a->size() > Topology::kMaxNodes) {
    *error = line_of(n) + ": 'nodes' must be a count or a list of 1 to " + std::to_string(Topology::kMaxNodes) +
             " device names";
    return false;
  }
  for (const toml::node& e : *a) {
    auto s = e.value_exact<std::string>();
    if (!s || !valid_name(*s)) {
      *error = line_of(e) + ": a node is a device name (no ',', '@', '/', spaces; not '*')";
      return false;
    }
    if (t->index_of(*s)) {
      *error = line_of(e) + ": node '" + *s + "' is listed twice";
      return false;
    }
    t->nodes.push_back(*s);
  }
  return true;
}

// The nodes a link end names: one node, or "*" for all of them.
bool parse_end(const toml::node& n, const Topology& t, std::vector<size_t>* out, std::string* error) {
  auto s = n.value_exact<std::string>();
  if (s && *s == "*") {
    for (size_t i = 0; i < t.nodes.size(); ++i) out->push_back(i);
    return true;
  }
  std::optional<size_t> i = s ? t.index_of(*s) : std::nullopt;
  if (!i) {
    *error = line_of(n) + ": " + (s ? "'" + *s + "' is not a node" : std::string("a link end is a node name or \"*\""));
    return false;
  }
  out->push_back(*i);
  return true;
}

// One [[link]]: `between = [A, B]` (both directions) or `from`/`to` (one).
bool parse_link(const toml::table& l, Topology* t, std::string* error) {
  if (!only_keys(l, {"between", "from", "to", "latency_us", "bandwidth_gbps", "loss", "mtu"}, "[[link]]", error))
    return false;
  std::vector<size_t> from, to;
  bool both = false;
  if (const toml::node* b = l.get("between")) {
    const toml::array* a = b->as_array();
    if (!a || a->size() != 2 || l.contains("from") || l.contains("to")) {
      *error = line_of(*b) + ": 'between' is a list of two nodes, without 'from' and 'to'";
      return false;
    }
    if (!parse_end((*a)[0], *t, &from, error) || !parse_end((*a)[1], *t, &to, error)) return false;
    both = true;
  } else {
    const toml::node* f = l.get("from");
    const toml::node* d = l.get("to");
    if (!f || !d) {
      *error = line_of(l) + ": a [[link]] names its ends: 'between = [A, B]', or 'from' and 'to'";
      return false;
    }
    if (!parse_end(*f, *t, &from, error) || !parse_end(*d, *t, &to, error)) return false;
  }
  const size_t n = t->nodes.size();
  for (size_t i : from) {
    for (size_t j : to) {
      if (i == j) continue;
      if (!parse_props(l, &t->props[i * n + j], error)) return false;
      if (both && !parse_props(l, &t->props[j * n + i], error)) return false;
    }
  }
  return true;
}

}  // namespace

std::optional<size_t> Topology::index_of(std::string_view name) const {
  for (size_t i = 0; i < nodes.size(); ++i)
    if (nodes[i] == name) return i;
  return std::nullopt;
}

bool parse_topology(std::string_view text, Topology* out, std::string* error) {
  toml::table doc;
  try {
    doc = toml::parse(text);
  } catch (const toml::parse_error& e) {
    *error = "line " + std::to_string(e.source().begin.line) + ": " + std::string(e.description());
    return false;
  }
  if (!only_keys(doc, {"seed", "nodes", "default", "link"}, "the file", error)) return false;
  Topology t;
  if (const toml::node* n = doc.get("seed")) {
    auto v = n->value_exact<int64_t>();
    if (!v || *v < 0) {
      *error = line_of(*n) + ": 'seed' must be a non-negative integer";
      return false;
    }
    t.seed = static_cast<uint64_t>(*v);
  }
  const toml::node* nodes = doc.get("nodes");
  if (!nodes) {
    *error = "line 1: 'nodes' is missing (a count, or a list of device names)";
    return false;
  }
  if (!parse_nodes(*nodes, &t, error)) return false;
  if (const toml::node* d = doc.get("default")) {
    const toml::table* dt = d->as_table();
    if (!dt) {
      *error = line_of(*d) + ": 'default' is a table: [default]";
      return false;
    }
    if (!only_keys(*dt, {"latency_us", "bandwidth_gbps", "loss", "mtu"}, "[default]", error) ||
        !parse_props(*dt, &t.defaults, error))
      return false;
  }
  t.props.assign(t.nodes.size() * t.nodes.size(), t.defaults);
  if (const toml::node* l = doc.get("link")) {
    const toml::array* a = l->as_array();
    if (!a) {
      *error = line_of(*l) + ": links are written as [[link]] tables";
      return false;
    }
    for (const toml::node& e : *a) {
      const toml::table* lt = e.as_table();
      if (!lt) {
        *error = line_of(e) + ": links are written as [[link]] tables";
        return false;
      }
      if (!parse_link(*lt, &t, error)) return false;
    }
  }
  *out = std::move(t);
  return true;
}

bool load_topology(const std::string& path, Topology* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = path + ": cannot be read";
    return false;
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (!parse_topology(text.str(), out, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

namespace {

// splitmix64: a small, well-mixed stream per link, so that thousands of links
// cost a word each (the fault engine's per-rule mt19937 would cost 2.5 KiB).
uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

SimFabric::SimFabric(Topology topology)
    : topology_(std::move(topology)), wires_(new Wire[topology_.nodes.size() * topology_.nodes.size()]) {
  // Each link's stream depends on the seed and the link's ends only, so a
  // link's decisions do not change when other links carry more or less.
  const size_t n = topology_.nodes.size();
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < n; ++j) {
      uint64_t s = topology_.seed ^ (static_cast<uint64_t>(i) << 32 | j);
      wires_[i * n + j].rng = splitmix64(&s);
    }
  }
}

void SimFabric::add_node(size_t index, in_addr addr) { addrs_.emplace_back(addr.s_addr, index); }

std::optional<size_t> SimFabric::node_at(in_addr addr) const {
  for (const auto& [a, i] : addrs_)
    if (a == addr.s_addr) return i;
  return std::nullopt;
}

LinkVerdict SimFabric::cross(size_t from, size_t to, uint64_t bytes, uint64_t payload, Clock::time_point now,
                             Clock::time_point* arrival) {
  const LinkProps& p = topology_.link(from, to);
  if (p.mtu != 0 && payload > p.mtu) return LinkVerdict::kTooBig;
  Wire& w = wires_[from * topology_.nodes.size() + to];
  std::lock_guard lock(w.mu);
  // The packet starts when the previous one has left, and arrives its
  // serialisation time plus the latency later.
  const Clock::time_point start = std::max(now, w.free_at);
  w.free_at = start + std::chrono::nanoseconds(p.serialisation_ns(bytes));
  *arrival = w.free_at + std::chrono::nanoseconds(p.latency_ns);
  // One draw per packet that gets on the wire, in the order they do: the
  // decisions depend on the seed and that order only.
  if (p.loss > 0) {
    const double u = static_cast<double>(splitmix64(&w.rng) >> 11) * 0x1.0p-53;
    if (u < p.loss) return LinkVerdict::kLost;
  }
  return LinkVerdict::kPass;
}

}  // namespace softverbs::fabric
