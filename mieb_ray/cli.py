"""The command line: `mieb-ray COMMAND ...`, each command a job (DESCRIPTION), its flags checked by flags.py."""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager, nullcontext

from mieb_ray import __version__, flags
from mieb_ray.audit.job import DEFAULT_THRESHOLD, AuditConfig, audit
from mieb_ray.errors import UserError, surfaced
from mieb_ray.evals import registry
from mieb_ray.evals.job import evaluate
from mieb_ray.formats import AUDIT_ERRORS, BUILD_DETECTORS, DETECTORS, PAIRS, REPORT, SUMMARY
from mieb_ray.pipelines import preflight
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.pipelines.embed import EmbedConfig, embed
from mieb_ray.runtime import cluster
from mieb_ray.runtime.output import no_empty_folder_on_failure
from mieb_ray.runtime.pools import PoolRequest
from mieb_ray.sources import SOURCES, TOTAL_ROWS, select

DESCRIPTION = (f"mieb-ray: build the mieb-train CLIP training set from the {len(SOURCES)} MIEB zero-shot "
               "classification datasets, encode any image or text table with a CLIP model, score embeddings on MIEB "
               "tasks exactly as mteb does, and audit which train rows duplicate an eval image. Each command runs on "
               "this machine, or on a Ray cluster (--address, RAY_ADDRESS, `ray job submit`). Start with `mieb-ray "
               "demo`; every flag: docs/cli.md.")


def add_sources_flag(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--sources", "--data", dest="sources", default="hf", type=flags.sources,
                   help=f"{what}'hf' for the Hugging Face hub at the pinned revisions (default), or a mirror of it: a "
                        "root (local path or s3://bucket/prefix) holding <org>/<repo>/ folders as the hub's "
                        "`--local-dir` downloads make them; --data is the same flag")


def add_build_flags(p: argparse.ArgumentParser) -> None:
    add_sources_flag(p)
    p.add_argument("--out", required=True, type=flags.output, help="output root, local path or s3://bucket/prefix")
    p.add_argument("--datasets", default=None,
                   help=f"comma-separated dataset slugs (default: all {len(SOURCES)}): "
                        + ", ".join(s.slug for s in SOURCES))
    p.add_argument("--format", default="parquet", choices=["parquet", "webdataset"],
                   help="the shards' format (docs/formats.md)")
    # no argparse `choices`: a wrong value is then the one-line UserError of BuildConfig.check()
    p.add_argument("--split", default="train", metavar="{train,eval}",
                   help="train: the train splits, keys <slug>/<index> (default); eval: each task's MIEB eval split "
                        "(test; validation for food101), every row kept, keys <slug>/<split>/<index>, to its own --out")
    p.add_argument("--rows-per-shard", type=flags.count, default=10_000,
                   help="rows per output shard; shard k of a dataset holds source rows [k*N, (k+1)*N) (default: 10000, "
                        "as the WebDataset sources' tars)")
    p.add_argument("--exclude", default=None, type=flags.existing_folder,
                   help="an audit output (mieb-ray audit --out): leave out the train rows it flagged; the other "
                        "rows keep their keys")
    p.add_argument("--exclude-detectors", default=BUILD_DETECTORS, type=flags.detectors,
                   help=f"with --exclude: the detectors ({', '.join(DETECTORS)}) whose pairs leave a train row out, "
                        f"comma-separated (default: {','.join(BUILD_DETECTORS)}; add near to trust the CLIP threshold "
                        "too)")
    p.add_argument("--overwrite", action="store_true", help="replace a complete build already at --out")
    p.add_argument("--resume", action="store_true",
                   help="continue an unfinished run: skip the units it built with the same settings (an unfinished "
                        "output needs --resume or --overwrite)")
    p.add_argument("--check-counts", dest="check_counts", action=argparse.BooleanOptionalAction, default=None,
                   help=f"fail unless each dataset has its catalog row count and all {len(SOURCES)} make "
                        f"{TOTAL_ROWS:,} (default: on for --sources hf)")
    p.add_argument("--max-error-rate", type=flags.fraction, default=0.001,
                   help="fail when more than this fraction of rows cannot be built (default: 0.001); such rows are "
                        "listed in OUT/_errors/, never silently dropped")
    p.add_argument("--workers", type=flags.count, default=None,
                   help="shard builders, a fixed number (default: a pool from the CPUs up now to the CPUs the cluster "
                        "can grow to)")
    p.add_argument("--cpus-per-worker", type=flags.cpus, default=1.0, help="CPUs per shard builder (default: 1)")
    add_executor_flag(p)


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # `ray job stop` and `kill` send SIGTERM: unwind as for Ctrl-C, staged files removed


