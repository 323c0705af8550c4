#!/usr/bin/env bash
# capture_records.sh REPO OUT: run the commands whose records prove a refactor changed no figure, with REPO's
# .venv, writing each command's run directories under OUT/<command>; then compare two captures with
#   python tools/compare_records.py BEFORE AFTER
# Commands: the CPU workflow's stress suites at smoke, and stability run / stress variants (fp16, the controls
# arm set, a Hugging Face Qwen3, FSDP2 under torchrun on 2 processes (run and a stress case), a model.factory,
# gpt2 in bf16, an injected LR spike, Ray). About 3 minutes on 2 cores.
# The suites' preset is given as --scale, the option's old name, which commits before and after its rename read.
set -u
REPO=$(cd "$1" && pwd); OUT=$(mkdir -p "$2" && cd "$2" && pwd)
cd "$REPO"; export PATH=$REPO/.venv/bin:$PATH PYTHONHASHSEED=0
log=$OUT/log.txt
run() { echo "== $*" >>"$log"; "$@" >>"$log" 2>&1; echo "rc=$?" >>"$log"; }
STABILITY_RUN_DIR=$OUT/workflow run pytest suites/ -m stress --scale smoke --device cpu -n 2 --dist loadfile \
  -p no:cacheprovider --tracking-uri "sqlite:///$OUT/wf.db"
run stability run --preset smoke --set precision.dtype=fp16 --no-track --quiet --out "$OUT/fp16"
run stability run --preset smoke --set arms=controls --set steps=60 --no-track --quiet --out "$OUT/controls"
run stability run --preset smoke --set model.source=hf --set model.hf_config=qwen3 --set steps=20 --no-track --quiet \
  --out "$OUT/hf"
run python -m torch.distributed.run --standalone --nproc_per_node 2 -m stability.cli run --preset smoke --set seeds=0 \
  --set steps=20 --no-track --quiet --out "$OUT/fsdp"
run python -m torch.distributed.run --standalone --nproc_per_node 2 -m stability.cli stress shock --preset smoke \
  --set seeds=0 --set steps=40 --set stress.shock_step=20 --no-track --quiet --out "$OUT/fsdp_shock"
PYTHONPATH=examples${PYTHONPATH:+:$PYTHONPATH} run stability run --preset smoke --set model.factory=my_model:build --set steps=20 --set seeds=0 \
  --no-track --quiet --out "$OUT/factory"
run stability run --preset smoke --set model.family=gpt2 --set model.bias=true --set steps=20 --set seeds=0 \
  --set precision.dtype=bf16 --no-track --quiet --out "$OUT/gpt2bf16"
run stability run --preset smoke --set steps=30 --set seeds=0 --set fault.kind=lr_spike --set fault.step=20 \
  --set fault.lr_factor=1000 --no-track --quiet --out "$OUT/fault"
run stability stress shock --ray local:2 --preset smoke --set steps=40 --set seeds=0 --no-track --quiet --out "$OUT/ray"
echo DONE >>"$log"
