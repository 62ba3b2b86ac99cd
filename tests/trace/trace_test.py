#!/usr/bin/env python3
"""The trace (SOFTVERBS_TRACE, docs/simulation.md "The trace") on a recorded exchange.

Runs trace_exchange (an RC SEND, then an RDMA WRITE whose last packet the fault
layer drops once) with SOFTVERBS_TRACE and SOFTVERBS_PCAP set, then checks one part:
  schema   every record has the fields of its kind, time never goes back, and the
           RDMA WRITE's id links its post, its packets (by PSN range), the lost
           packet, the ACK timeout, the retransmission, the ACK and its completion;
  summary  `softverbs trace FILE` counts what the exchange did, per QP;
  filter   `softverbs trace` --qp/--device/--kind/--from/--to, --records and -o;
  shared   a trace file another process holds is left to it: the exchange writes FILE.PID.
"""
import argparse
import fcntl
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print("FAIL: " + what)


def record(directory, exchange, name="trace.json"):
    trace = os.path.join(directory, name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env.update(SOFTVERBS_DEVICES="ta,tb", SOFTVERBS_TRACE=trace,
               SOFTVERBS_PCAP=os.path.join(directory, "capture.pcap"))
    run = subprocess.run([exchange], env=env, capture_output=True, text=True, timeout=50)
    if run.returncode != 0:
        sys.exit("trace_exchange failed:\n" + run.stdout + run.stderr)
    return trace


def load(trace):
    with open(trace) as f:
        doc = json.load(f)
    return doc["traceEvents"]


# The arguments every record of a kind has (besides "dev").
REQUIRED = {
    "post_send": {"qpn", "wr", "wr_id", "opcode", "len"},
    "post_recv": {"qpn", "wr", "wr_id", "opcode", "len"},
    "post_srq_recv": {"srqn", "wr", "wr_id", "opcode", "len"},
    "wr_start": {"qpn", "wr", "first_psn", "last_psn", "dqpn"},
    "completion": {"qpn", "wr", "wr_id", "status", "opcode", "byte_len"},
    "retired": {"qpn", "wr", "wr_id", "status", "opcode", "byte_len"},
    "modify_qp": {"qpn", "from", "to"},
}
BY_CAT = {
    "packet": {"dir", "dqpn", "psn", "opcode", "len", "fault"},
    "timer": {"timer", "what"},
    "event": {"kind"},
}


def schema(events):
    check(len(events) > 20, "the trace holds the exchange (%d records)" % len(events))
    last = 0
    for i, e in enumerate(events):
        where = "record %d %s" % (i, json.dumps(e))
        for key, kind in (("name", str), ("cat", str), ("ph", str), ("pid", int), ("tid", int)):
            check(isinstance(e.get(key), kind), where + ": " + key)
        check(isinstance(e.get("ts"), (int, float)) and e["ts"] >= last, where + ": ts missing or going back")
        last = e.get("ts", last)
        check(e.get("pid", 0) >= 1, where + ": pid")
        ph = e.get("ph")
        check(ph in ("i", "M", "s", "f", "b", "e"), where + ": ph")
        if ph in ("s", "f", "b", "e"):
            check(isinstance(e.get("id"), int), where + ": flow id")
            check(ph != "f" or e.get("bp") == "e", where + ": flow end binds to its enclosing slice")
            continue
        args = e.get("args")
        check(isinstance(args, dict), where + ": args")
        if ph == "M" or not isinstance(args, dict):
            continue
        check(e.get("s") == "t", where + ": thread-scoped instant")
        check(isinstance(args.get("dev"), str), where + ": dev")
        need = REQUIRED.get(e["name"], BY_CAT.get(e["cat"], set()))
        check(need <= set(args), where + ": missing " + str(sorted(need - set(args))))
        if e["cat"] == "packet":
            check(args.get("dir") in ("tx", "rx"), where + ": dir")
        if e["cat"] == "timer":
            check(args.get("what") in ("armed", "fired", "cancelled"), where + ": what")


def links(events):
    instants = [e for e in events if e["ph"] == "i"]
    write = [e for e in instants if e["name"] == "post_send" and e["args"]["opcode"] == "RDMA_WRITE"]
    check(len(write) == 1, "one RDMA WRITE posted")
    if not write:
        return
    post = write[0]
    wr, dev, qpn = post["args"]["wr"], post["args"]["dev"], post["args"]["qpn"]
    start = [e for e in instants if e["name"] == "wr_start" and e["args"]["wr"] == wr]
    check(len(start) == 1, "the WRITE's start names its PSNs")
    if not start:
        return
    first, last_psn, dqpn = (start[0]["args"][k] for k in ("first_psn", "last_psn", "dqpn"))
    check(last_psn - first == 2, "three packets at MTU 1024")
    sent = [e for e in instants if e["cat"] == "packet" and e["args"]["dev"] == dev and e["args"]["dir"] == "tx"
            and e["args"]["dqpn"] == dqpn and first <= e["args"]["psn"] <= last_psn and e["ts"] >= post["ts"]]
    psns = [e["args"]["psn"] for e in sent]
    check(set(psns) == set(range(first, last_psn + 1)), "every PSN of the WRITE went out: %s" % psns)
    check(any(e["args"]["fault"] == "drop" for e in sent), "the lost packet is recorded with its fault")
    check(len(psns) > len(set(psns)), "the WRITE's packets were sent again")
    check(all(e["args"]["qpn"] == qpn for e in sent), "sent packets are on their sender's QP track")
    framed = [e["args"]["frame"] for e in sent if e["args"]["fault"] != "drop"]
    check(framed and all(isinstance(f, int) and f > 0 for f in framed), "captured packets carry their pcap frame")
    check(framed == sorted(framed), "frame numbers follow the sends")
    received = [e for e in instants if e["cat"] == "packet" and e["args"]["dir"] == "rx"
                and e["args"]["dqpn"] == dqpn and first <= e["args"]["psn"] <= last_psn and e["ts"] >= post["ts"]]
    check({e["args"]["psn"] for e in received} == set(range(first, last_psn + 1)), "the peer received every PSN")
    fired = [e for e in instants if e["cat"] == "timer" and e["args"].get("qpn") == qpn
             and e["args"]["timer"] == "ack_timeout" and e["args"]["what"] == "fired" and e["ts"] >= post["ts"]]
    check(len(fired) >= 1, "the ACK timeout fired")
    acks = [e for e in instants if e["cat"] == "packet" and e["args"]["dev"] == dev and e["args"]["dir"] == "rx"
            and e["args"].get("qpn") == qpn and e["args"]["opcode"] == "RC_ACKNOWLEDGE"
            and e["args"]["psn"] == last_psn]
    check(len(acks) >= 1, "the ACK of the last PSN reached the requester")
    done = [e for e in instants if e["name"] == "completion" and e["args"]["wr"] == wr]
    check(len(done) == 1 and done[0]["args"]["status"] == "IBV_WC_SUCCESS", "the WRITE completed once, successfully")
    if acks and done and fired:
        check(post["ts"] <= fired[0]["ts"] <= acks[0]["ts"] <= done[0]["ts"], "post, timeout, ACK, completion in order")
    flows = {e["ph"]: e for e in events if e["ph"] in ("s", "f", "b", "e") and e["id"] == wr}
    check(set(flows) == {"s", "f", "b", "e"}, "the WR's flow and lifetime records: %s" % sorted(flows))
    # A flow binds to the slice that encloses it: the post's and the completion's instants.
    check("s" in flows and flows["s"]["ts"] == post["ts"] and flows["s"]["tid"] == post["tid"],
          "the flow starts at the post")
    check("f" in flows and done and flows["f"]["ts"] == done[0]["ts"], "the flow ends at the completion")
    # The receive the SEND consumed is linked too.
    recv = [e for e in instants if e["name"] == "post_recv"]
    check(len(recv) == 1, "one receive posted")
    if recv:
        rdone = [e for e in instants if e["name"] == "completion" and e["args"]["wr"] == recv[0]["args"]["wr"]]
        check(len(rdone) == 1 and rdone[0]["args"]["opcode"] == "RECV", "the receive completed")


def softverbs(tool, *args):
    return subprocess.run([tool, "trace", *args], capture_output=True, text=True, timeout=30)


def qp_of_write(events):
    return next(e["args"]["qpn"] for e in events if e["name"] == "post_send" and e["args"]["opcode"] == "RDMA_WRITE")


def summary(tool, trace, events):
    run = softverbs(tool, trace)
    check(run.returncode == 0, "softverbs trace exits 0: " + run.stderr)
    out = run.stdout
    print(out)
    qpn = qp_of_write(events)
    section = out.split("ta QP %d:\n" % qpn)
    check(len(section) == 2, "a section for the requester's QP")
    if len(section) == 2:
        body = section[1].split("\n" + "t")[0]
        check("  posted: RDMA_WRITE 1, SEND 1\n" in body, "posts by opcode")
        m = re.search(r"packets: sent (\d+), received (\d+), retransmitted (\d+)", body)
        check(m and int(m.group(3)) >= 1, "retransmissions counted")
        check("  faults: drop 1\n" in body, "faults counted")
        m = re.search(r"timeouts: (\d+), rnr waits: 0", body)
        check(m and int(m.group(1)) >= 1, "timeouts counted")
        check("  completions: IBV_WC_SUCCESS 2\n" in body, "completions by status")
        check(re.search(r"latency post->completion \(us\): n 2, p50 [0-9.]+, p90 [0-9.]+, p99 [0-9.]+, max", body),
              "latency percentiles")
    check(re.search(r"tb QP \d+:\n(  .*\n)*  completions: IBV_WC_SUCCESS 1\n", out), "the responder's receive completion")
    check(re.search(r"^ta:\n  verbs: .*create_cq 1", out, re.M), "the device's own verbs")
    missing = softverbs(tool, trace + ".missing")
    check(missing.returncode == 1 and "cannot read" in missing.stderr, "a missing file is an error")
    bad = os.path.join(os.path.dirname(trace), "bad.json")
    with open(bad, "w") as f:
        f.write('{"traceEvents": [ {"name": 1,')
    broken = softverbs(tool, bad)
    check(broken.returncode == 1 and "not JSON" in broken.stderr, "a truncated file is an error: " + broken.stderr)


def filters(tool, trace, events, directory):
    qpn = qp_of_write(events)
    run = softverbs(tool, "--qp", str(qpn), "--kind", "packet", "--records", trace)
    lines = run.stdout.splitlines()
    check(run.returncode == 0 and len(lines) >= 6, "packet records of one QP")
    check(all(" QP %d  packet  " % qpn in l for l in lines), "only that QP's packets: " + run.stdout)
    run = softverbs(tool, "--device", "tb", "--kind", "wr", "--records", trace)
    lines = run.stdout.splitlines()
    check(len(lines) == 2 and "post_recv" in lines[0] and "completion" in lines[1], "tb's work requests: " + run.stdout)
    times = sorted(e["ts"] for e in events if e["ph"] == "i")
    lo, hi = times[len(times) // 3], times[2 * len(times) // 3]
    run = softverbs(tool, "--from", str(lo), "--to", str(hi), "--records", trace)
    stamps = [float(l.split()[0]) for l in run.stdout.splitlines()]
    check(stamps and all(lo - 0.001 <= t <= hi + 0.001 for t in stamps), "records in the time window")
    out = os.path.join(directory, "timers.json")
    run = softverbs(tool, "--kind", "timer", "-o", out, trace)
    check(run.returncode == 0, "writing a filtered trace: " + run.stderr)
    with open(out) as f:
        kept = json.load(f)["traceEvents"]
    check(kept and all(e["cat"] in ("timer", "__metadata") for e in kept), "the filtered trace holds timers only")
    check(any(e["cat"] == "timer" for e in kept), "the filtered trace holds the timers")
    again = softverbs(tool, out)
    check(again.returncode == 0 and "timers: " in again.stdout, "a filtered trace reads again")
    bad = softverbs(tool, "--kind", "bogus", trace)
    check(bad.returncode == 2, "an unknown kind is a usage error")


def shared(directory, exchange):
    held = os.path.join(directory, "held.json")
    with open(held, "w") as f:
        f.write("another process's trace")
        f.flush()
        fcntl.flock(f, fcntl.LOCK_EX)  # as a live writer holds it
        record(directory, exchange, "held.json")
    with open(held) as f:
        check(f.read() == "another process's trace", "the held file is left as it was")
    others = glob.glob(held + ".*")
    check(len(others) == 1, "the exchange wrote a file of its own: %s" % others)
    if others:
        check(len(load(others[0])) > 20, "its trace is complete")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("part", choices=("schema", "summary", "filter", "shared"))
    ap.add_argument("--exchange", required=True)
    ap.add_argument("--softverbs", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if a.part == "shared":
            shared(d, a.exchange)
            if FAILURES:
                sys.exit("%d check(s) failed" % len(FAILURES))
            print("ok")
            return
        trace = record(d, a.exchange)
        events = load(trace)
        if a.part == "schema":
            schema(events)
            links(events)
        elif a.part == "summary":
            summary(a.softverbs, trace, events)
        else:
            filters(a.softverbs, trace, events, d)
    if FAILURES:
        sys.exit("%d check(s) failed" % len(FAILURES))
    print("ok")


if __name__ == "__main__":
    main()
