#!/usr/bin/env python3
"""Tests of scripts/divergence.py (the divergence report), run by ctest.

  report_test.py fixtures --script S --fixtures DIR
      compare on the checked-in reports fixtures/a.json and fixtures/b.json,
      which differ in exactly one verdict and one observed value; and
      `personality` on fixtures/hw_rxe.json, which must give fixtures/seeded.toml
      (tests/unit/personality_test.cpp checks that file loads as a personality).
  report_test.py emu --script S --build DIR [--hwtest-lib PATH]
      run on emu (and hw-over-emu when the hw-test library exists) for a small
      filter, compare of the generated reports, the no-device case.
"""

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED: " + what, flush=True)


def script(args, *argv, env=None):
    p = subprocess.run([sys.executable, args.script] + list(argv), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True, env=env, timeout=300)
    print("$ divergence.py %s -> %d" % (" ".join(argv), p.returncode))
    if p.stdout:
        print(p.stdout, end="")
    if p.stderr:
        print(p.stderr, end="")
    return p


def difference_lines(stdout):
    """The lines of compare's output that name tests or their differences."""
    # A header, a blank line, [the differences, a blank line,] the summary.
    paragraphs = stdout.split("\n\n")
    return paragraphs[1].splitlines() if len(paragraphs) >= 3 else []


def test_fixtures(args):
    a = os.path.join(args.fixtures, "a.json")
    b = os.path.join(args.fixtures, "b.json")
    with open(os.path.join(args.fixtures, "expected_compare.txt")) as f:
        expected = f.read()
    with tempfile.TemporaryDirectory() as tmp:
        md = os.path.join(tmp, "diff.md")
        js = os.path.join(tmp, "diff.json")
        p = script(args, "compare", a, b, "--md", md, "--json", js)
        check(p.returncode == 1, "compare of differing reports exits 1 (got %d)" % p.returncode)
        check(p.stdout == expected, "compare's output is fixtures/expected_compare.txt exactly")
        # Exactly the two tests, each with exactly its difference.
        check(difference_lines(p.stdout) == [
            "Devices/PostTest.RecvOnAQpThatUsesAnSrq [cf_roce = mlx5_0]",
            "  observed ibv_post_recv: EINVAL -> ENOMEM",
            "Devices/SrqTest.CreateRejectsBadSizes [cf_roce = mlx5_0]",
            "  verdict: pass -> fail (tests/conformance/srq_test.cpp:73: Expected equality of these values:)",
        ], "compare lists exactly the verdict and the observation that differ")
        with open(js) as f:
            diff = json.load(f)
        check([d["test"] for d in diff["differences"]] ==
              ["Devices/PostTest.RecvOnAQpThatUsesAnSrq", "Devices/SrqTest.CreateRejectsBadSizes"],
              "--json names the two tests")
        check(diff["differences"][0]["observed"] == {"ibv_post_recv": ["EINVAL", "ENOMEM"]} and
              diff["differences"][0]["verdict"] is None, "--json: the observation, no verdict change")
        check(diff["differences"][1]["verdict"] == ["pass", "fail"] and diff["differences"][1]["observed"] == {},
              "--json: the verdict change, no observation")
        check(diff["only_in_a"] == [] and diff["only_in_b"] == [], "--json: no test of only one report")
        with open(md) as f:
            rows = [line for line in f.read().splitlines() if line.startswith("| Devices/")]
        check(len(rows) == 2 and "RecvOnAQpThatUsesAnSrq" in rows[0] and "ENOMEM" in rows[0] and
              "CreateRejectsBadSizes" in rows[1] and "| pass | fail |" in rows[1],
              "--md has one row per differing test")

        p = script(args, "compare", a, a)
        check(p.returncode == 0, "compare of a report with itself exits 0 (got %d)" % p.returncode)
        check("identical" in p.stdout and difference_lines(p.stdout) == [], "compare says identical, lists nothing")

        # A test missing from B, a test only B has, and explicit device pairing.
        with open(b) as f:
            report = json.load(f)
        other = copy.deepcopy(report)
        other["tests"] = [t for t in report["tests"] if "QueryEce" not in t["test"]]
        extra = copy.deepcopy(report["tests"][0])
        extra["name"] = extra["test"] = "Rates.OutOfRange"
        other["tests"].append(extra)
        c = os.path.join(tmp, "c.json")
        with open(c, "w") as f:
            json.dump(other, f)
        p = script(args, "compare", b, c)
        check(p.returncode == 1, "a test of only one report is a difference (exit %d)" % p.returncode)
        check(difference_lines(p.stdout) == [
            "only in A: Devices/OptionalFeatureTest.QueryEce [mlx5_0] (pass)",
            "only in B: Rates.OutOfRange (pass)",
        ], "compare lists the tests of only one report")
        p = script(args, "compare", a, b, "--pair", "cf_roce=nonexistent")
        check(p.returncode == 2, "--pair with an unknown device is an error (exit %d)" % p.returncode)
        p = script(args, "compare", a, os.path.join(args.fixtures, "expected_compare.txt"))
        check(p.returncode == 2, "a file that is not a report is an error (exit %d)" % p.returncode)

    test_personality(args)


