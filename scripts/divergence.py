#!/usr/bin/env python3
"""Divergence report: the conformance suite's verdicts and observations on one
backend, and the differences between two such reports.

  divergence.py run --backend emu|hw|both [--hw-over-emu] [--out DIR] [--filter F]
  divergence.py compare A.json B.json [--md OUT] [--json OUT] [--pair DEV_A=DEV_B]
  divergence.py personality REPORT.json [--name NAME] [--device DEV] > NAME.toml

`run` runs build/tests/conformance/conformance_tests in the environment the
ctest entries use and writes DIR/NAME.json and DIR/NAME.md. `compare` lists
every test whose verdict or observed values differ between two reports.
`personality` writes a personality file (data/personalities/) from what a
report observed. See
docs/hardware.md, "Divergence report". Python 3 standard library only.
"""

import argparse
import datetime
import json
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import tempfile

FORMAT = "softverbs-divergence-report"
VERSION = 1
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The emulated devices of every run, as tests/conformance/CMakeLists.txt pins
# them: one RoCE and one InfiniBand device, active MTU 1024.
EMU_DEVICES = "cf_roce/eth,cf_ib/ib"
EMU_MTU = "1024"
# Variables that would change what the suite sees and are not part of a report.
UNSET = ("SOFTVERBS_LINK_LAYER", "SOFTVERBS_FAULTS", "SOFTVERBS_FAULT_SEED", "SOFTVERBS_FAULT_LOG")

# Keys of a gtest JSON test object that are not test properties.
GTEST_KEYS = {"name", "value_param", "type_param", "file", "line", "status", "result", "timestamp", "time",
              "classname", "failures"}
OBSERVED = "observed."

EXIT_OK, EXIT_DIFFER, EXIT_ERROR = 0, 1, 2


class Failure(Exception):
    """An error that ends the command with exit status 2 and a message."""


# ---------------------------------------------------------------------------
# run


def sanitize(device):
    """The device name as it appears in test names (conformance::device_param_name)."""
    out = re.sub(r"[^A-Za-z0-9]", "_", device)
    return out or "unnamed"


def unquote_param(text):
    """A gtest-printed std::string parameter ("cf_roce", with C escapes) to its value."""
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        body = text[1:-1]
        try:
            return body.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError:
            return body
    return text


def parse_listing(text):
    """--gtest_list_tests output to [(full test name, device or None)], in order."""
    tests = []
    suite = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#", 1)[0].strip()
            continue
        name, _, comment = line.strip().partition("#")
        device = None
        m = re.search(r"GetParam\(\) = (.*)$", comment.strip())
        if m:
            device = unquote_param(m.group(1).strip())
        if suite:
            tests.append((suite + name.strip(), device))
    return tests


def devices_of(listing):
    seen = []
    for _, device in listing:
        if device is not None and device not in seen:
            seen.append(device)
    return seen


def build_dir(args):
    return os.path.abspath(args.build or os.environ.get("SOFTVERBS_BUILD_DIR") or os.path.join(ROOT, "build"))


