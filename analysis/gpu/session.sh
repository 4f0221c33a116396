#!/usr/bin/env bash
# One GPU session's calls (analysis/gpu/README.md): run from the repository root on the device machine.
#
#   bash analysis/gpu/session.sh paper-once [FLAGS]  # THE command (issue 28): setup, bench, train, Figure 1, analyze,
#                                               # pack by a deadline, one archive per phase (paper_once.py)
#   bash analysis/gpu/session.sh check         # env facts, bench train --preset paper, -m gpu, default suite
#   STEPS=N bash analysis/gpu/session.sh paper  # the paper-gpu sweep (RoPE + absolute), report, trials.csv
#   NEW=1 bash analysis/gpu/session.sh chain    # one long run chained over calls (issue 19): the first call;
#   NEW=0 bash analysis/gpu/session.sh chain    # each later call, back to back while the machine is warm: trains
#                                               # on until the deadline, then Figure 1 and the layerwise analysis
#
# Every step's output goes to $OUT (at most 8 files come back: see README.md), each step under its own
# timeout so a slow one cannot take the rest of the call with it. DRY=1 runs the same steps here, on the CPU
# at the tiny scale with the worktree's .venv (to check this script; it measures nothing about a GPU).
set -uo pipefail
T0=$(date +%s.%N)  # the command's start: paper-once's deadline counts from here
OUT=${OUT:?set OUT to the folder whose files come back}
PY=${PY:-python3}
DRY=${DRY:-0}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ "$DRY" = 1 ]; then PY=$PWD/.venv/bin/python; export PATH="$PWD/.venv/bin:$PATH" HMMSCOPE_THREADS=${HMMSCOPE_THREADS:-1}; fi

setup() {  # a venv of our own that sees the image's packages (a .pth), the carried wheels, and hmmscope (editable)
  local t0=$SECONDS v=/tmp/venv purelib
  if [ "$DRY" = 1 ]; then mkdir -p mlruns; return 0; fi
  if [ -x "$v/bin/hmmscope" ] && "$v/bin/hmmscope" --version >/dev/null 2>&1; then  # a warm machine: done before
    PY=$v/bin/python; export PATH="$v/bin:$PATH"; mkdir -p mlruns
    echo "setup: reused $v ($((SECONDS - t0)) s)"; return 0
  fi
  "$PY" -m venv "$v" || return 1  # the image's python is itself a venv: --system-site-packages would miss its torch
  purelib=$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' >"$purelib/image-site.pth"
  PY=$v/bin/python
  export PATH="$v/bin:$PATH"
  if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl || return 1
  fi
  if ! "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>"$OUT/pip-editable.txt"; then
    echo "setup: the editable install failed (pip-editable.txt); installing .whl/self/, built from this checkout"
    "$PY" -m pip install -q --no-index --no-deps --no-compile .whl/self/hmmscope-*.whl || return 1
  fi
  "$PY" -c "import torch, mlflow, optuna, hmmlearn, sklearn, statsmodels, typer, numba, hmmscope.cli" || return 1
  "$PY" -m pip check 2>&1 | head -n 20 >"$OUT/pip-check.txt"
  hmmscope --version || return 1
  mkdir -p mlruns
  echo "setup: $((SECONDS - t0)) s"
}

