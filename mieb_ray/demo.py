"""`mieb-ray demo`: the whole flow on a laptop, from a fixture mirror of every source made on the spot."""

from __future__ import annotations

import os
import time

from mieb_ray import storage
from mieb_ray.demo_data.biovita import CANDIDATES, make_biovita_mirror
from mieb_ray.demo_data.mirror import make_mirror
from mieb_ray.demo_data.models import make_tiny_clip
from mieb_ray.errors import UserError
from mieb_ray.evals import registry
from mieb_ray.evals.job import evaluate
from mieb_ray.evals.zeroshot_tasks import select_tasks
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.pipelines.embed import EmbedConfig, embed
from mieb_ray.runtime.cluster import RunContext

ZEROSHOT_TASK, ZEROSHOT_ROWS = "CIFAR10ZeroShot", 100  # one zero-shot task, on 100 test images of the mirror
TASKS = f"BioVITAT2IReranking,{ZEROSHOT_TASK}"
OUTPUTS = ("mirror", "mieb-train", "tiny-clip", "embeddings-image", "embeddings-text", "eval")


def demo(out: str, rows: int = 40, overwrite: bool = False, log=print, ctx: RunContext | None = None) -> dict:
    """Every output under `out`; what an earlier run (or anything else) left there is replaced only with
    `overwrite`. ctx: the command's Ray, one for all three jobs: the one-node Ray the build started (if any) does
    not hold embed and eval on Ray (runtime/placement.py)."""
    ctx = ctx or RunContext()
    out = os.path.abspath(out)
    there = [name for name in OUTPUTS if os.path.exists(os.path.join(out, name))]
    if there and not overwrite:
        raise UserError(f"{out} already holds {', '.join(there)} (an earlier run's?); pass --overwrite to replace "
                        "them, or another --out")
    mirror, train, model, evaluated = (os.path.join(out, d) for d in ("mirror", "mieb-train", "tiny-clip", "eval"))
    t0 = time.time()
    written = make_mirror(mirror, rows=rows, eval_rows={select_tasks(ZEROSHOT_TASK)[0].slug: ZEROSHOT_ROWS})
    make_biovita_mirror(mirror)
    log(f"[demo] fixture mirror of the {len(written)} sources ({sum(written.values()):,} rows) and of a BioVITA-shaped "
        f"benchmark, in the hub's layout, from real pictures, in {time.time() - t0:.1f}s: {mirror}")
    built = build(BuildConfig(mirror, train, rows_per_shard=rows // 2, overwrite=True), log=log, ctx=ctx)
    make_tiny_clip(model)
    log(f"[demo] a tiny random CLIP saved with save_pretrained: {model}")
    outputs = {"mieb-train": built}
    for modality in ("image", "text"):
        target = os.path.join(out, f"embeddings-{modality}")
        outputs[target] = embed(EmbedConfig(train, target, model, modality=modality, carry_columns=("dataset_name",),
                                            overwrite=True), log=log, ctx=ctx)
    outputs[evaluated] = results = evaluate(registry.select(TASKS), registry.Options(mirror), evaluated,
                                            model=model, overwrite=True, log=log, ctx=ctx)
    dropped = {slug: n for slug, n in built["counts"]["dropped"].items() if n}
    log("[demo] outputs:")
    log(f"  {mirror}: the fixture mirror, {sum(written.values()):,} train rows of the {len(written)} sources and a "
        "BioVITA-shaped benchmark, as `huggingface-cli download --local-dir` lays out the hub's repos")
    log(f"  {train}: {built['counts']['total']:,} rows in {len(built['shards'])} Parquet shards "
        f"(datasets.load_dataset({train!r}, 'cifar100'))"
        + (f"; {sum(dropped.values())} fewer than the mirror's: rows of classes mieb-train leaves out "
           f"({', '.join(f'{slug}: {n}' for slug, n in dropped.items())}; docs/build.md)" if dropped else ""))
    log(f"  {model}: the tiny random CLIP (save_pretrained), loaded as a hub model would be")
    for modality in ("image", "text"):
        target = os.path.join(out, f"embeddings-{modality}")
        m = outputs[target]
        log(f"  {target}: {m['counts']['total']:,} {modality} embeddings (dim {m['dim']}) in {len(m['shards'])} "
            f"Arrow shards, manifest {storage.join(target, storage.MANIFEST)}")
    result = results["BioVITAT2IReranking"]
    subsets = ", ".join(f"{e['hf_subset']} top-1/5/10 {e['taxon_top_1_accuracy']:.3f}/{e['taxon_top_5_accuracy']:.3f}/"
                        f"{e['taxon_top_10_accuracy']:.3f}" for e in result["scores"]["test"])
    chance = "/".join(f"{k / CANDIDATES:.3f}" for k in (1, 5, 10))
    log(f"  {evaluated}/biovita: BioVITA-shaped scores of the random CLIP: {subsets} (chance: about {chance}, one "
        f"right taxon among {CANDIDATES} candidates; the report gives it per query pool); task score "
        f"{result['mieb_ray']['task_score']:.3f}; report {evaluated}/biovita/report.html")
    zeroshot = results[ZEROSHOT_TASK]
    classes = zeroshot["mieb_ray"]["classes"]
    log(f"  {evaluated}/zeroshot: {ZEROSHOT_TASK} on {ZEROSHOT_ROWS} test images (built with `build --split eval`), "
        f"accuracy {zeroshot['scores']['test'][0]['accuracy']:.3f} with mteb's prompts, "
        f"{zeroshot['mieb_ray']['fixed_prompts']['accuracy']:.3f} with the fixed ones (chance: {1 / classes:.3f}, "
        f"{classes} classes: a random model's difference is noise); report {evaluated}/zeroshot/report.html")
    log(f"[demo] done in {time.time() - t0:.0f}s")
    return outputs