def run_environment(args, build):
    env = dict(os.environ)
    for name in UNSET:
        env.pop(name, None)
    env["SOFTVERBS_DEVICES"] = EMU_DEVICES
    env["SOFTVERBS_MTU"] = EMU_MTU
    env["SOFTVERBS_BACKEND"] = args.backend
    hw_library = None
    if args.hw_over_emu:
        hw_library = os.path.join(build, "lib-hwtest", "libibverbs.so.1")
        if not os.path.isfile(hw_library):
            raise Failure("--hw-over-emu: no %s (built by the sv_hwtest_lib target; not made in sanitizer builds "
                          "without SOFTVERBS_HWTEST_INNER)" % hw_library)
        env["SOFTVERBS_HW_LIBIBVERBS"] = hw_library
    elif args.backend != "emu":
        hw_library = env.get("SOFTVERBS_HW_LIBIBVERBS", "/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
    return env, hw_library


def run_process(cmd, env, timeout=None):
    try:
        return subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure("%s did not finish within %s s" % (" ".join(cmd), timeout))
    except OSError as e:
        raise Failure("cannot run %s: %s" % (cmd[0], e))


def list_tests(binary, env, gtest_filter=None):
    cmd = [binary, "--gtest_list_tests"]
    if gtest_filter:
        cmd.append("--gtest_filter=" + gtest_filter)
    p = run_process(cmd, env, timeout=120)
    if p.returncode != 0:
        raise Failure("listing the tests failed (exit status %d):\n%s" % (p.returncode, p.stderr.strip()))
    return parse_listing(p.stdout)


def combine_filter(user_filter, exclude):
    """A gtest filter: the user's (positive[-negative]) with more negative patterns."""
    positive, _, negative = (user_filter or "*").partition("-")
    negatives = [n for n in negative.split(":") if n] + exclude
    return (positive or "*") + ("-" + ":".join(negatives) if negatives else "")


def status_text(returncode):
    if returncode < 0:
        try:
            return "killed by %s" % signal.Signals(-returncode).name
        except ValueError:
            return "killed by signal %d" % -returncode
    return "exit status %d" % returncode


def skip_reasons(stdout):
    """Test name -> the first line of its GTEST_SKIP message, from gtest's output."""
    reasons = {}
    current = None
    pending = False
    for line in stdout.splitlines():
        m = re.match(r"\[ RUN      \] (\S+)", line)
        if m:
            current, pending = m.group(1), False
            continue
        if current is None:
            continue
        if line.endswith(": Skipped"):
            pending = True
            continue
        if pending and line.strip():
            reasons.setdefault(current, line.strip())
            pending = False
    return reasons


def relative_location(text):
    """Paths in failure texts relative to the source tree."""
    return text.replace(ROOT + os.sep, "")


def convert(gtest_json, stdout):
    """gtest's JSON report to the report's test entries."""
    reasons = skip_reasons(stdout)
    tests = []
    for suite in gtest_json.get("testsuites", []):
        for t in suite.get("testsuite", []):
            classname = t.get("classname", suite.get("name", ""))
            name = t.get("name", "")
            device = None
            test = classname + "." + name
            full = test
            if "value_param" in t:
                device = unquote_param(t["value_param"])
                if "/" in name:
                    test = classname + "." + name.rsplit("/", 1)[0]
            failures = [relative_location(f.get("failure", "")) for f in t.get("failures", [])]
            entry = {"name": full, "test": test, "device": device}
            if failures:
                entry["verdict"] = "fail"
                first = failures[0].split("\n")
                location = first[0]
                message = next((line.strip() for line in first[1:] if line.strip()), "")
                entry["message"] = (location + ": " + message) if message else location
                entry["failures"] = [f[:4000] for f in failures]
            elif t.get("result") == "SKIPPED":
                entry["verdict"] = "skip"
                entry["message"] = reasons.get(full, "")
            elif t.get("status") == "NOTRUN":
                entry["verdict"] = "skip"
                entry["message"] = "not run (disabled)"
            else:
                entry["verdict"] = "pass"
                entry["message"] = ""
            entry["observed"] = {k[len(OBSERVED):]: v for k, v in sorted(t.items())
                                 if k.startswith(OBSERVED) and k not in GTEST_KEYS}
            tests.append(entry)
    return tests


def run_gtest(binary, env, gtest_filter, echo, timeout):
    """One run of the binary. Returns (tests or None if it left no JSON, stdout, returncode)."""
    with tempfile.TemporaryDirectory(prefix="divergence.") as tmp:
        out = os.path.join(tmp, "gtest.json")
        cmd = [binary, "--gtest_filter=" + gtest_filter, "--gtest_output=json:" + out, "--gtest_color=no"]
        lines = []
        try:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    errors="replace")
        except OSError as e:
            raise Failure("cannot run %s: %s" % (binary, e))
        try:
            for line in proc.stdout:
                lines.append(line)
                if echo and re.match(r"\[ +(OK|FAILED|SKIPPED) +\] \S+ \(", line):
                    print(line, end="", flush=True)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        stdout = "".join(lines)
        tests = None
        if os.path.isfile(out):
            try:
                with open(out) as f:
                    tests = convert(json.load(f), stdout)
            except (OSError, ValueError):
                tests = None
        return tests, stdout, proc.returncode


def run_isolated(binary, env, selected, echo, timeout):
    """Every test in a process of its own: a crash costs only the crashing test."""
    tests, log = [], []
    for full, device in selected:
        result, stdout, rc = run_gtest(binary, env, full, False, timeout)
        log.append(stdout)
        if result:
            tests.extend(result)
            entry = result[0]
        else:
            test = full.rsplit("/", 1)[0] if device is not None else full
            entry = {"name": full, "test": test, "device": device, "verdict": "fail",
                     "message": "the test process ended without a result (%s)" % status_text(rc),
                     "observed": {}}
            tests.append(entry)
        if echo:
            print("[ %7s ] %s" % (entry["verdict"].upper(), full), flush=True)
    return tests, "".join(log)


