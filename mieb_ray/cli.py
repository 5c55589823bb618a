"""The command line: `mieb-ray COMMAND ...`, each command a job (DESCRIPTION), its flags checked by flags.py."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from contextlib import nullcontext

from mieb_ray import __version__, flags
from mieb_ray.audit.job import AuditConfig, audit
from mieb_ray.errors import UserError, surfaced
from mieb_ray.evals import benchmarks, registry
from mieb_ray.evals.job import EvalConfig, evaluate
from mieb_ray.formats import DETECTORS
from mieb_ray.pipelines import preflight
from mieb_ray.pipelines.build import BuildConfig, build
from mieb_ray.pipelines.embed import EmbedConfig, embed
from mieb_ray.runtime import cluster, quiet
from mieb_ray.runtime.output import no_empty_folder_on_failure
from mieb_ray.sources import SOURCES, select

DESCRIPTION = (f"mieb-ray: build the mieb-train CLIP training set from the {len(SOURCES)} MIEB zero-shot "
               "classification datasets, encode any image or text table with a CLIP model, score embeddings on MIEB "
               "tasks exactly as mteb does, and audit which train rows duplicate an eval image. Each command runs on "
               "this machine, or on a Ray cluster (--address, RAY_ADDRESS, `ray job submit`). Start with `mieb-ray "
               "demo`; every flag: docs/cli.md.")


def add_sources_flag(p: argparse.ArgumentParser, what: str = "") -> None:
    p.add_argument("--sources", "--data", dest="sources", default="hf", type=flags.sources,
                   help=f"{what}{flags.SOURCES_HELP}")


BUILD_FLAGS = ("sources", "out", "datasets", "fmt", "split", "rows_per_shard", "exclude", "exclude_detectors",
               "overwrite", "resume", "check_counts", "max_error_rate", "workers", "cpus_per_worker", "executor")


def run_context(args: argparse.Namespace) -> cluster.RunContext:
    """The command's Ray (--address, --verbose), handed to its job: one per command, no module state."""
    return cluster.RunContext(args.address, args.verbose)


def _interrupt(signum, frame):
    """Ctrl-C, and the SIGTERM of `ray job stop` and `kill`: unwind as for Ctrl-C, staged files removed. The tasks
    the job abandons may fail as Ray tears them down (a commit task's "not callable", a cancel's "no owner");
    Ray would print each such error no one fetched, after the command's own line: they are not the job's."""
    os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"  # read by Ray's driver at each report
    raise KeyboardInterrupt


def run_build(args: argparse.Namespace) -> None:
    config = BuildConfig(**flags.values(args, BuildConfig))
    config.check()
    select(args.datasets)  # an unknown name fails here, before Ray starts
    build(config, ctx=run_context(args))


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


EMBED_FLAGS = ("input", "out", "model", "revision", "modality", "image_column", "text_column", "key_column",
               "carry_columns", "batch_size", "rows_per_shard", "dtype", "raw", "exact", "resume", "overwrite",
               "max_error_rate", "decode", "compile", "executor", "workers", "gpus_per_worker", "cpus_per_worker")


def run_embed(args: argparse.Namespace) -> None:
    config = EmbedConfig(**flags.values(args, EmbedConfig))
    embed(config, ctx=run_context(args))  # no Ray yet: embed checks the config first, then picks where it runs


def add_eval_flags(p: argparse.ArgumentParser, within: tuple[registry.Suite, ...]) -> None:
    """The flags of `eval`, and of `eval-biovita` and `eval-zeroshot`: the same command limited to their tasks."""
    names = [n for suite in within for n in suite.tasks]
    if len(names) > 1:
        p.add_argument("--tasks", default=registry.ALL,
                       help=f"comma-separated mteb task names or MIEB benchmark names, or {registry.ALL} "
                            "(default): " + ", ".join(names[:3]) + ", ..."
                            + (f"; {', '.join(benchmarks.BENCHMARKS)}" if within == registry.SUITES else ""))
    add_sources_flag(p, "where the tasks' data is read: ")
    flags.add_flags(p, EvalConfig, ("images", "texts", "model", "revision", "out"))
    for setting in dict.fromkeys(s for suite in within for s in suite.settings):  # the suites' own settings
        p.add_argument(setting.flag, type=getattr(flags, setting.check), default=setting.default, help=setting.help)
    p.add_argument("--exclude", type=flags.existing_folder,
                   help="an audit output (mieb-ray audit --out): every task also scored without the eval images it "
                        "flagged (the linear probe also without the train rows it flagged), under mieb_ray.clean")
    flags.add_flags(p, EvalConfig, ("fast", "results_dir", "trained_on_mieb_train", "resume", "overwrite",
                                    "allow_mixed_models", "executor", "workers", "gpus_per_worker", "cpus_per_worker"))
    p.set_defaults(run=run_eval, within=within)


