#!/usr/bin/env bash
# The GPU check: one command, one GPU (two for the torchrun part), about 10 minutes. Is this machine
# ready for the paper's runs? Prints one table; the raw numbers go to $OUT (default gpu_check/).
#
#   bash scripts/gpu_check.sh               # all seven modes at the 120m shape, then rd_343m's memory
#   MODES=standard,attnres,rd_attnres bash scripts/gpu_check.sh   # fewer modes, fewer compilations
#
# 1. every mode, torch.compile + bf16, at the 120m shape (12 x 768, context 1024, micro-batch 16):
#    step time, tokens/s, MFU, peak memory, compile time (the first step); attnres and rd_attnres also with
#    their reads computed in two phases (+two_phase: compiled one region per AttnRes block), each x standard
# 2. peak memory of one rd_343m micro-batch of 16 (24 x 1024, compiled, bf16): does batch_size=16 fit?
# 3. with 2 or more GPUs: torchrun with 2 processes, 20 steps on the tiny corpus (NCCL, DDP, compile), with
#    the plain read and with the two-phase read (its per-block region under DDP; recompiles counted)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_check}"
MODES="${MODES:-standard,attnres,rd_attnres,attnres+two_phase,rd_attnres+two_phase,ctrl_params,ctrl_dup,ctrl_fixed_v,ctrl_heads}"
mkdir -p "$OUT"
rm -f "$OUT"/bench_*.jsonl "$OUT"/traffic.jsonl
# compiled graphs are cached here: a second run of this script (or of train.py with the same variable)
# reuses them
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$PWD/$OUT/inductor_cache}"
NGPU=$(python -c "import torch; print(torch.cuda.device_count())")
if [ "$NGPU" -lt 1 ]; then echo "no CUDA GPU visible: this check needs one" >&2; exit 1; fi
python -c "import torch; print('GPU:', torch.cuda.get_device_name(0), '| torch', torch.__version__, '| bf16:', torch.cuda.is_bf16_supported(including_emulation=False))"

SHAPE_120M="--n_layer=12 --n_head=12 --n_embd=768 --block_size=1024 --attnres_block_size=4"
SHAPE_343M="--n_layer=24 --n_head=16 --n_embd=1024 --block_size=1024 --attnres_block_size=6"
COMMON="--device=cuda --dtype=bfloat16 --compile=True --batch_size=16 --warmup=2 --steps=3"

echo "== 1. every mode at the 120m shape (compiled, bf16, micro-batch 16)"
python bench.py $SHAPE_120M $COMMON --modes="$MODES" --rounds=3 --json="$OUT/bench_120m.jsonl" | tee "$OUT/bench_120m.txt"
python bench.py --traffic=True --json="$OUT/traffic.jsonl" > "$OUT/traffic.txt"
echo "== 2. one rd_343m micro-batch of 16"
python bench.py $SHAPE_343M $COMMON --modes=rd_attnres --rounds=1 --json="$OUT/bench_343m.jsonl" | tee "$OUT/bench_343m.txt"

DDP="skipped (1 GPU)"
if [ "$NGPU" -ge 2 ]; then
  echo "== 3. torchrun, 2 processes, 20 steps on the tiny corpus"
  python prepare.py --dataset tiny --data_dir "$OUT/data" > /dev/null
  DDP=""
  for read in plain two_phase; do   # two_phase: compiled one region per AttnRes block, under DDP
    if TORCH_LOGS=recompiles torchrun --standalone --nproc_per_node=2 train.py config/quickstart.py \
         --data_dir="$OUT/data" --out_dir="$OUT/ddp_$read" --overwrite=True --device=cuda --dtype=auto \
         --compile=True --depth_read=$read --batch_size=8 --max_iters=20 --eval_interval=20 --log_interval=5 \
         > "$OUT/ddp_$read.txt" 2>&1; then
      DDP="$DDP $read ok: $(grep 'step 20:' "$OUT/ddp_$read.txt" | tail -1), $(grep -c 'Recompiling' "$OUT/ddp_$read.txt" || true) recompiles;"
    else
      DDP="$DDP $read FAILED (see $OUT/ddp_$read.txt);"
    fi
  done
fi

python - "$OUT" "$DDP" <<'PY'
import json, sys
out, ddp = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for f in ('bench_120m.jsonl', 'bench_343m.jsonl') for l in open(f"{out}/{f}")]
print("\n| shape | mode | step ms | tok/s | MFU | × standard | × attnres | peak memory GB | compile s (first step) |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
for r in rows:
    c = r['config']
    f = lambda v, fmt: '-' if v is None else format(v, fmt)
    print(f"| {c['n_layer']}x{c['n_embd']}, batch {c['batch_size']}x{c['block_size']} | {r['mode']} | {r['step_ms']:.1f} "
          f"| {r['tok_per_s']:,.0f} | {f(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | {f(r['time_vs_standard'], '.3f')} "
          f"| {f(r['time_vs_attnres'], '.3f')} | {f(r['peak_mem_mb'] and r['peak_mem_mb'] / 1024, '.1f')} "
          f"| {f(r['first_step_s'], '.0f')} |")
print(f"\ntorchrun, 2 processes: {ddp}")
# the measured overhead of depth routing at the 120m shape, beside the traffic model's estimate
measured = {r['mode']: r['time_vs_standard'] for r in rows if r['config']['n_layer'] == 12}
estimate = {r['mode'] + ('' if r['read'] == 'plain' else '+two_phase'): r['predicted_overhead']
            for l in open(f"{out}/traffic.jsonl") for r in [json.loads(l)] if r['shape'] == '120m'}
print("\n| 120m, compiled bf16 | measured step time x standard | estimated (bench.py --traffic, from bandwidth) |")
print("|---|---:|---:|")
for mode in ('attnres', 'rd_attnres', 'attnres+two_phase', 'rd_attnres+two_phase'):
    if mode in measured:
        print(f"| {mode} | {measured[mode]:.3f} | {1 + estimate[mode]:.3f} |")
PY