def markdown_cell(text):
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def observed_text(observed):
    return "<br>".join("`%s` = %s" % (markdown_cell(k), markdown_cell(v)) for k, v in sorted(observed.items()))


def report_markdown(report):
    s = report["summary"]
    lines = ["# Conformance report: %s" % report_label(report), "",
             "| | |", "|---|---|",
             "| backend | %s |" % markdown_cell(report_label(report)),
             "| devices | %s |" % markdown_cell(", ".join(report["devices"])),
             "| date | %s |" % report["date"],
             "| host | %s |" % markdown_cell(report["host"]),
             "| filter | `%s` |" % markdown_cell(report.get("filter", "*")),
             "| tests | %d: %d pass, %d fail, %d skip |" % (s["tests"], s["pass"], s["fail"], s["skip"]),
             "", "| test | device | verdict | observed | message |", "|---|---|---|---|---|"]
    for t in report["tests"]:
        lines.append("| %s | %s | %s | %s | %s |" % (markdown_cell(t["test"]), markdown_cell(t["device"] or ""),
                                                     t["verdict"], observed_text(t["observed"]),
                                                     markdown_cell(t.get("message", ""))))
    return "\n".join(lines) + "\n"


def report_label(report):
    return report["backend"] + (" (hw-over-emu)" if report.get("hw_over_emu") else "")


def cmd_run(args):
    if args.hw_over_emu and args.backend != "hw":
        raise Failure("--hw-over-emu needs --backend hw")
    build = build_dir(args)
    binary = os.path.join(build, "tests", "conformance", "conformance_tests")
    if not os.access(binary, os.X_OK):
        raise Failure("no conformance binary at %s (build it first: scripts/build.sh, or pass --build DIR)" % binary)
    env, hw_library = run_environment(args, build)
    name = args.name or (args.backend + ("-over-emu" if args.hw_over_emu else ""))

    # The devices: from the full listing, whatever the filter selects.
    listing = list_tests(binary, env)
    devices = devices_of(listing)
    if not devices:
        print("no device: nothing ran (backend %s lists no device)" % args.backend, file=sys.stderr)
        if args.backend != "emu":
            debug = dict(env, SOFTVERBS_LOG="debug")
            p = run_process([binary, "--gtest_list_tests"], debug, timeout=120)
            why = [line for line in p.stderr.splitlines() if "hw" in line][:10]
            for line in why:
                print("  " + line, file=sys.stderr)
            if not why:
                print("  (SOFTVERBS_LOG=debug shows why the hw backend lists no device)", file=sys.stderr)
        return EXIT_ERROR
    exclude = []
    if args.device:
        if args.device not in devices:
            raise Failure("--device %s: not listed; the devices are %s" % (args.device, ", ".join(devices)))
        exclude = ["*/" + sanitize(d) for d in devices if d != args.device]
        devices = [args.device]
    gtest_filter = combine_filter(args.filter, exclude)
    selected = list_tests(binary, env, gtest_filter)
    if not selected:
        raise Failure("the filter %s selects no test" % gtest_filter)

    print("%s: %d tests on %s (%s)" % (name, len(selected), ", ".join(devices), args.backend), flush=True)
    timeout = args.timeout or None
    if args.isolate:
        tests, stdout = run_isolated(binary, env, selected, not args.quiet, timeout)
    else:
        tests, stdout, rc = run_gtest(binary, env, gtest_filter, not args.quiet, timeout)
        if tests is None:
            print("the conformance binary ended without a report (%s); running each test in a process of its own"
                  % status_text(rc), file=sys.stderr, flush=True)
            tests, stdout = run_isolated(binary, env, selected, not args.quiet, timeout)

    summary = {"tests": len(tests)}
    for verdict in ("pass", "fail", "skip"):
        summary[verdict] = sum(1 for t in tests if t["verdict"] == verdict)
    report = {
        "format": FORMAT,
        "version": VERSION,
        "backend": args.backend,
        "hw_over_emu": bool(args.hw_over_emu),
        "hw_library": hw_library,
        "devices": devices,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "filter": gtest_filter,
        "environment": {k: v for k, v in sorted(env.items()) if k.startswith("SOFTVERBS_")},
        "summary": summary,
        "tests": tests,
    }
    out = os.path.abspath(args.out or os.path.join(build, "divergence"))
    os.makedirs(out, exist_ok=True)
    json_path = os.path.join(out, name + ".json")
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1, sort_keys=False)
        f.write("\n")
    md_path = os.path.join(out, name + ".md")
    with open(md_path, "w") as f:
        f.write(report_markdown(report))
    with open(os.path.join(out, name + ".log"), "w") as f:
        f.write(stdout)
    print("%d tests: %d pass, %d fail, %d skip" % (summary["tests"], summary["pass"], summary["fail"],
                                                   summary["skip"]))
    print("wrote %s and %s" % (json_path, md_path))
    return EXIT_OK if summary["fail"] == 0 else EXIT_DIFFER


