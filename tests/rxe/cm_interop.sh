#!/bin/bash
# rdma_cm interoperability with the kernel's CM (docs/rdma-cm.md, "Against the
# kernel"): boots the rxe guest of the rxe-vm tool (its path in RXE_VM), runs
# tests/rxe/cm_guest_job.sh there, and softverbs' side here in the guest's
# network namespace (device h@10.77.0.1). Needs root (namespaces, qemu).
#   tests/rxe/cm_interop.sh BUILD_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-build}" && pwd)
rxe_vm=${RXE_VM:?set RXE_VM to the rxe-vm command}
work=$(mktemp -d)
cmake --install "$build" --prefix "$work/prefix" >/dev/null
"$rxe_vm" net-up
host_side() {
  local sv="$work/prefix/bin/softverbs"
  export SOFTVERBS_DEVICES=h@10.77.0.1 SOFTVERBS_CM_RESPONSE_TIMEOUT=18 SOFTVERBS_CM_MAX_RETRIES=5
  for _ in $(seq 100); do timeout 60 "$sv" run -- rping -c -a 10.77.0.2 -C 10 -v > "$work/h1.log" 2>&1 && break; done
  echo "host client: $(tail -1 "$work/h1.log")"
  SOFTVERBS_PCAP="$work/cm.pcap" timeout 300 "$sv" run -- rping -s -a 10.77.0.1 -C 10 -v > "$work/h2.log" 2>&1
  echo "host server rc=$?: $(tail -1 "$work/h2.log")"
}
export -f host_side
export work
ip netns exec rxens bash -c host_side > "$work/host.log" 2>&1 &
"$rxe_vm" run "$here/cm_guest_job.sh" "$work/prefix"
wait
cat "$work/host.log"
echo "capture: $work/cm.pcap"
tshark -r "$work/cm.pcap" 2>/dev/null | grep "CM:" || true
