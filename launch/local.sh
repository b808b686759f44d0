#!/usr/bin/env bash
# fedur on one machine: one rank per GPU (or per CPU process); the clients are spread over the ranks in
# contiguous blocks (fedur/federated/placement.py). Run from the repository root, in the environment
# where fedur is installed (`fabric` comes with lightning):
#
#   launch/local.sh 8 --config configs/cifar10.yaml --dataset.root /data/cifar10   # one node, 8 GPUs
#   launch/local.sh 1 --config configs/cifar10.yaml --dataset.root /data/cifar10   # one GPU
#   launch/local.sh cpu:2 --config configs/smoke.yaml                              # 2 CPU processes
#
# Everything after the device count goes to fedur/main.py. Flags for `fabric run` itself (--main-port,
# --precision, ...) go in FABRIC_ARGS, e.g. FABRIC_ARGS="--main-port 29600" for a second job on the node.
set -euo pipefail
usage="usage: launch/local.sh N|cpu:N [fedur/main.py arguments ...]"
devices=${1:?$usage}
shift
case "$devices" in
  cpu:*) accelerator=cpu; devices=${devices#cpu:} ;;
  *) accelerator=cuda ;;
esac
[[ "$devices" =~ ^[1-9][0-9]*$ ]] || { echo "$usage (got '$devices')" >&2; exit 2; }
# shellcheck disable=SC2086  # FABRIC_ARGS holds several flags
exec fabric run --accelerator "$accelerator" --devices "$devices" ${FABRIC_ARGS:-} \
  "$(dirname "$0")/../fedur/main.py" "$@"