# ---------------------------------------------------------------------------
# compare


def load_report(path):
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise Failure("%s: %s" % (path, e))
    if not isinstance(report, dict) or report.get("format") != FORMAT:
        raise Failure("%s: not a divergence report (format %r)" % (path, FORMAT))
    if report.get("version") != VERSION:
        raise Failure("%s: report version %r, expected %d" % (path, report.get("version"), VERSION))
    for t in report.get("tests", []):
        for key in ("test", "verdict"):
            if key not in t:
                raise Failure("%s: a test without %r" % (path, key))
        t.setdefault("device", None)
        t.setdefault("observed", {})
        t.setdefault("message", "")
        t.setdefault("name", t["test"])
    report.setdefault("devices", [])
    return report


def pair_devices(a, b, explicit):
    """[(device of A, device of B)]: explicit pairs, else the only device of each, else by position."""
    if explicit:
        pairs = []
        for p in explicit:
            left, sep, right = p.partition("=")
            if not sep or left not in a["devices"] or right not in b["devices"]:
                raise Failure("--pair %s: expected DEVICE_OF_A=DEVICE_OF_B (A: %s; B: %s)"
                              % (p, ", ".join(a["devices"]), ", ".join(b["devices"])))
            pairs.append((left, right))
        return pairs
    return list(zip(a["devices"], b["devices"]))


def keyed(report, slots):
    """(test, slot) -> entry, where slot is the device pair's index (None: no device)."""
    out, unpaired = {}, []
    for t in report["tests"]:
        if t["device"] is None:
            out[(t["test"], None)] = t
        elif t["device"] in slots:
            out[(t["test"], slots[t["device"]])] = t
        else:
            unpaired.append(t)
    return out, unpaired


def describe_devices(pairs, slot):
    if slot is None:
        return ""
    left, right = pairs[slot]
    return " [%s]" % (left if left == right else left + " = " + right)


def compare(a, b, pairs):
    """The differences: a list of dicts, in A's test order, then B's extra tests."""
    ka, only_a = keyed(a, {d: i for i, (d, _) in enumerate(pairs)})
    kb, only_b = keyed(b, {d: i for i, (_, d) in enumerate(pairs)})
    diffs = []
    for key, ta in ka.items():
        tb = kb.get(key)
        if tb is None:
            only_a.append(ta)
            continue
        d = {"test": key[0], "devices": describe_devices(pairs, key[1]).strip(" []"), "a": ta, "b": tb,
             "verdict": ta["verdict"] != tb["verdict"], "observed": []}
        for k in sorted(set(ta["observed"]) | set(tb["observed"])):
            va, vb = ta["observed"].get(k), tb["observed"].get(k)
            if va != vb:
                d["observed"].append((k, va, vb))
        if d["verdict"] or d["observed"]:
            diffs.append(d)
    only_b.extend(t for key, t in kb.items() if key not in ka)
    return diffs, only_a, only_b


def header(label, report):
    s = report.get("summary", {})
    return "%s: %s on %s, devices %s, %s; %s tests: %s pass, %s fail, %s skip" % (
        label, report_label(report), report.get("host", "?"), ", ".join(report["devices"]) or "none",
        report.get("date", "?"), s.get("tests", len(report["tests"])), s.get("pass", "?"), s.get("fail", "?"),
        s.get("skip", "?"))


def shown(value):
    return "(not observed)" if value is None else value


