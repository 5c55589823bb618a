"""A BioVITA-shaped mirror of `myang333/BioVITAT2IRetrieval`: the demo's, which the tests and benchmarks build on.

make_biovita_mirror(root) writes ROOT/myang333/BioVITAT2IRetrieval/ as `push_to_hub(config_name=...)` left the
hub repo (README front matter with `configs:` and `dataset_info:`, `<config>/test-00000-of-00001.parquet` with HF
features), plus the `.cache/` a `--local-dir` download leaves. Both subsets share one corpus of photos (same ids,
taxon at species vs genus level), as the real data does.

The data is small but has every awkward case of the real benchmark:
- 100 candidate taxa per query, pools of over 1,000 photos (mteb keeps the top 1,000 documents);
- groups of 1 photo (a genus of one species of one photo) and of 95 photos (a genus of 7 species);
- taxa without photos among the candidates (score -inf: ranked last, in candidate order);
- a genus asked by several queries (one text, several ids, different candidate lists);
- query ids "0", "1", ... in both subsets;
- exact ties: the same photo under several ids in different taxa, with identical embeddings. Species query
  `ties["species_query"]` has its correct taxon tied at the top with an earlier and a later candidate
  (rank 2); genus `ties["genus"]` is asked three times, its tied rival before, after and not among the candidates.

The tests' make_biovita_embeddings (tests/support/embedding_fixtures.py) writes embeddings of it from its plan,
whose parameters are kept beside the mirror (SIDECAR); tests/support/biovita.py describes a plan's counts and
special cases.
"""

from __future__ import annotations

import functools
import io
import json
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import DatasetInfo, Features, Image, List, SplitDict, SplitInfo, Value
from datasets.info import DatasetInfosDict
from datasets.utils.metadata import MetadataConfigs
from huggingface_hub import DatasetCardData

from mieb_ray.demo_data.mirror import photo_names, record_download
from mieb_ray.demo_data.mirror import picture as fixture_picture
from mieb_ray.evals.biovita_data import REPO, REVISION, SPLIT, SUBSETS

CANDIDATES = 100
ROW_GROUP_ROWS = 100  # push_to_hub's row groups for image datasets
BIG_GENUS_SPECIES = (18, 16, 15, 14, 12, 11, 9)  # photos per species: a genus of 95 photos, species of at most 18
MULTI_GENERA = 10  # genera with 2-3 species
SINGLE_GENERA = 100  # genera with one species
EMPTY_GENERA = 3  # genera (one species each) without photos
EMPTY_SPECIES = 3  # more species without photos, in genera that have photos
RANDOM_DUPLICATES = 4  # photos filed again under another id in another species (the real corpus has 22)
SIDECAR = ".cache/mieb-ray/biovita-fixture.json"  # the plan's parameters, for make_biovita_embeddings(root)
_PREFIXES = ("Acro", "Bra", "Cal", "Dendro", "Eu", "Gla", "Hali", "Lepto", "Mega", "Micro", "Nycti", "Ortho",
             "Phyllo", "Ptero", "Rhyncho", "Sphen", "Tricho", "Xeno", "Zo", "Chloro", "Melano", "Poly")
_SUFFIXES = ("ptera", "myia", "cephalus", "dactylus", "phis", "saurus", "gale", "nota", "rhina", "stoma", "pus",
             "derma", "cnemis", "ornis")
_EPITHETS = ("alba", "nigra", "viridis", "minor", "major", "borealis", "australis", "montana", "sylvatica",
             "palustris", "maculata", "gracilis", "robusta", "vulgaris", "elegans", "fusca", "rufa", "lutea",
             "caerulea", "striata", "occidentalis", "orientalis", "pulchra", "tenuis")


@dataclass
class Plan:
    genus_of: dict[str, str]  # every species -> its genus (species without photos too)
    photos: list[tuple[str, tuple[str, int]]]  # corpus id (= index) -> (species, picture: (base genus, number))
    queries: dict[str, list[tuple[str, str, list[str]]]]  # subset -> (text, correct taxon, candidates)
    ties: dict = field(default_factory=dict)  # tied photos: corpus ids and the text their vector copies
    notes: dict = field(default_factory=dict)


def _names(rng: random.Random, n_genera: int) -> list[str]:
    genera = [p + s for p in _PREFIXES for s in _SUFFIXES]
    rng.shuffle(genera)
    return ["Poa", "Pseudochlorops"] + genera[:n_genera - 2]  # 3 and 14 characters: the real extremes