def run_eval(args: argparse.Namespace) -> None:
    selected = registry.select(getattr(args, "tasks", None), args.within)  # unknown names fail before Ray starts
    options = registry.Options(args.sources, args.exclude,
                               {s.name: getattr(args, s.name) for suite in args.within for s in suite.settings})
    settings = flags.values(args, EvalConfig)
    evaluate(selected, options, settings.pop("out"), ctx=run_context(args), **settings)


AUDIT_FLAGS = ("train", "against", "sources", "out", "model", "revision", "train_embeddings", "against_embeddings",
               "threshold", "resume", "overwrite", "allow_mixed_models", "executor", "workers", "gpus_per_worker",
               "cpus_per_worker")


def run_audit(args: argparse.Namespace) -> None:
    config = AuditConfig(**flags.values(args, AuditConfig))
    config.check()  # before Ray starts
    audit(config, ctx=run_context(args))


def run_demo(args: argparse.Namespace) -> None:
    from mieb_ray.demo import (
        demo,  # here: its data (demo_data/) imports transformers and datasets (seconds)
    )

    demo(args.out, overwrite=args.overwrite, ctx=run_context(args))


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
    flags.add_flags(b, BuildConfig, BUILD_FLAGS)
    b.set_defaults(run=run_build)
    c = command("check-sources", help="check every source in minutes, from file metadata: files, layout, "
                                      "columns, class names, rows; one table, exit 1 if any fails")
    add_check_flags(c)
    c.set_defaults(run=run_check)
    e = command("embed", help="encode the images (or texts) of a table with a CLIP model")
    flags.add_flags(e, EmbedConfig, EMBED_FLAGS)
    e.set_defaults(run=run_embed)
    add_eval_flags(command("eval", help="score embeddings on MIEB tasks by mteb's names (--tasks; every one: "
                                        "docs/evals.md), equal to mteb's scores"),
                   registry.SUITES)
    add_eval_flags(command("eval-biovita", help="eval limited to BioVITA text-to-image taxon retrieval"),
                   (registry.BY_NAME["biovita"],))
    add_eval_flags(command("eval-zeroshot", help="eval limited to the MIEB zero-shot classification tasks, with "
                                                 "mteb's prompts and with fixed ones"), (registry.BY_NAME["zeroshot"],))
    a = command("audit", help=f"find the train rows that duplicate an eval image (detectors: {', '.join(DETECTORS)})")
    flags.add_flags(a, AuditConfig, AUDIT_FLAGS)
    a.set_defaults(run=run_audit)
    d = command("demo", help="the whole flow on this machine from fixtures made on the spot: build, embed with a "
                             "tiny CLIP, eval BioVITA and a zero-shot task")
    d.add_argument("--out", default="mieb-demo", type=flags.output, help="output folder (default: ./mieb-demo)")
    d.add_argument("--overwrite", action="store_true", help="replace what an earlier run left in --out")
    d.set_defaults(run=run_demo)
    return p


def reference() -> str:
    """docs/cli.md: every command and flag as the parser defines them, the one place flags are documented
    (tests/repo/test_docs.py keeps the page equal to this)."""
    return flags.reference(parser())


def main(argv: list[str] | None = None) -> int:
    command = parser()
    args = command.parse_args(argv)
    if getattr(args, "resume", False) and getattr(args, "overwrite", False):
        command.exit(2, "mieb-ray: error: --resume and --overwrite exclude each other: --resume continues what is "
                        "there, --overwrite replaces it\n")
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    done = False
    try:
        with nullcontext() if args.verbose else quiet.quiet(), cluster.own_ray(), \
                no_empty_folder_on_failure(getattr(args, "out", None)), surfaced():
            args.run(args)
            done = True
    except KeyboardInterrupt:
        if done:  # only the teardown (Ray's shutdown) was cut short: the output is complete, --resume would refuse it
            return 0
        print("mieb-ray: interrupted; " + ("what was committed is complete, run again with --resume to finish"
                                           if hasattr(args, "resume") else  # check-sources, demo: start over
                                           f"{args.command} has no --resume: run it again"), file=sys.stderr)
        return 130
    except UserError as user:  # a user's mistake is one line; anything else keeps its traceback
        print(f"mieb-ray: error: {user}", file=sys.stderr)
        return 1
    return 0
