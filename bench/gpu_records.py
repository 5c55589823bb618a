"""Records of a lent GPU machine's run of bench/gpu_check.sh (bench/records/gpu_encode.json and gpu_embed.json),
from the logs it sent back: the device runs the benchmarks, this machine keeps their records (bench/harness.py's
format, rendered into bench/RESULTS.md by bench/results.py). Times are seconds per 100,000 images, from each
contender's images/s.

    python bench/gpu_records.py --encode DIR/encode.log --embed DIR/embed.log --date 2026-12-04
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness as h  # noqa: E402

PER = 100_000  # images a time is given for
# start-up parts as the first device run's gpu_embed.py named them: its "model module" step imported
# mieb_ray.encode.model only, so transformers' import fell into "model loaded"
RENAMED = {"import transformers (the model module)": "import mieb_ray.encode.model",
           "model loaded": "import transformers and the model loaded to the GPU"}


def encode_record(log: str, date: str) -> None:
    """bench/gpu_encode.py's table: per model, the encoder as the embed job runs it (transformers, eager), with
    --compile, and timm's model of the same shape, on one bf16 batch of 512 already on the GPU."""
    rates = {}
    for model, measure, rate in re.findall(r"^\| (ViT-\S+) \| ([^|]+?) \| 512 \| ([\d,]+) \|", log, re.M):
        kind = "compiled" if measure.startswith("compiled") else "timm" if measure.startswith("timm") else measure
        rates[model, kind] = float(rate.replace(",", ""))
    head = re.search(r"^Device: .*$", log, re.M).group(0)
    names = {"synthetic": "mieb-ray encoder", "compiled": "mieb-ray encoder --compile", "timm": "timm"}
    contenders, seconds = [], {}
    for model in ("ViT-B/32", "ViT-L/14"):
        for kind, label in names.items():
            name = f"{model} {label}"
            contenders.append(h.Contender(name, f"{PER:,} images: {_includes(kind)}",
                                          baseline=None if kind == "timm" else f"{model} timm"))
            seconds[name] = [PER / rates[model, kind]]
    bench = h.Benchmark("gpu_encode", "images/s of ViT-B/32 and L/14 on one H200 in bf16: mieb-ray's encoder, "
                        "compiled, and timm's model of the same shape, side by side in one call", contenders,
                        group="Embed", ratio=("ViT-L/14 mieb-ray encoder --compile", "ViT-L/14 timm"))
    table = log[log.index("| model | measure"):]
    h.measured(bench, seconds).finish(figures={"device table": table[:table.index("\n\n")], "device": head,
                                               "date": date}, notes=[
        "Run on a lent NVIDIA H200 by bench/gpu_check.sh (step encode); this record was made from its log by "
        "bench/gpu_records.py. Random weights of the real shapes; a batch of 512 already on the GPU.",
        "The eager encoder is 0.88x timm's (B/32) and 0.89x (L/14); compiled, 1.08x and 1.09x, at 46.5% and 70.0% "
        "of the measured bf16 matmul rate (663 TFLOP/s that run)."])


def _includes(kind: str) -> str:
    return {"synthetic": "Encoder's model (transformers CLIP, sdpa), get_image_features",
            "compiled": "Encoder(compile=True).image_features (torch.compile, inductor), after compiling",
            "timm": "timm vit_*_clip_224 forward (fused QKV, F.scaled_dot_product_attention)"}[kind]


