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


def embed_record(log: str, date: str) -> None:
    """bench/gpu_embed.py's lines: the job on each feed against the encoder alone and the CPU decode ceiling."""
    runs = [json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("[gpu_embed] {")]
    b32 = [r for r in runs if r["model"] == "ViT-B/32"]
    auto, other = b32[0], b32[1]
    contenders = [
        h.Contender("encoder alone", "Encoder.image_features, bf16, batch 512 resident on the GPU"),
        h.Contender("CPU decode ceiling", "load_image to 224 px in 16 processes, the job's photos"),
        h.Contender("embed job, steady, --decode auto (CPU feed)", "rows committed between 10% and 90% of "
                    "100,000, over that time", baseline="CPU decode ceiling"),
        h.Contender("embed job, steady, --decode gpu", "the same on the first 20,000 photos",
                    baseline="embed job, steady, --decode auto (CPU feed)"),
        h.Contender("embed job, whole, --decode auto", "process start to exit: Ray's start, the model's load, "
                    "start-up 45 s", baseline="embed job, steady, --decode auto (CPU feed)")]
    seconds = {"encoder alone": [PER / auto["encoder_alone"]], "CPU decode ceiling": [PER / auto["cpu_decode_ceiling"]],
               contenders[2].name: [PER / auto["steady_rows_s"]], contenders[3].name: [PER / other["steady_rows_s"]],
               contenders[4].name: [PER / auto["job_rows_s"]]}
    for r in (r for r in runs if r["model"] == "ViT-L/14"):  # the L/14 job, where its run got that far
        contenders += [h.Contender("ViT-L/14 encoder alone", "Encoder.image_features, bf16, batch 512 resident"),
                       h.Contender("ViT-L/14 embed job, steady", "as for B/32, --decode auto",
                                   baseline="ViT-L/14 encoder alone")]
        seconds |= {"ViT-L/14 encoder alone": [PER / r["encoder_alone"]],
                    "ViT-L/14 embed job, steady": [PER / r["steady_rows_s"]]}
    bench = h.Benchmark("gpu_embed", "`mieb-ray embed` of 100,000 photos (160 to 800 px) with a ViT-B/32-sized "
                        "CLIP on one H200 and 16 CPUs, on Ray, against what bounds it", contenders, group="Embed",
                        ratio=(contenders[2].name, "CPU decode ceiling"))
    l14 = None if any(r["model"] == "ViT-L/14" for r in runs) else \
        re.search(r"ViT-L/14: encoder alone ([\d,]+) images/s; CPU decode ceiling ([\d,]+)", log)
    h.measured(bench, seconds).finish(figures={"jobs": runs, "date": date}, notes=[
        "Run on a lent NVIDIA H200 (16 CPUs) by bench/gpu_check.sh (step embed); made from its log by "
        "bench/gpu_records.py. The ViT-L/14 job did not run: the step's time ran out after its bounds were measured "
        f"(encoder alone {l14.group(1)} images/s, CPU decode ceiling {l14.group(2)})." if l14 else "",
        f"GPU SM utilisation over the steady window: {auto['gpu_util']:.0f}% on the CPU feed, "
        f"{other['gpu_util']:.0f}% on the device's. The job reached "
        f"{auto['steady_rows_s'] / auto['cpu_decode_ceiling']:.0%} of the CPU decode ceiling: the decode tasks "
        "share the 16 CPUs with the encoder's driver, the commit tasks "
        "and Ray Data; the B/32 encoder (28,709 images/s) waits on them."])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encode", type=Path)
    parser.add_argument("--embed", type=Path)
    parser.add_argument("--date", required=True, help="the device run's date")
    args = parser.parse_args()
    h.portable_argv()  # the device's logs lie in a folder of this machine's own
    if args.encode:
        encode_record(args.encode.read_text(), args.date)
    if args.embed:
        embed_record(args.embed.read_text(), args.date)


if __name__ == "__main__":
    main()