env_facts() {
  {
    date -u +"date: %Y-%m-%dT%H:%M:%SZ"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
    "$PY" - <<'EOF'
import platform, torch
print(f"python: {platform.python_version()}  torch: {torch.__version__}  cuda: {torch.version.cuda}  "
      f"cudnn: {torch.backends.cudnn.version()}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"device: {p.name}, {p.total_memory / 2**30:.1f} GiB, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs")
else:
    print("device: CUDA not available")
EOF
    echo "cpus: $(nproc)  mem: $(free -g | awk '/Mem:/ {print $2}') GiB"
  } 2>&1
}

check() {  # budget: the call's 600 s less the start; each step gets what is left of CHECK_S (default 560 s)
  local dev=cuda gpu_env=(HMMSCOPE_REQUIRE_GPU=1) xdist=(-n 8 --dist loadfile) end=$((SECONDS + ${CHECK_S:-560}))
  if [ "$DRY" = 1 ]; then dev=cpu gpu_env=() xdist=(); fi
  env_facts | tee "$OUT/env.txt"
  # 1. speed first, alone on the machine: tokens/s, FLOPs/token and MFU at the paper's shape (357 tokens)
  local preset=paper
  [ "$DRY" = 1 ] && preset=tiny
  timeout 150 hmmscope bench train --preset "$preset" --device "$dev" --seq-len 357 --steps 10 --no-peer \
    >"$OUT/bench-train.log" 2>&1
  echo "bench train: rc=$? $(tail -n 2 "$OUT/bench-train.log" | tr '\n' ' ')"
  # 2. the mixture oracle on the GPU (issue 9: the paper's evaluation set, 1024 episodes x 8192 tasks, < 5 s):
  #    the automatic chunk first, then the cost against n_tasks and chunk size
  local n_ep=1024 counts=512,2048,8192
  [ "$DRY" = 1 ] && n_ep=4 counts=64
  { timeout 60 hmmscope bench oracle --device "$dev" --n-tasks "${counts##*,}" --n-episodes "$n_ep" --chunk-tasks auto
    echo "rc=$?"
    timeout 70 hmmscope bench oracle --device "$dev" --n-tasks "$counts" --n-episodes "$n_ep" --chunk-tasks auto,256,1024
    echo "rc=$?"; } >"$OUT/bench-oracle.log" 2>&1
  echo "bench oracle: $(grep -c 'n_tasks' "$OUT/bench-oracle.log") rows; $(grep -m1 'n_tasks' "$OUT/bench-oracle.log")"
  # 3. the gpu group and the default suite side by side (GPU + a few cores; the suite on 8 more), in what is left
  local left=$((end - SECONDS))
  (env "${gpu_env[@]}" timeout "$left" "$PY" -m pytest -m gpu -rs -q --durations=15 >"$OUT/pytest-gpu.log" 2>&1
   echo "pytest -m gpu: rc=$? $(tail -n 1 "$OUT/pytest-gpu.log")") &
  local suite=(-q -rs --durations=15)
  [ "$DRY" = 1 ] && suite=(-q --co)  # here the default suite runs on its own (README.md); DRY only collects it
  timeout "$left" "$PY" -m pytest "${suite[@]}" "${xdist[@]}" >"$OUT/pytest-default.log" 2>&1
  echo "pytest (default): rc=$? $(tail -n 1 "$OUT/pytest-default.log")"
  wait
}

default_probe_jobs() {  # the probes' fit processes: the usable cores, the most `hmmscope analyze` takes (issue 37:
  nproc                 # cores + 1 made the analyze phase fail at once on the 16-core device)
}

pack() {  # the record so far into $OUT (called after each phase, so a call cut short still brings it back)
  local rec=$1 name=$2
  hmmscope sweep status "$name" >"$rec/status.txt" 2>&1
  timeout 40 hmmscope report "$name" --out "$rec/report" >"$rec/report.log" 2>&1
  echo "report: rc=$?"
  "$PY" analysis/gpu/trials_csv.py "$name" "$rec"
  tar czf "$OUT/$name.tar.gz" -C /tmp "$name"
  tar czf "$OUT/store.tar.gz" -C "$PWD/mlruns" mlflow.db optuna.db
  cp "$rec/sweep.log" "$rec/env.txt" "$rec/report/report.md" "$OUT/" 2>/dev/null
}

paper() {  # phases: setup, sweep (SWEEP_S), pack, analysis (until DEADLINE s after the call began), pack
  # NAME (study, default paper-gpu), ENCODINGS (default "rope absolute": one worker each, sharing the GPU)
  local steps=${STEPS:?set STEPS: README.md, from the bench tokens per second} name=${NAME:-paper-gpu}
  local encs=(${ENCODINGS:-rope absolute}) spec rec t0=$SECONDS n_an=${ANALYZE_EPISODES:-128} dev=cuda ids id grid
  spec=mlruns/$name.toml rec=/tmp/$name
  [ "$DRY" = 1 ] && dev=cpu
  rm -rf "$rec" && mkdir -p "$rec"
  env_facts >"$rec/env.txt"
  grid=$(printf '"%s", ' "${encs[@]}")
  sed -e "s/^\"train.steps\" = .*/\"train.steps\" = $steps/" \
      -e "s/^\"train.eval_every\" = .*/\"train.eval_every\" = $(( steps / 8 > 0 ? steps / 8 : 1 ))/" \
      -e "s/^\"train.ckpt_every\" = .*/\"train.ckpt_every\" = $steps/" \
      -e "s/^\"train.compile\" = .*/\"train.compile\" = ${COMPILE:-false}/" \
      -e "s/^name = .*/name = \"$name\"/" -e "s/^experiment = .*/experiment = \"hmmscope-$name\"/" \
      -e "s/^\"model.pos_enc\" = .*/\"model.pos_enc\" = {grid = [${grid%, }]}/" analysis/gpu/paper-gpu.toml >"$spec"
  if [ "$DRY" = 1 ]; then  # the same sweep on the CPU at the tiny scale, small enough to finish in minutes
    sed -i -e 's/^base = "paper"/base = "tiny"/' -e 's/^"train.device" = .*/"train.device" = "cpu"/' \
        -e 's/^"data.n_eval" = .*/"data.n_eval" = 64/' "$spec"
    printf '"model.n_layers" = 2\n"model.d_model" = 32\n"model.d_mlp" = 64\n"data.n_train" = 256\n"train.warmup" = 2\n' \
      | sed -i '/^\[fixed\]/r /dev/stdin' "$spec"
  fi
  cp "$spec" "$rec/"
  # 1. training + Figure 1 evaluation of the encodings at once on the one GPU (one worker each)
  timeout "${SWEEP_S:-290}" hmmscope sweep run "$spec" --workers "${#encs[@]}" >"$rec/sweep.log" 2>&1
  echo "sweep: rc=$? at $((SECONDS - t0)) s; $(tail -n 2 "$rec/sweep.log" | tr '\n' ' ')"
  pack "$rec" "$name"
  # 2. the layerwise analysis of each trained run, all at once (each lbfgs fit is single-threaded, the layers are
  #    fitted in --probe-jobs processes: README.md),
  #    until DEADLINE seconds after the call began, leaving 45 s for the last pack
  ids=$("$PY" -c "from hmmscope.sweep import default_storage, study_status
print(' '.join(r['mlflow_run_id'] for r in study_status('$name', default_storage())
               if r['state'] == 'COMPLETE' and r['mlflow_run_id']))")
  local an_s=$(( ${DEADLINE:-555} - SECONDS - 45 ))
  [ -n "${ANALYZE_S:-}" ] && an_s=$ANALYZE_S
  local n_ids; n_ids=$(echo $ids | wc -w)
  # the probes' layer fits in worker processes: the CPUs shared among the runs analyzed at once
  local pj=${PROBE_JOBS:-$(( $(default_probe_jobs) / (n_ids > 0 ? n_ids : 1) ))}
  [ "$pj" = auto ] || [ "$pj" -ge 1 ] 2>/dev/null || pj=1
  echo "analysis: $an_s s for [$ids], --probe-jobs $pj each"
  for id in $ids; do
    timeout "$an_s" hmmscope analyze "$id" --n-episodes "$n_an" --ks "${ANALYZE_KS:-1,2,3}" --device "$dev" \
      --probe-tasks "${PROBE_TASKS:-32}" --min-per-task "${MIN_PER_TASK:-30}" --probe-jobs "$pj" \
      --experiment "hmmscope-$name" >"$rec/analyze-$id.log" 2>&1 &
  done
  wait
  echo "analysis of [$ids]: done at $((SECONDS - t0)) s; $(grep -h -o 'claims (analysis run[^)]*)' "$rec"/analyze-*.log | tr '\n' ' ')"
  for f in "$rec"/analyze-*.log; do [ -f "$f" ] && echo "  ${f##*/}: last phase: $(grep '^analyze: ' "$f" | tail -n 1)"; done
  # 3. the record again, now with the analysis
  pack "$rec" "$name"
  echo "total: $((SECONDS - t0)) s" | tee -a "$rec/sweep.log"
  ls -la "$OUT"
}

chain_pack() {  # the chain's record so far into $OUT: every phase calls it as it ends (a later cut-off loses nothing)
  local rec=$1 name=$2 run=$3
  [ -n "$run" ] && "$PY" analysis/gpu/chain.py record "$run" "$rec" >"$rec/record.log" 2>&1
  cp mlruns/chain-"$name".* "$rec/" 2>/dev/null
  tar czf "$OUT/$name.tar.gz" -C "$(dirname "$rec")" "$(basename "$rec")"
  [ -f mlruns/mlflow.db ] && tar czf "$OUT/store.tar.gz" -C mlruns mlflow.db  # the database alone: no checkpoints
  cp "$rec/curves.csv" "$rec/run.json" "$rec/env.txt" "$OUT/" 2>/dev/null
  echo "pack: $(du -sh "$OUT/$name.tar.gz" | cut -f1) at $((SECONDS - CHAIN_T0)) s"
}

chain() {  # one call of a long run chained over calls (README.md, "The chained long run"); knobs in the environment
  # NEW=1 (the first call: starts the run) | 0 (a later call: continues the run found in mlruns/, fails if none);
  # NAME (paper-long), STEPS (12288), DEADLINE (s after the call began when all is packed: 570), PACK_S (25),
  # SCHEDULE (cosine, if the config has train.schedule), EVAL_EVERY (STEPS/24), COMPILE (false),
  # EVAL_EPISODES (512), FIG1_S (120: Figure 1 starts only with this much left), ANALYZE_EPISODES (256),
  # ANALYZE_KS (1,2,3), PROBE_TASKS (32), MIN_PER_TASK (15), PROBE_JOBS (nproc: the usable cores, the most analyze
  # takes), ANALYZE_MIN_S (150). The probe set 32 x 15 = 480 episodes: predicted 67 s of probes on the device,
  # against 132 s at the default 32 x 30 (probe-cost-predict.txt).
  CHAIN_T0=$SECONDS
  local name=${NAME:-paper-long} new=${NEW:?set NEW=1 for the first call of a chain, NEW=0 for the next ones}
  local steps=${STEPS:-12288} dl=${DEADLINE:-570} pack_s=${PACK_S:-25} dev=cuda preset=paper rec exp st left
  local run="" done=0 target=0 state=none args_file rc
  [ "$DRY" = 1 ] && dev=cpu preset=tiny steps=${STEPS:-240}
  exp=hmmscope-$name rec=/tmp/$name-rec args_file=mlruns/chain-$name.args
  rm -rf "$rec" && mkdir -p "$rec"
  env_facts >"$rec/env.txt"
  st=$("$PY" analysis/gpu/chain.py state "$exp" 2>"$rec/state.log") || { echo "chain: state failed: $(tail -n 1 "$rec/state.log")"; return 1; }
  read -r run done target state <<<"$st"
  [ "$run" = none ] && run="" state=none
  echo "chain $name: found [${run:-no run}] ${done}/${target} ${state} at $((SECONDS - CHAIN_T0)) s"
  if [ "$new" = 1 ] && [ -n "$run" ]; then
    echo "chain: NEW=1 but run $run of $exp is here ($done/$target steps, $state): NEW=0 continues it"; return 2
  fi
  if [ "$new" != 1 ] && [ -z "$run" ]; then
    echo "chain: NEW=0 but no run of $exp in mlruns/: this is a fresh machine (the last one went cold, or this is"
    echo "  the first call), and the checkpoint went with it. The record packed by the earlier calls is what is left;"
    echo "  NEW=1 starts the run over (plan STEPS for the time that remains: README.md)."
    chain_pack "$rec" "$name" ""; return 3
  fi
  if [ -z "$run" ]; then  # the run's options, fixed once: every later call resumes with exactly these
    local sets=(--set "train.steps=$steps" --set "train.eval_every=${EVAL_EVERY:-$(( steps / 24 > 0 ? steps / 24 : 1 ))}"
                --set "train.ckpt_every=$steps" --set "train.compile=${COMPILE:-false}")
    if "$PY" -c "import sys; from hmmscope.config import TrainConfig; sys.exit('schedule' not in TrainConfig.__dataclass_fields__)"; then
      sets+=(--set "train.schedule=${SCHEDULE:-cosine}")
    fi
    [ "$DRY" = 1 ] && sets+=(--set model.n_layers=2 --set model.d_model=32 --set model.d_mlp=64 --set model.max_len=64
                             --set data.n_train=256 --set data.n_eval=64 --set data.n_demos=2 --set data.l_demo=8
                             --set data.l_test=8 --set train.batch_size=8 --set train.warmup=2)
    printf '%s\n' --preset "$preset" "${sets[@]}" --device "$dev" --run-name "$name" --experiment "$exp" >"$args_file"
  fi
  local targs=(); mapfile -t targs <"$args_file"
  # 1. training until the deadline (what is left of DEADLINE, less the pack), or to train.steps
  if [ "$state" != done ]; then
    left=$(( dl - (SECONDS - CHAIN_T0) - pack_s ))
    if [ "$left" -lt "${TRAIN_MIN_S:-20}" ]; then echo "train: only $left s left: the next call (NEW=0)"; return 0; fi
    local resume=(); [ -n "$run" ] && resume=(--resume "$run")
    echo "train: ${resume[*]:-new run}, deadline ${left} s"
    timeout $(( left + 15 )) hmmscope train "${targs[@]}" "${resume[@]}" --no-evaluate --deadline "$left" \
      >>"$rec/train.log" 2>&1
    rc=$?
    echo "train: rc=$rc at $((SECONDS - CHAIN_T0)) s; $(grep -E '^run |stopped by|error' "$rec/train.log" | tail -n 2 | tr '\n' ' ')"
    read -r run done target state <<<"$("$PY" analysis/gpu/chain.py state "$exp")"
    echo "chain $name: run $run ${done}/${target} ${state}"
    chain_pack "$rec" "$name" "$run"
  fi
  # 2. Figure 1 (seen / unseen tasks, oracles, counting baselines) on the last checkpoint, once the run is done
  local figs=$rec/figures
  if [ "$state" = done ] && [ ! -f "mlruns/chain-$name.fig1" ]; then
    left=$(( dl - (SECONDS - CHAIN_T0) - pack_s ))
    if [ "$left" -ge "${FIG1_S:-120}" ]; then
      timeout "$left" hmmscope evaluate "$run" --device "$dev" --n-episodes "${EVAL_EPISODES:-512}" --out "$figs" \
        >"$rec/evaluate.log" 2>&1 && touch "mlruns/chain-$name.fig1"
      echo "evaluate: rc=$? at $((SECONDS - CHAIN_T0)) s"
      chain_pack "$rec" "$name" "$run"
    else
      echo "evaluate: $left s left, FIG1_S=${FIG1_S:-120} needed: the next call (NEW=0) does it"
    fi
  fi
  # 3. Figures 2-3: shuffle test, task / state / k-back probes, belief probes (the fits in PROBE_JOBS processes)
  if [ "$state" = done ] && [ -f "mlruns/chain-$name.fig1" ] && [ ! -f "mlruns/chain-$name.layers" ]; then
    left=$(( dl - (SECONDS - CHAIN_T0) - pack_s ))
    if [ "$left" -ge "${ANALYZE_MIN_S:-150}" ]; then
      timeout "$left" hmmscope analyze "$run" --device "$dev" --n-episodes "${ANALYZE_EPISODES:-256}" \
        --ks "${ANALYZE_KS:-1,2,3}" --probe-tasks "${PROBE_TASKS:-32}" --min-per-task "${MIN_PER_TASK:-15}" \
        --probe-jobs "${PROBE_JOBS:-$(default_probe_jobs)}" --experiment "$exp" --out "$figs" >"$rec/analyze.log" 2>&1 \
        && touch "mlruns/chain-$name.layers"
      echo "analyze: rc=$? at $((SECONDS - CHAIN_T0)) s; last phase: $(grep '^analyze: ' "$rec/analyze.log" | tail -n 1)"
      chain_pack "$rec" "$name" "$run"
    else
      echo "analyze: $left s left, ANALYZE_MIN_S=${ANALYZE_MIN_S:-150} needed: the next call (NEW=0) does it"
    fi
  fi
  if [ -f "mlruns/chain-$name.layers" ]; then
    echo "chain: done ($done steps, Figure 1 and the layerwise analysis packed) at $((SECONDS - CHAIN_T0)) s"
  else
    echo "chain: next call: the same command with NEW=0 ($done/$target steps, $state) at $((SECONDS - CHAIN_T0)) s"
  fi
  ls -la "$OUT"
}

case "${1:-}" in
  paper-once) shift; exec "$PY" analysis/gpu/paper_once.py run --out "$OUT" --t0 "$T0" $([ "$DRY" = 1 ] && echo --dry) "$@" ;;
  setup-once) rc=0; setup || rc=$?; env_facts >"$OUT/env.txt"; exit $rc ;;  # paper_once.py's phase 1 (OUT: its folder)
  check) setup && check ;;
  paper) setup && paper ;;
  chain) setup && chain ;;
  verify) setup && "$PY" analysis/gpu/chain.py verify "$("$PY" analysis/gpu/chain.py state "hmmscope-${NAME:-paper-long}" | cut -d' ' -f1)" ;;
  setup) setup ;;
  probe-jobs) echo "${PROBE_JOBS:-$(default_probe_jobs)}" ;;  # the default the calls above use (a test reads it)
  *) echo "usage: [DRY=1] bash analysis/gpu/session.sh paper-once [FLAGS] | check | STEPS=N ... paper | NEW=1|0 ... chain | ... verify" >&2; exit 2 ;;
esac