def verdict_text(t):
    if t["verdict"] == "pass" or not t.get("message"):
        return t["verdict"]
    return "%s (%s)" % (t["verdict"], t["message"])


def compare_text(a, b, pairs, diffs, only_a, only_b):
    lines = [header("A", a), header("B", b)]
    if pairs:
        lines.append("devices matched: " + ", ".join(x if x == y else "%s = %s" % (x, y) for x, y in pairs))
    lines.append("")
    for d in diffs:
        lines.append(d["test"] + (" [%s]" % d["devices"] if d["devices"] else ""))
        if d["verdict"]:
            lines.append("  verdict: %s -> %s" % (verdict_text(d["a"]), verdict_text(d["b"])))
        for k, va, vb in d["observed"]:
            lines.append("  observed %s: %s -> %s" % (k, shown(va), shown(vb)))
    for t in only_a:
        lines.append("only in A: %s%s (%s)" % (t["test"], " [%s]" % t["device"] if t["device"] else "", t["verdict"]))
    for t in only_b:
        lines.append("only in B: %s%s (%s)" % (t["test"], " [%s]" % t["device"] if t["device"] else "", t["verdict"]))
    if diffs or only_a or only_b:
        lines.append("")
    n_verdict = sum(1 for d in diffs if d["verdict"])
    n_observed = sum(1 for d in diffs if d["observed"])
    if not (diffs or only_a or only_b):
        lines.append("identical: every matched test has the same verdict and observations")
    else:
        lines.append("%d tests differ (%d in verdict, %d in observations); %d only in A, %d only in B"
                     % (len(diffs), n_verdict, n_observed, len(only_a), len(only_b)))
        keys = {}
        for d in diffs:
            for k, _, _ in d["observed"]:
                keys[k] = keys.get(k, 0) + 1
        for k in sorted(keys):
            lines.append("  observed %s differs in %d test%s" % (k, keys[k], "" if keys[k] == 1 else "s"))
    return "\n".join(lines) + "\n"


def compare_markdown(a, b, pairs, diffs, only_a, only_b):
    lines = ["# Divergence: %s vs %s" % (report_label(a), report_label(b)), "",
             "| | A | B |", "|---|---|---|",
             "| backend | %s | %s |" % (markdown_cell(report_label(a)), markdown_cell(report_label(b))),
             "| devices | %s | %s |" % (markdown_cell(", ".join(a["devices"])), markdown_cell(", ".join(b["devices"]))),
             "| host | %s | %s |" % (markdown_cell(a.get("host", "")), markdown_cell(b.get("host", ""))),
             "| date | %s | %s |" % (a.get("date", ""), b.get("date", "")), ""]
    if not (diffs or only_a or only_b):
        lines.append("No differences: every matched test has the same verdict and observations.")
        return "\n".join(lines) + "\n"
    lines += ["| test | devices | verdict A | verdict B | observed A | observed B | message B |",
              "|---|---|---|---|---|---|---|"]
    for d in diffs:
        obs_a = "<br>".join("`%s` = %s" % (markdown_cell(k), markdown_cell(shown(va))) for k, va, _ in d["observed"])
        obs_b = "<br>".join("`%s` = %s" % (markdown_cell(k), markdown_cell(shown(vb))) for k, _, vb in d["observed"])
        lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            markdown_cell(d["test"]), markdown_cell(d["devices"]), d["a"]["verdict"], d["b"]["verdict"], obs_a,
            obs_b, markdown_cell(d["b"].get("message", ""))))
    for label, rest in (("A", only_a), ("B", only_b)):
        for t in rest:
            cells = [t["verdict"], "—"] if label == "A" else ["—", t["verdict"]]
            lines.append("| %s | %s | %s | %s | %s | %s | %s |" % (
                markdown_cell(t["test"]), markdown_cell((t["device"] or "") + " (only in %s)" % label), cells[0],
                cells[1], observed_text(t["observed"]) if label == "A" else "",
                observed_text(t["observed"]) if label == "B" else "", markdown_cell(t.get("message", ""))))
    return "\n".join(lines) + "\n"


