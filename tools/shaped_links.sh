#!/bin/bash
# Two worker "machines" on this one: network namespaces twn1 and twn2, each
# behind its own veth pair (10.77.N.1 here, 10.77.N.2 there) whose two
# directions are shaped to RATE by Linux tbf (no added latency). Needs root.
#
#   tools/shaped_links.sh 1gbit      # or 10gbit, or none (unshaped veth)
#   ip netns exec twn1 .venv/bin/python bin/worker.py --port=8000 &
#   ip netns exec twn2 .venv/bin/python bin/worker.py --port=8000 &
#   .venv/bin/python bin/train.py ... --workers=10.77.1.2:8000,10.77.2.2:8000
#   tools/shaped_links.sh down       # remove both
#
# Bytes over the links: /sys/class/net/thv{1,2}/statistics/{rx,tx}_bytes.
# docs/results_scale.md ("Remote workers") has the runs made with it.
set -euo pipefail
rate=${1:?usage: shaped_links.sh RATE|none|down}
for i in 1 2; do
  ip netns del twn$i 2>/dev/null || true
  ip link del thv$i 2>/dev/null || true
  [ "$rate" = down ] && continue
  ip netns add twn$i
  ip link add thv$i type veth peer name twv$i
  ip link set twv$i netns twn$i
  ip addr add 10.77.$i.1/24 dev thv$i
  ip link set thv$i up
  ip netns exec twn$i ip addr add 10.77.$i.2/24 dev twv$i
  ip netns exec twn$i ip link set twv$i up
  ip netns exec twn$i ip link set lo up
  if [ "$rate" != none ]; then
    tc qdisc add dev thv$i root tbf rate "$rate" burst 1mb latency 50ms
    ip netns exec twn$i tc qdisc add dev twv$i root tbf rate "$rate" burst 1mb latency 50ms
  fi
done
