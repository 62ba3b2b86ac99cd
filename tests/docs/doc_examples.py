#!/usr/bin/env python3
"""Every command example of README.md and docs/*.md is run by a test, or listed here
with the reason it is not.

What counts as a command example (found by `inventory`, in every page, also pages
added later):
  - a fenced block tagged sh, bash, shell, console or zsh (in a `console` block only
    the lines that start with "$ " are commands);
  - a fenced block tagged cmake: a user's CMakeLists.txt. A test runs it as a project
    of its own (PROJECT_HEAD, then the block; the test's `files` beside it) against
    the prefix of the test's `cmake_prefix`: configure, build, then its ctest;
  - an untagged fenced block whose first line looks like a command: an error, tag it;
  - an inline `code span` that starts with a command (after VAR=value assignments):
    a path under ./, build/bin/, scripts/ or benchmarks/ with arguments, or one of
    COMMAND_WORDS with two or more arguments (a span broken across two lines of the
    page is not seen).
An example is named by its page and its first line (a fenced block; the first
line of its commands in a console block) or its whole text (an inline span).

The mapping, all of it in this file:
  TESTS    runnable examples: each test runs one or more examples, extracted from the
           markdown at run time, in a fresh work directory (below), under a timeout;
           ctest runs each as `docs.example.NAME` (tests/docs/CMakeLists.txt).
  NOT_RUN  examples this suite cannot run, each with the reason.
`inventory` (ctest `docs.inventory`) fails for an example in neither, for a mapped
example that no page has any more, and for an untagged block that holds commands.

To map a new example (the inventory names it as `PAGE: FIRST LINE`):
  - if it can run here, add it to a test of TESTS (or a new one): `examples` names it
    by the same page and first line; `files` puts the files it needs in the work
    directory (a fenced block of a page, named by its first line, or a source file);
    `setup` runs shell lines first and `after` checks what the example left;
    `subst` is the substitution table of a test: (text, replacement, why) for a
    placeholder (`./my_rdma_app`, FILE, /opt/...) or a bound (iterations, a test
    filter); `pairs` runs each perftest/pingpong line without an address as a server
    on a free port and the same line with `-p PORT 127.0.0.1` as its client, waiting
    (bounded) until the server listens; `expect` are regular expressions the output
    must match; `skip_lines` leaves out single lines of a block, with the reason;
  - else add it to NOT_RUN with the reason (needs a ConnectX, needs root, rebuilds the
    tree, runs for minutes, ...).
Then build (CMake reads the list of tests again whenever this file changes) and run
`ctest -L docs`.

The work directory of a test holds `build/` (a directory of links to every entry of
the build tree, so a command that writes under build/ writes into the work
directory), and links to the source tree's scripts/ (a directory of links, so a test
can replace one script with `stubs`), include/, tests/ and benchmarks/. Commands run
there with bash -euo pipefail, so every command of a block must succeed. Variables
SOFTVERBS_* of the caller's environment are removed first.

Usage: doc_examples.py inventory --root SRC
       doc_examples.py table --root SRC          (every example: its test and substitutions, or why not)
       doc_examples.py list-tests                (NAME TIMEOUT per line, for CMake)
       doc_examples.py run NAME --root SRC --build BUILD
       doc_examples.py show NAME --root SRC      (the script `run` would execute)
       doc_examples.py --self-test
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

SHELL_LANGS = ("sh", "bash", "shell", "console", "zsh")
PROJECT_LANGS = ("cmake",)
COMMAND_WORDS = ("cmake", "ctest", "cpack", "tshark", "rdma", "perf", "valgrind", "pkg-config", "cc", "c++", "gcc",
                 "eval", "sudo", "apt", "apt-get", "python3", "dpkg")
COMMAND_PATHS = ("./", "build/bin/", "scripts/", "benchmarks/")


@dataclass
class Test:
    examples: list                  # (page, first line) of each example, run in this order
    timeout: int = 60               # seconds for the whole test, repeated runs included (ctest's TIMEOUT
                                    # is a little more)
    files: dict = field(default_factory=dict)   # work file -> (page, first line of a block) or "src:PATH"
    setup: list = field(default_factory=list)   # shell lines run before the examples
    subst: list = field(default_factory=list)   # (old, new, why): applied to the examples' text
    pairs: bool = False             # perftest/pingpong lines run as server + client
    expect: list = field(default_factory=list)  # regular expressions the output must match
    after: list = field(default_factory=list)   # shell lines run after the examples: checks of what they did
    skip_lines: dict = field(default_factory=dict)  # substring of a line -> why it is not run
    stubs: dict = field(default_factory=dict)   # scripts/NAME -> the script's replacement text
    env: dict = field(default_factory=dict)     # extra environment ({build} = the build tree)
    cmake_prefix: str = ""          # CMAKE_PREFIX_PATH of the cmake blocks' projects


# The perftest / pingpong programs that act as a server when given no address.
PAIR_PROGRAMS = r"(ib_(send|write|read|atomic)_(bw|lat)|ibv_(rc|uc|ud|srq)_pingpong)"

TESTS = {
    # README, "The first two commands": the demo's main job on this build tree. Its
    # scripts/build.sh (install the packages, configure and build into build/) is
    # replaced: the tree under test is already built, and configuring or building it
    # from inside its own suite would change it under the other tests
    # (scripts.install_deps tests install-deps.sh).
    "readme_demo": Test(
        examples=[("README.md", "./scripts/demo.sh")],
        timeout=90,
        stubs={"build.sh": "#!/bin/sh\n# the build tree is the one under test\nexit 0\n"},
        expect=[r"hca_id:\s+emu0", r"\d+ bytes in [\d.]+ seconds", r"BW average"]),
    # README, "Using it with your own program".
    "readme_run": Test(
        examples=[("README.md", "build/bin/softverbs run -- ibv_devinfo -v"),
                  ("README.md", "LD_LIBRARY_PATH=build/lib ibv_devices")],
        files={"drop-1pct.toml": ("docs/faults.md", "# drop-1pct.toml")},
        subst=[("./my_rdma_app", "ibv_devices", "your program: an unmodified one that lists the devices")],
        # After the eval, programs of this shell find softverbs' library.
        after=['case ":$LD_LIBRARY_PATH:" in *":$(realpath build/lib):"*) ;; *) exit 1;; esac',
               "ibv_devices | grep -q emu0", "ls run-*.pcap"],
        expect=[r"hca_id:\s+emu0", r"GID\[\s*1\]:\s+::ffff:127\.", r"rule drop-1pct: on packets",
                r"b: InfiniBand", r"\bemu0\b"]),
    # docs/faults.md, "Scenario files": ib_write_bw with the scenario of the page.
    "faults_scenario_file": Test(
        examples=[("docs/faults.md", "SOFTVERBS_FAULTS=drop-1pct.toml build/bin/softverbs run -- ib_write_bw -d emu0 -x 1")],
        timeout=120,
        files={"drop-1pct.toml": ("docs/faults.md", "# drop-1pct.toml")},
        pairs=True,
        subst=[(" -x 1", " -x 1 -n 200", "200 iterations instead of 5000: the subject is the scenario, and 5000 "
                "take 8 s under 1 % loss")],
        expect=[r"BW average", r"with probability 0\.01: drop"]),
    # docs/rdma-cm.md: rping between two processes, with fixed addresses and with
    # none. The client is repeated (bounded) until the server listens: typed in two
    # terminals, the server is up first; in one script it may not be yet.
    "rdma_cm_rping": Test(
        examples=[("docs/rdma-cm.md", "SOFTVERBS_DEVICES=s@127.0.0.20 build/bin/softverbs run -- rping -s -a 127.0.0.20 -C 10 -v &"),
                  ("docs/rdma-cm.md", "build/bin/softverbs run -- rping -s -C 10 -v &"),
                  ("docs/rdma-cm.md", "SOFTVERBS_DEVICES=s@127.0.0.20 build/bin/softverbs run -- rstream -b 127.0.0.20 -S 4096 -C 100 &")],
        timeout=120,
        # Repeated only while the client did not reach the server; a run that did
        # and then lost rping's own end-of-run race (its CM thread's last
        # rdma_get_cm_event finds the channel destroyed: "Bad file descriptor",
        # exit 255) is rping's, not the example's, and is not run again.
        setup=["retry() { for i in $(seq 100); do \"$@\" > run.out 2>&1 && { cat run.out; return 0; }; cat run.out; "
               "if grep -q 'ping data' run.out; then tail -n 3 run.out | grep -q '^rdma_get_cm_event: Bad file descriptor$'; "
               "return; fi; done; return 1; }"],
        subst=[("127.0.0.20", "127.0.0.70", "an address no other test of the suite uses"),
               ("127.0.0.21", "127.0.0.71", "an address no other test of the suite uses"),
               ("build/bin/softverbs run -- rping -c", "retry build/bin/softverbs run -- rping -c",
                "the client is repeated until the server started just before listens"),
               ("build/bin/softverbs run -- rstream -s", "retry build/bin/softverbs run -- rstream -s",
                "the client is repeated until the server started just before listens")],
        after=["wait"],
        expect=[r"ping data: rdma-ping-9: ", r"custom\s+4k\s+100\s+1\s"]),
    # docs/rdma-cm.md, "Datagram rsockets": udpong's server, a custom client run and
    # the server stopped. The client is repeated (bounded) until the server started
    # just before is bound: a datagram to a port not bound yet fails the next send.
    "rdma_cm_udpong": Test(
        examples=[("docs/rdma-cm.md", "SOFTVERBS_DEVICES=s@127.0.0.20 build/bin/softverbs run -- udpong -b 127.0.0.20 &")],
        timeout=120,
        setup=["retry() { for i in $(seq 100); do \"$@\" && return 0; sleep 0.1; done; return 1; }"],
        subst=[("127.0.0.20", "127.0.0.72", "an address no other test of the suite uses"),
               ("127.0.0.21", "127.0.0.73", "an address no other test of the suite uses"),
               ("build/bin/softverbs run -- udpong -s", "retry build/bin/softverbs run -- udpong -s",
                "the client is repeated until the server started just before is bound")],
        after=["wait"],
        expect=[r"custom\s+1000\s+\d+\s"]),
    # docs/configuration.md, "CMake options": the sanitizer runtime preloaded into an
    # unmodified program. Run on this build (sanitized or not), it must still work.
    "configuration_asan_preload": Test(
        examples=[("docs/configuration.md",
                   "LD_PRELOAD=$(gcc -print-file-name=libasan.so) build/bin/softverbs run -- ibv_devinfo")],
        env={"ASAN_OPTIONS": "detect_leaks=0"},  # ibv_devinfo's own leaks are not the example's subject
        expect=[r"hca_id:\s+emu0"]),
    # docs/install.md: install into a temporary prefix, then pkg-config and a compile.
    "install_prefix": Test(
        examples=[("docs/install.md", "cmake --install build --prefix /opt/softverbs"),
                  ("README.md", "cmake --install build --prefix /opt/softverbs"),
                  ("docs/install.md", "PKG_CONFIG_PATH=/opt/softverbs/lib/pkgconfig pkg-config --modversion softverbs")],
        timeout=120,
        files={"counters.c": "src:tests/package/consumer/counters.c"},
        subst=[("/opt/softverbs", "$PWD/opt/softverbs", "a temporary prefix instead of /opt (no root)")],
        after=["test -x opt/softverbs/bin/softverbs", "test -x counters"],
        expect=[r"^\d+\.\d+\.\d+$"]),
    # The CMake projects of docs/install.md and docs/testing-your-code.md, each built
    # on its own against a fresh install, with the sources tests/package/consumer has.
    "install_cmake_projects": Test(
        examples=[("docs/install.md", "cmake --install build --prefix /opt/softverbs"),
                  ("docs/install.md",
                   "find_package(softverbs CONFIG REQUIRED)      # -DCMAKE_PREFIX_PATH=/opt/softverbs if not under /usr"),
                  ("docs/testing-your-code.md",
                   "find_package(softverbs CONFIG REQUIRED)   # -DCMAKE_PREFIX_PATH=/opt/softverbs if not under /usr")],
        timeout=240,
        files={"devcheck.c": "src:tests/package/consumer/devcheck.c",
               "counters.c": "src:tests/package/consumer/counters.c",
               "fail-recv.toml": "src:tests/package/consumer/fail-recv.toml",
               "rdma_write_test.cpp": ("docs/testing-your-code.md",
                                       "// An RDMA WRITE between two emulated devices, and the same WRITE on a network")},
        subst=[("/opt/softverbs", "$PWD/opt/softverbs", "a temporary prefix instead of /opt (no root)")],
        cmake_prefix="$PWD/opt/softverbs",
        expect=[r"100% tests passed, 0 tests failed out of 2\b", r"100% tests passed, 0 tests failed out of 1\b"]),
    # docs/testing-your-code.md: the example, compiled without installing, and run.
    "testing_your_code_build_tree": Test(
        examples=[("docs/testing-your-code.md", "c++ -std=c++17 -I include rdma_write_test.cpp -o rdma_write_test \\")],
        timeout=180,
        files={"rdma_write_test.cpp": ("docs/testing-your-code.md",
                                       "// An RDMA WRITE between two emulated devices, and the same WRITE on a network")},
        expect=[r"\[  PASSED  \] 2 tests"]),
    # docs/hardware.md: the hw backend's commands, pointed at the hw-test copy of the
    # library (emulated devices behind the passthrough, as ctest's hw label does),
    # since this machine has no RDMA device; the conformance suite and the divergence
    # report with a few tests instead of all of them.
    "hardware_backend": Test(
        examples=[("docs/hardware.md", "# which devices the real rdma-core sees, through softverbs"),
                  ("docs/hardware.md",
                   "scripts/divergence.py run --backend hw      # the real devices: build/divergence/hw.json, hw.md")],
        timeout=120,
        env={"SOFTVERBS_HW_LIBIBVERBS": "{build}/lib-hwtest/libibverbs.so.1"},
        subst=[("conformance/conformance_tests", "conformance/conformance_tests --gtest_filter='Devices/DeviceTest.*'",
                "a few tests instead of the whole suite (ctest's hw.* entries run all of it this way)"),
               ("run --backend hw", "run --backend hw --hw-over-emu --name hw --filter 'Devices/DeviceTest.*'",
                "the hw-test copy as the real library, and a few tests instead of the suite"),
               ("run --backend emu", "run --backend emu --filter 'Devices/DeviceTest.*'",
                "a few tests instead of the suite")],
        skip_lines={
            "cmake -S . -B build": "reconfigures the build tree under test",
            "ctest --test-dir build -L hwdevice": "registered only with SOFTVERBS_HW_DEVICE_TESTS=ON, on a machine "
                                                  "with an RDMA device",
        },
        expect=[r"hca_id:\s+emu0", r"\[  PASSED  \] \d+ tests", r"^\d+ tests: \d+ pass, 0 fail",
                r"identical: every matched test has the same verdict"]),
    # docs/performance.md: the three benchmark programs, each bounded to a token run.
    "performance_benchmarks": Test(
        examples=[("docs/performance.md", "build/bin/engine_bench                                  # all benchmarks")],
        timeout=120,
        subst=[("build/bin/engine_bench ", "build/bin/engine_bench --benchmark_min_time=0.001 ",
                "a token run of every benchmark instead of a measurement"),
               ("build/bin/scale_bench ", "build/bin/scale_bench --benchmark_min_time=0.001 ",
                "a token run of every benchmark instead of a measurement"),
               ("[--seconds 0.5] [--reps 3] [--no-pin]", "--seconds 0.05 --reps 1",
                "the optional arguments, with a token duration")],
        expect=[r"BM_MsgRate64B/16", r"BM_ReadBw/1048576", r"BM_QpScale/1024/65536", r"BM_MrScale/10000/64",
                r"BM_LossBw/1", r"udp_busypoll_rtt_8b_us"]),
    # docs/simulation.md, "Virtual time": the retry-exhaustion program on the real
    # clock, then on virtual time (0.54 s of timeouts in milliseconds).
    "simulation_virtual_time": Test(
        examples=[("docs/simulation.md", "SOFTVERBS_DEVICES=2 build/tests/faults/virtual_retry")],
        expect=[r"(?s)status transport retry counter exceeded.*virtual elapsed [\d.]+ s, wall time \d+\.\d+ ms"
                r".*virtual elapsed 0\.536871 s, wall time \d{1,3}\.\d+ ms, emu0-tx drops 8"]),
    # docs/simulation.md, "Determinism": two runs of the fault workload with one seed
    # write the same trace, a third with another seed another one.
    "simulation_determinism": Test(
        examples=[("docs/simulation.md",
                   "export SOFTVERBS_CLOCK=virtual SOFTVERBS_DEVICES=emu0@127.0.204.10,emu1@127.0.204.11")],
        expect=[r"seed 7: the same trace twice", r"seed 8: another run"]),
    # docs/simulation.md, "The summary": a trace of the example program (an RDMA
    # WRITE, then one that every loss fails), its summary and its timers.
    "simulation_trace": Test(
        examples=[("docs/simulation.md", "SOFTVERBS_TRACE=trace.json build/tests/package/package_example_test")],
        expect=[r"completions: IBV_WC_RETRY_EXC_ERR 1", r"faults: drop \d+", r"timeouts: [1-9]",
                r"latency post->completion \(us\): n 1, p50 [\d.]+", r"timer  ack_timeout fired"]),
    # docs/simulation.md, "A simulated fabric": the all-to-all program over the
    # page's 16-node topology file, on virtual time.
    "simulation_topology": Test(
        examples=[("docs/simulation.md", "SOFTVERBS_TOPOLOGY=fabric.toml SOFTVERBS_CLOCK=virtual "
                   "build/tests/topology/topology_alltoall 4096 4")],
        files={"fabric.toml": ("docs/simulation.md", "# fabric.toml: 16 nodes, 2 us / 100 Gb/s links, one slow "
                               "and lossy pair")},
        expect=[r"nodes 16, RC QPs 240, messages 960 of 4096 bytes: all completed",
                r"virtual time \d+ ns, topology drops: loss [1-9]\d*, mtu 0"]),
    # docs/simulation.md, "Vendor personalities": a personality seeded from a
    # divergence report, then ibv_devinfo on it. This machine has no adapter to
    # report on: the report is the checked-in one of an rxe device.
    "simulation_seed_personality": Test(
        examples=[("docs/simulation.md",
                   "scripts/divergence.py personality build/divergence/hw.json --name mynic > mynic.toml")],
        subst=[("build/divergence/hw.json", "tests/report/fixtures/hw_rxe.json",
                "no RDMA adapter here: a report of rxe (tests/report/fixtures) stands for the adapter's")],
        after=["grep -q '^name = \"mynic\"' mynic.toml", "grep -q '^bad_lkey = \"loc_qp_op_err\"' mynic.toml"],
        expect=[r"vendor_id:\s+0xffffff", r"max_qp_wr:\s+1048576", r"max_msg_sz:\s+0x800000"]),
    # docs/wire.md, "Reading a capture": tshark on a capture of an ibv_rc_pingpong pair.
    "wire_tshark": Test(
        examples=[("docs/wire.md", "tshark --disable-heuristic rpcrdma_infiniband -r FILE -V")],
        # One process with two devices: an RDMA WRITE and its ACK (the example of
        # docs/testing-your-code.md, as built in this tree).
        setup=["SOFTVERBS_PCAP=cap.pcap build/tests/package/package_example_test --gtest_filter=RdmaWrite.DataArrives"],
        subst=[(" -r FILE", " -r cap.pcap", "FILE: the capture the setup line makes")],
        expect=[r"Opcode: Reliable Connection \(RC\) - RDMA WRITE Only", r"Opcode: Reliable Connection \(RC\) - "
                r"Acknowledge", r"Invariant CRC: 0x"]),
}

NOT_RUN = {
    ("docs/simulation.md", "ctest -L virtual"):
        "labels of the suite this test is part of, which ctest runs as such",
    ("docs/simulation.md", "ctest -L faults"):
        "labels of the suite this test is part of, which ctest runs as such",
    ("docs/testing.md", "ctest -L LABEL"):
        "a placeholder for any label of the suite this test is part of",
    ("docs/testing.md", "cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \\"):
        "a full ThreadSanitizer build of the tree and its CM tests (tens of minutes)",
    ("docs/configuration.md", "tshark -i lo"):
        "a live capture on an interface needs capture rights, and the page says what it does not show; SOFTVERBS_PCAP captures are read by docs.example.wire_tshark",
    ("docs/wire.md", "tshark -i lo"):
        "a live capture on an interface needs capture rights, and the page says what it does not show; SOFTVERBS_PCAP captures are read by docs.example.wire_tshark",
    ("docs/rdma-cm.md", "RXE_VM=/path/to/rxe-vm tests/rxe/cm_interop.sh build"):
        "boots the Soft-RoCE guest of the rxe-vm tool: needs root, qemu and the tool, which are not part of the suite",
    ("README.md", "./scripts/test.sh"):
        "the whole suite, of which this test is a part; .ci/run runs it",
    ("README.md", "./scripts/test.sh -L abi"):
        "builds and runs a label of the suite this test is part of; ctest -L abi is that label",
    ("README.md", "./scripts/build.sh -DSOFTVERBS_SANITIZE=address"):
        "a full sanitizer build of the tree (minutes)",
    ("README.md", "build/bin/softverbs run --"):
        "a prefix, not a command; test readme_run runs it with programs",
    ("README.md", "find_package(softverbs CONFIG REQUIRED)"):
        "an excerpt of docs/install.md's block (no devcheck target), which test install_cmake_projects builds",
    ("README.md", "cpack -G DEB"):
        "package.install_and_consume builds and checks the .deb",
    ("docs/configuration.md", "softverbs run [--devices SPEC] [--faults FILE] [--pcap FILE] [--log LEVEL] [--rsockets] [--no-sysfs] [--] CMD [ARGS...]"):
        "a synopsis with placeholders; tests/cli (label cli) runs every command and option",
    ("docs/configuration.md", "./scripts/build.sh -DSOFTVERBS_SANITIZE=address -DSOFTVERBS_WERROR=OFF"):
        "a full sanitizer build of the tree (minutes)",
    ("docs/configuration.md", "apt-get install --no-install-recommends"):
        "needs root; scripts.install_deps drives install-deps.sh with fake apt-get and sudo",
    ("docs/configuration.md", "tshark -r FILE"):
        "the short form of docs/wire.md's tshark line, which test wire_tshark runs",
    ("docs/faults.md", "ctest -L soak -R TwoProcessSoak --output-on-failure"):
        "the long soak (label soak, minutes), excluded from the default suite",
    ("docs/hardware.md", "scripts/build.sh"):
        "needs a ConnectX (the mlx5_0 device), and builds the tree",
    ("docs/hardware.md", "# this host, 10.77.0.1 on eth0; the peer runs rxe0 on 10.77.0.2"):
        "needs a second host (or the rxe VM) with the kernel's rxe driver on a real link",
    ("docs/hardware.md", "scripts/divergence.py run --backend hw"):
        "the run on the rxe VM; test hardware_backend runs the same command over the hw-test copy",
    ("docs/hardware.md", "rdma link add rxe0 type rxe netdev eth0"):
        "needs root and the kernel's rdma_rxe module",
    ("docs/hardware.md", "ctest --test-dir build -L hw            # hw scenarios + the conformance suite through the passthrough"):
        "labels of the suite this test is part of; running them from inside it would run them twice",
    ("docs/hardware.md", "ctest -L conformance"):
        "a label of the suite this test is part of",
    ("docs/hardware.md", "cmake -S . -B build && cmake --build build"):
        "two full builds, one with ASan (many minutes)",
    ("docs/install.md", "cd build && cpack -G DEB && sudo apt install ./softverbs_*.deb"):
        "needs root to install the package; package.install_and_consume builds the .deb and checks its files",
    ("docs/install.md", "build/bin/softverbs run -- CMD"):
        "a synopsis (CMD); test readme_run runs it with a program",
    ("docs/install.md", "ctest -L package"):
        "a label of the suite this test is part of",
    ("docs/testing-your-code.md", "ctest -L package"):
        "a label of the suite this test is part of",
    ("docs/limits.md", "perf record -e cpu-clock"):
        "names a profiler, no program to profile",
    ("docs/performance.md", "cmake --build build                 # SOFTVERBS_BUILD_BENCHMARKS=ON is the default"):
        "builds the tree under test, and perftest.sh runs 1-5 minutes and rewrites docs/performance.md",
    ("docs/performance.md", "perf record -e cpu-clock --call-graph dwarf engine_bench --benchmark_filter=BM_MsgRate64B/64"):
        "a profile of a full benchmark run (perf, minutes of samples)",
    ("docs/performance.md", "perf record -e cpu-clock"):
        "names a profiler, no program to profile",
    ("docs/performance.md", "perf stat -e context-switches"):
        "names a profiler option, no program to profile",
    ("docs/performance.md", "perf sched record"):
        "names a profiler, no program to profile (and needs the scheduler's tracepoints)",
    ("docs/performance.md", "benchmarks/cm_setup.sh [build-dir]"):
        "a measurement on the fixed addresses 127.0.0.20 and .21, which the clients label's "
        "cm_acceptance test holds; the clients label runs cmtime (rdmacm_test.cpp, cm_acceptance.sh)",
}


# ---------------------------------------------------------------------------------
# Finding the examples

@dataclass
class Example:
    page: str          # path from the repository root
    line: int          # line of the opening fence or of the span
    kind: str          # "block" or "inline"
    key: str           # the first line (block) or the whole span (inline)
    text: str          # the commands (a console block: the "$ " lines, without the prompt)
    lang: str = ""


FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(\$\([^)]*\)|\"[^\"]*\"|'[^']*'|\S*)\s+")


def looks_like_command(text):
    """Whether a line or span starts with a command, after VAR=value assignments."""
    t = text.strip()
    while ASSIGN.match(t):
        t = ASSIGN.sub("", t, count=1)
    words = t.split()
    if len(words) < 2:
        return False
    # A command word with a single argument (`cmake --install`, `perf stat`) names a
    # tool or a feature; with two or more it is a command line.
    return words[0].startswith(COMMAND_PATHS) or (words[0] in COMMAND_WORDS and len(words) >= 3)


def pages(root):
    out = ["README.md"] if os.path.exists(os.path.join(root, "README.md")) else []
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        out += sorted("docs/" + f for f in os.listdir(docs) if f.endswith(".md"))
    return out


def parse_page(root, page):
    """(examples, blocks by first line, problems) of one page."""
    with open(os.path.join(root, page), encoding="utf-8") as f:
        lines = f.read().split("\n")
    examples, blocks, problems = [], {}, []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m:
            indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
            body, j = [], i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
                j += 1
            first = next((b.strip() for b in body if b.strip()), "")
            blocks.setdefault(first, "\n".join(body) + "\n")
            if lang in SHELL_LANGS or lang in PROJECT_LANGS:
                if lang == "console":
                    cmds = [b.strip()[2:] for b in body if b.strip().startswith("$ ")]
                    text, key = "\n".join(cmds) + "\n", (cmds[0] if cmds else "")
                else:
                    text, key = "\n".join(body) + "\n", first
                examples.append(Example(page, i + 1, "block", key, text, lang))
            elif lang == "" and looks_like_command(first):
                problems.append(f"{page}:{i + 1}: an untagged block that starts with a command ({first!r}): "
                                "tag it ```sh (or make it not look like one)")
            i = j + 1
            continue
        for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", lines[i]):
            if looks_like_command(span):
                examples.append(Example(page, i + 1, "inline", span.strip(), span.strip() + "\n"))
        i += 1
    return examples, blocks, problems


def scan(root):
    examples, blocks, problems = [], {}, []
    for page in pages(root):
        e, b, p = parse_page(root, page)
        examples += e
        problems += p
        blocks[page] = b
    return examples, blocks, problems


def inventory(root, tests=None, not_run=None):
    """The problems of the mapping: a list of messages, empty when every example is mapped."""
    tests = TESTS if tests is None else tests
    not_run = NOT_RUN if not_run is None else not_run
    examples, blocks, problems = scan(root)
    run_by = {}
    for name, t in tests.items():
        for ex in t.examples:
            run_by.setdefault(tuple(ex), name)
        for path, src in t.files.items():
            if isinstance(src, tuple) and src[1] not in blocks.get(src[0], {}):
                problems.append(f"TESTS[{name!r}].files[{path!r}]: {src[0]} has no block whose first line is "
                                f"{src[1]!r}")
    seen = {}
    for ex in examples:
        k = (ex.page, ex.key)
        if k in seen and seen[k].kind == "block" and ex.kind == "block":
            problems.append(f"{ex.page}:{ex.line}: two blocks start with the same line {ex.key!r} (line "
                            f"{seen[k].line}): make the first lines differ, e.g. with a comment line")
        seen.setdefault(k, ex)
        if k not in run_by and k not in not_run:
            problems.append(f"{ex.page}:{ex.line}: unmapped {ex.kind} example {ex.key!r}: run it in a test of "
                            "TESTS or list it in NOT_RUN with the reason (tests/docs/doc_examples.py)")
    for k in list(run_by) + list(not_run):
        if k not in seen:
            where = f"TESTS[{run_by[k]!r}]" if k in run_by else "NOT_RUN"
            problems.append(f"{where}: {k[0]} has no example {k[1]!r} any more: update the mapping")
    for k in set(run_by) & set(not_run):
        problems.append(f"{k[0]}: {k[1]!r} is both run (TESTS[{run_by[k]!r}]) and in NOT_RUN")
    return problems, examples


# ---------------------------------------------------------------------------------
# Running a test

PRELUDE = r'''
# Waits (bounded) until process $2 listens on TCP port $1; fails if it exits first.
sv_wait_listen() {
  local hex i
  hex=$(printf ':%04X ' "$1")
  for i in $(seq 1 1000); do
    if grep -q "$hex[0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; then return 0; fi
    kill -0 "$2" 2>/dev/null || { echo "docs: the server exited before it listened on port $1" >&2; return 1; }
    sleep 0.01
  done
  echo "docs: nothing listens on port $1 after 10 s" >&2
  return 1
}
# Runs "$@" as a server on a free port, and the same command with 127.0.0.1 as its client.
sv_pair() {
  local port server rc=0
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  echo "docs: server: $* -p $port"
  env "$@" -p "$port" > "server-$port.log" 2>&1 &
  server=$!
  sv_wait_listen "$port" "$server" || { cat "server-$port.log"; return 1; }
  echo "docs: client: $* -p $port 127.0.0.1"
  env "$@" -p "$port" 127.0.0.1 || rc=$?
  wait "$server" || rc=$?
  echo "docs: server output:"
  cat "server-$port.log"
  return $rc
}
'''


def find_example(examples, page, key):
    for ex in examples:
        if ex.page == page and ex.key == key:
            return ex
    raise SystemExit(f"docs: {page} has no example {key!r} (run `doc_examples.py inventory`)")


def join_continuations(text):
    out, cur = [], ""
    for line in text.split("\n"):
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    if cur:
        out.append(cur)
    return out


# What a user's CMakeLists.txt has above the lines the docs show.
PROJECT_HEAD = "cmake_minimum_required(VERSION 3.25)\nproject(docs_example C CXX)\n"


def project_script(ex, t, number):
    """Shell lines that build and test a cmake block as a project of its own."""
    d = f"project{number}"
    files = " ".join(sh_quote(f) for f in t.files)
    return [f"echo {sh_quote(f'docs: == {ex.page}:{ex.line}: the project {d}/')}",
            f"mkdir {d}" + (f" && cp {files} {d}/" if files else ""),
            f"printf '%s' {sh_quote(PROJECT_HEAD + ex.text)} > {d}/CMakeLists.txt",
            f"cmake -S {d} -B {d}/build -G Ninja -DCMAKE_PREFIX_PATH={t.cmake_prefix} > {d}/configure.log 2>&1 || "
            f"{{ cat {d}/configure.log; exit 1; }}",
            f"cmake --build {d}/build > {d}/build.log 2>&1 || {{ cat {d}/build.log; exit 1; }}",
            f"ctest --test-dir {d}/build --output-on-failure"]


def build_script(name, t, root):
    examples, blocks, _ = scan(root)
    parts = ["set -euo pipefail", PRELUDE]
    projects = 0
    for line in t.setup:
        parts.append(f"echo {sh_quote('docs: setup: ' + line)}")
        parts.append(pair_line(line) if t.pairs and is_pair_line(line) else line)
    for page, key in t.examples:
        ex = find_example(examples, page, key)
        if ex.lang in PROJECT_LANGS:
            projects += 1
            parts += project_script(ex, t, projects)
            continue
        text = ex.text
        for old, new, _why in t.subst:
            text = text.replace(old, new)
        parts.append(f"echo {sh_quote(f'docs: == {page}:{ex.line}')}")
        for line in join_continuations(text):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            skip = next((why for s, why in t.skip_lines.items() if s in stripped), None)
            if skip:
                parts.append(f"echo {sh_quote('docs: not run: ' + stripped + ' (' + skip + ')')}")
                continue
            parts.append(f"echo {sh_quote('docs: $ ' + stripped)}")
            parts.append(pair_line(stripped) if t.pairs and is_pair_line(stripped) else stripped)
    for line in t.after:
        parts.append(f"echo {sh_quote('docs: check: ' + line)}")
        parts.append(line)
    return "\n".join(parts) + "\n"


def is_pair_line(line):
    code = line.split(" #")[0]
    return re.search(r"(^|\s)" + PAIR_PROGRAMS + r"(\s|$)", code) and not re.search(r"\d+\.\d+\.\d+\.\d+\s*$", code)


def pair_line(line):
    code, sep, comment = line.partition(" #")
    return "sv_pair " + code.rstrip().rstrip("&").rstrip() + (" #" + comment if sep else "")


def sh_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def prepare_work(work, t, root, build):
    # build/: links to the build tree's entries, so writes under build/ stay here.
    os.mkdir(os.path.join(work, "build"))
    for entry in os.listdir(build):
        os.symlink(os.path.join(build, entry), os.path.join(work, "build", entry))
    os.mkdir(os.path.join(work, "scripts"))
    for entry in os.listdir(os.path.join(root, "scripts")):
        dst = os.path.join(work, "scripts", entry)
        if entry in t.stubs:
            with open(dst, "w") as f:
                f.write(t.stubs[entry])
            os.chmod(dst, 0o755)
        else:
            os.symlink(os.path.join(root, "scripts", entry), dst)
    for entry in ("include", "tests", "benchmarks"):
        os.symlink(os.path.join(root, entry), os.path.join(work, entry))
    _, blocks, _ = scan(root)
    for path, src in t.files.items():
        if isinstance(src, tuple):
            text = blocks[src[0]][src[1]]
        else:
            with open(os.path.join(root, src[len("src:"):]), encoding="utf-8") as f:
                text = f.read()
        with open(os.path.join(work, path), "w", encoding="utf-8") as f:
            f.write(text)


# perftest times the host's CPU clock before it reports, and gives up when a loaded
# machine makes that timing too noisy; the peer then loses its final exchange. Nothing
# about softverbs: such a run is repeated (tests/clients/program_pair.hpp does the same).
HOST_CLOCK_UNMEASURED = (r"Can't produce a report", r"Correlation coefficient r\^2")
RUNS = 3


def run_once(name, t, root, build, deadline):
    """(passed, retry, output) of one run in a fresh work directory."""
    work = tempfile.mkdtemp(prefix=f"sv-docs-{name}-")
    try:
        prepare_work(work, t, root, build)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SOFTVERBS_")}
        env.update({k: v.replace("{build}", build) for k, v in t.env.items()})
        proc = subprocess.Popen(["bash", "-c", build_script(name, t, root)], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            return False, False, out + f"\nFAIL: docs.example.{name}: not done after {t.timeout} s"
        # Nothing the script started may outlive it (a server whose client failed).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if proc.returncode != 0:
            retry = all(re.search(r, out) for r in HOST_CLOCK_UNMEASURED)
            return False, retry, out + f"\nFAIL: docs.example.{name}: exit status {proc.returncode}"
        missing = [e for e in t.expect if not re.search(e, out, re.M)]
        if missing:
            return False, False, out + f"\nFAIL: docs.example.{name}: the output does not match {missing}"
        return True, False, out + f"\ndocs.example.{name}: passed"
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_test(name, root, build):
    t = TESTS[name]
    root, build = os.path.realpath(root), os.path.realpath(build)
    deadline = time.monotonic() + t.timeout
    for run in range(1, RUNS + 1):
        passed, retry, out = run_once(name, t, root, build, deadline)
        print(out)
        if passed:
            return 0
        if not retry or run == RUNS:
            return 1
        print(f"docs: perftest could not time the host's clock (run {run} of at most {RUNS}); again")
    return 1


def print_table(root):
    """Every example as a Markdown table row: where, and the test that runs it or why none does."""
    _, examples = inventory(root)
    print("| example | run by | substitutions, lines left out |\n|---|---|---|")
    for ex in examples:
        name = next((n for n, t in TESTS.items() if (ex.page, ex.key) in map(tuple, t.examples)), None)
        cell = f"`{ex.page}:{ex.line}` `{ex.key[:70]}`"
        if name is None:
            print(f"| {cell} | not run | {NOT_RUN.get((ex.page, ex.key), 'UNMAPPED')} |")
            continue
        t = TESTS[name]
        notes = [f"`{o.strip()}` → `{n.strip()}` ({why})" for o, n, why in t.subst if o in ex.text]
        notes += [f"left out `{k}` ({why})" for k, why in t.skip_lines.items() if k in ex.text]
        notes += ["each server line also run as its client" for _ in [0] if t.pairs]
        print(f"| {cell} | docs.example.{name} | {'; '.join(notes)} |")


# ---------------------------------------------------------------------------------
# The checker on a small tree with known problems

def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))
        with open(os.path.join(root, "README.md"), "w") as f:
            f.write("Run `build/bin/softverbs run -- ibv_devices` or `softverbs`.\n\n"
                    "```sh\nbuild/bin/softverbs devices\n```\n\n```\nscripts/build.sh -DX=1\n```\n"
                    "```toml\naction = \"drop\"\n```\n")
        with open(os.path.join(root, "docs", "new.md"), "w") as f:
            f.write("```console\n$ ctest -L unit\nok\n```\n\n```bash\n# mapped\necho hi\n```\n")
        tests = {"t": Test(examples=[("docs/new.md", "# mapped")])}
        not_run = {("README.md", "build/bin/softverbs devices"): "why", ("docs/gone.md", "x"): "stale"}
        problems, examples = inventory(root, tests, not_run)
        text = "\n".join(problems)
        expected = ["README.md:1: unmapped inline example 'build/bin/softverbs run -- ibv_devices'",
                    "README.md:7: an untagged block that starts with a command",
                    "docs/new.md:1: unmapped block example 'ctest -L unit'",
                    "NOT_RUN: docs/gone.md has no example 'x' any more"]
        bad = [e for e in expected if e not in text]
        if len(problems) != len(expected) or bad:
            print("FAIL: self-test: expected these problems:\n  " + "\n  ".join(expected) +
                  "\ngot:\n  " + "\n  ".join(problems))
            return 1
        if [e.key for e in examples if e.kind == "inline"] != ["build/bin/softverbs run -- ibv_devices"]:
            print("FAIL: self-test: inline examples", [e.key for e in examples])
            return 1
    server = "SOFTVERBS_FAULTS=f.toml build/bin/softverbs run -- ib_write_bw -d emu0 -x 1   # a server"
    if (not is_pair_line(server) or is_pair_line(server.split(" #")[0] + " 127.0.0.1")
            or pair_line(server) != "sv_pair " + server.split("   #")[0] + " # a server"
            or join_continuations("a \\\n  b\nc") != ["a    b", "c"]):
        print("FAIL: self-test: server lines", pair_line(server))
        return 1
    print("self-test: the inventory finds unmapped, untagged and stale examples; server lines are paired")
    return 0


def main():
    if "--self-test" in sys.argv[1:]:
        return self_test()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("inventory", "table", "list-tests", "run", "show"))
    p.add_argument("name", nargs="?")
    p.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    p.add_argument("--build")
    a = p.parse_args()
    if a.command == "list-tests":
        for name, t in TESTS.items():
            print(name, t.timeout)
        return 0
    if a.command == "inventory":
        problems, examples = inventory(a.root)
        for m in problems:
            print(m)
        runs = sum(1 for e in examples if any((e.page, e.key) in map(tuple, t.examples) for t in TESTS.values()))
        print(f"docs: {len(examples)} command examples: {runs} run by {len(TESTS)} tests, "
              f"{len(examples) - runs} listed as not run; {len(problems)} problems")
        return 1 if problems else 0
    if a.command == "table":
        print_table(a.root)
        return 0
    if a.name not in TESTS:
        p.error(f"unknown test {a.name!r}; one of {', '.join(TESTS)}")
    if a.command == "show":
        print(build_script(a.name, TESTS[a.name], a.root))
        return 0
    if not a.build:
        p.error("run needs --build")
    return run_test(a.name, a.root, a.build)


if __name__ == "__main__":
    sys.exit(main())