def embed_record(logs: list[str], date: str) -> None:
    """bench/gpu_embed.py's lines: the job on each feed against the encoder alone and the CPU decode ceiling. A
    model the logs lack keeps its jobs from the last record (a device run may measure one model only)."""
    runs = [json.loads(line.split(" ", 1)[1]) for log in logs for line in log.splitlines()
            if line.startswith("[gpu_embed] {")]
    for r in runs:
        r.setdefault("date", date)
    earlier = h.RECORDS / "gpu_embed.json"
    if earlier.exists():
        old = json.loads(earlier.read_text())
        runs += [dict(r, date=r.get("date", old["figures"].get("date")), commit=r.get("commit", old["commit"][:7]))
                 for r in old["figures"]["jobs"] if r["model"] not in {n["model"] for n in runs}]
    contenders, seconds, notes = [], {}, [
        "Run on a lent NVIDIA H200 (16 CPUs) by bench/gpu_check.sh (step embed); made from its logs by "
        "bench/gpu_records.py. Steady: rows committed between 10% and 90% of the job's rows, over that time. "
        "Start-up: process start to the first committed unit."]
    for model in ("ViT-B/32", "ViT-L/14"):
        jobs = [r for r in runs if r["model"] == model]
        if not jobs:
            continue
        auto = jobs[0]
        feed = "CPU feed" if "by CPU tasks" in auto["decode"] else "device feed"
        names = [f"{model} encoder alone", f"{model} CPU decode ceiling", f"{model} job, steady, --decode auto "
                 f"({feed})", f"{model} job, whole, --decode auto"]
        contenders += [
            h.Contender(names[0], "Encoder.image_features, bf16, batch 512 resident on the GPU"),
            h.Contender(names[1], "load_image to 224 px in 16 processes, the job's photos"),
            h.Contender(names[2], f"{auto['rows']:,} photos", baseline=names[0]),
            h.Contender(names[3], f"process start to exit: Ray's start, the model's load (start-up "
                        f"{auto['startup_s']:.0f} s)", baseline=names[2])]
        seconds |= {names[0]: [PER / auto["encoder_alone"]], names[1]: [PER / auto["cpu_decode_ceiling"]],
                    names[2]: [PER / auto["steady_rows_s"]], names[3]: [PER / auto["job_rows_s"]]}
        for other in jobs[1:]:  # the feed auto did not choose
            name = f"{model} job, steady, --decode {'gpu' if 'on their GPUs' in other['decode'] else 'cpu'}"
            contenders.append(h.Contender(name, f"the first {other['rows']:,} photos", baseline=names[2]))
            seconds[name] = [PER / other["steady_rows_s"]]
        bound = min(auto["encoder_alone"], auto["cpu_decode_ceiling"])
        notes.append(
            f"{model} ({auto['date']}{', commit ' + auto['commit'] if 'commit' in auto else ''}): steady "
            f"{auto['steady_rows_s']:,.0f} rows/s, {auto['steady_rows_s'] / auto['encoder_alone']:.0%} of the encoder "
            f"alone and {auto['steady_rows_s'] / auto['cpu_decode_ceiling']:.0%} of the CPU decode ceiling (the "
            f"bound, the lower of the two: {'the encoder' if bound == auto['encoder_alone'] else 'CPU decode'}); "
            f"GPU SM "
            f"{auto['gpu_util']:.0f}% over the steady window"
            + "".join(f"; --decode {'gpu' if 'on their GPUs' in o['decode'] else 'cpu'} {o['steady_rows_s']:,.0f} "
                      f"rows/s (GPU SM {o['gpu_util']:.0f}%)" for o in jobs[1:]) + ".")
        if "startup_parts" in auto:
            notes.append(f"{model} start-up parts, each timed once in a fresh process on the device: "
                         + ", ".join(f"{RENAMED.get(k, k)} {v:.1f} s" for k, v in auto["startup_parts"].items()) + ".")
    bench = h.Benchmark("gpu_embed", "`mieb-ray embed` of 100,000 photos (160 to 800 px) with ViT-B/32- and "
                        "L/14-sized CLIPs on one H200 and 16 CPUs, on Ray, against what bounds each", contenders,
                        group="Embed", ratio=(contenders[2].name, contenders[0].name))
    h.measured(bench, seconds).finish(figures={"jobs": runs, "date": date}, notes=notes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encode", type=Path)
    parser.add_argument("--embed", type=Path, action="append", help="an embed.log (repeatable)")
    parser.add_argument("--date", required=True, help="the device run's date")
    args = parser.parse_args()
    h.portable_argv()  # the device's logs lie in a folder of this machine's own
    if args.encode:
        encode_record(args.encode.read_text(), args.date)
    if args.embed:
        embed_record([p.read_text() for p in args.embed], args.date)


if __name__ == "__main__":
    main()