def run_build(args: argparse.Namespace) -> None:
    config = BuildConfig(args.sources, args.out, datasets=args.datasets, fmt=args.format,
                         rows_per_shard=args.rows_per_shard, overwrite=args.overwrite, resume=args.resume,
                         check_counts=args.check_counts, max_error_rate=args.max_error_rate, workers=args.workers,
                         cpus_per_worker=args.cpus_per_worker, split=args.split, exclude=args.exclude,
                         exclude_detectors=args.exclude_detectors,
                         executor=args.executor)
    config.check()
    select(args.datasets)  # an unknown name fails here, before Ray starts
    cluster.configure(args.address)
    build(config)


def add_check_flags(p: argparse.ArgumentParser) -> None:
    add_sources_flag(p)
    p.add_argument("--datasets", default=None, help="comma-separated dataset names (default: all)")
    p.add_argument("--split", default="train", choices=["train", "eval"],
                   help="the split to check, as for build --split (default: train)")
    p.add_argument("--check-counts", dest="check_counts", action=argparse.BooleanOptionalAction, default=True,
                   help="fail when a source's rows differ from the catalog's (default: on; off for a mirror of "
                        "samples)")


def run_check(args: argparse.Namespace) -> None:
    preflight.run(args.sources, args.datasets, split=args.split, check_counts=args.check_counts)


def add_embed_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, type=flags.existing,
                   help="mieb-train output, a folder of Parquet files or WebDataset tars, or one file; local or s3://")
    p.add_argument("--out", required=True, type=flags.output,
                   help="output root for the embedding shards, local or s3://")
    p.add_argument("--model", required=True, type=flags.model,
                   help="a hub name (e.g. openai/clip-vit-base-patch32), a local directory or an s3:// prefix holding "
                        "what save_pretrained writes: CLIP, SigLIP, SigLIP2 or any transformers model with "
                        "get_image_features / get_text_features (docs/embed.md); never remote code")
    p.add_argument("--revision", default=None,
                   help="hub commit to load (default: the pinned one for openai/clip-vit-base-patch32 and "
                        "-large-patch14; else the hub's, recorded in the manifest)")
    p.add_argument("--modality", default="image", choices=["image", "text"],
                   help="what to embed: the images of --image-column or the texts of --text-column")
    p.add_argument("--image-column", default="image",
                   help="HF Image structs or raw bytes; in tars, the image member")
    p.add_argument("--text-column", default="text", help="in tars, the .txt member")
    p.add_argument("--key-column", default="key", help="in tars, the sample key")
    p.add_argument("--carry-columns", default="",
                   help="comma-separated input columns to copy beside each embedding (in tars: members or fields of "
                        "the .json)")
    p.add_argument("--batch-size", type=flags.count, default=256, help="rows per model call (default: 256)")
    p.add_argument("--rows-per-shard", type=flags.count, default=10_000,
                   help="most rows per output shard; an input file with more is cut into row ranges (default: "
                        "10000; image shards hold at most 256 MB of decoded pixels)")
    p.add_argument("--dtype", default="float32", choices=["float16", "float32"],
                   help="stored embedding type (the model runs in bf16 on a GPU, float32 on a CPU)")
    p.add_argument("--resume", action="store_true",
                   help="continue an unfinished run: skip the shards it committed with the same settings (an "
                        "unfinished output needs --resume or --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace complete embeddings already at --out")
    p.add_argument("--max-error-rate", type=flags.fraction, default=0.01,
                   help="fail when more than this fraction of rows cannot be encoded (default: 0.01)")
    p.add_argument("--decode", default="auto", choices=["cpu", "gpu", "auto"],
                   help="where images are decoded: cpu (the read tasks), gpu (baseline JPEGs by each encoder on its "
                        "device with nvJPEG, other images by the read tasks; needs torchvision) or auto (default): "
                        "gpu when the encoders have GPUs, torchvision imports and the model's resize filter runs "
                        "there, else cpu (docs/embed.md)")
    add_executor_flag(p)
    add_pool_flags(p)


