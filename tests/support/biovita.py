"""What the tests know of the BioVITA-shaped mirror (mieb_ray/demo_data/biovita.py), and the loader they compare
with: one subset whole (queries, candidates, pools, qrels, the corpus' taxa), as mteb's harness
(support/mteb_reference.py) and the reimplementations in the tests take it; the eval job reads the same files its
own way (mieb_ray/evals/biovita_data.py)."""

from __future__ import annotations

from dataclasses import dataclass

from mieb_ray.demo_data.biovita import make_plan, photos_by_taxon
from mieb_ray.evals.biovita_data import SUBSETS, load_queries, pool_positions, read_corpus


@dataclass
class Subset:
    name: str
    corpus_ids: list[str]  # corpus `id`, file order
    corpus_taxa: list[str]  # corpus `taxon`, aligned
    query_ids: list[str]
    query_texts: list[str]
    correct_taxa: list[str]
    candidate_taxa: list[list[str]]  # 100 each, in the official order (the tie-break)
    top_ranked: list[list[str]]  # per query, aligned with query_ids: its pool of corpus ids, in order
    qrels: dict[str, dict[str, int]]  # as mteb loads them: only queries with qrels rows appear


def describe(mirror: dict) -> dict:
    """The counts and special cases of the mirror make_biovita_mirror returned (its plan, from its params)."""
    plan = make_plan(**mirror["params"])
    out = {"corpus": len(plan.photos), "ties": plan.ties, **plan.notes, "subsets": {}}
    for subset in SUBSETS:
        groups = photos_by_taxon(plan, subset)
        queries = plan.queries[subset]
        pools = [sum(len(groups.get(t, [])) for t in c) for _, _, c in queries]
        out["subsets"][subset] = {
            "queries": len(queries), "distinct_texts": len({t for t, _, _ in queries}),
            "taxa_with_photos": len(groups), "group_sizes": [min(map(len, groups.values())),
                                                             max(map(len, groups.values()))],
            "pool_sizes": [min(pools), max(pools)], "pools_over_1000": sum(p > 1000 for p in pools),
        }
    return out


def read_pools(data: str, subset: str, query_ids: list[str], corpus_ids: list[str]) -> list[list[str]]:
    """Each query's top_ranked pool of corpus ids, in order, aligned with query_ids (see pool_positions)."""
    indptr, positions = pool_positions(data, subset, query_ids, corpus_ids)
    return [[corpus_ids[p] for p in positions[a:b]] for a, b in zip(indptr[:-1], indptr[1:])]


def load_subset(data: str, subset: str) -> Subset:
    """One subset's queries, candidates, pools, qrels and the corpus id -> taxon map (no images)."""
    corpus_ids, corpus_taxa = read_corpus(data, subset)
    q = load_queries(data, subset)
    pools = read_pools(data, subset, q.query_ids, corpus_ids)
    return Subset(name=subset, corpus_ids=corpus_ids, corpus_taxa=corpus_taxa, query_ids=q.query_ids,
                  query_texts=q.query_texts, correct_taxa=q.correct_taxa, candidate_taxa=q.candidate_taxa,
                  top_ranked=pools, qrels=q.qrels)