def test_personality(args):
    rxe = os.path.join(args.fixtures, "hw_rxe.json")
    with open(os.path.join(args.fixtures, "seeded.toml")) as f:
        expected = f.read()
    p = script(args, "personality", rxe, "--name", "rxe-seeded")
    check(p.returncode == 0, "personality exits 0 (got %d)" % p.returncode)
    check(p.stdout == expected, "personality's output is fixtures/seeded.toml exactly")
    p = script(args, "personality", rxe, "--device", "mlx5_0")
    check(p.returncode == 2 and "no device 'mlx5_0'" in p.stderr, "personality of an unknown device exits 2")
    p = script(args, "personality", rxe, "--name", "Bad Name")
    check(p.returncode == 2 and "--name" in p.stderr, "personality with a bad name exits 2")
    # Post-time refusals and failures, from a report made up here with just those observations.
    cases = (("post:EINVAL", "cmp_and_swp.post", "refuse", "refuse"),
             ("completion:local QP operation error", "fetch_and_add.status", "fail", "fail"))
    with tempfile.TemporaryDirectory() as tmp:
        for seen, atomic, opcode_word, atomic_word in cases:
            made = os.path.join(tmp, "post_%s.json" % opcode_word)
            with open(made, "w") as f:
                json.dump({"format": "softverbs-divergence-report", "version": load(rxe)["version"],
                           "devices": ["dev0"], "tests": [
                               {"test": "Devices/PostTest.OpcodeNotValidForTheService", "device": "dev0",
                                "verdict": "pass", "observed": {"post.invalid_opcode.UC.4": seen}},
                               {"test": "Devices/ErrorTest.MisalignedAtomicRc", "device": "dev0",
                                "verdict": "pass", "observed": {atomic: "x"}}]}, f)
            p = script(args, "personality", made, "--name", "x")
            want = '\n[post]\nunsupported_opcode = "%s"\nmisaligned_atomic = "%s"\n' % (opcode_word, atomic_word)
            check(p.returncode == 0 and want in p.stdout, "personality seeds [post] from %s: %r" % (seen, p.stdout))
    # A report of emulated devices without the attributes test: only a header and the name.
    p = script(args, "personality", os.path.join(args.fixtures, "a.json"), "--name", "x")
    check(p.returncode == 0 and p.stdout.rstrip().endswith('name = "x"'),
          "a report that observed nothing gives a file of defaults")


def load(path):
    with open(path) as f:
        return json.load(f)


