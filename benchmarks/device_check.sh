#!/usr/bin/env bash
# The accelerator check, at most 8 minutes on one GPU (issue "Speed where the work is", item 5):
#   1. the FMNIST CNN round (200 clients; 200 and 20 a round) with each automatic choice forced
#      on and off: --fast-paths, --low-rank, --conv, the block size (benchmarks/device_check.py);
#   2. a PyTorch per-client loop of the CNN peer round (20 clients x 12 steps of B = 10) on the
#      same GPU, beside mcfl's round of the same workload;
#   3. the FashionMNIST-CNN table's FedAvg and FlexCFL cells (experiments/flexcfl_table3_fmnist
#      .toml) for 30 rounds;
#   4. the MLP rounds (10,000 clients, 1,000 a round; 1,000 clients, all a round) with the same
#      choices and three block sizes;
#   5. FeSEM's small rounds (100,000 MCLR clients, 100 a round): --scan-rounds auto (the default),
#      on and off.
# Run from the repository root (mcfl need not be installed: PYTHONPATH=.):
#   bash benchmarks/device_check.sh OUT_DIR [FASHION_MNIST_DIR]
# Every part has its own time limit inside the whole budget (DEVICE_CHECK_SECONDS, 480), writes
# its records under OUT_DIR as it goes, and a part that fails or runs out of time leaves the
# others running. OUT_DIR/device_check.log has every line printed.
set -u
out=${1:?usage: device_check.sh OUT_DIR [FASHION_MNIST_DIR]}
fmnist=${2:-/usr/share/datasets/fashion-mnist}
python=${PYTHON:-python3}
budget=${DEVICE_CHECK_SECONDS:-480}
mkdir -p "$out" || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log="$out/device_check.log"
started=$(date +%s)

# part LIMIT NAME COMMAND...: COMMAND with at most LIMIT seconds, never past the budget.
part() {
  local limit=$1 name=$2; shift 2
  local left=$(( budget - ($(date +%s) - started) ))
  (( left < limit )) && limit=$left
  if (( limit < 10 )); then echo "== $name: skipped, ${left}s of the budget left" | tee -a "$log"; return; fi
  echo "== $name (limit ${limit}s) $(date -u +%T)" | tee -a "$log"
  local t0=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== $name: exit ${PIPESTATUS[0]} after $(( $(date +%s) - t0 ))s" | tee -a "$log"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1
  lscpu 2>/dev/null | grep -E '^(Model name|CPU\(s\))'
  "$python" -c 'import jax, flax, optax, torch; print("jax", jax.__version__, jax.devices(), "flax", flax.__version__, "optax", optax.__version__, "torch", torch.__version__)' 2>&1
  git log -1 --format='mcfl commit %H (%cs)' 2>/dev/null
} | tee "$out/machine.txt" | tee -a "$log"

part 130 cnn "$python" benchmarks/device_check.py cnn --out "$out"
part 40 torch-cnn-loop "$python" benchmarks/peers/torch_cnn_round.py --device cuda --clients 20 \
  --rounds 5 --json "$out/torch_cnn_loop.json"
part 40 mcfl-cnn-round "$python" benchmarks/peers/mcfl_cnn_round.py --clients 20 --rounds 5 \
  --json "$out/mcfl_cnn_round.json"
for cell in fedavg flexcfl; do
  part $([ $cell = fedavg ] && echo 70 || echo 90) "table-$cell" "$python" -m mcfl run \
    --config experiments/flexcfl_table3_fmnist.toml --algorithm $cell --rounds 30 \
    --data-dir "$fmnist" --out "$out/table-$cell" --overwrite
done
part 160 mlp "$python" benchmarks/device_check.py mlp --out "$out"
part 70 fesem "$python" benchmarks/device_check.py fesem --out "$out"
echo "== done after $(( $(date +%s) - started ))s" | tee -a "$log"
