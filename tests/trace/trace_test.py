#!/usr/bin/env python3
"""The trace (SOFTVERBS_TRACE, docs/simulation.md "The trace") on a recorded exchange.

Runs trace_exchange (an RC SEND, then an RDMA WRITE whose last packet the fault
layer drops once) with SOFTVERBS_TRACE and SOFTVERBS_PCAP set, then checks one part:
  schema   every record has the fields of its kind, time never goes back, and the
           RDMA WRITE's id links its post, its packets (by PSN range), the lost
           packet, the ACK timeout, the retransmission, the ACK and its completion;
  summary  `softverbs trace FILE` counts what the exchange did, per QP;
  filter   `softverbs trace` --qp/--device/--kind/--from/--to, --records and -o;
  shared   a trace file another process holds is left to it: the exchange writes FILE.PID;
  faults   the same schema on a longer workload under seeded faults on virtual time
           (tests/faults/virtual_replay.c: RC WRITE, READ, SEND, atomics, RNR waits and UD
           SENDs under drops, duplicates, reordering and delays), and the summary and
           filters of `softverbs trace` agree with its records.
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


# The documented schema (docs/simulation.md, "What is recorded"): the arguments
# every record of a name has besides "dev", with their types, and the optional
# ones. int: a JSON integer; str: a string.
WR_POST = {"wr": int, "wr_id": int, "opcode": str, "len": int}
WC = {"qpn": int, "wr": int, "wr_id": int, "status": str, "opcode": str, "byte_len": int}
VERB_NUM = {"create_qp": "qpn", "destroy_qp": "qpn", "create_srq": "srqn", "destroy_srq": "srqn",
            "create_cq": "num", "destroy_cq": "num", "reg_mr": "num", "dereg_mr": "num", "alloc_pd": "num",
            "dealloc_pd": "num", "create_ah": "num", "destroy_ah": "num"}
REQUIRED = {
    "post_send": dict(WR_POST, qpn=int),
    "post_recv": dict(WR_POST, qpn=int),
    "post_srq_recv": dict(WR_POST, srqn=int),
    "wr_start": {"qpn": int, "wr": int, "first_psn": int, "last_psn": int, "dqpn": int},
    "completion": WC,
    "retired": WC,
    "modify_qp": {"qpn": int, "from": str, "to": str},
}
REQUIRED.update({verb: {key: int} for verb, key in VERB_NUM.items()})
OPTIONAL = {"completion": {"fault": str}, "retired": {"fault": str}, "modify_qp": {"dqpn": int}}
BY_CAT = {
    "packet": ({"dir": str, "dqpn": int, "psn": int, "opcode": str, "len": int, "fault": str},
               {"qpn": int, "frame": int}),
    "timer": ({"timer": str, "what": str}, {"qpn": int, "in_ns": int}),
    "event": ({"kind": str}, {"qpn": int, "status": int}),
}
CAT_OF = dict({n: "wr" for n in ("post_send", "post_recv", "post_srq_recv", "wr_start", "completion", "retired")},
              modify_qp="verb", **{verb: "verb" for verb in VERB_NUM})
TIMERS = ("ack_timeout", "ack_repair", "rnr_wait", "cm_retry", "cm_timewait")
QP_STATES = ("RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR")
SRQ_TRACK = 1 << 24


def typed(value, kind):
    # bool is an int to Python: a JSON true is not a number here.
    return isinstance(value, kind) and not isinstance(value, bool)


def schema(events):
    """Every record against the documented schema; returns the traced posts' ids and the completed ones."""
    check(len(events) > 20, "the trace holds the exchange (%d records)" % len(events))
    last = 0
    names = {}        # pid -> device name (process_name)
    tracks = set()    # (pid, tid) named by thread_name
    flows = {}        # (cat, id) -> list of phases in order
    for i, e in enumerate(events):
        where = "record %d %s" % (i, json.dumps(e))
        for key, kind in (("name", str), ("cat", str), ("ph", str), ("pid", int), ("tid", int)):
            check(typed(e.get(key), kind), where + ": " + key)
        check(typed(e.get("ts"), (int, float)) and e["ts"] >= last, where + ": ts missing or going back")
        last = e.get("ts", last)
        check(e.get("pid", 0) >= 1, where + ": pid")
        ph, pid, tid = e.get("ph"), e.get("pid"), e.get("tid")
        check(ph in ("i", "M", "s", "f", "b", "e"), where + ": ph")
        if ph == "M":
            check(e.get("cat") == "__metadata" and e.get("name") in ("process_name", "thread_name"),
                  where + ": track name record")
            value = e.get("args", {}).get("name")
            check(isinstance(value, str), where + ": args.name")
            if e.get("name") == "process_name":
                check(pid not in names and pid == len(names) + 1, where + ": devices numbered in order")
                names[pid] = value
            else:
                check((pid, tid) not in tracks, where + ": a track named twice")
                tracks.add((pid, tid))
                want = "device" if tid == 0 else ("SRQ %d" % (tid - SRQ_TRACK) if tid >= SRQ_TRACK else "QP %d" % tid)
                check(value == want, where + ": track name " + want)
            continue
        check(pid in names and (pid, tid) in tracks, where + ": on a named track")
        if ph in ("s", "f", "b", "e"):
            check(e.get("name") == "wr" and e.get("cat") == ("wr" if ph in "sf" else "wr_life"), where + ": link cat")
            check(typed(e.get("id"), int) and e.get("id", 0) > 0, where + ": flow id")
            check(ph != "f" or e.get("bp") == "e", where + ": flow end binds to its enclosing slice")
            check("args" not in e, where + ": a link carries no arguments")
            flows.setdefault((e.get("cat"), e.get("id")), []).append((ph, e.get("ts"), pid, tid))
            continue
        args = e.get("args")
        check(isinstance(args, dict), where + ": args")
        if not isinstance(args, dict):
            continue
        check(e.get("s") == "t", where + ": thread-scoped instant")
        check(args.get("dev") == names.get(pid), where + ": dev is the track's device")
        name, cat = e.get("name"), e.get("cat")
        if name in REQUIRED:
            check(cat == CAT_OF[name], where + ": category of " + name)
            need, may = REQUIRED[name], OPTIONAL.get(name, {})
        elif cat in BY_CAT:
            need, may = BY_CAT[cat]
        else:
            check(False, where + ": an undocumented record")
            continue
        for key, kind in list(need.items()) + list(may.items()):
            if key in need or key in args:
                check(typed(args.get(key), kind), where + ": %s is a %s" % (key, kind.__name__))
        extra = set(args) - set(need) - set(may) - {"dev"}
        check(not extra, where + ": undocumented arguments " + str(sorted(extra)))
        qpn = args.get("qpn")
        if qpn is not None:
            check(tid == qpn, where + ": on its QP's track")
        elif "srqn" in args:
            check(tid == SRQ_TRACK + args["srqn"], where + ": on its SRQ's track")
        elif cat != "verb" or name in VERB_NUM and VERB_NUM[name] == "num":
            check(tid == 0, where + ": on the device's track")
        if cat == "packet":
            check(args.get("dir") in ("tx", "rx") and name == args.get("opcode"), where + ": dir, name")
            check(args.get("frame", 1) > 0, where + ": frame numbers start at 1")
        elif cat == "timer":
            check(args.get("timer") in TIMERS and args.get("what") in ("armed", "fired", "cancelled"),
                  where + ": timer, what")
            check(name == "%s %s" % (args.get("timer"), args.get("what")), where + ": name is timer and what")
            check(("in_ns" in args) == (args.get("what") == "armed"), where + ": in_ns when armed")
        elif cat == "event":
            check(args.get("kind") in ("async", "cm"), where + ": kind")
            check(name.startswith("IBV_EVENT_" if args.get("kind") == "async" else "RDMA_CM_EVENT_"),
                  where + ": event name")
        elif name == "modify_qp":
            check(args.get("from") in QP_STATES and args.get("to") in QP_STATES, where + ": states")
        elif name == "completion":
            check(args.get("status", "").startswith("IBV_WC_"), where + ": status")
    # A traced post opens a flow ("s") and a lifetime ("b"), which its
    # completion closes ("f", "e"), once; a receive still posted at the end has
    # neither end.
    posts = {e["args"]["wr"] for e in events if e.get("ph") == "i" and e["name"].startswith("post_")}
    done = [e["args"]["wr"] for e in events if e.get("ph") == "i" and e["name"] in ("completion", "retired")
            and e["args"]["wr"]]
    check(len(done) == len(set(done)), "a work request completes once")
    check(set(done) <= posts, "every completion's wr was posted")
    for wr in posts:
        want = ["s", "f"] if wr in done else ["s"]
        check([m[0] for m in flows.get(("wr", wr), [])] == want, "wr %d: flow %s" % (wr, want))
        check([m[0] for m in flows.get(("wr_life", wr), [])] == [{"s": "b", "f": "e"}[p] for p in want],
              "wr %d: lifetime" % wr)
    check(len(flows) == 2 * len(posts), "no flow without its post")
    return posts, set(done)


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


