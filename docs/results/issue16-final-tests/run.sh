#!/usr/bin/env bash
# Issue 16: the fp8 attention with only the rope copied straight into K (hisparse-rope) against
# the tip (hisparse), kernel-bench three times alternating; then every packed GPU test on the tip.
cd "$(dirname "$0")/../../.."
export HISPARSE_CUDA_INCLUDE=/usr/local/cuda/include RUST_BACKTRACE=1
R=$OUT/r; mkdir -p $R; B=.gpu/bin
t() { local name=$1 lim=$2; shift 2; echo "=== $name $(date +%T)"; timeout $lim "$@" > $R/$name.log 2>&1; echo "rc=$? $(date +%T)"; }
for i in 1 2 3; do for v in base rope; do
  bin=$B/hisparse; [ $v = rope ] && bin=$B/hisparse-rope
  t kba-$v-$i 30 $bin kernel-bench --only attention --batches 1,64 --out $R/kboa-$v-$i
  grep -E "wgmma.*fp8.*graph" $R/kba-$v-$i.log | sed 's/  */ /g; s/per call, 8 calls a graph; //'
done; done
t tests 540 bash .gpu/run-tests.sh
grep -E "^=== |test result|gpu tests:" $R/tests.log
cd $OUT && tar czf r.tgz r && rm -rf r
