#!/bin/bash
# First turns at 4 req/s (2x), two replicas; per seed three runs one after the other, the
# order rotating by seed: slo routing with the KV room (/tmp/head: a worktree of e1d3569
# with kv_room.diff applied), power-of-two (Ray Serve's rule, one try, /tmp/head), slo
# routing as committed (/tmp/base: a worktree of e1d3569):
#   bash runs.sh 1 2 3 4 5 6      # results in /tmp/mt/kr_{new,p2,old}_sSEED.json
cd "$(dirname "$0")/../pairs_1207" || exit 1
for s in "$@"; do
  a=kr_new_s$s:head:slo b=kr_p2_s$s:head:power-of-two:1 c=kr_old_s$s:base:slo
  case $((s % 3)) in
    0) SEED=$s DATASET=sharegpt bash run.sh 4 "" "$a" "$b" "$c";;
    1) SEED=$s DATASET=sharegpt bash run.sh 4 "" "$b" "$c" "$a";;
    2) SEED=$s DATASET=sharegpt bash run.sh 4 "" "$c" "$a" "$b";;
  esac
done
