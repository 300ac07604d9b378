"""The canary's miniature, proven on a real GPU: write it, load it with transformers, run one forward.

For each bundled config (Qwen3.5-122B-A10B-FP8, the headline model, and Qwen3-8B, a plain dense one):

1. ``write``: pipe the writer's text into this Python (``python3 - CONFIG OUT``, as the canary sends it
   over ssh) and read its ``::miniature::`` events with :mod:`sparkconsole.serving.miniature`;
2. ``files``: open every file with the real ``safetensors`` library: names, dtypes, shapes, bytes,
   no NaN codes in the FP8 tensors;
3. ``load``: ``from_pretrained`` with the class the config names (``architectures[0]``), on the GPU,
   with ``output_loading_info``: the class, the quantization config transformers kept, which modules
   became ``FP8Linear``/``FP8Experts``, and a byte-for-byte comparison of loaded tensors with the file
   (so the weights were read, not initialised);
4. ``forward``: one forward pass on a few token ids (no tokenizer: the real one is not available
   offline there), logits shape and finiteness; then a 4-token greedy ``generate`` (the cache paths).

Writes ``miniature_gpu_report.json`` (to ``$OUT`` when set). Each phase's failure is recorded with its
traceback and the next model still runs, so one call tells everything.

    python3 benchmarks/miniature_gpu.py [--out DIR] [--work DIR]

The miniature's speed is no performance claim: the seconds are only there to show a canary is quick.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from sparkconsole.serving import miniature  # noqa: E402

SPECS = ROOT / "sparkconsole" / "planner" / "specs"
MODELS = {
    "qwen3.5-122B-A10B-FP8": SPECS / "qwen3.5-122B-A10B.config.json",
    "qwen3-8B": SPECS / "qwen3-8B.config.json",
}


def _tb() -> str:
    return traceback.format_exc()[-4000:]


def write_phase(cfg: Path, out: Path) -> dict:
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-", str(cfg), str(out)], input=miniature.program_text(),
                          capture_output=True, text=True, timeout=300)
    events = miniature.parse_events(proc.stdout)
    s = miniature.summarize(events, proc.stderr, proc.returncode)
    return {"seconds": round(time.time() - t0, 3), "returncode": proc.returncode, "done": s.done,
            "tensors": s.tensors, "bytes": s.bytes, "files": s.files, "error": s.error,
            "events": [{"phase": e.phase, **{k: v for k, v in e.data.items() if k != "source"}}
                       for e in events]}


def files_phase(out: Path) -> dict:
    import torch
    from safetensors import safe_open

    t0 = time.time()
    names, total, dtypes, nan_codes, sampled = 0, 0, {}, 0, 0
    size = {"F8_E4M3": 1, "BF16": 2, "F32": 4, "float8_e4m3fn": 1, "bfloat16": 2, "float32": 4}
    for path in sorted(out.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 - safe_open has keys(), not __iter__
                sl = f.get_slice(key)
                shape = sl.get_shape()
                dt = str(sl.get_dtype()).replace("torch.", "")
                dtypes[dt] = dtypes.get(dt, 0) + 1
                names += 1
                n = 1
                for d in shape:
                    n *= d
                if size.get(dt) == 1 and (sampled < 64 or "in_proj_qkv" in key or "q_proj" in key):
                    t = f.get_tensor(key)
                    u = t.view(torch.uint8)
                    nan_codes += int(((u == 0x7F) | (u == 0xFF)).sum())
                    assert torch.isfinite(t.float()).all(), key
                    sampled += 1
                total += n * size.get(dt, 0)
    return {"seconds": round(time.time() - t0, 3), "tensors": names, "bytes": total, "dtypes": dtypes,
            "fp8_tensors_sampled": sampled, "fp8_nan_codes": nan_codes}


def load_phase(out: Path, state: dict) -> dict:
    import torch
    import transformers

    t0 = time.time()
    cfg = json.loads((out / "config.json").read_text())
    arch = cfg["architectures"][0]
    cls = getattr(transformers, arch)
    model, info = cls.from_pretrained(str(out), device_map="cuda", dtype=torch.bfloat16,
                                      output_loading_info=True)
    torch.cuda.synchronize()
    seconds = round(time.time() - t0, 3)
    model.eval()
    state["model"] = model
    kinds: dict[str, int] = {}
    for _name, mod in model.named_modules():
        k = type(mod).__name__
        if "Linear" in k or "Experts" in k:
            kinds[k] = kinds.get(k, 0) + 1
    by_dtype: dict[str, int] = {}
    params = 0
    for _name, p in model.named_parameters():
        by_dtype[str(p.dtype)] = by_dtype.get(str(p.dtype), 0) + p.numel()
        params += p.numel()
    qc = getattr(model.config, "quantization_config", None)
    qd = qc.to_dict() if hasattr(qc, "to_dict") else qc
    named = dict(model.named_parameters())
    probes = {}
    for needle in ("linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_a.weight", "self_attn.q_proj.weight",
                   "experts.gate_up_proj", "experts.gate_up_proj_scale_inv", "experts.down_proj_scale_inv",
                   "shared_expert.gate_proj.weight_scale_inv", "visual.blocks.0.attn.qkv.weight", "lm_head.weight",
                   "mlp.gate_proj.weight"):
        hit = next((n for n in named if n.endswith(needle)), None)
        if hit:
            probes[hit] = {"dtype": str(named[hit].dtype), "shape": list(named[hit].shape),
                           "module": type(model.get_submodule(hit.rpartition(".")[0])).__name__}
    return {
        "seconds": seconds,
        "class": type(model).__name__,
        "class_is_config_architecture": type(model).__name__ == arch,
        "quantization_config": {k: qd.get(k) for k in ("quant_method", "weight_block_size",
                                                       "activation_scheme")} if isinstance(qd, dict) else None,
        "quantization_config_class": type(qc).__name__ if qc is not None else None,
        "modules_to_not_convert_count": len((qd or {}).get("modules_to_not_convert") or [])
        if isinstance(qd, dict) else None,
        "module_kinds": kinds,
        "parameters": params,
        "parameters_by_dtype": by_dtype,
        "missing_keys": sorted(info.get("missing_keys", []))[:40],
        "missing_keys_count": len(info.get("missing_keys", [])),
        "unexpected_keys_sample": sorted(info.get("unexpected_keys", []))[:10],
        "unexpected_keys_count": len(info.get("unexpected_keys", [])),
        "unexpected_keys_all_mtp": all(k.startswith("mtp.") for k in info.get("unexpected_keys", [])),
        "mismatched_keys": [list(map(str, m)) for m in info.get("mismatched_keys", [])][:20],
        "error_msgs": [str(m)[:500] for m in info.get("error_msgs", [])][:10],
        "probes": probes,
    }


def same_bytes_phase(out: Path, state: dict) -> dict:
    """Loaded tensors equal the file's: a plain linear, a quantized one and its scale, and expert 5's
    gate/up/down rows inside transformers' fused experts tensors."""
    import torch
    from safetensors import safe_open

    model = state["model"]
    named = dict(model.named_parameters())
    index = out / "model.safetensors.index.json"
    where = (json.loads(index.read_text())["weight_map"] if index.exists()
             else dict.fromkeys(safe_open(str(out / "model.safetensors"), framework="pt").keys(),
                                "model.safetensors"))

    def file_tensor(key: str) -> torch.Tensor:
        with safe_open(str(out / where[key]), framework="pt") as f:
            return f.get_tensor(key)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        a, b = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        return bool(torch.equal(a.view(torch.uint8), b.view(torch.uint8)))

    results = {}
    for key in where:
        if key.startswith("mtp."):
            continue
        if key.endswith(("embed_tokens.weight", "in_proj_qkv.weight", "in_proj_qkv.weight_scale_inv",
                         "in_proj_a.weight", "q_proj.weight", "lm_head.weight")) and key in named:
            results[key] = same(named[key], file_tensor(key))
    for key, param in named.items():
        if key.endswith("experts.gate_up_proj") or key.endswith("experts.gate_up_proj_scale_inv"):
            base = key.rsplit(".", 1)[0]
            suffix = ".weight_scale_inv" if key.endswith("_scale_inv") else ".weight"
            g, u = file_tensor(f"{base}.5.gate_proj{suffix}"), file_tensor(f"{base}.5.up_proj{suffix}")
            results[key + "[5]"] = same(param[5], torch.cat([g, u], dim=0))
        if key.endswith("experts.down_proj"):
            base = key.rsplit(".", 1)[0]
            results[key + "[5]"] = same(param[5], file_tensor(f"{base}.5.down_proj.weight"))
    return {"compared": len(results), "all_equal": all(results.values()) if results else None,
            "results": dict(list(results.items())[:24])}