def run_embed(args: argparse.Namespace) -> None:
    config = EmbedConfig(args.input, args.out, args.model, revision=args.revision, modality=args.modality,
                         image_column=args.image_column, text_column=args.text_column, key_column=args.key_column,
                         carry_columns=tuple(c for c in args.carry_columns.split(",") if c),
                         batch_size=args.batch_size, rows_per_shard=args.rows_per_shard, dtype=args.dtype,
                         resume=args.resume, overwrite=args.overwrite, max_error_rate=args.max_error_rate,
                         workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                         cpus_per_worker=args.cpus_per_worker, decode=args.decode, executor=args.executor)
    cluster.configure(args.address)  # no Ray yet: embed checks the config first, then picks where it runs
    embed(config)


def add_eval_flags(p: argparse.ArgumentParser, within: tuple[registry.Suite, ...]) -> None:
    """The flags of `eval`, and of `eval-biovita` and `eval-zeroshot`: the same command limited to their tasks."""
    names = [n for suite in within for n in suite.tasks]
    if len(names) > 1:
        p.add_argument("--tasks", default=registry.ALL,
                       help=f"comma-separated mteb task names, or {registry.ALL} (default): "
                            + ", ".join(names[:3]) + ", ...")
    add_sources_flag(p, "where the tasks' data is read: ")
    p.add_argument("--image-embeddings", type=flags.existing_list,
                   help="embed output(s), comma-separated, of the images: keyed by BioVITA's corpus id, "
                        "<slug>/<split>/<index> for the eval splits (what build --split eval writes) and, for the "
                        "linear probe, <slug>/<index> for its train rows (mieb-train's keys)")
    p.add_argument("--text-embeddings", type=flags.existing,
                   help="embed output of the query texts, prompts and captions, keyed by the text itself")
    p.add_argument("--model", type=flags.model,
                   help="instead of the two embedding flags: embed what the tasks need with this model first "
                        "(reused only when made from the same model commit or files, input and settings)")
    p.add_argument("--revision", default=None, help="hub commit of --model")
    p.add_argument("--out", required=True, type=flags.output,
                   help="output folder: <Task>.json per task (mteb's TaskResult layout), report.html, per-query ranks "
                        "or predictions")
    for setting in dict.fromkeys(s for suite in within for s in suite.settings):  # the suites' own settings
        p.add_argument(setting.flag, type=getattr(flags, setting.check), default=setting.default, help=setting.help)
    p.add_argument("--exclude", type=flags.existing_folder,
                   help="an audit output (mieb-ray audit --out): every task also scored without the eval images it "
                        "flagged (the linear probe also without the train rows it flagged), under mieb_ray.clean")
    p.add_argument("--results-dir", type=flags.output,
                   help="also write the TaskResults as mteb's results repository lays them out: "
                        "DIR/<org>__<model>/<revision>/<Task>.json and model_meta.json (docs/evals.md)")
    p.add_argument("--trained-on-mieb-train", action="store_true",
                   help="the model was trained on mieb-train: model_meta.json's training_datasets names the MIEB "
                        "tasks drawn from its sources, so a leaderboard does not count them as zero-shot")
    p.add_argument("--resume", action="store_true",
                   help="continue an unfinished run: skip the suites it scored from the same inputs and settings "
                        "(an unfinished output needs --resume or --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace complete results already at --out (their embeddings stay, reused when they fit)")
    add_mixed_models_flag(p)
    add_executor_flag(p)
    add_pool_flags(p, "with --model: ")
    p.set_defaults(run=run_eval, within=within)


