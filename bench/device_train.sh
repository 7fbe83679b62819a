# One device call of a training run (bench/RESULTS.md §5a): bash bench/device_train.sh "JOB [JOB ...]" DEADLINE [--resume]
# (JOB = PRESET:SEED; the data in .gpu/data, carried; run the --resume call within 30 s of the first, on the warm machine)
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
T0=$(date +%s); date -u
mkdir -p runs/r35
ls -la runs/r35 2>/dev/null | head
python3 -m convnn.zoo --jobs $1 --jobs-per-gpu ${JPG:-1} --out runs/r35 --deadline $2 -- --data-root .gpu/data --lite --save-dtype int8 $3 > $OUT/zoo.log 2>&1; echo "zoo rc=$?"
tail -5 $OUT/zoo.log
for f in runs/r35/*.out runs/r35/*.log.jsonl runs/r35/*.json runs/r35/*.safetensors; do [ -f "$f" ] && cp "$f" $OUT/; done
for f in runs/r35/*.log.jsonl; do echo "== $f"; python3 - "$f" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows[-3:]:
    print({k: r[k] for k in r if k in ("epoch", "test_top1", "train_loss", "epoch_time_s")})
print("epochs", len(rows))
PY
done
ls -la runs/r35
echo "all by $(( $(date +%s) - T0 )) s"; date -u
