#!/usr/bin/env bash
# Hardware counters of one decode launch: bash benchmarks/ncu_decode.sh OUTFILE FMT B CTX H [k=v ...]
# (NCU_DRIVER=benchmarks/profile_sparse.py: OUTFILE B H [k=v ...], a sparse launch)
out=$1; shift
M="launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem"
M+=",dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__warps_active.avg.pct_of_peak_sustained_active"
M+=",l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"
M+=",l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"
M+=",l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum,l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"
M+=",smsp__inst_executed.sum,sm__cycles_elapsed.avg,sm__cycles_active.avg"
M+=",sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
M+=",sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
M+=",sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
M+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
M+=",regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active"
# every pipe's busy cycles (session 10's question: is the 16-row loop bound by the e4m3
# conversions' pipe or by shared memory? a second program per SM adds only ~10%)
M+=",regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active"
timeout 90 ncu --clock-control none -k "regex:_mla_(decode|sparse)" --launch-skip 2 --launch-count 1 --metrics "$M" \
  python3 "${NCU_DRIVER:-benchmarks/profile_decode.py}" "$@" > "$out" 2>&1