def record_faults(directory, replay):
    trace = os.path.join(directory, "faults.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
    env.update(SOFTVERBS_DEVICES="emu0,emu1", SOFTVERBS_CLOCK="virtual", SOFTVERBS_FAULT_SEED="11",
               SOFTVERBS_TRACE=trace)
    run = subprocess.run([replay, "42"], env=env, capture_output=True, text=True, timeout=50)
    if run.returncode != 0:
        sys.exit("virtual_replay failed:\n" + run.stdout + run.stderr)
    return trace


def faults(tool, replay, directory):
    trace = record_faults(directory, replay)
    events = load(trace)
    posts, done = schema(events)
    instants = [e for e in events if e["ph"] == "i"]
    packets = [e for e in instants if e["cat"] == "packet"]
    opcodes = {e["name"] for e in packets}
    for op in ("RC_RDMA_WRITE_FIRST", "RC_RDMA_READ_REQUEST", "RC_RDMA_READ_RESPONSE_LAST", "RC_SEND_ONLY",
               "RC_COMPARE_SWAP", "RC_FETCH_ADD", "RC_ATOMIC_ACKNOWLEDGE", "RC_ACKNOWLEDGE", "UD_SEND_ONLY"):
        check(op in opcodes, "a packet " + op)
    actions = {e["args"]["fault"] for e in packets}
    check({"none", "drop", "duplicate", "reorder", "delay"} <= actions, "every fault action: %s" % sorted(actions))
    timers = [e for e in instants if e["cat"] == "timer"]
    check(any(e["name"] == "rnr_wait armed" for e in timers), "RNR waits")
    wc = {e["args"]["opcode"] for e in instants if e["name"] == "completion"}
    check({"RDMA_WRITE", "RDMA_READ", "SEND", "COMP_SWAP", "FETCH_ADD", "RECV"} <= wc, "completions: %s" % wc)
    check(len(posts - done) == 8, "only the UD receives still posted at the end lack a completion")

    # The summary agrees with the records, QP by QP.
    run = softverbs(tool, trace)
    check(run.returncode == 0, "softverbs trace exits 0: " + run.stderr)
    out = run.stdout
    qps = sorted({(e["args"]["dev"], e["args"]["qpn"]) for e in instants if e["name"] == "post_send"})
    check(len(qps) == 2, "posts on emu0's RC and UD QPs: %s" % qps)
    for dev, qpn in qps:
        section = out.split("%s QP %d:\n" % (dev, qpn))
        check(len(section) == 2, "a section for %s QP %d" % (dev, qpn))
        if len(section) != 2:
            continue
        body = section[1].split("\n" + "e")[0]
        mine = [e for e in instants if e["args"]["dev"] == dev and e["args"].get("qpn") == qpn]
        by_op = {}
        for e in mine:
            if e["name"] == "post_send":
                by_op[e["args"]["opcode"]] = by_op.get(e["args"]["opcode"], 0) + 1
        check("  posted: %s\n" % ", ".join("%s %d" % kv for kv in sorted(by_op.items())) in body,
              "%s QP %d: posts by opcode %s" % (dev, qpn, by_op))
        sent = sum(1 for e in mine if e["cat"] == "packet" and e["args"]["dir"] == "tx")
        got = sum(1 for e in mine if e["cat"] == "packet" and e["args"]["dir"] == "rx")
        if sent or got:
            check("  packets: sent %d, received %d," % (sent, got) in body, "%s QP %d: packet counts" % (dev, qpn))
        ok = sum(1 for e in mine if e["name"] == "completion" and e["args"]["status"] == "IBV_WC_SUCCESS")
        check("  completions: IBV_WC_SUCCESS %d\n" % ok in body, "%s QP %d: completions" % (dev, qpn))
        rnr = sum(1 for e in mine if e["name"] == "rnr_wait armed")
        if rnr:
            check(re.search(r"rnr waits: %d\n" % rnr, body), "%s QP %d: RNR waits" % (dev, qpn))

    # Filters: one kind, one QP, and their records one per line.
    run = softverbs(tool, "--kind", "timer", "--records", trace)
    lines = run.stdout.splitlines()
    check(len(lines) == len(timers) and all("  timer  " in l for l in lines), "the timer records, one per line")
    # The UD QP of emu1: the datagrams it received are on its track.
    ud = {e["args"]["qpn"] for e in packets if e["name"] == "UD_SEND_ONLY" and e["args"]["dir"] == "rx"}
    check(len(ud) == 1, "the datagrams are received on one QP: %s" % ud)
    # Sent datagrams are on their sender's track (the DETH's source QP).
    ud_tx = [e for e in packets if e["name"] == "UD_SEND_ONLY" and e["args"]["dir"] == "tx"]
    check(ud_tx and all(e["args"].get("qpn") for e in ud_tx), "every sent datagram names its QP")
    check(len({(e["args"]["dev"], e["args"].get("qpn")) for e in ud_tx}) == 1, "the datagrams are sent by one QP")
    if len(ud) == 1:
        qpn = ud.pop()
        run = softverbs(tool, "--device", "emu1", "--qp", str(qpn), "--kind", "packet", "--records", trace)
        lines = run.stdout.splitlines()
        want = sum(1 for e in packets if e["args"]["dev"] == "emu1" and e["args"].get("qpn") == qpn)
        check(want and len(lines) == want and all(" UD_SEND_ONLY " in l for l in lines), "the UD QP's packets")


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
    ap.add_argument("part", choices=("schema", "summary", "filter", "shared", "faults"))
    ap.add_argument("--exchange", required=True)
    ap.add_argument("--replay", help="tests/faults' virtual_replay program (part faults)")
    ap.add_argument("--softverbs", required=True)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        if a.part in ("shared", "faults"):
            if a.part == "shared":
                shared(d, a.exchange)
            else:
                faults(a.softverbs, a.replay, d)
            if FAILURES:
                sys.exit("%d check(s) failed" % len(FAILURES))
            print("ok")
            return
        trace = record(d, a.exchange)
        events = load(trace)
        if a.part == "schema":
            posts, done = schema(events)
            check(posts == done, "every work request of the exchange completed")
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
