#!/usr/bin/env bash
# train_browsergym_trl.py --screenshots on the tiny VLM, synchronously (in-process generation,
# RolloutImagesGRPOTrainer) then asynchronously (--async: EvalRolloutWorker on a CPU vLLM server started here,
# CPUAsyncImagesGRPOTrainer, weights through disk), one after the other in one run; prints each arm's wall clock
# (the whole script: browser server, model load, training) and its closing line, and writes them to RESULT with the
# run's record (ep_trl.devtools.run_record). Figures: docs/browsergym.md.
#   bash benchmarks/vlm_async_walls.sh [STEPS] [RESULT]
#   (default 6 steps of 8 episodes, groups of 4; RESULT benchmarks/results/vlm_async_walls.json)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-6}"
RESULT="${2:-benchmarks/results/vlm_async_walls.json}"
OUT=outputs/vlm-async-walls
PORT="${VLM_PORT:-8012}"
mkdir -p "$OUT"
rm -f "$OUT/arms.jsonl"
python - "$@" > "$OUT/run_start.json" <<'PY'
import dataclasses, json, sys
from ep_trl.devtools import run_record
print(json.dumps(dataclasses.asdict(run_record.start(".", ["benchmarks/vlm_async_walls.sh", *sys.argv[1:]],
                                                     executable="bash"))))
PY
python -c "from ep_trl.devtools.tiny_vlm import build_tiny_vlm; build_tiny_vlm('$OUT/tiny-vlm')"
VLLM_CPU_KVCACHE_SPACE=1 VLLM_SERVER_DEV_MODE=1 .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server \
    --model "$OUT/tiny-vlm" --host 127.0.0.1 --port "$PORT" --enforce-eager --dtype float32 --max-model-len 2048 \
    --logprobs-mode processed_logprobs --max-logprobs -1 --enable-scale-out --limit-mm-per-prompt '{"image": 8}' \
    > "$OUT/vllm.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $SERVER 2>/dev/null || { echo "the vLLM server ended; see $OUT/vllm.log" >&2; exit 1; }
  sleep 2
done
COMMON=(--screenshots --model "$OUT/tiny-vlm" --max-steps "$STEPS" --batch-size 8 --num-generations 4)
for arm in sync async; do
  extra=()
  [[ $arm == async ]] && extra=(--async --vllm-base-url "http://127.0.0.1:$PORT")
  started=$(date +%s.%N)
  python train_browsergym_trl.py "${COMMON[@]}" "${extra[@]}" --output-dir "$OUT/$arm" > "$OUT/$arm.log" 2>&1
  ended=$(date +%s.%N)
  python - "$arm" "$started" "$ended" "$OUT/$arm.log" >> "$OUT/arms.jsonl" <<'PY'
import json, sys
arm, started, ended, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
closing = [line.strip() for line in open(log) if line.startswith("done")]
print(json.dumps({"arm": arm, "wall_s": round(ended - started, 1), "closing_line": closing[-1] if closing else None}))
PY
  echo "$arm: wall $(python -c "print(round($ended - $started, 1))") s; $(grep '^done' "$OUT/$arm.log")"
done
echo "load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
python - "$OUT" "$RESULT" "$STEPS" <<'PY'
import json, sys
from pathlib import Path
from ep_trl.devtools import run_record
out, result, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
start = run_record.RunStart(**json.loads((out / "run_start.json").read_text()))
arms = [json.loads(line) for line in (out / "arms.jsonl").read_text().splitlines()]
result.parent.mkdir(parents=True, exist_ok=True)
result.write_text(json.dumps({"run": run_record.finish(start), "steps": steps, "batch_size": 8, "num_generations": 4,
                              "arms": arms}, indent=1) + "\n")
print(f"result: {result}")
PY
