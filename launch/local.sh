#!/usr/bin/env bash
# fedur on one machine: one rank per GPU (or per CPU process); the clients are spread over the ranks in
# contiguous blocks (fedur/federated/placement.py). Run from the repository root, in the environment
# where fedur is installed (`fabric` comes with lightning):
#
#   launch/local.sh 8 --config configs/cifar10.yaml --dataset.root /data/cifar10   # one node, 8 GPUs
#   launch/local.sh 1 --config configs/cifar10.yaml --dataset.root /data/cifar10   # one GPU
#   launch/local.sh cpu:2 --config configs/smoke.yaml                              # 2 CPU processes
#
# Everything after the device count goes to fedur/main.py. Flags for `fabric run` itself (--precision, ...) go
# in FABRIC_ARGS. The ranks meet on a free port picked here (fabric run's own default, 29400, would make a
# second job on the machine fail with EADDRINUSE); FABRIC_ARGS="--main-port 29600" picks one yourself.
set -euo pipefail
usage="usage: launch/local.sh N|cpu:N [fedur/main.py arguments ...]"
devices=${1:?$usage}
shift
case "$devices" in
  cpu:*) accelerator=cpu; devices=${devices#cpu:} ;;
  *) accelerator=cuda ;;
esac
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || { echo "$usage (got '$devices')" >&2; exit 2; }
port=""
if [[ " ${FABRIC_ARGS:-} " != *" --main-port"* ]]; then
  port="--main-port $("${PYTHON:-python3}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
fi
# shellcheck disable=SC2086  # FABRIC_ARGS and port hold several words
exec fabric run --accelerator "$accelerator" --devices "$devices" $port ${FABRIC_ARGS:-} \
  "$(dirname "$0")/../fedur/main.py" "$@"
