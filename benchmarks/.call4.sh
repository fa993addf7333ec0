export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1; mkdir -p $OUT/r
bash benchmarks/ncu_decode.sh $OUT/r/ncu-fp8-B64-H16-tma.txt fp8 64 8192 16
bash benchmarks/ncu_decode.sh $OUT/r/ncu-fp8-B64-H16-gather.txt fp8 64 8192 16 tma=0
bash benchmarks/ncu_decode.sh $OUT/r/ncu-fp8-B1-128K-tma.txt fp8 1 131072 8
grep -E "stalled_(long|short|wait|barrier|math|mio|selected|not_sel|branch|lg_|dispatch|no_inst)|pipe_.*pct|cycles_active.avg|inst_executed.sum|dram__|warps_active|registers_per|occupancy_limit" $OUT/r/ncu-fp8-B64-H16-tma.txt | awk '{print $1, $NF}' > $OUT/r/summary.txt
tar czf $OUT/r.tgz -C $OUT r
