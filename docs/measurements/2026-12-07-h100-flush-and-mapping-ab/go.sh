#!/bin/bash
# A/B of workloads binaries in .gpu/ab, order rotating each rep; RMM beside. BUDGET seconds.
cd "$(dirname "$0")"; AB=$PWD; S=$SECONDS; BUDGET=${BUDGET:-570}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee $OUT/gpu.txt
left() { echo $((BUDGET - (SECONDS-S))); }
run() { # name binary args...
  local n=$1; shift; local t0=$SECONDS
  timeout -k 5 $(( $(left) > 10 ? $(left) - 5 : 5 )) "$@" > $OUT/tmp.txt 2>$OUT/err_$n.txt; local rc=$?
  sed "s/^{/{\"bin\":\"$n\",\"rep\":$REP,/" $OUT/tmp.txt | grep '^{' >> $OUT/$n.jsonl
  echo "rep $REP $n rc=$rc $((SECONDS-t0)) s (at $((SECONDS-S)))" | tee -a $OUT/summary.txt
}
ONLY=${ONLY:-serving,mixed,churn}
REP=0; run A ./wl_A /tmp/wl --only $ONLY --configs default
run rmm ./rmm_replay /tmp/wl/serving.cmwl /tmp/wl/mixed.cmwl /tmp/wl/churn.cmwl
ORDER=(B D C A)
for REP in 1 2 3 4 5 6 7 8 9 10; do
  for i in 0 1 2 3; do
    x=${ORDER[$(( (i + REP) % 4 ))]}
    [ $(left) -lt 60 ] && break 2
    if [ $x = C ]; then run C ./wl_C /tmp/wl --only $ONLY --configs mappings_16,mappings_32
    else run $x ./wl_$x /tmp/wl --only $ONLY --configs default; fi
  done
done
[ $(left) -gt 40 ] && { REP=99; run rmm ./rmm_replay /tmp/wl/serving.cmwl /tmp/wl/mixed.cmwl; }
true
