#!/bin/bash
set -u
L=$OUT; source scripts/lib/deps.sh; mn_use_debs .deps/debs >/dev/null
cmake -S . -B build-gpu -G Ninja -DMN_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DMN_WERROR=OFF > $L/cfg.log 2>&1
t0=$(date +%s)
cmake --build build-gpu -j16 --target bench_lm_step test_cuda_models > $L/build.log 2>&1 || { tail -40 $L/build.log; exit 1; }
echo "build $(( $(date +%s) - t0 )) s; $(nvidia-smi --query-gpu=name --format=csv,noheader)"
export MN_CACHE_DIR=$PWD/build-gpu/kernel-cache
B=build-gpu
timeout 60 $B/tests/test_cuda_models --jobs 1 --filter '*tuned*' > $L/t_models.log 2>&1; echo "tuned test rc=$?"; grep -E "Synthesis|FAIL|Assert" $L/t_models.log | head -5
MN_MATMUL_TUNE=1 timeout 60 $B/bench_lm_step gpt2 --precision bf16 --profile > $L/prof_tuned.txt 2>&1
grep -E "^BENCH|FLOOR (matmul|total)" $L/prof_tuned.txt
timeout 120 scripts/ab-env.sh --build-dir $B --rounds 2 -- gpt2 --precision bf16 -- base MN_MATMUL_TUNE=1 > $L/ab.txt 2>&1; tail -4 $L/ab.txt
timeout 70 scripts/ab-env.sh --build-dir $B --rounds 1 -- smollm2 --precision bf16 -- base MN_MATMUL_TUNE=1 > $L/ab_smol.txt 2>&1; tail -3 $L/ab_smol.txt