@functools.cache
def make_plan(species_queries: int, genus_queries: int, seed: int, single_genera: int = SINGLE_GENERA) -> Plan:
    if species_queries < 3 or genus_queries < 6:
        raise ValueError("the fixture needs at least 3 species queries and 6 genus queries for its special cases")
    rng = random.Random(f"biovita/{seed}")
    n_genera = 1 + 1 + MULTI_GENERA + single_genera + EMPTY_GENERA
    genera = _names(rng, n_genera)
    big, single, empty_genera = genera[0 + 2], genera[1 + 2], genera[-EMPTY_GENERA:]
    species_count = {big: len(BIG_GENUS_SPECIES), single: 1}
    for g in genera[4:4 + MULTI_GENERA]:
        species_count[g] = rng.choice((2, 3))
    for g in genera[:2] + genera[4 + MULTI_GENERA:]:
        species_count.setdefault(g, 1)
    genus_of, photo_count = {}, {}
    for g, n in species_count.items():
        epithets = rng.sample(_EPITHETS, n)
        for k, e in enumerate(epithets):
            s = f"{g} {e}"
            genus_of[s] = g
            if g in empty_genera:
                photo_count[s] = 0
            elif g == big:
                photo_count[s] = BIG_GENUS_SPECIES[k]
            elif g == single:
                photo_count[s] = 1
            else:
                photo_count[s] = rng.randint(3, 18)
    empty_species = [s for s, g in genus_of.items() if g in empty_genera]
    for g in rng.sample(genera[4:4 + MULTI_GENERA], EMPTY_SPECIES):  # one species of a multi-species genus:
        s = next(s for s in genus_of if genus_of[s] == g)  # the genus keeps photos
        photo_count[s] = 0
        empty_species.append(s)
    with_photos = [s for s in genus_of if photo_count[s] > 0]
    genera_with_photos = sorted({genus_of[s] for s in with_photos})

    # Photos: each genus has its own base picture (its species look alike), crops vary per photo.
    photos = [(s, (genus_of[s], rng.randrange(8))) for s in with_photos for _ in range(photo_count[s])]
    rng.shuffle(photos)  # ids scattered over taxa

    def first_photo(s: str) -> int:
        return next(i for i, (sp, _) in enumerate(photos) if sp == s)

    def plain(s: str) -> bool:  # a species of an ordinary genus, with at least 3 photos
        return genus_of[s] not in (big, single) and photo_count[s] >= 3

    ordinary = [s for s in with_photos if plain(s)]
    # the species tie: one photo of A, E and L each, the same picture, its vector A's text
    tie_a, tie_e, tie_l = rng.sample([s for s in ordinary if species_count[genus_of[s]] == 1], 3)
    picture = photos[first_photo(tie_a)][1]
    species_tie = [first_photo(s) for s in (tie_a, tie_e, tie_l)]
    for i in species_tie:
        photos[i] = (photos[i][0], picture)
    # the genus tie: genera G and H share one photo whose vector is G's text
    used = {genus_of[s] for s in (tie_a, tie_e, tie_l)}
    tie_g, tie_h = rng.sample([g for g in genera_with_photos if g not in used | {big, single}], 2)
    g_photo = first_photo(next(s for s in with_photos if genus_of[s] == tie_g))
    h_photo = first_photo(next(s for s in with_photos if genus_of[s] == tie_h))
    photos[h_photo] = (photos[h_photo][0], photos[g_photo][1])
    # random duplicates: a photo filed again, as a new id, under a species of another genus
    duplicates = []
    tied = set(species_tie) | {g_photo, h_photo}
    for _ in range(RANDOM_DUPLICATES):
        src = rng.choice([i for i in range(len(photos)) if i not in tied])
        other = rng.choice([s for s in ordinary if genus_of[s] != genus_of[photos[src][0]]])
        photos.append((other, photos[src][1]))
        duplicates.append((src, len(photos) - 1))

    def candidates(correct: str, pool: list[str], empty: list[str], before=None, after=None, absent=None):
        n_empty = rng.randint(1, min(3, len(empty)))
        others = [t for t in pool if t not in (correct, before, after, absent)]
        fixed = [t for t in (before, after) if t]
        cands = rng.sample(others, CANDIDATES - 1 - n_empty - len(fixed)) + rng.sample(empty, n_empty)
        rng.shuffle(cands)
        lo = 1 if before else 0
        hi = CANDIDATES - 1 - len(fixed) - (1 if after else 0)
        pos = rng.randint(lo, hi)
        cands.insert(pos, correct)
        if before:
            cands.insert(rng.randint(0, pos - 1), before)
            pos += 1
        if after:
            cands.insert(rng.randint(pos + 1, len(cands)), after)
        assert len(cands) == CANDIDATES == len(set(cands))
        return cands

    # species queries: each species at most once; the special ones first, then shuffled
    specials = [tie_a, next(s for s in with_photos if genus_of[s] == single),
                next(s for s in with_photos if genus_of[s] == big)]
    rest = [s for s in with_photos if s not in specials and s not in (tie_e, tie_l)]
    if species_queries > len(specials) + len(rest):
        raise ValueError(f"the fixture has {len(specials) + len(rest)} species to query")
    chosen = specials + rng.sample(rest, species_queries - len(specials))
    species_q = [(s, s, candidates(s, with_photos, empty_species, *((tie_e, tie_l) if s == tie_a else ())))
                 for s in chosen]
    # genus queries: G three times (H before, after, absent), the 95-photo genus twice, the 1-photo genus,
    # then genera drawn with replacement (the real subset asks 208 genera 289 times)
    g_empty = list(empty_genera)
    genus_q = [(tie_g, tie_g, candidates(tie_g, genera_with_photos, g_empty, before=tie_h)),
               (tie_g, tie_g, candidates(tie_g, genera_with_photos, g_empty, after=tie_h)),
               (tie_g, tie_g, candidates(tie_g, genera_with_photos, g_empty, absent=tie_h))]
    drawn = [big, big, single] + [rng.choice(genera_with_photos[:max(3, round((genus_queries - 6) / 1.4))])
                                  for _ in range(genus_queries - 6)]
    genus_q += [(g, g, candidates(g, genera_with_photos, g_empty)) for g in drawn]

    order = {subset: list(range(len(q))) for subset, q in (("unseen_species", species_q), ("unseen_genus", genus_q))}
    for o in order.values():
        rng.shuffle(o)
    queries = {"unseen_species": [species_q[i] for i in order["unseen_species"]],
               "unseen_genus": [genus_q[i] for i in order["unseen_genus"]]}
    ties = {
        "species_query": str(order["unseen_species"].index(0)),  # its correct taxon ranks 2nd on an exact tie
        "species_photos": [str(i) for i in species_tie],  # photos of A, E, L: vector = A's text
        "species_taxa": [tie_a, tie_e, tie_l],
        "genus": tie_g, "genus_rival": tie_h,
        "genus_photos": [str(g_photo), str(h_photo)],  # vector = G's text
        "genus_queries": {k: str(order["unseen_genus"].index(i))  # rival before: rank 2; after, absent: rank 1
                          for i, k in enumerate(("rival_before", "rival_after", "rival_absent"))},
        "duplicates": [[str(a), str(b)] for a, b in duplicates],
    }
    notes = {"big_genus": big, "single_genus": single, "single_species": specials[1],
             "empty_genera": list(empty_genera), "empty_species": empty_species}
    return Plan(genus_of, photos, queries, ties, notes)