def cmd_compare(args):
    a, b = load_report(args.a), load_report(args.b)
    pairs = pair_devices(a, b, args.pair)
    diffs, only_a, only_b = compare(a, b, pairs)
    sys.stdout.write(compare_text(a, b, pairs, diffs, only_a, only_b))
    if args.md:
        with open(args.md, "w") as f:
            f.write(compare_markdown(a, b, pairs, diffs, only_a, only_b))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"a": args.a, "b": args.b, "pairs": pairs,
                       "differences": [{"test": d["test"], "devices": d["devices"],
                                        "verdict": [d["a"]["verdict"], d["b"]["verdict"]] if d["verdict"] else None,
                                        "observed": {k: [va, vb] for k, va, vb in d["observed"]}} for d in diffs],
                       "only_in_a": [t["name"] for t in only_a], "only_in_b": [t["name"] for t in only_b]},
                      f, indent=1)
            f.write("\n")
    return EXIT_OK if not (diffs or only_a or only_b) else EXIT_DIFFER


# ---------------------------------------------------------------------------
# personality: a personality file (docs/configuration.md, SOFTVERBS_PERSONALITY)
# seeded from a report. The attributes come from DeviceAttributesTest.Observed,
# the behaviours from the observations of the tests that exercise them. Keys a
# report does not observe are left out, so they keep the built-in (ConnectX)
# values.

ATTRIBUTES_TEST = "DeviceAttributesTest.Observed"
# [device] keys written as numbers; the 64-bit ones above 2^63 as a "0x" string.
DEVICE_INT_KEYS = ("vendor_id", "vendor_part_id", "hw_ver", "max_mr_size", "page_size_cap", "max_qp", "max_qp_wr",
                   "device_cap_flags", "max_sge", "max_sge_rd", "max_cq", "max_cqe", "max_mr", "max_pd",
                   "max_qp_rd_atom", "max_res_rd_atom", "max_qp_init_rd_atom", "max_mw", "max_ah", "max_mcast_grp",
                   "max_mcast_qp_attach", "max_total_mcast_qp_attach", "max_srq", "max_srq_wr", "max_srq_sge",
                   "max_pkeys", "local_ca_ack_delay")
# [port] keys and the range a personality accepts (a value outside is clamped, with a note).
PORT_KEYS = (("max_mtu", None), ("gid_tbl_len", (4, 4096)), ("active_width", (1, 255)),
             ("active_speed", (1, 255)), ("max_msg_sz", (1, 1 << 31)), ("max_vl_num", (1, 15)))
MAX_DM_SIZE = 131072  # the device memory an emulated device holds (caps.hpp)
# ibv_wc_status_str() texts to the words of the [completions] keys.
STATUS_WORDS = {
    "bad_lkey": {"local protection error": "loc_prot_err", "local QP operation error": "loc_qp_op_err"},
    "recv_too_small_sender": {"remote invalid request error": "rem_inv_req_err",
                              "remote operation error": "rem_op_err"},
    "recv_too_small_receiver": {"local length error": "loc_len_err", "local QP operation error": "loc_qp_op_err"},
}
STATUS_OBSERVATIONS = (("bad_lkey", "bad_lkey.status"), ("recv_too_small_sender", "recv_too_small.sender"),
                       ("recv_too_small_receiver", "recv_too_small.receiver"))


def toml_string(text):
    return json.dumps(text)  # a JSON string is a TOML basic string for these characters


def first_value(value):
    """An observation seen more than once keeps every value ("a, b"): the first."""
    return value.split(", ")[0] if isinstance(value, str) else value


def integer(value):
    try:
        return int(first_value(value))
    except (TypeError, ValueError):
        return None


def personality_device(report, wanted):
    devices = [d for d in report.get("devices", []) if d]
    if wanted:
        if wanted not in devices:
            raise Failure("no device %r in the report (devices: %s)" % (wanted, ", ".join(devices) or "none"))
        return wanted
    if not devices:
        raise Failure("the report names no device")
    return devices[0]


def observations_of(report, device):
    """{test: observed} of the device's tests (and those without a device), without the
    instantiation prefix ("Devices/")."""
    return {t["test"].rsplit("/", 1)[-1]: t.get("observed", {}) for t in report.get("tests", [])
            if t.get("device") in (device, None)}


