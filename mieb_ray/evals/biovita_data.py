"""The BioVITA text-to-image benchmark data (mteb `BioVITAT2IReranking`), read from the hub or a mirror.

The hub repo was written by `push_to_hub(config_name=...)`: per subset four configs
`{subset}-{corpus,queries,qrels,top_ranked}`, each a folder of `test-NNNNN-of-NNNNN*.parquet` files,
listed in the README's YAML `configs:`, resolved as `datasets` resolves them (io/datafiles.py). Only the
columns scoring needs are read: never the corpus images, except through read_images().
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mieb_ray import storage
from mieb_ray.errors import FormatError, UserError, first_line
from mieb_ray.io import datafiles

REPO = "myang333/BioVITAT2IRetrieval"
REVISION = "fa59ba155cc59354c388e454c705a93bb9d984ab"
SUBSETS = ("unseen_species", "unseen_genus")
SPLIT = "test"
TASK = "BioVITAT2IReranking"
KINDS = ("corpus", "queries", "qrels", "top_ranked")
HF = "hf"


class BioVITAError(UserError):
    pass


# ---------------------------------------------------------------------------------------------- files


def repo_root(data: str) -> str:
    """The hub at the pinned revision ("hf"), or ROOT/<org>/<repo> of a mirror (local or s3://)."""
    if data == HF:
        return f"hf://datasets/{REPO}@{REVISION}"
    return storage.join(data, REPO)


def _config_files(repo: datafiles.Repo, config: str) -> list[str]:
    """`config`'s test-split parquet files, as `datasets.load_dataset(REPO, config)` reads them (the card's
    `configs`, io/datafiles.py); none, or a config it cannot resolve: a one-line error. Only the configs a reader
    takes are matched against the repo's listing (all eight each time had been most of a read's setup)."""
    try:
        files = list(repo.files(config).splits.get(SPLIT, ()))
    except FormatError:
        files = []
    if not files:
        subset = config.rsplit("-", 1)[0]
        raise BioVITAError(f"BioVITA subset {subset}: no files for config {config} under "
                           f"{storage.display(repo.root)}")
    return files


def _check_subset(subset: str) -> None:
    if subset not in SUBSETS:
        raise BioVITAError(f"unknown BioVITA subset {subset!r}; valid: {', '.join(SUBSETS)}")


def config_files(data: str, config: str) -> list[str]:
    """The parquet files of `config`'s test split, in order."""
    return _config_files(datafiles.Repo(repo_root(data)), config)


def corpus_files(data: str, subset: str) -> list[str]:
    """The corpus files (columns id, image, taxon), for embedding the images."""
    _check_subset(subset)
    return config_files(data, f"{subset}-corpus")


# ---------------------------------------------------------------------------------------------- reading


def _read(files: list[str], columns: list[str]) -> pa.Table:
    """Only `columns` of the files, concatenated in order (column projection: other columns are not read)."""
    tables = []
    for uri in files:
        try:
            with storage.open_input(uri) as f:
                tables.append(pq.ParquetFile(f).read(columns=columns))
        except (pa.ArrowInvalid, KeyError) as exc:
            raise BioVITAError(f"cannot read columns {', '.join(columns)} of {storage.display(uri)}: "
                               f"{first_line(exc)}") from exc
    return pa.concat_tables(tables)


def _strings(table: pa.Table, column: str) -> list[str]:
    return [None if v is None else str(v) for v in table[column].to_pylist()]


@dataclass
class Queries:
    """One subset's query side: what the eval driver holds (no corpus, no pools)."""

    name: str
    query_ids: list[str]
    query_texts: list[str]
    correct_taxa: list[str]
    candidate_taxa: list[list[str]]  # 100 each, in the official order (the tie-break)
    qrels: dict[str, dict[str, int]]  # as mteb loads them: only queries with qrels rows appear


def _found(data: str, subset: str):
    _check_subset(subset)
    repo = datafiles.Repo(repo_root(data))  # its card read once for the configs asked
    return lambda kind: _config_files(repo, f"{subset}-{kind}")


def _check_unique(ids: list[str], subset: str, kind: str) -> None:
    if len(set(ids)) != len(ids):
        dup = next(i for i, n in Counter(ids).items() if n > 1)
        raise BioVITAError(f"BioVITA subset {subset}: id {dup!r} appears twice in config {subset}-{kind}")


def read_corpus(data: str, subset: str) -> tuple[list[str], list[str]]:
    """The corpus ids and their taxa, in file order (never the images)."""
    corpus = _read(_found(data, subset)("corpus"), ["id", "taxon"])
    ids = _strings(corpus, "id")
    _check_unique(ids, subset, "corpus")
    return ids, _strings(corpus, "taxon")


def load_queries(data: str, subset: str) -> Queries:
    """The queries, their candidate taxa and the qrels: the query side, without the corpus or the pools."""
    files = _found(data, subset)
    where = f"BioVITA subset {subset}"
    queries = _read(files("queries"), ["id", "text", "correct_taxon", "candidate_taxa"])
    qrels_t = _read(files("qrels"), ["query-id", "corpus-id", "score"])
    query_ids = _strings(queries, "id")
    if not query_ids:
        raise BioVITAError(f"{where}: no queries in config {subset}-queries")
    _check_unique(query_ids, subset, "queries")
    texts, correct = _strings(queries, "text"), _strings(queries, "correct_taxon")
    candidates = queries["candidate_taxa"].to_pylist()
    for qid, taxon, cands in zip(query_ids, correct, candidates):
        if taxon not in (cands or []):
            raise BioVITAError(f"{where}: query {qid!r}: correct taxon {taxon!r} is not among its "
                               f"{len(cands or [])} candidate taxa")
    qrels: dict[str, dict[str, int]] = {}
    for qid, doc, score in zip(_strings(qrels_t, "query-id"), _strings(qrels_t, "corpus-id"),
                               qrels_t["score"].to_pylist()):
        qrels.setdefault(qid, {})[doc] = int(score)
    return Queries(subset, query_ids, texts, correct, [list(c) for c in candidates], qrels)


def pool_positions(data: str, subset: str, query_ids: list[str], corpus_ids: list[str] | pa.Array
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Each query's top_ranked pool, aligned with query_ids, as CSR of positions in corpus_ids, in pool order:
    (indptr (q + 1,), positions). A query without a top_ranked row has an empty pool (as in mteb); of two rows
    for one query the last counts."""
    where = f"BioVITA subset {subset}"
    ranked = _read(_found(data, subset)("top_ranked"), ["query-id", "corpus-ids"])
    row_query = pc.index_in(pc.cast(ranked["query-id"], pa.string()), value_set=pa.array(query_ids, pa.string()))
    if row_query.null_count:
        qid = _strings(ranked, "query-id")[row_query.is_null().to_numpy(zero_copy_only=False).argmax()]
        raise BioVITAError(f"{where}: top_ranked has an entry for query {qid!r}, "
                           f"which is not in config {subset}-queries")
    pools = ranked["corpus-ids"].combine_chunks()
    offsets = pools.offsets.to_numpy().astype(np.int64)
    flat = pc.cast(pools.flatten(), pa.string())
    at = pc.index_in(flat, value_set=pa.array(corpus_ids, pa.string()) if isinstance(corpus_ids, list) else corpus_ids)
    if at.null_count:
        i = int(at.is_null().to_numpy(zero_copy_only=False).argmax())
        qid = _strings(ranked, "query-id")[int(np.searchsorted(offsets, i, side="right")) - 1]
        raise BioVITAError(f"{where}: the pool of query {qid!r} names corpus id {flat[i].as_py()!r}, "
                           f"which is not in config {subset}-corpus")
    at = at.to_numpy().astype(np.int64)
    row_of = np.full(len(query_ids), -1)
    row_of[row_query.to_numpy()] = np.arange(len(ranked))  # the last row of a query wins
    sizes = np.where(row_of >= 0, np.diff(offsets)[row_of], 0)
    take = np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in row_of if r >= 0] or [np.zeros(0, int)])
    return np.r_[0, np.cumsum(sizes)].astype(np.int64), at[take]


def read_images(data: str, subset: str, ids: set[str]) -> dict[str, bytes]:
    """The image bytes of some corpus ids (ids not in the corpus are left out). Reads the image column
    only of the row groups that hold a wanted id."""
    wanted, out = {str(i) for i in ids}, {}
    for uri in corpus_files(data, subset):
        if len(out) == len(wanted):
            break
        with storage.open_input(uri) as f:
            pf = pq.ParquetFile(f)
            for group in range(pf.num_row_groups):
                group_ids = _strings(pf.read_row_group(group, columns=["id"]), "id")
                rows = [i for i, d in enumerate(group_ids) if d in wanted and d not in out]
                if not rows:
                    continue
                images = pf.read_row_group(group, columns=["image"])["image"]
                for i in rows:
                    value = images[i].as_py()
                    if value is not None and value.get("bytes") is not None:
                        out[group_ids[i]] = value["bytes"]
    return out


# ---------------------------------------------------------------------------------------------- scoring inputs


def taxon_ids(taxa: list[str]) -> tuple[list[str], np.ndarray]:
    """The sorted taxon vocabulary and each corpus photo's taxon id (its group)."""
    vocabulary = sorted(set(taxa))
    index = {t: i for i, t in enumerate(vocabulary)}
    return vocabulary, np.array([index[t] for t in taxa], dtype=np.int64)


def candidate_groups(candidate_taxa: list[list[str]], vocabulary: list[str]) -> np.ndarray:
    """(q, 100) taxon ids of each query's candidates, in its order; -1 for a taxon without photos."""
    index = {t: i for i, t in enumerate(vocabulary)}
    return np.array([[index.get(t, -1) for t in c] for c in candidate_taxa], dtype=np.int64).reshape(
        len(candidate_taxa), -1)


def pool_csr(indptr: np.ndarray, positions: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Pools as CSR with each query's distinct docs ascending (docs = positions in a corpus of n_docs)."""
    query = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr))
    pairs = np.sort(query * n_docs + positions)  # a sort, not np.unique: its hash table is 10x slower here
    pairs = pairs[np.r_[True, pairs[1:] != pairs[:-1]]] if len(pairs) else pairs
    return np.searchsorted(pairs // n_docs, np.arange(len(indptr))).astype(np.int64), pairs % n_docs