# ---------------------------------------------------------------------------------------------- data


def _taxon(plan: Plan, subset: str, species: str) -> str:
    return species if subset == "unseen_species" else plan.genus_of[species]


def photos_by_taxon(plan: Plan, subset: str) -> dict[str, list[str]]:
    """taxon -> its corpus ids, in the order the photos were listed (not id order)."""
    groups: dict[str, list[str]] = {}
    for i, (s, _) in enumerate(plan.photos):
        groups.setdefault(_taxon(plan, subset, s), []).append(str(i))
    return groups


@functools.cache
def _photo(picture: tuple[str, int]) -> bytes:
    """A small JPEG crop of a genus's base picture (its species look alike); one of 8 crops per genus."""
    genus, number = picture
    names = photo_names()
    rng = random.Random(f"{genus}/{number}")
    picture = fixture_picture(names[sum(map(ord, genus)) % len(names)])
    side = rng.randint(64, 112)
    crop = rng.uniform(0.35, 0.8) * min(picture.size)
    x, y = rng.uniform(0, picture.width - crop), rng.uniform(0, picture.height - crop)
    image = picture.resize((side, side), box=(x, y, x + crop, y + crop))
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def _features(kind: str) -> Features:
    string = Value("string")
    return Features({
        "corpus": {"id": string, "image": Image(), "taxon": string},
        "queries": {"id": string, "text": string, "correct_taxon": string, "candidate_taxa": List(string)},
        "qrels": {"query-id": string, "corpus-id": string, "score": Value("int64")},
        "top_ranked": {"query-id": string, "corpus-ids": List(string)},
    }[kind])


