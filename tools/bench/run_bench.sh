#!/usr/bin/env bash
# Runs the benchmark suite and writes its report (what `make bench` runs).
#
#   tools/bench/run_bench.sh [--quick] [--out DIR] [--only STAGE[,STAGE...]]
#
# Stages (what each runs and writes: docs/research/benchmarks.md): collectives,
# overhead, fusion, training, sim_cluster (as root), pipeline, data_share
# (or data), scale (needs tnt-sim), reliability, compression, zero. Each runs
# under a time limit and writes its results into DIR (default bench/results);
# then tools/bench/report.py writes DIR/summary.md, DIR/details.md and the
# plots.
# A stage that fails or runs out of time is recorded in the summary and the
# others still run; the exit status is 1 when any stage failed, 0 otherwise.
# Every command's output is in DIR/logs/<stage>.log, traces in DIR/traces/.
#
# Environment: PYTHON (python3), PREFIX (/usr/local: where tnt-bench is
# installed), TNT_BENCH (the tnt-bench binary), BUILD (the build tree with
# tnt-sim, default build), MPIRUN (mpirun), MPIFLAGS
# (--oversubscribe --bind-to none, plus --allow-run-as-root as root),
# BENCH_TIMEOUT_SCALE (multiplies every time limit, default 1).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=${PYTHON:-python3}
PREFIX=${PREFIX:-/usr/local}
TNT_BENCH=${TNT_BENCH:-$PREFIX/bin/tnt-bench}
LAUNCHER=$PREFIX/bin/tarantella
[[ -x $LAUNCHER ]] || LAUNCHER=$(command -v tarantella)
MPIRUN=${MPIRUN:-mpirun}
if [[ -z ${MPIFLAGS+x} ]]; then
  MPIFLAGS="--oversubscribe --bind-to none"
  [[ $(id -u) -eq 0 ]] && MPIFLAGS+=" --allow-run-as-root"
fi
SCALE=${BENCH_TIMEOUT_SCALE:-1}

QUICK=0
OUT=$ROOT/bench/results
ONLY=""
usage() {
  sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --out) OUT=${2:?--out needs a directory}; shift ;;
    --out=*) OUT=${1#--out=} ;;
    --only) ONLY=${2:?--only needs stage names}; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    -h | --help) sed -n '2,/^set/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1'" >&2; usage ;;
  esac
  shift
done

LOGS=$OUT/logs
STAGES_TSV=$LOGS/stages.tsv
mkdir -p "$OUT" "$LOGS" || exit 1
# Results of an earlier run must not pass for this run's: everything goes,
# or with --only, what the chosen stages write (the rest stays in the report).
# The stages and the prefix of the files each writes (report_base.STAGES).
STAGE_NAMES=()
declare -A STAGE_FILES=()
while read -r s p; do
  STAGE_NAMES+=("$s")
  STAGE_FILES[$s]=$p
