#!/bin/bash
# The first device call of session 27 (dev/serving/README.md): moeserve alone.
cd "$(dirname "$0")/../.."
R=/tmp/res; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv | tee $R/gpu.txt
timeout 590 bash -c "
OUT=$R bash dev/serving/run.sh moe 16 1,64,256,512
OUT=$R bash dev/serving/run.sh model 16 1,64,256
OUT=$R bash dev/serving/run.sh moe 46 1,64,256
OUT=$R bash dev/serving/run.sh act
" 2>&1 | tee $R/call.log
tar czf $OUT/res.tgz -C $R .