def add_executor_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--executor", default="auto", choices=["auto", "ray", "local"],
                   help="where the work runs: ray, local (in this process, Ray never started) or auto (default): in "
                        "this process when no cluster was asked for and the work is small, else on Ray (the rule: "
                        "docs/architecture.md)")


def add_mixed_models_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-mixed-models", action="store_true",
                   help="score embeddings whose manifests name different models (name or revision), with a warning "
                        "(default: refused)")


def add_pool_flags(p: argparse.ArgumentParser, prefix: str = "") -> None:
    p.add_argument("--workers", type=flags.count, default=None,
                   help=f"{prefix}encoder actors, a fixed number (default: a pool from one per GPU up now to one per "
                        "GPU the cluster can grow to; on CPUs, one per 4 CPUs)")
    p.add_argument("--gpus-per-worker", type=flags.gpus, default=None,
                   help=f"{prefix}GPUs per encoder actor; 0 encodes on CPUs (default: 1 when the cluster has or can "
                        "add GPUs; CPUs only on a single machine without GPU and autoscaler, else an error)")
    p.add_argument("--cpus-per-worker", type=flags.cpus, default=None,
                   help=f"{prefix}CPUs (and torch threads) per encoder actor (default: 2 for a GPU encoder that "
                        "decodes JPEGs on its device, else 1)")


def run_eval(args: argparse.Namespace) -> None:
    selected = registry.select(getattr(args, "tasks", None), args.within)  # unknown names fail before Ray starts
    options = registry.Options(args.sources, args.exclude,
                               {s.name: getattr(args, s.name) for suite in args.within for s in suite.settings})
    cluster.configure(args.address)
    evaluate(selected, options, args.out, model=args.model, revision=args.revision, images=args.image_embeddings,
             texts=args.text_embeddings, allow_mixed_models=args.allow_mixed_models, executor=args.executor,
             results_dir=args.results_dir, trained_on_mieb_train=args.trained_on_mieb_train, resume=args.resume,
             overwrite=args.overwrite, pool=PoolRequest(args.workers, args.gpus_per_worker, args.cpus_per_worker))


def add_audit_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train", required=True, type=flags.existing,
                   help="a mieb-train output, or any Parquet/WebDataset table with key and image (local or s3://)")
    p.add_argument("--against", required=True, type=flags.tables,
                   help="'mieb' for the MIEB eval splits of the sources (read from --sources), 'self' for the "
                        "groups of --train's rows that are copies of each other (duplicates.parquet), or "
                        "comma-separated tables with key and image; a table's eval task is the last component of its "
                        "path")
    add_sources_flag(p, "with --against mieb, where the eval splits are read: ")
    p.add_argument("--out", required=True, type=flags.output,
                   help=f"output folder: {', '.join((PAIRS, SUMMARY, REPORT, AUDIT_ERRORS))}")
    p.add_argument("--model", type=flags.model,
                   help="find near-duplicates too: embed both sides with this CLIP model first (reused only when "
                        "made from the same model commit or files, input and settings)")
    p.add_argument("--revision", default=None, help="hub commit of --model")
    p.add_argument("--train-embeddings", type=flags.existing,
                   help="instead of --model: embed output of the train images, keyed as --train")
    p.add_argument("--against-embeddings", type=flags.existing,
                   help="instead of --model: embed output of the eval images, keyed as --against (mieb: "
                        "<slug>/<split>/<index>)")
    p.add_argument("--threshold", type=flags.cosine, default=None,
                   help="near-duplicate cosine, at or above which a pair is reported (default: 0.95)")
    p.add_argument("--resume", action="store_true", help="continue an unfinished run: skip the units it hashed")
    p.add_argument("--overwrite", action="store_true", help="replace a complete audit already at --out")
    add_mixed_models_flag(p)
    add_executor_flag(p)
    add_pool_flags(p, "with --model: ")