def _tables(plan: Plan, subset: str, with_images: bool) -> dict[str, dict[str, list]]:
    groups = photos_by_taxon(plan, subset)
    photo_ids = [str(i) for i in range(len(plan.photos))]
    images = [{"bytes": _photo(picture), "path": f"{i}.jpg"} if with_images else None
              for i, (_, picture) in enumerate(plan.photos)]
    queries = plan.queries[subset]
    qids = [str(i) for i in range(len(queries))]
    qrels = [(q, d) for q, (_, correct, _) in zip(qids, queries) for d in sorted(groups[correct], key=int)]
    ranked = [(q, [d for t in cands for d in groups.get(t, [])]) for q, (_, _, cands) in zip(qids, queries)]
    random.Random(f"{subset}/top_ranked").shuffle(ranked)  # not in query order: readers align by id
    return {
        "corpus": {"id": photo_ids, "image": images,
                   "taxon": [_taxon(plan, subset, s) for s, _ in plan.photos]},
        "queries": {"id": qids, "text": [t for t, _, _ in queries], "correct_taxon": [c for _, c, _ in queries],
                    "candidate_taxa": [c for _, _, c in queries]},
        "qrels": {"query-id": [q for q, _ in qrels], "corpus-id": [d for _, d in qrels], "score": [1] * len(qrels)},
        "top_ranked": {"query-id": [q for q, _ in ranked], "corpus-ids": [p for _, p in ranked]},
    }


def _write_card(repo: Path, infos: dict[str, DatasetInfo]) -> None:
    """README.md front matter as push_to_hub(config_name=...) writes it: dataset_info and configs per config."""
    card = DatasetCardData()
    DatasetInfosDict(infos).to_dataset_card_data(card)
    MetadataConfigs({c: {"data_files": [{"split": SPLIT, "path": f"{c}/{SPLIT}-*"}]} for c in infos}
                    ).to_dataset_card_data(card)
    (repo / "README.md").write_text(f"---\n{card}\n---\n\n# BioVITA T2I (fixture)\n", encoding="utf-8")


def make_biovita_mirror(root: str | os.PathLike, species_queries: int = 30, genus_queries: int = 30, seed: int = 0,
                        with_images: bool = True, single_genera: int = SINGLE_GENERA) -> dict:
    """Write ROOT/myang333/BioVITAT2IRetrieval/ in the hub layout (both subsets); return where (root, repo) and
    with what (params, with_images).

    single_genera: how many one-species genera the corpus holds besides the special ones (about 10 photos
    each): 100 gives 1,329 photos; 250 gives the real benchmark's scale (about 2,900 photos, 290 species)."""
    plan = make_plan(species_queries, genus_queries, seed, single_genera)
    repo = Path(root) / REPO
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    written, infos = [], {}
    for subset in SUBSETS:
        for kind, columns in _tables(plan, subset, with_images).items():
            config, features = f"{subset}-{kind}", _features(kind)
            table = pa.Table.from_pydict(columns, schema=features.arrow_schema)  # with the `huggingface` metadata
            name = f"{config}/{SPLIT}-00000-of-00001.parquet"
            (repo / config).mkdir()
            pq.write_table(table, repo / name, row_group_size=ROW_GROUP_ROWS if kind == "corpus" else None)
            written.append(name)
            infos[config] = DatasetInfo(features=features, splits=SplitDict(), dataset_size=table.nbytes,
                                        download_size=(repo / name).stat().st_size)
            infos[config].splits.add(SplitInfo(name=SPLIT, num_bytes=table.nbytes, num_examples=table.num_rows))
    _write_card(repo, infos)
    record_download(repo, written + ["README.md"], REVISION)
    params = {"species_queries": species_queries, "genus_queries": genus_queries, "seed": seed,
              "single_genera": single_genera}
    (repo / SIDECAR).parent.mkdir(parents=True, exist_ok=True)
    (repo / SIDECAR).write_text(json.dumps(params) + "\n")
    return {"root": str(root), "repo": str(repo), "params": params, "with_images": with_images}

