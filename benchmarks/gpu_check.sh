#!/usr/bin/env bash
# One prepared check for a machine with an accelerator (about 10 minutes on one GPU), from the repository root:
#
#   bash benchmarks/gpu_check.sh            # on the GPU machine, after `pip install -e '.[test]'` with a CUDA jax
#   DRY_RUN=1 bash benchmarks/gpu_check.sh  # on a CPU: the same steps at tiny sizes, to check the script itself
#                                           # (written to benchmarks/results/dry-run/)
#
# It runs, in order, each with its own time limit so that one stuck step cannot eat the others:
#   1. the tests that touch the device (layers, models, the step, sharding, checkpoints);
#   2. `functional-gan bench` at batches 64 and 128: PyTorch eager, torch.compile and JAX, full float32
#      (TF32 off), then again with --tf32 (both frameworks allowed TF32 inputs);
#   3. the divergence finder in float32 at the tutorial's widths (every intermediate against PyTorch's own noise);
#   4. a short training run on the built-in digits;
#   5. a 300-iteration training run in JAX beside PyTorch's own tutorial loop (PyTorch on the CPU) on the same digits
#      batches, noise and initial weights, their metrics side by side: a run where D wins early is judged against
#      what PyTorch does on the same data.
# and writes benchmarks/results/<device>.{json,md} (bench) and <device>-check.log (everything printed).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-benchmarks/results$([ "${DRY_RUN:-0}" = 1 ] && echo /dry-run)}
mkdir -p "$OUT"
device=$($PY -c "import jax; d = jax.devices()[0]; print((d.device_kind if d.platform != 'cpu' else 'cpu').lower().replace(' ', '-'))")
[ "${DRY_RUN:-0}" = 1 ] && device="$device-dry-run"
log="$OUT/$device-check.log"
: > "$log"
status=0
step() {  # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    echo "== $name (limit ${limit} s): $*" | tee -a "$log"
    local start=$SECONDS
    timeout "$limit" "$@" >> "$log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - start)) s" | tee -a "$log"
    [ $rc -eq 0 ] || status=1
}
if [ "${DRY_RUN:-0}" = 1 ]; then  # a 2-core CPU: the same steps, tiny sizes, the tests given more time
    test_limit=900
    bench=(--batch-sizes 8 --scaling --repeats 1 --no-torch-compile --no-layers --no-startup)
    diverge_batch=2; train=(--steps 4 --batch-size 8 --image-size 32 --ngf 8 --ndf 8); beside=(--steps 4 --every 2)
else
    test_limit=180
    bench=(--batch-sizes 64 128 --scaling --repeats 5 --no-startup)  # start-up is measured on the CPU machine
    diverge_batch=64; train=(--steps 300 --batch-size 128 --image-size 64); beside=(--steps 300 --every 50)
fi
$PY -c "import jax; print('devices:', jax.devices())" | tee -a "$log"
step "tests on the device" "$test_limit" $PY -m pytest -q -p no:cacheprovider tests/test_layers.py tests/test_models.py \
    tests/test_train_step.py tests/test_sharding.py tests/test_wgan_gp.py
step "bench, TF32 off" 120 $PY -m functional_gan.main bench "${bench[@]}" --json "$OUT/$device.json" --markdown "$OUT/$device.md"
step "bench, TF32 on" 90 $PY -m functional_gan.main bench "${bench[@]}" --tf32 --json "$OUT/$device-tf32.json" \
    --markdown "$OUT/$device-tf32.md"
step "diverge, float32, the tutorial's widths" 60 $PY - "$diverge_batch" <<'PYTHON'
import dataclasses, sys
import torch
from functional_gan.comparisons import diverge
from functional_gan.comparisons.common import TUTORIAL_WIDTHS, make_batches
from functional_gan.pytorch import dcgan
spec = dataclasses.replace(TUTORIAL_WIDTHS, batch_size=int(sys.argv[1]), steps=2)
net_g, net_d = dcgan.make_models(spec, dtype=torch.float64)
real, noise = make_batches(spec)
found, history = diverge.find_divergence(dcgan.state_dict_numpy(net_g), dcgan.state_dict_numpy(net_d), real, noise,
                                         "float32", settings=spec)
print(diverge.format_divergence(found, history, "float32"))
sys.exit(0 if found is None else 1)
PYTHON
step "train on the digits" 60 $PY -m functional_gan.main train --data digits --out "$OUT/.gpu-check-run" "${train[@]}" --no-progress
rm -rf "$OUT/.gpu-check-run"
step "300 iterations beside PyTorch's tutorial loop" 240 $PY -m functional_gan.benchmarks.training_beside_pytorch "${beside[@]}"
echo "gpu_check: $( [ $status -eq 0 ] && echo all steps passed || echo some step failed ), log in $log" | tee -a "$log"
exit $status