def personality_tables(observed):
    """The tables of the file: {table: [(key, TOML value or None, note)]}."""
    tables = {}

    def put(table, key, value, note=""):
        tables.setdefault(table, []).append((key, value, note))

    attrs = observed.get(ATTRIBUTES_TEST, {})
    if "device.fw_ver" in attrs:
        put("device", "fw_ver", toml_string(str(attrs["device.fw_ver"])[:63]))
    for key in DEVICE_INT_KEYS:
        v = integer(attrs.get("device." + key))
        if v is None:
            continue
        if key == "vendor_id" and v > 0xffffff:
            v = 0xffffff
        put("device", key, ('"0x%x"' % v) if v >= 1 << 63 else ("0x%x" % v if key == "device_cap_flags" else str(v)))
    if first_value(attrs.get("device.atomic_cap")) in ("none", "hca", "glob"):
        put("device", "atomic_cap", toml_string(first_value(attrs["device.atomic_cap"])))

    if integer(attrs.get("device_ex.odp_general_caps")) is not None:
        put("device_ex", "odp", "true" if integer(attrs["device_ex.odp_general_caps"]) else "false")
    dm = integer(attrs.get("device_ex.max_dm_size"))
    if dm is not None:
        put("device_ex", "max_dm_size", str(min(dm, MAX_DM_SIZE)),
            "observed %d; emulated devices hold at most %d" % (dm, MAX_DM_SIZE) if dm > MAX_DM_SIZE else "")
    if integer(attrs.get("device_ex.hca_core_clock")) is not None:
        put("device_ex", "completion_timestamps", "true" if integer(attrs["device_ex.hca_core_clock"]) else "false")

    for key, bounds in PORT_KEYS:
        v = integer(attrs.get("port." + key))
        if v is None:
            continue
        if key == "max_mtu":
            if v in (256, 512, 1024, 2048, 4096):
                put("port", key, str(v))
            continue
        lo, hi = bounds
        put("port", key, str(min(max(v, lo), hi)), "observed %d" % v if not lo <= v <= hi else "")

    created, queried = integer(attrs.get("queues.created_max_recv_wr")), integer(attrs.get("queues.queried_max_recv_wr"))
    if created is not None and queried is not None:
        put("queues", "written_back", '"requested"' if queried > created else '"actual"',
            "create wrote back %d, query reported %d" % (created, queried))

    merged = {}
    for _, obs in sorted(observed.items()):
        for k, v in obs.items():
            merged.setdefault(k, first_value(v))
    for key, name in STATUS_OBSERVATIONS:
        if name not in merged:
            continue
        word = STATUS_WORDS[key].get(merged[name])
        put("completions", key, toml_string(word) if word else None,
            "" if word else "observed %r, which no personality models" % merged[name])
    grh = [first_value(obs["recv.IBV_WC_GRH"]) for test, obs in observed.items()
           if "recv.IBV_WC_GRH" in obs and re.search(r"(Rc|Uc)$", test)]
    if grh:
        put("completions", "grh_on_connected", "true" if "set" in grh else "false")
    if "ibv_modify_srq.max_wr" in merged:
        put("queues", "srq_resize", "true" if merged["ibv_modify_srq.max_wr"] == "0" else "false")
    if "ibv_post_recv.RESET" in merged:
        put("post", "before_rts", '"refuse"' if merged["ibv_post_recv.RESET"] != "0" else '"queue"')
    if "ibv_reg_mr.on_demand" in merged and "device_ex" not in tables:
        put("device_ex", "odp", "true" if merged["ibv_reg_mr.on_demand"] == "ok" else "false")
    if "mr.local_only_rkey" in merged:
        put("mr", "local_only_rkey", '"zero"' if merged["mr.local_only_rkey"] == "0" else '"key"')
    # PostTest.OpcodeNotValidForTheService: "post:EINVAL" (refused) or "completion:..." (failed later).
    invalid = [v for k, v in merged.items() if k.startswith("post.invalid_opcode.")]
    if any(v.startswith("post:") for v in invalid):
        put("post", "unsupported_opcode", '"refuse"')
    elif any(v.startswith("completion:") for v in invalid):
        put("post", "unsupported_opcode", '"fail"')
    # ErrorTest.MisalignedAtomicRc: "<atomic>.post" (refused) or "<atomic>.status" (NAKed).
    atomics = ("cmp_and_swp", "fetch_and_add")
    if any(a + ".post" in merged for a in atomics):
        put("post", "misaligned_atomic", '"refuse"')
    elif any(a + ".status" in merged for a in atomics):
        put("post", "misaligned_atomic", '"fail"')
    return tables