def forward_phase(state: dict, vocab: int) -> dict:
    import torch

    model = state["model"]
    ids = torch.tensor([[0, 1, 100, 9707, vocab - 1]], device="cuda")
    with torch.no_grad():
        torch.cuda.synchronize()
        t0 = time.time()
        logits = model(input_ids=ids).logits
        torch.cuda.synchronize()
        seconds = round(time.time() - t0, 3)
    out = {"seconds": seconds, "input_ids": ids.tolist(), "logits_shape": list(logits.shape),
           "logits_dtype": str(logits.dtype), "finite": bool(torch.isfinite(logits).all()),
           "logits_abs_max": float(logits.float().abs().max())}
    try:
        t0 = time.time()
        with torch.no_grad():
            gen = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
        out["generate"] = {"seconds": round(time.time() - t0, 3), "new_tokens": gen[0, ids.shape[1]:].tolist()}
    except Exception:
        out["generate"] = {"error": _tb()}
    return out


def dequantized_forward_phase(out: Path, vocab: int) -> dict:
    """The same files loaded with ``FineGrainedFP8Config(dequantize=True)``: transformers multiplies each
    FP8 block by its ``weight_scale_inv`` into bf16 at load, then the forward needs no FP8 GEMM kernel.
    It runs where transformers' own FP8 kernel cannot be had (it comes from the ``kernels`` package,
    which fetches compiled kernels from the Hub: no network on the device), and still proves the
    FP8 weights and their scale tensors are what the architecture reads, block for block."""
    import torch
    import transformers

    cfg = json.loads((out / "config.json").read_text())
    if (cfg.get("quantization_config") or {}).get("quant_method") != "fp8":
        return {"skipped": "not an FP8 model"}
    cls = getattr(transformers, cfg["architectures"][0])
    t0 = time.time()
    model = cls.from_pretrained(str(out), device_map="cuda", dtype=torch.bfloat16,
                                quantization_config=transformers.FineGrainedFP8Config(dequantize=True))
    model.eval()
    load_s = round(time.time() - t0, 3)
    res = forward_phase({"model": model}, vocab)
    res["load_seconds"] = load_s
    res["class"] = type(model).__name__
    del model
    return res