def run_audit(args: argparse.Namespace) -> None:
    config = AuditConfig(args.train, tuple(a for a in args.against.split(",") if a), args.out, sources=args.sources,
                         model=args.model, revision=args.revision, train_embeddings=args.train_embeddings,
                         against_embeddings=args.against_embeddings,
                         threshold=DEFAULT_THRESHOLD if args.threshold is None else args.threshold,
                         allow_mixed_models=args.allow_mixed_models, resume=args.resume, overwrite=args.overwrite,
                         workers=args.workers, gpus_per_worker=args.gpus_per_worker,
                         cpus_per_worker=args.cpus_per_worker, executor=args.executor)
    config.check()  # before Ray starts
    cluster.configure(args.address)
    audit(config)


def run_demo(args: argparse.Namespace) -> None:
    from mieb_ray.demo import (
        demo,  # here: its fixtures import transformers and datasets (seconds)
    )

    cluster.configure(args.address)
    demo(args.out, overwrite=args.overwrite)


def parser() -> argparse.ArgumentParser:
    address = "Ray cluster address, e.g. auto (default: RAY_ADDRESS, else a local Ray)"
    verbose = "print Ray's own logs and the libraries' progress bars too (default: the job's lines and errors)"
    p = flags.Parser(prog="mieb-ray", description=DESCRIPTION)
    p.add_argument("--version", action="version", version=f"mieb-ray {__version__}")
    p.add_argument("--address", default=None, help=address)
    p.add_argument("--verbose", action="store_true", help=verbose)
    # the same flags after the command (`mieb-ray build ... --address auto`); SUPPRESS keeps the one given before
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--address", default=argparse.SUPPRESS, help=address)
    common.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS, help=verbose)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help, parents=[common])

    b = command("build", help="build the mieb-train table from the catalog's sources")
    add_build_flags(b)
    b.set_defaults(run=run_build)
    c = command("check-sources", help="check every source in minutes, from file metadata: files, layout, "
                                      "columns, class names, rows; one table, exit 1 if any fails")
    add_check_flags(c)
    c.set_defaults(run=run_check)
    e = command("embed", help="encode the images (or texts) of a table with a CLIP model")
    add_embed_flags(e)
    e.set_defaults(run=run_embed)
    add_eval_flags(command("eval", help="score embeddings on MIEB tasks by mteb's names (--tasks; every one: "
                                        "docs/evals.md), equal to mteb's scores"),
                   registry.SUITES)
    add_eval_flags(command("eval-biovita", help="eval limited to BioVITA text-to-image taxon retrieval"),
                   (registry.BY_NAME["biovita"],))
    add_eval_flags(command("eval-zeroshot", help="eval limited to the MIEB zero-shot classification tasks, with "
                                                 "mteb's prompts and with fixed ones"), (registry.BY_NAME["zeroshot"],))
    a = command("audit", help=f"find the train rows that duplicate an eval image (detectors: {', '.join(DETECTORS)})")
    add_audit_flags(a)
    a.set_defaults(run=run_audit)
    d = command("demo", help="the whole flow on this machine from fixtures made on the spot: build, embed with a "
                             "tiny CLIP, eval BioVITA and a zero-shot task")
    d.add_argument("--out", default="mieb-demo", type=flags.output, help="output folder (default: ./mieb-demo)")
    d.add_argument("--overwrite", action="store_true", help="replace what an earlier run left in --out")
    d.set_defaults(run=run_demo)
    return p