done < <("$PYTHON" "$ROOT/tools/bench/report.py" --stages)
((${#STAGE_NAMES[@]})) || { echo "run_bench.sh: $PYTHON tools/bench/report.py --stages failed" >&2; exit 1; }
# "data" is short for data_share.
ONLY=$(sed -E 's/(^|,)data(,|$)/\1data_share\2/g' <<<"$ONLY")
for s in ${ONLY//,/ }; do
  [[ -n ${STAGE_FILES[$s]:-} ]] || { echo "run_bench.sh: unknown stage '$s' (expected" \
    "${STAGE_NAMES[*]})" >&2; exit 2; }
done
if [[ -z $ONLY ]]; then
  rm -f "$OUT"/*.jsonl "$OUT"/*.png "$OUT"/traces/* "$LOGS"/*.log "$STAGES_TSV"
else
  for s in ${ONLY//,/ }; do
    p=${STAGE_FILES[$s]}
    rm -f "$OUT/$p"*.jsonl "$OUT/$p"*.png "$OUT/traces/$p"* "$LOGS/$p"*.log
    [[ -f $STAGES_TSV ]] && sed -i "/^$p/d" "$STAGES_TSV"
  done
fi
rm -f "$OUT"/summary.md "$OUT"/details.md
[[ -s $STAGES_TSV ]] || printf 'stage\tstatus\trc\tseconds\tlog\n' >"$STAGES_TSV"

# Time limits in seconds: full run, quick run.
limit() {
  local full=$1 quick=$2 s
  s=$((QUICK ? quick : full))
  awk -v s="$s" -v k="$SCALE" 'BEGIN { printf "%d\n", s * k + 0.5 }'
}

wanted() {
  [[ -z $ONLY ]] || [[ ",$ONLY," == *",$1,"* ]]
}

failed=0
# run_stage NAME LIMIT_S EXPECTED_JSON COMMAND...: runs COMMAND under a time
# limit with its output in logs/NAME.log and records how it ended.
run_stage() {
  local name=$1 limit_s=$2 expect=$3
  shift 3
  local log=$LOGS/$name.log start rc status
  printf 'bench: %-28s ' "$name"
  start=$(date +%s)
  {
    echo "\$ $*"
    echo "# time limit: ${limit_s} s"
  } >"$log"
  timeout --kill-after=20 "$limit_s" "$@" >>"$log" 2>&1 </dev/null
  rc=$?
  local secs=$(($(date +%s) - start))
  if ((rc == 124 || rc == 137)); then
    status="timeout"
  elif ((rc != 0)); then
    status="failed"
  elif [[ -n $expect && ! -s $expect ]]; then
    status="failed"
    echo "# no results in $expect" >>"$log"
  else
    status="ok"
  fi
  # A stage cut short may leave an empty file (tnt-bench opens it early).
  [[ $status != ok && -n $expect && -f $expect && ! -s $expect ]] && rm -f "$expect"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" "logs/$name.log" >>"$STAGES_TSV"
  printf '%-8s %5d s  (logs/%s.log)\n' "$status" "$secs" "$name"
  if [[ $status != ok ]]; then
    failed=1
    tail -n 15 "$log" | sed 's/^/    /'
  fi
}

# not_run NAME WHY: records a stage that could not start.
not_run() {
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "not run" "-" "0" "$2" >>"$STAGES_TSV"
  printf 'bench: %-28s not run  (%s)\n' "$1" "$2"
}

# What ran where: commit, cores, load, versions (the report's header).
info_args=(--results "$OUT" --run-info --mpirun "$MPIRUN")
[[ $QUICK == 1 ]] && info_args+=(--quick)
[[ -n $ONLY ]] && info_args+=(--rerun "$ONLY")
"$PYTHON" "$ROOT/tools/bench/report.py" "${info_args[@]}" >"$LOGS/run_info.log" 2>&1 ||
  echo "bench: could not record the run's environment (logs/run_info.log)"
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-2}

# 1. Collectives against MPI, and the memcpy ceiling.
if wanted collectives; then
  if [[ ! -x $TNT_BENCH ]]; then
    not_run collectives "no tnt-bench at $TNT_BENCH (make install)"
  else
    max=$([[ $QUICK == 1 ]] && echo 4M || echo 64M)
    mkdir -p "$OUT/traces"
    for coll in allreduce broadcast allgather; do
      for np in 2 4; do
        name=collectives_${coll}_${np}ranks
        # tnt-bench's own JSON, kept among the traces, becomes a results file.
        # shellcheck disable=SC2086
        run_stage "$name" "$(limit 900 240)" "$OUT/traces/$name.json" \
          "$MPIRUN" $MPIFLAGS -np "$np" "$TNT_BENCH" "$coll" --min 4K --max "$max" \
          --json "$OUT/traces/$name.json"
        if [[ -s $OUT/traces/$name.json ]] && ! "$PYTHON" "$ROOT/tools/bench/bench_results.py" \
          --from-tnt-bench "$OUT/traces/$name.json" "$OUT/$name.jsonl" >>"$LOGS/$name.log" 2>&1; then
          echo "bench: could not convert $OUT/traces/$name.json (logs/$name.log)"
          failed=1
        fi
      done
    done
  fi
fi

# 2. Framework overhead on 1 rank.
if wanted overhead; then
  args=()
  [[ $QUICK == 1 ]] && args=(--samples 2048 --trials 3)
  run_stage overhead "$(limit 1200 400)" "$OUT/overhead.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/fit_bench.py" overhead "${args[@]}" --json "$OUT/overhead.jsonl"
  run_stage overhead_small_cnn "$(limit 1200 400)" "$OUT/overhead_small_cnn.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/fit_bench.py" overhead --model small_cnn "${args[@]}" \
    --json "$OUT/overhead_small_cnn.jsonl"
fi

# 3. Fusion threshold sweep on 2 ranks.
if wanted fusion; then
  if [[ $QUICK == 1 ]]; then
    models=(deep_mlp)
    args=(--samples 1024 --trials 3 --thresholds "0,32,1024,8192")
  else
    models=(deep_mlp lenet5)
    args=(--trials 5 --thresholds "0,8,32,128,512,2048,8192")
  fi
  for model in "${models[@]}"; do
    json=$OUT/fusion_sweep_$model.jsonl
    # shellcheck disable=SC2086
    run_stage "fusion_sweep_$model" "$(limit 1500 480)" "$json" \
      "$MPIRUN" $MPIFLAGS -np 2 -x TF_CPP_MIN_LOG_LEVEL "$PYTHON" \
      "$ROOT/tools/bench/fit_bench.py" sweep --model "$model" "${args[@]}" --json "$json"
  done
fi

# 4. Tarantella against other data-parallel frameworks.
if wanted training; then
  args=(--out "$OUT/training.jsonl")
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_stage training "$(limit 3600 1200)" "$OUT/training.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/train_compare.py" "${args[@]}"
fi

# 5. The simulated cluster (as root): training, the allreduce alone against
# MPI_Allreduce, Tarantella against MultiWorkerMirroredStrategy, ZeRO stages
# 1 and 2 against stage 0, and compression and the tuned threshold at 1 Gbit/s.
# sim_stage NAME FULL QUICK ARGS...: sim_cluster_bench.py ARGS, writing
# NAME.jsonl, under the time limit FULL (QUICK with --quick).
sim_stage() {
  local name=$1 full=$2 quick=$3
  shift 3
  local args=("$@" --out "$OUT/$name.jsonl")
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_stage "$name" "$(limit "$full" "$quick")" "$OUT/$name.jsonl" \
    "$PYTHON" "$ROOT/tools/research/sim_cluster_bench.py" "${args[@]}"
}
if wanted sim_cluster; then
  if [[ $(id -u) -ne 0 ]]; then
    for name in sim_cluster sim_cluster_allreduce sim_cluster_frameworks sim_cluster_zero \
        sim_cluster_compression; do
      not_run "$name" "needs root (network namespaces, tc)"
    done
  else
    sim_stage sim_cluster 3000 900
    if [[ -x $TNT_BENCH ]]; then
      sim_stage sim_cluster_allreduce 1200 400 --allreduce --tnt-bench "$TNT_BENCH"
    else
      not_run sim_cluster_allreduce "no tnt-bench at $TNT_BENCH (make install)"
    fi
    sim_stage sim_cluster_frameworks 1200 400 --frameworks
    sim_stage sim_cluster_zero 1800 600 --zero
    sim_stage sim_cluster_compression 900 300 --variants --hosts 2 --links 1gbit_0.1ms \
      --models lenet5 --steps 20 --reps 3
  fi
fi

# 6. Pipeline parallelism: three measurements, each a stage of its own.
if wanted pipeline; then
  args=(--mpirun "$MPIRUN" --mpiflags "$MPIFLAGS")
  [[ $QUICK == 1 ]] && args+=(--quick)
  for part in bubble memory capacity sim_cluster; do
    if [[ $part == sim_cluster && $(id -u) -ne 0 ]]; then
      not_run pipeline_sim_cluster "needs root (network namespaces, tc)"
      continue
    fi
    json=$OUT/pipeline_$part.jsonl
    run_stage "pipeline_$part" "$(limit 1200 420)" "$json" \
      "$PYTHON" "$ROOT/tools/bench/pipeline_bench.py" "$part" "${args[@]}" --json "$json"
  done
fi

# 7. Each rank prepares only its share of the input data.
if wanted data_share; then
  args=(--mpirun "$MPIRUN" --mpiflags "$MPIFLAGS")
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_stage data_share "$(limit 1800 420)" "$OUT/data_share.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/data_bench.py" "${args[@]}" --out "$OUT/data_share.jsonl"
fi

# 8. At scale: libtnt's allreduce and reduce-scatter on simulated fat-trees
# (SimGrid), the allreduce first checked against the measured 2-host runs of
# sim_cluster_allreduce.
if wanted scale; then
  build=${BUILD:-$ROOT/build}
  sim_so=$build/src/sim/tnt-sim.so
  if [[ ! -f $sim_so ]] || ! command -v smpirun >/dev/null; then
    not_run scale "no tnt-sim (build with libsimgrid-dev installed)"
  else
    measured=$OUT/sim_cluster_allreduce.jsonl
    [[ -f $measured ]] || measured=$ROOT/bench/results/sim_cluster_allreduce.jsonl
    if [[ -f $measured ]]; then
      run_stage scale_validation "$(limit 600 300)" "$OUT/scale_validation.jsonl" \
        "$PYTHON" "$ROOT/tools/research/scale_bench.py" --validate --build "$build" \
        --measured "$measured" --out "$OUT/scale_validation.jsonl"
    else
      not_run scale_validation "no sim_cluster_allreduce.jsonl: run the sim_cluster stage first (as root)"
    fi
    # SMPI's selectors up to what they simulate here in about half an hour
    # (their temporary buffers are real memory: 64 x 8 ranks stop at 16 or
    # 32 MiB, 256 and 1024 hosts at 16 and 4 MiB), libtnt alone up to
    # 256 MiB on every layout (docs/research/scale-study.md).
    if [[ $QUICK == 1 ]]; then
      parts=("--hosts 8 --per-host 1,8 --gbit 100 --max 16M")
    else
      parts=("--hosts 8 --per-host 1 --gbit 10,100,400 --max 256M"
             "--hosts 8 --per-host 8 --gbit 10,100,400 --max 64M"
             "--hosts 64 --per-host 1 --gbit 10,100,400 --max 64M"
             "--hosts 64 --per-host 8 --gbit 100 --max 64M"
             "--hosts 256 --per-host 1 --gbit 100 --max 16M"
             "--hosts 1024 --per-host 1 --gbit 100 --max 4M"
             "--impls tnt --hosts 8,64 --per-host 8 --gbit 100 --max 256M"
             "--impls tnt --hosts 8 --per-host 8 --gbit 10,400 --max 256M"
             "--impls tnt --hosts 64 --per-host 1 --gbit 10,100,400 --max 256M"
             "--impls tnt --hosts 256,1024 --per-host 1 --gbit 100 --max 256M")
    fi
    rm -f "$OUT/scale.jsonl"
    for i in "${!parts[@]}"; do
      part=${parts[$i]}
      # shellcheck disable=SC2086  # part is a list of options
      run_stage "scale_$((i + 1))" "$(limit 7200 900)" "$OUT/scale.jsonl" \
        "$PYTHON" "$ROOT/tools/research/scale_bench.py" --scale --build "$build" $part \
        --run-timeout 1800 --append --out "$OUT/scale.jsonl"
    done
    # The reduce-scatter against MPI_Reduce_scatter_block, one rank a host:
    # SMPI's selectors as far as their temporary buffers fit in memory
    # (1.5 to 2 x the vector per rank), libtnt to 256 MiB.
    if [[ $QUICK == 1 ]]; then
      parts=("--hosts 8 --max 16M")
    else
      parts=("--hosts 8 --max 256M"
             "--hosts 64 --max 64M"
             "--hosts 256 --max 16M"
             "--impls mpi_ompi,mpi_mpich --hosts 1024 --max 4M"
             "--impls tnt --hosts 64,256,1024 --max 256M")
    fi
    rm -f "$OUT/scale_reduce_scatter.jsonl"
    for i in "${!parts[@]}"; do
      # shellcheck disable=SC2086  # parts[i] is a list of options
      run_stage "scale_reduce_scatter_$((i + 1))" "$(limit 3600 600)" \
        "$OUT/scale_reduce_scatter.jsonl" "$PYTHON" "$ROOT/tools/research/scale_bench.py" \
        --scale --collective reduce_scatter --per-host 1 --gbit 100 --build "$build" \
        ${parts[$i]} --run-timeout 1800 --append --out "$OUT/scale_reduce_scatter.jsonl"
    done
    # Each algorithm forced: where recursive doubling, Rabenseifner's and the
    # ring cross (docs/research/scale-study.md).
    if [[ $QUICK == 1 ]]; then
      parts=("--hosts 8 --gbit 100 --algos rd,rabenseifner --min 8K --max 128K")
    else
      parts=("--hosts 8,64 --gbit 10,100,400 --algos rd,rabenseifner --min 8K --max 128K"
             "--hosts 256,1024 --gbit 100 --algos rd,rabenseifner --min 8K --max 128K"
             "--hosts 8 --gbit 10,100,400 --algos rd,rabenseifner,ring --min 8K --max 64M")
    fi
    rm -f "$OUT/scale_forced.jsonl"
    for i in "${!parts[@]}"; do
      # shellcheck disable=SC2086  # parts[i] is a list of options
      run_stage "scale_forced_$((i + 1))" "$(limit 3600 600)" "$OUT/scale_forced.jsonl" \
        "$PYTHON" "$ROOT/tools/research/scale_bench.py" --scale --impls tnt --per-host 1 \
        --build "$build" ${parts[$i]} --run-timeout 1800 --append --out "$OUT/scale_forced.jsonl"
    done
    run_stage scale_check "$(limit 3600 900)" "$OUT/scale_check.jsonl" \
      "$PYTHON" "$ROOT/tools/research/scale_bench.py" --check --build "$build" \
      $([[ $QUICK == 1 ]] && echo "--layouts 64x1,100x1") --run-timeout 1800 \
      --out "$OUT/scale_check.jsonl"
    # Training projected from measured timelines and those allreduces.
    steps=$OUT/sim_cluster.jsonl
    [[ -f $steps ]] || steps=$ROOT/bench/results/sim_cluster.jsonl
    run_stage scale_timelines "$(limit 1200 600)" "$OUT/scale_timelines.jsonl" \
      "$PYTHON" "$ROOT/tools/research/project_scale.py" --measure --out "$OUT/scale_timelines.jsonl"
    run_stage scale_projection 60 "$OUT/scale_projection.jsonl" \
      "$PYTHON" "$ROOT/tools/research/project_scale.py" --project \
      --timelines "$OUT/scale_timelines.jsonl" --scale "$OUT/scale.jsonl" \
      --measured-steps "$steps" --measured-allreduce "$measured" --out "$OUT/scale_projection.jsonl"
    # Plain and sharded data parallelism of ResNet-50 and a 1.3 B GPT at a
    # device's step time (tools/research/project_zero.py): libtnt's three
    # collectives on 8 to 1024 hosts at 100 and 400 Gbit/s, up to 16 MiB.
    zhosts=8,64,256,512,1024
    [[ $QUICK == 1 ]] && zhosts=8,64
    for c in allreduce reduce_scatter allgather; do
      run_stage "scale_zero_$c" "$(limit 3600 600)" "$OUT/scale_zero_$c.jsonl" \
        "$PYTHON" "$ROOT/tools/research/scale_bench.py" --scale --impls tnt --collective "$c" \
        --hosts "$zhosts" --per-host 1 --gbit 100,400 --max 16M --build "$build" \
        --run-timeout 1800 --out "$OUT/scale_zero_$c.jsonl"
    done
    run_stage scale_zero_timelines "$(limit 1800 900)" "$OUT/scale_zero_timelines.jsonl" \
      "$PYTHON" "$ROOT/tools/research/project_zero.py" --measure \
      --out "$OUT/scale_zero_timelines.jsonl"
    run_stage scale_zero_projection 60 "$OUT/scale_zero_projection.jsonl" \
      "$PYTHON" "$ROOT/tools/research/project_zero.py" --project --results "$OUT" \
      --out "$OUT/scale_zero_projection.jsonl"
  fi
fi

# 9. Reliability: what backups cost, and how long a restart takes.
if wanted reliability; then
  if [[ -z $LAUNCHER ]]; then
    not_run reliability "no tarantella launcher (make install)"
  else
    args=(--rounds 4 --steps 200)
    [[ $QUICK == 1 ]] && args=(--rounds 2 --steps 100)
    run_stage reliability_backup "$(limit 900 400)" "$OUT/reliability_backup.jsonl" \
      "$LAUNCHER" --no-gpu -n 2 -- "$PYTHON" "$ROOT/tools/bench/backup_cost.py" \
      --save-freq 50 "${args[@]}" --json "$OUT/reliability_backup.jsonl"
    run_stage reliability_restart "$(limit 900 400)" "$OUT/reliability_restart.jsonl" \
      env PATH="$(dirname "$LAUNCHER"):$PATH" "$PYTHON" "$ROOT/tools/bench/restart_time.py" \
      --ranks 2 --trials "$((QUICK ? 1 : 3))" --json "$OUT/reliability_restart.jsonl"
  fi
fi

# 10. What gradient compression does to accuracy.
if wanted compression; then
  if [[ -z $LAUNCHER ]]; then
    not_run compression_accuracy "no tarantella launcher (make install)"
  else
    args=(--epochs 2 --samples 30000)
    [[ $QUICK == 1 ]] && args=(--epochs 1 --samples 6000)
    run_stage compression_accuracy "$(limit 2400 900)" "$OUT/compression_accuracy.jsonl" \
      env PATH="$(dirname "$LAUNCHER"):$PATH" "$PYTHON" "$ROOT/tools/bench/compression_accuracy.py" \
      "${args[@]}" --out "$OUT/compression_accuracy.jsonl"
  fi
fi

# 11. Sharded data parallelism: what a rank holds at ZeRO stages 0, 1 and 2,
# what stage 2 lets train under a memory limit, and the stages' throughput
# against stage 0's on 2 ranks.
if wanted zero; then
  args=(--mpirun "$MPIRUN" --mpiflags "$MPIFLAGS")
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_stage zero_memory "$(limit 1800 900)" "$OUT/zero.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/zero_bench.py" memory "${args[@]}" --json "$OUT/zero.jsonl"
  run_stage zero_capacity "$(limit 1800 400)" "$OUT/zero_capacity.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/zero_bench.py" capacity "${args[@]}" \
    --json "$OUT/zero_capacity.jsonl"
  args=(--ranks 2 --models lenet5,transformer,dense --out "$OUT/zero_throughput.jsonl"
        --frameworks tarantella,tarantella-zero1,tarantella-zero2,tarantella-zero3)
  [[ $QUICK == 1 ]] && args+=(--quick)
  run_stage zero_throughput "$(limit 1800 600)" "$OUT/zero_throughput.jsonl" \
    "$PYTHON" "$ROOT/tools/bench/train_compare.py" "${args[@]}"
fi

# The report: summary.md and the plots, from whatever the stages left.
report_args=(--results "$OUT")
[[ $QUICK == 1 ]] && report_args+=(--quick)
printf 'bench: %-28s ' report
if timeout 300 "$PYTHON" "$ROOT/tools/bench/report.py" "${report_args[@]}" >"$LOGS/report.log" 2>&1; then
  echo "ok        -> $OUT/summary.md"
else
  echo "failed    (logs/report.log)"
  tail -n 15 "$LOGS/report.log" | sed 's/^/    /'
  failed=1
fi
if ((failed)); then
  echo "bench: some stages failed; see $OUT/summary.md and $LOGS"
fi
exit "$failed"
