// The `softverbs` command: runs programs on softverbs' libibverbs.so.1 and
// librdmacm.so.1 and answers what a process would get from its configuration.
//   softverbs run [--devices SPEC] [--faults FILE] [--pcap FILE] [--log LEVEL] [--rsockets] [--no-sysfs] [--] CMD [ARGS...]
//   softverbs devices [--devices SPEC]
//   softverbs sysfs [--devices SPEC] DIR
//   softverbs faults check FILE
//   softverbs trace [--qp N] [--device NAME] [--kind KIND] [--from US] [--to US] [--records | -o OUT] FILE
//   softverbs env | softverbs libdir
// docs/configuration.md ("Launcher") is the reference. The program never loads
// libibverbs itself: it links the configuration and scenario parsers only, so
// that what it accepts is exactly what the library accepts.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/env.hpp"
#include "core/log.hpp"
#include "emu/device/config.hpp"
#include "faults/scenario.hpp"
#include "tools/describe.hpp"
#include "tools/launcher_env.hpp"
#include "tools/sysfs_view.hpp"
#include "tools/trace_file.hpp"

namespace {

using softverbs::tools::libdir;

constexpr int kUsageError = 2;
constexpr int kNotFound = 127;  // the shell's status for a command not found

int fail(const std::string& message, int status = kUsageError) {
  std::cerr << "softverbs: " << message << "\n";
  return status;
}

bool read_file(const std::string& path, std::string* text, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = "cannot read " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream s;
  s << in.rdbuf();
  *text = s.str();
  return true;
}

// The scenario in `path`, parsed as the library would parse SOFTVERBS_FAULTS.
bool load_scenario(const std::string& path, softverbs::faults::Scenario* scenario, std::string* error) {
  std::string text;
  if (!read_file(path, &text, error)) return false;
  if (softverbs::faults::parse_scenario(text, 0, scenario, error)) return true;
  *error = path + ": " + *error;
  return false;
}

struct RunOptions {
  std::string devices, faults, pcap, log;
  bool rsockets = false;
  bool no_sysfs = false;
  std::vector<std::string> command;
};

// The devices `spec` gives, with the environment's link layer and MTU, as the
// library parses them; without `spec`, the environment's devices as the library
// reads them (SOFTVERBS_DEVICES, or SOFTVERBS_TOPOLOGY's nodes).
std::optional<softverbs::emu::Config> config_of(const std::string& spec, std::string* error) {
  using namespace softverbs;
  if (spec.empty()) return emu::config_from_env(error);
  // The view describes the devices of the personality the program will run with.
  if (!emu::personality_from_env(error)) return std::nullopt;
  return emu::parse_config(spec.c_str(), env::link_layer(), env::mtu(), error);
}

// Gives the program about to be exec'd (this process) a /sys/class that
// describes its emulated devices (docs/configuration.md, "The sysfs view").
// Where that is impossible the program runs without it, as before: one line
// at info level says why.
void enter_sysfs_view(const std::string& spec) {
  using namespace softverbs;
  const char* backend = env::backend();
  if (backend && std::string(backend) == "hw") {
    SV_LOG(kInfo, "no sysfs view: SOFTVERBS_BACKEND=hw lists no emulated devices");
    return;
  }
  std::string error;
  auto config = config_of(spec, &error);
  if (!config) return;  // the library reports it
  std::string auto_addrs;
  // The program keeps this process's id, so the library would search from the same point.
  std::vector<emu::ViewDevice> devices = tools::plan_view(*config, static_cast<uint32_t>(::getpid()), &auto_addrs);
  if (!tools::enter_view(emu::sysfs_nodes(devices), &error)) {
    SV_LOG(kInfo, "no sysfs view (%s): programs that read /sys/class/infiniband will not find the devices", error.c_str());
    return;
  }
  if (!auto_addrs.empty()) setenv("SOFTVERBS_AUTO_ADDRS", auto_addrs.c_str(), 1);
  SV_LOG(kDebug, "sysfs view: %zu emulated device%s in /sys/class/infiniband%s%s", devices.size(),
         devices.size() == 1 ? "" : "s", auto_addrs.empty() ? "" : ", SOFTVERBS_AUTO_ADDRS=", auto_addrs.c_str());
}

// Checks the options as the library will read them, sets the environment and
// execs the command; returns only on failure.
int run(const RunOptions& o) {
  std::string error;
  if (!o.devices.empty() && !softverbs::emu::parse_config(o.devices.c_str(), nullptr, nullptr, &error))
    return fail("--devices: " + error);
  std::string faults;
  if (!o.faults.empty()) {
    softverbs::faults::Scenario scenario;
    if (!load_scenario(o.faults, &scenario, &error)) return fail("--faults: " + error);
    // Absolute: the command may change its working directory before the library reads it.
    faults = std::filesystem::absolute(o.faults).lexically_normal().string();
  }
  if (o.command.empty()) return fail("run: no command given (softverbs run [OPTIONS] [--] CMD [ARGS...])");

  std::string path = libdir();
  std::string old = softverbs::tools::ld_library_path();
  if (!old.empty()) path += ":" + old;
  setenv("LD_LIBRARY_PATH", path.c_str(), 1);
  if (!o.devices.empty()) setenv("SOFTVERBS_DEVICES", o.devices.c_str(), 1);
  if (!faults.empty()) setenv("SOFTVERBS_FAULTS", faults.c_str(), 1);
  if (!o.pcap.empty()) setenv("SOFTVERBS_PCAP", o.pcap.c_str(), 1);
  if (!o.log.empty()) setenv("SOFTVERBS_LOG", o.log.c_str(), 1);
  if (o.rsockets) {
    // librspreload.so after what is preloaded already (a sanitizer runtime must stay first).
    std::string preload = softverbs::tools::ld_preload();
    preload += (preload.empty() ? "" : ":") + libdir() + "/librspreload.so";
    setenv("LD_PRELOAD", preload.c_str(), 1);
  }
  if (!o.no_sysfs) enter_sysfs_view(o.devices);

  std::vector<char*> argv;
  for (const std::string& a : o.command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  execvp(argv[0], argv.data());
  int err = errno;
  return fail(o.command[0] + ": " + std::strerror(err), err == ENOENT ? kNotFound : 126);
}

std::string proc_net_udp() {
  std::string text, error;
  read_file("/proc/net/udp", &text, &error);
  return text;
}

int devices(const std::string& spec) {
  using namespace softverbs;
  std::string error;
  const char* text = spec.empty() ? env::devices() : spec.c_str();
  auto config = config_of(spec, &error);
  if (!config) return fail(error);
  std::vector<in_addr> bound = tools::roce_ports_bound(proc_net_udp());
  auto taken = [&](in_addr a) {
    for (in_addr b : bound)
      if (b.s_addr == a.s_addr || b.s_addr == INADDR_ANY) return true;
    return false;
  };
  if (text && *text)
    std::cout << "SOFTVERBS_DEVICES=" << text << (spec.empty() ? " (environment)" : " (--devices)");
  else if (config->topology)
    std::cout << "SOFTVERBS_TOPOLOGY=" << env::topology() << " (environment: its nodes)";
  else
    std::cout << "SOFTVERBS_DEVICES unset or empty (means 1)";
  std::cout << ": " << config->devices.size() << " device" << (config->devices.size() == 1 ? "" : "s") << "\n";
  for (const emu::DeviceConfig& d : config->devices) {
    std::cout << "  " << d.name << ": " << tools::to_string(d.link_layer) << ", MTU " << tools::mtu_bytes(d.active_mtu)
              << ", ";
    if (d.addr)
      std::cout << "fixed address " << tools::to_string(*d.addr)
                << (taken(*d.addr) ? " (UDP port 4791 is taken there now: the device would not be created)" : "");
    else
      std::cout << "automatic address (the first free one in 127.0.1.1-127.0.191.255)";
    std::cout << "\n";
  }
  std::cout << "UDP port 4791 bound on this host now:";
  if (bound.empty()) std::cout << " nowhere";
  for (in_addr a : bound)
    std::cout << " " << (a.s_addr == INADDR_ANY ? "0.0.0.0 (every address: a kernel RoCE driver?)" : tools::to_string(a));
  std::cout << "\n";
  return 0;
}

// Writes the sysfs description of the devices into DIR/class, for tools that
// take a sysfs root (SYSFS_PATH=DIR), and prints the SOFTVERBS_AUTO_ADDRS
// that gives a process started now the automatic addresses described.
int sysfs(const std::string& spec, const std::string& dir) {
  using namespace softverbs;
  std::string error;
  auto config = config_of(spec, &error);
  if (!config) return fail(error);
  std::error_code ec;
  const std::string root = dir + "/class";
  std::filesystem::create_directories(root, ec);
  if (ec) return fail("cannot create " + root + ": " + ec.message(), 1);
  std::string auto_addrs;
  std::vector<emu::ViewDevice> devices = tools::plan_view(*config, static_cast<uint32_t>(::getpid()), &auto_addrs);
  if (!tools::write_nodes(root, emu::sysfs_nodes(devices), &error)) return fail(error, 1);
  std::cout << "wrote " << devices.size() << " device" << (devices.size() == 1 ? "" : "s") << " into " << root
            << "/infiniband\n";
  if (!auto_addrs.empty()) std::cout << "export SOFTVERBS_AUTO_ADDRS=" << auto_addrs << "\n";
  return 0;
}

int faults_check(const std::string& path) {
  softverbs::faults::Scenario scenario;
  std::string error;
  if (!load_scenario(path, &scenario, &error)) return fail(error, 1);
  std::cout << path << ": valid, " << scenario.rules.size() << " rule" << (scenario.rules.size() == 1 ? "" : "s");
  if (scenario.seed) std::cout << ", seed " << *scenario.seed;
  std::cout << "\n";
  for (const auto& rule : scenario.rules) std::cout << softverbs::tools::describe_rule(rule) << "\n";
  return 0;
}

struct TraceOptions {
  std::string file, output;
  softverbs::tools::TraceFilter filter;
  bool records = false;
};

// `softverbs trace`: the summary of a SOFTVERBS_TRACE file, its matching
// records, or a filtered copy (docs/simulation.md, "The trace").
int trace(const TraceOptions& o) {
  namespace t = softverbs::tools;
  std::string error;
  if (!o.output.empty()) {
    std::ofstream out(o.output, std::ios::binary | std::ios::trunc);
    if (!out) return fail("cannot write " + o.output + ": " + std::strerror(errno), 1);
    bool first = true;
    t::write_trace_begin(out);
    if (!t::read_trace(o.file, [&](const t::TraceRecord& r) { t::write_trace_add(r, o.filter, &first, out); }, &error))
      return fail(error, 1);
    t::write_trace_end(out);
    return out.good() ? 0 : fail("cannot write " + o.output, 1);
  }
  if (o.records) {
    // Printed as read; an error later in the file still ends with status 1.
    if (!t::read_trace(o.file, [&](const t::TraceRecord& r) { t::print_record(r, o.filter, std::cout); }, &error))
      return fail(error, 1);
    return 0;
  }
  t::TraceSummary summary(o.filter);
  if (!t::read_trace(o.file, [&](const t::TraceRecord& r) { summary.add(r); }, &error)) return fail(error, 1);
  summary.print(std::cout);
  return 0;
}

// Splits `softverbs run ... [--] CMD ARGS` into the launcher's part and CMD
// ARGS, which must reach the command untouched even when they look like
// options: the command starts after "--" or at the first word that is neither
// an option nor an option's value. (CLI11 would read CMD's own options.)
size_t command_start(int argc, char** argv, const std::vector<std::string>& value_options, bool* dashdash) {
  *dashdash = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      *dashdash = true;
      return i;
    }
    if (a.empty() || a[0] != '-') return i;
    for (const std::string& o : value_options)
      if (a == o) ++i;  // its value follows
  }
  return argc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"softverbs: run programs on emulated RDMA devices (docs/configuration.md, \"Launcher\")", "softverbs"};
  app.set_version_flag("--version", SOFTVERBS_VERSION);
  app.require_subcommand(1);

  RunOptions ro;
  auto* run_cmd = app.add_subcommand(
      "run", "run CMD on softverbs' libibverbs.so.1 and librdmacm.so.1 (LD_LIBRARY_PATH, SOFTVERBS_*)");
  run_cmd->add_option("--devices", ro.devices, "SOFTVERBS_DEVICES for CMD, checked first");
  run_cmd->add_option("--faults", ro.faults, "a fault scenario (SOFTVERBS_FAULTS, made absolute), checked first");
  run_cmd->add_option("--pcap", ro.pcap, "capture the packets to this pcap file (SOFTVERBS_PCAP; %p: the pid)");
  run_cmd->add_option("--log", ro.log, "SOFTVERBS_LOG for CMD")
      ->check(CLI::IsMember({"none", "error", "warn", "info", "debug"}));
  run_cmd->add_flag("--rsockets", ro.rsockets, "TCP sockets of CMD over rsockets (LD_PRELOAD=librspreload.so)");
  run_cmd->add_flag("--no-sysfs", ro.no_sysfs,
                    "no /sys/class/infiniband view of the devices (no mount or user namespace)");
  run_cmd->footer("CMD [ARGS...] follow the options, after an optional --.");

  std::string dev_spec;
  auto* dev_cmd = app.add_subcommand("devices", "the devices a process would get, and the RoCEv2 ports bound now");
  dev_cmd->add_option("--devices", dev_spec, "a SOFTVERBS_DEVICES value (default: the environment's)");

  std::string sysfs_spec, sysfs_dir;
  auto* sysfs_cmd = app.add_subcommand("sysfs", "write the devices' sysfs files into DIR/class (for SYSFS_PATH=DIR)");
  sysfs_cmd->add_option("--devices", sysfs_spec, "a SOFTVERBS_DEVICES value (default: the environment's)");
  sysfs_cmd->add_option("DIR", sysfs_dir, "the sysfs root to write into")->required();

  std::string scenario;
  auto* faults_cmd = app.add_subcommand("faults", "fault scenarios (docs/faults.md)");
  faults_cmd->require_subcommand(1);
  auto* check_cmd = faults_cmd->add_subcommand("check", "check a scenario file and print its rules in words");
  check_cmd->add_option("FILE", scenario, "the scenario (TOML)")->required();

  TraceOptions to;
  auto* trace_cmd = app.add_subcommand("trace", "summarise or filter a SOFTVERBS_TRACE file (per QP)");
  trace_cmd->add_option("FILE", to.file, "the trace (Chrome trace event JSON)")->required();
  trace_cmd->add_option("--qp", to.filter.qp, "only records of this QP number");
  trace_cmd->add_option("--device", to.filter.device, "only records of this device");
  trace_cmd->add_option("--kind", to.filter.kind, "only records of this kind")
      ->check(CLI::IsMember({"packet", "timer", "wr", "event", "verb"}));
  trace_cmd->add_option("--from", to.filter.from, "only records at or after this time (us from the trace's start)");
  trace_cmd->add_option("--to", to.filter.to, "only records at or before this time (us)");
  auto* records_flag = trace_cmd->add_flag("--records", to.records, "print the matching records instead of a summary");
  trace_cmd->add_option("-o,--output", to.output, "write the matching records as a trace file")->excludes(records_flag);

  auto* env_cmd = app.add_subcommand("env", "print the LD_LIBRARY_PATH line `run` sets, for eval");
  auto* libdir_cmd = app.add_subcommand("libdir", "print the directory of softverbs' libraries");

  // The command of `run` is cut off before CLI11 sees the arguments.
  int parsed_argc = argc;
  if (argc >= 2 && std::string(argv[1]) == "run") {
    bool dashdash = false;
    size_t start = command_start(argc, argv, {"--devices", "--faults", "--pcap", "--log"}, &dashdash);
    for (size_t i = start + (dashdash ? 1 : 0); i < static_cast<size_t>(argc); ++i) ro.command.push_back(argv[i]);
    parsed_argc = static_cast<int>(start);
  }
  // Before the commands, only the program's own options: name what is wrong.
  if (argc >= 2) {
    std::string first = argv[1];
    bool known = first == "-h" || first == "--help" || first == "--version";
    for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
      known |= sub->get_name() == first;
    if (!known && first[0] == '-') return fail("unknown option '" + first + "' (see softverbs --help)");
    if (!known)
      return fail("unknown command '" + first + "' (run, devices, sysfs, faults, trace, env, libdir; see --help)");
  }
  try {
    app.parse(parsed_argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see softverbs --help)");
  }

  if (run_cmd->parsed()) return run(ro);
  if (dev_cmd->parsed()) return devices(dev_spec);
  if (check_cmd->parsed()) return faults_check(scenario);
  if (sysfs_cmd->parsed()) return sysfs(sysfs_spec, sysfs_dir);
  if (trace_cmd->parsed()) return trace(to);
  if (libdir_cmd->parsed()) {
    std::cout << libdir() << "\n";
    return 0;
  }
  if (env_cmd->parsed()) {
    std::cout << "export LD_LIBRARY_PATH=\"" << libdir() << "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\"\n";
    return 0;
  }
  return fail("no command (run, devices, sysfs, faults, trace, env, libdir; see --help)");
}