def run_model(key: str, cfg: Path, work: Path) -> dict:
    out = work / key
    rep: dict = {"config": str(cfg.relative_to(ROOT))}
    state: dict = {}
    vocab = json.loads(cfg.read_text()).get("text_config", {}).get("vocab_size") or \
        json.loads(cfg.read_text())["vocab_size"]
    phases = [("write", lambda: write_phase(cfg, out)), ("files", lambda: files_phase(out)),
              ("load", lambda: load_phase(out, state)), ("same_bytes", lambda: same_bytes_phase(out, state)),
              ("forward", lambda: forward_phase(state, vocab)),
              ("forward_dequantized", lambda: (state.clear(), dequantized_forward_phase(out, vocab))[1])]
    for name, fn in phases:
        try:
            rep[name] = fn()
        except Exception:
            rep[name] = {"error": _tb()}
            if name in ("write", "load"):
                break
    state.clear()
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:
        pass
    return rep


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or ".")
    ap.add_argument("--work", default=None)
    args = ap.parse_args(argv)
    import torch
    import transformers

    work = Path(args.work or tempfile.mkdtemp(prefix="miniature-"))
    report: dict = {
        "_header": {
            "what": "benchmarks/miniature_gpu.py output, kept verbatim: never edit by hand",
            "machine": f"{torch.cuda.get_device_name(0)} (cc {'.'.join(map(str, torch.cuda.get_device_capability(0)))}),"
                       f" {platform.machine()}, {platform.system()} {platform.release()}",
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "command": "python3 benchmarks/miniature_gpu.py --out $OUT",
            "tokenizer": "none: the real tokenizer is not available offline there; token ids are given directly",
        },
        "device_name": torch.cuda.get_device_name(0),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "models": {},
    }
    for pkg in ("safetensors", "accelerate", "kernels", "fla"):
        try:
            mod = __import__(pkg)
            report[pkg] = getattr(mod, "__version__", "present")
        except Exception:
            report[pkg] = None
    for key, cfg in MODELS.items():
        t0 = time.time()
        report["models"][key] = run_model(key, cfg, work)
        report["models"][key]["seconds_total"] = round(time.time() - t0, 3)
        print(f"{key}: done in {report['models'][key]['seconds_total']} s", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "miniature_gpu_report.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: {p: ((v.get("error") or "ok")[-300:] if isinstance(v, dict) else v)
                          for p, v in m.items()} for k, m in report["models"].items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