def test_emu(args):
    # CreateCqEx* checks errno right after an observation; ActualSizeIsAtLeastRequested
    # observes one key six times.
    flt = ("Devices/PostTest.*:Devices/OptionalFeatureTest.*:Devices/AhTest.EthernetNeedsAGrh*:Strings.WcStatus:"
           "Devices/CqTest.CreateCqEx*:Devices/CqTest.ActualSizeIsAtLeastRequested*")
    env = dict(os.environ)
    env.pop("SOFTVERBS_HW_LIBIBVERBS", None)
    with tempfile.TemporaryDirectory() as tmp:
        p = script(args, "run", "--backend", "emu", "--build", args.build, "--out", tmp, "--filter", flt, "--quiet",
                   env=env)
        check(p.returncode == 0, "run on emu exits 0 (got %d)" % p.returncode)
        emu_json = os.path.join(tmp, "emu.json")
        check(os.path.isfile(emu_json) and os.path.isfile(os.path.join(tmp, "emu.md")), "run wrote emu.json, emu.md")
        if not os.path.isfile(emu_json):
            return
        emu = load(emu_json)
        check(emu["backend"] == "emu" and emu["devices"] == ["cf_roce", "cf_ib"],
              "report: backend emu, devices cf_roce, cf_ib")
        for key in ("date", "host", "summary", "tests"):
            check(key in emu, "report has %s" % key)
        by_name = {t["name"]: t for t in emu["tests"]}
        check(len(by_name) == len(emu["tests"]) == emu["summary"]["tests"] and len(by_name) > 20,
              "report: one entry per test (%d)" % len(by_name))
        for device in ("cf_roce", "cf_ib"):
            t = by_name.get("Devices/PostTest.RecvOnAQpThatUsesAnSrq/" + device, {})
            check(t.get("test") == "Devices/PostTest.RecvOnAQpThatUsesAnSrq" and t.get("device") == device and
                  t.get("verdict") == "pass", "report: RecvOnAQpThatUsesAnSrq on %s passed" % device)
            check(t.get("observed", {}).get("ibv_post_recv") in ("EINVAL", "ENOMEM"),
                  "report: RecvOnAQpThatUsesAnSrq on %s observed ibv_post_recv" % device)
            t = by_name.get("Devices/OptionalFeatureTest.MemoryWindowWorksOrIsNotSupported/" + device, {})
            check(set(t.get("observed", {})) == {"ibv_alloc_mw.type1", "ibv_alloc_mw.type2"},
                  "report: both memory-window types observed on %s" % device)
        t = by_name.get("Devices/CqTest.ActualSizeIsAtLeastRequested/cf_roce", {})
        sizes = t.get("observed", {}).get("cqe", "").split(", ")
        check([v.split("->")[0] for v in sizes] == ["1", "2", "10", "100", "128", "4096"],
              "report: a key observed six times keeps its six values in order (%s)" % sizes)
        t = by_name.get("Devices/CqTest.CreateCqExFlagsTheDeviceMayNotSupport/cf_roce", {})
        check(t.get("verdict") == "pass" and "ibv_create_cq_ex.flow_tag_tm_info" in t.get("observed", {}),
              "report: an observation leaves errno for the check after it")
        t = by_name.get("Devices/AhTest.EthernetNeedsAGrh/cf_ib", {})
        check(t.get("verdict") == "skip" and t.get("message") == "InfiniBand port",
              "report: a skipped test with its reason")
        t = by_name.get("Strings.WcStatus", {})
        check(t.get("device") is None and t.get("test") == "Strings.WcStatus" and t.get("verdict") == "pass",
              "report: a test without a device")
        with open(os.path.join(tmp, "emu.md")) as f:
            md = f.read()
        rows = [line for line in md.splitlines() if line.startswith("| Devices/") or line.startswith("| Strings.")]
        check(len(rows) == len(emu["tests"]) and
              "| Devices/AhTest.EthernetNeedsAGrh | cf_ib | skip |  | InfiniBand port |" in rows,
              "emu.md has a row per test")

        # The same tests through the passthrough (or emu again): identical.
        if args.hwtest_lib and os.path.isfile(args.hwtest_lib):
            p = script(args, "run", "--backend", "hw", "--hw-over-emu", "--build", args.build, "--out", tmp,
                       "--filter", flt, "--quiet", "--name", "second", env=env)
            check(p.returncode == 0, "run on hw-over-emu exits 0 (got %d)" % p.returncode)
            if os.path.isfile(os.path.join(tmp, "second.json")):
                second = load(os.path.join(tmp, "second.json"))
                check(second["backend"] == "hw" and second["hw_over_emu"] and second["hw_library"] == args.hwtest_lib,
                      "hw-over-emu report: backend hw, the hw-test library")
        else:
            p = script(args, "run", "--backend", "emu", "--build", args.build, "--out", tmp, "--filter", flt,
                       "--quiet", "--name", "second", env=env)
            check(p.returncode == 0, "second run on emu exits 0 (got %d)" % p.returncode)
        second_json = os.path.join(tmp, "second.json")
        p = script(args, "compare", emu_json, second_json)
        check(p.returncode == 0 and "identical" in p.stdout, "the two generated reports are identical")

        # A changed verdict and a changed observation in a generated report.
        changed = load(emu_json)
        for t in changed["tests"]:
            if t["name"] == "Devices/PostTest.SendTooManySges/cf_ib":
                t["verdict"], t["message"] = "fail", "post_test.cpp:1: injected"
            if t["name"] == "Devices/OptionalFeatureTest.QueryEce/cf_roce":
                t["observed"]["ibv_query_ece"] = "EOPNOTSUPP"
        changed_json = os.path.join(tmp, "changed.json")
        with open(changed_json, "w") as f:
            json.dump(changed, f)
        p = script(args, "compare", emu_json, changed_json)
        check(p.returncode == 1, "compare with a changed report exits 1 (got %d)" % p.returncode)
        old = next(t for t in emu["tests"] if t["name"] == "Devices/OptionalFeatureTest.QueryEce/cf_roce")
        check(difference_lines(p.stdout) == [
            "Devices/OptionalFeatureTest.QueryEce [cf_roce]",
            "  observed ibv_query_ece: %s -> EOPNOTSUPP" % old["observed"].get("ibv_query_ece"),
            "Devices/PostTest.SendTooManySges [cf_ib]",
            "  verdict: pass -> fail (post_test.cpp:1: injected)",
        ], "compare lists exactly the changed verdict and observation")

        # --device: one device's tests and those without a device.
        p = script(args, "run", "--backend", "emu", "--build", args.build, "--out", tmp, "--filter", flt,
                   "--device", "cf_ib", "--name", "one", "--quiet", env=env)
        check(p.returncode == 0, "run --device exits 0 (got %d)" % p.returncode)
        if os.path.isfile(os.path.join(tmp, "one.json")):
            one = load(os.path.join(tmp, "one.json"))
            check(one["devices"] == ["cf_ib"] and {t["device"] for t in one["tests"]} == {None, "cf_ib"},
                  "run --device cf_ib: only cf_ib's tests and device-less ones")

        # No device: a clear message, no report, a non-zero exit.
        nodev = os.path.join(tmp, "nodev")
        p = script(args, "run", "--backend", "hw", "--build", args.build, "--out", nodev,
                   env=dict(env, SOFTVERBS_HW_LIBIBVERBS="/nonexistent/libibverbs.so.1"))
        check(p.returncode == 2, "run without a device exits 2 (got %d)" % p.returncode)
        check("no device: nothing ran" in p.stderr, "run without a device says 'no device: nothing ran'")
        check(not os.path.exists(os.path.join(nodev, "hw.json")), "run without a device writes no report")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("fixtures", "emu"))
    parser.add_argument("--script", required=True)
    parser.add_argument("--fixtures")
    parser.add_argument("--build")
    parser.add_argument("--hwtest-lib", default="")
    args = parser.parse_args()
    if args.what == "fixtures":
        test_fixtures(args)
    else:
        test_emu(args)
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