def personality_text(report, path, name, device):
    tables = personality_tables(observations_of(report, device))
    lines = ["# Seeded by scripts/divergence.py personality from %s (device %s, backend %s, host %s, %s)." %
             (os.path.basename(path), device, report.get("backend"), report.get("host"), report.get("date")),
             "# Keys the report did not observe are absent and keep the built-in (ConnectX) values;",
             "# the async events, bad_wr, flushing, wake-up and QP attribute checks are not observed.",
             "# Format: docs/configuration.md, \"SOFTVERBS_PERSONALITY\".",
             "name = %s" % toml_string(name)]
    for table in ("device", "device_ex", "port", "queues", "completions", "post", "mr"):
        if table not in tables:
            continue
        lines += ["", "[%s]" % table]
        for key, value, note in tables[table]:
            if value is None:
                lines.append("# %s: %s" % (key, note))
            else:
                lines.append("%s = %s%s" % (key, value, ("  # " + note) if note else ""))
    return "\n".join(lines) + "\n"


def cmd_personality(args):
    report = load_report(args.report)
    if not re.fullmatch(r"[a-z0-9_-]{1,64}", args.name):
        raise Failure("--name %r: a personality name is 1 to 64 of a-z, 0-9, '_' and '-'" % args.name)
    device = personality_device(report, args.device)
    sys.stdout.write(personality_text(report, args.report, args.name, device))
    return EXIT_OK


# ---------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the conformance suite on one backend and write a report",
                         description="Runs the conformance suite on one backend and writes OUT/NAME.json, "
                         "OUT/NAME.md and OUT/NAME.log. Exit status: 0 every test passed or was skipped, "
                         "1 some failed, 2 nothing ran (no device) or an error.")
    run.add_argument("--backend", choices=("emu", "hw", "both"), required=True,
                     help="SOFTVERBS_BACKEND for the run")
    run.add_argument("--hw-over-emu", action="store_true",
                     help="with --backend hw: the real library is BUILD/lib-hwtest/libibverbs.so.1, the copy of "
                     "softverbs that serves emulated devices (as the hw. ctest entries)")
    run.add_argument("--build", help="the build directory (default: $SOFTVERBS_BUILD_DIR or build/)")
    run.add_argument("--out", help="where the report goes (default: BUILD/divergence)")
    run.add_argument("--name", help="file name of the report, without extension (default: the backend, or "
                     "hw-over-emu)")
    run.add_argument("--filter", help="a gtest filter, POSITIVE[-NEGATIVE] (default: every test)")
    run.add_argument("--device", help="only this device's tests (and those without a device)")
    run.add_argument("--isolate", action="store_true", help="run every test in a process of its own (also done "
                     "automatically when the binary dies without a result)")
    run.add_argument("--timeout", type=float, default=0, help="seconds per process (default: none)")
    run.add_argument("--quiet", action="store_true", help="no line per test")
    run.set_defaults(func=cmd_run)

    cmp = sub.add_parser("compare", help="list the tests whose verdict or observations differ between two reports",
                         description="Matches the tests of two reports by name without the device parameter "
                         "(devices paired by --pair, else the only device of each, else by position) and lists "
                         "every test whose verdict or observed values differ, and the tests of only one report. "
                         "Exit status: 0 identical, 1 different, 2 error.")
    cmp.add_argument("a", metavar="A.json")
    cmp.add_argument("b", metavar="B.json")
    cmp.add_argument("--md", help="also write the differences as a Markdown table")
    cmp.add_argument("--json", help="also write the differences as JSON")
    cmp.add_argument("--pair", action="append", metavar="DEV_A=DEV_B",
                     help="match A's device DEV_A with B's DEV_B (repeatable)")
    cmp.set_defaults(func=cmd_compare)

    per = sub.add_parser("personality", help="write a personality file seeded from a report",
                         description="Writes to standard output a personality file (SOFTVERBS_PERSONALITY) "
                         "holding what the report observed of one device: its attributes, the queue depths "
                         "create writes back, completion statuses, posting before RTS, ODP and local-only rkeys. "
                         "Exit status: 0 written, 2 error.")
    per.add_argument("report", metavar="REPORT.json")
    per.add_argument("--name", default="seeded", help="the personality's name (default: seeded)")
    per.add_argument("--device", help="the device whose observations to use (default: the report's first)")
    per.set_defaults(func=cmd_personality)

    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except Failure as e:
        print("divergence.py: %s" % e, file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
