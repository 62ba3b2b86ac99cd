#!/bin/bash
# rdma_cm against the kernel's CM, the guest's half: run by
#   tests/rxe/cm_interop.sh  (which boots the guest of shared tools' rxe-vm)
# Inside the guest (rxe0 on 10.77.0.2): rping with the kernel's rdma_cm against
# softverbs on the host (10.77.0.1), both directions; then softverbs' own
# librdmacm.so.1 over the real one (SOFTVERBS_BACKEND=hw) on rxe0, with rping
# and ucmatose. The install prefix of the build is at /opt/host.
set -u
retry() { for _ in $(seq 60); do "$@" && return 0; done; return 1; }
ibv_devinfo -d rxe0 | grep -E "hca_id|state|link_layer"

echo "== kernel CM server (guest), softverbs client (host)"
timeout 300 rping -s -a 10.77.0.2 -C 10 -v > /tmp/s1.log 2>&1
echo "guest server rc=$?"; tail -2 /tmp/s1.log

echo "== kernel CM client (guest), softverbs server (host)"
retry timeout 60 rping -c -a 10.77.0.1 -C 10 -v > /tmp/c2.log 2>&1
echo "guest client rc=$?"; tail -2 /tmp/c2.log

echo "== softverbs' librdmacm over the real one (SOFTVERBS_BACKEND=hw) on rxe0"
export SOFTVERBS_BACKEND=hw
SV=/opt/host/bin/softverbs
timeout 120 $SV run -- rping -s -a 10.77.0.2 -C 10 -v > /tmp/hs.log 2>&1 &
retry timeout 60 $SV run -- rping -c -a 10.77.0.2 -C 10 -v > /tmp/hc.log 2>&1
echo "hw rping client rc=$?"; wait; tail -1 /tmp/hc.log; tail -1 /tmp/hs.log
timeout 120 $SV run -- ucmatose -b 10.77.0.2 -c 2 -C 5 > /tmp/us.log 2>&1 &
retry timeout 60 $SV run -- ucmatose -s 10.77.0.2 -c 2 -C 5 > /tmp/uc.log 2>&1
echo "hw ucmatose client rc=$?"; wait; tail -1 /tmp/uc.log; tail -1 /tmp/us.log