def reference() -> str:
    """docs/cli.md: every command and flag as the parser defines them, the one place flags are documented
    (tests/test_docs.py keeps the page equal to this)."""
    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    lines = ["# Command-line reference", "",
             "Generated from the parser (`mieb_ray.cli.reference()`); `mieb-ray COMMAND --help` says the same.", ""]
    for name, command in commands.items():
        lines += [f"## mieb-ray {name}", "", command.description, "", "| flag | default | meaning |", "|---|---|---|"]
        for action in command._actions:
            if not action.option_strings or action.dest == "help":
                continue
            default = "" if action.default in (None, argparse.SUPPRESS, False) else f"`{action.default}`"
            flags = ", ".join(f"`{f}`" for f in action.option_strings)
            if action.choices:
                flags += " " + "\\|".join(f"`{c}`" for c in action.choices)
            lines.append(f"| {flags} | {default} | {(action.help or '').replace('|', chr(92) + '|')} |")
        lines.append("")
    return "\n".join(lines)


# Ray's lines that are no error of the job, as its driver writes them to this process's stderr: its C++ log
# (`[2026-12-02 21:16:56,714 E 6571 6571] core_worker.cc:2465: Actor with class name ... restart will fail ...`)
# and the raylets' warnings and retry notices (`(raylet) WARNING: 10 PYTHON worker processes have been started`,
# `(raylet) Task ... failed. There are infinite retries remaining, so the task will be retried`: a task that fails
# for good reaches the job as an exception); a raylet's other lines (a worker killed for memory, say) pass
_RAY_LINE = re.compile(rb"^(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWE] \d+ \d+\] [\w/.]+\.cc:\d+: |"
                       rb"(\x1b\[\d+m)?\(raylet(, ip=[\d.]+)?\)(\x1b\[0m)? (WARNING: |Task .* will be retried))")


@contextmanager
def quiet():
    """A job prints its own lines and Ray's errors, nothing else (--verbose keeps the rest). Ray's Python loggers,
    Ray Data's and the workers' output are runtime/cluster.py's; here, the tqdm bars of transformers and the hub
    (the workers' too: hubfs.WORKER_ENV), and the lines of Ray core's C++ log and the raylets' warnings that its
    driver writes straight to the stdout and stderr descriptors (among them an actor pool's 'restart will fail', an
    E line that is no error of the job: a failure reaches the job as an exception). Everything else passes, in
    order."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    if "transformers" in sys.modules:  # it read the variable at import
        sys.modules["transformers"].utils.logging.disable_progress_bar()
    with _filtered(2, sys.stderr), _filtered(1, sys.stdout):
        yield


@contextmanager
def _filtered(fd: int, stream):
    """Descriptor `fd` through a pipe whose lines pass unless they are Ray's (_RAY_LINE)."""
    stream.flush()
    saved, (read, write) = os.dup(fd), os.pipe()
    os.dup2(write, fd)
    os.close(write)

    def pump() -> None:
        with open(read, "rb", buffering=0) as lines:
            writable = True
            for line in lines:  # drained to the end even when the reader went away (`| head`): no writer blocks
                if writable and not _RAY_LINE.match(line):
                    try:
                        os.write(saved, line)
                    except OSError:
                        writable = False

    thread = threading.Thread(target=pump, name=f"mieb-fd{fd}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stream.flush()
        os.dup2(saved, fd)  # the pipe's last writer closes: the pump drains it and ends
        thread.join(timeout=5)
        os.close(saved)


def main(argv: list[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    if getattr(args, "resume", False) and getattr(args, "overwrite", False):
        command.exit(2, "mieb-ray: error: --resume and --overwrite exclude each other: --resume continues what is "
                        "there, --overwrite replaces it\n")
    cluster.set_verbose(args.verbose)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with nullcontext() if args.verbose else quiet(), cluster.own_ray(), \
                no_empty_folder_on_failure(getattr(args, "out", None)), surfaced():
            args.run(args)
    except KeyboardInterrupt:
        print("mieb-ray: interrupted; " + ("what was committed is complete, run again with --resume to finish"
                                           if hasattr(args, "resume") else  # check-sources, demo: start over
                                           f"{args.command} has no --resume: run it again"), file=sys.stderr)
        return 130
    except UserError as user:  # a user's mistake is one line; anything else keeps its traceback
        print(f"mieb-ray: error: {user}", file=sys.stderr)
        return 1
    return 0
