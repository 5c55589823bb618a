"""Captions of the 23 sources, checked on the real class lists shipped in mieb_ray/sources/labels/ (no Ray).

Each test names the caption rule it covers (the brief's rules 1-12; reference: mieb-train-sources.md
sections 2-4 and 6).
"""

from __future__ import annotations

import dataclasses
import random
import re
from importlib import resources

import pyarrow as pa
import pytest

from mieb_ray.captions import (
    ClassTable,
    class_table,
    clean_caption,
    clean_captions,
    indefinite_article,
    words,
)
from mieb_ray.sources import SOURCES, by_slug, read_labels
from mieb_ray.sources.catalog import AS_IS, CAMEL, HUB, PATH, SNAKE

HUB_SLUGS = ["ucf101", "sun397", "food101", "mnist", "cifar10", "cifar100", "resisc45", "birdsnap", "stanfordcars",
             "stl10", "dtd", "oxfordpets", "caltech101"]
# used only while hub/birdsnap.txt is not in the repo
BIRDSNAP_FALLBACK = ["Eurasian Wigeon", "European Starling", "Osprey", "Indigo Bunting", "Cooper's Hawk"]


def _has_hub_file(slug: str) -> bool:
    return resources.files("mieb_ray.sources").joinpath("labels", "hub", f"{slug}.txt").is_file()


def hub(slug: str) -> list[str]:
    """The ClassLabel names of a hub source, as saved in labels/hub/."""
    if slug == "birdsnap" and not _has_hub_file(slug):
        return list(BIRDSNAP_FALLBACK)
    return read_labels(f"hub/{slug}.txt")


def all_tables(hub_names: dict[str, list[str]]) -> dict[str, ClassTable]:
    """Every catalog source's table, in catalog order; hub_names by slug (needed for the `hub` sources)."""
    return {s.slug: class_table(s, hub_names.get(s.slug)) for s in SOURCES}


@pytest.fixture(scope="module")
def tables() -> dict[str, ClassTable]:
    return all_tables({slug: hub(slug) for slug in HUB_SLUGS})


def caption(tables, slug: str, name: str) -> str:
    t = tables[slug]
    return t.text[t.class_name.index(name)]


def test_hub_sources_are_the_expected_ones():
    assert sorted(s.slug for s in SOURCES if s.names == HUB) == sorted(HUB_SLUGS)


def test_every_source_has_a_table_of_the_right_size(tables):
    sizes = {"ucf101": 101, "imagenet1k": 1000, "scimmir": 5, "patchcamelyon": 2, "sun397": 397, "food101": 101,
             "clevr": 6, "clevr_count": 8, "mnist": 10, "cifar10": 10, "cifar100": 100, "country211": 211,
             "fer2013": 7, "gtsrb": 43, "resisc45": 45, "eurosat": 10, "stanfordcars": 196, "renderedsst2": 2,
             "stl10": 10, "dtd": 47, "oxfordpets": 37, "caltech101": 102,
             "birdsnap": 500 if _has_hub_file("birdsnap") else len(BIRDSNAP_FALLBACK)}
    assert list(tables) == [s.slug for s in SOURCES]
    for slug, t in tables.items():
        assert t.slug == slug
        n = sizes[slug]
        assert (len(t.source_names), len(t.class_name), len(t.text), len(t.keep)) == (n, n, n, n), slug


# --- rule 1: no newline from the template files ----------------------------------------------------------

def test_rule1_template_file_labels_carry_no_newline(tables):
    assert tables["imagenet1k"].text[0] == "a photo of tench."
    assert tables["patchcamelyon"].text == ("histopathology image of lymph node",
                                            "histopathology image of lymph node containing metastatic tumor tissue")
    assert tables["country211"].text[0] == "a photo showing the country of Andorra."
    assert tables["gtsrb"].text[14] == "a close up photo of a 'stop' traffic sign."
    for slug, t in tables.items():
        for s in t.source_names + t.class_name + t.text:
            assert "\n" not in s and "\r" not in s, (slug, s)


# --- rule 2: a / an --------------------------------------------------------------------------------------

@pytest.mark.parametrize("phrase, article", [
    ("airplane", "an"), ("bird", "a"), ("umbrella", "an"), ("underwater coral reef", "an"),
    ("unicycle", "a"), ("utility room", "a"), ("useful thing", "a"), ("usual suspect", "a"),
    ("euphonium", "a"), ("Eurasian Wigeon", "a"), ("European Starling", "a"), ("ewer", "a"),
    ("one-way street", "a"), ("once-famous place", "a"),
    ("hour glass", "an"), ("honest face", "an"), ("honor guard", "an"), ("heir", "an"),
    ("house", "a"), ("hedgehog", "a"), ("Havanese", "a"),
    ("AM General Hummer SUV 2000", "an"), ("BMW M3 Coupe 2012", "a"), ("GMC Savana Van 2012", "a"),
    ("FIAT 500 Abarth 2012", "a"), ("HUMMER H3T Crew Cab 2010", "a"), ("MINI Cooper Roadster Convertible 2012", "a"),
    ("smart fortwo Convertible 2012", "a"), ("Audi R8 Coupe 2012", "an"), ("Acura RL Sedan 2012", "an"),
    ("SUV", "an"), ("F-150", "an"), ("R8", "an"), ("US", "a"), ("UFO", "a"),
    ("80 kph speed limit", "an"), ("8", "an"), ("11", "an"), ("18", "an"), ("11000", "an"),
    ("1", "a"), ("100", "a"), ("110", "a"), ("0", "a"),
    ("'empty red and white circle'", "an"), ('"end / de-restriction"', "an"), ("(osprey)", "an"),
    ("angry", "an"), ("", "a"),
])
def test_rule2_indefinite_article(phrase, article):
    assert indefinite_article(phrase) == article


def test_rule2_examples_on_real_tables(tables):
    assert caption(tables, "cifar10", "airplane") == "a photo of an airplane."
    assert tables["stanfordcars"].text[0] == "a photo of an AM General Hummer SUV 2000."
    assert caption(tables, "caltech101", "euphonium") == "a photo of a euphonium."
    assert caption(tables, "caltech101", "ewer") == "a photo of a ewer."
    assert caption(tables, "caltech101", "accordion") == "a photo of an accordion."
    assert caption(tables, "sun397", "utility room") == "a photo of a utility room."
    assert caption(tables, "sun397", "underwater coral reef") == "a photo of an underwater coral reef."
    assert caption(tables, "birdsnap", "Eurasian Wigeon") == "a photo of a Eurasian Wigeon, a type of bird."
    assert caption(tables, "birdsnap", "European Starling") == "a photo of a European Starling, a type of bird."
    assert caption(tables, "birdsnap", "Osprey") == "a photo of an Osprey, a type of bird."
    assert caption(tables, "fer2013", "angry") == "a photo of an angry looking face."
    assert caption(tables, "gtsrb", "empty red and white circle") == \
        "a close up photo of an 'empty red and white circle' traffic sign."
    assert caption(tables, "gtsrb", "end / de-restriction of 80 kph speed limit") == \
        "a close up photo of an 'end / de-restriction of 80 kph speed limit' traffic sign."
    assert caption(tables, "oxfordpets", "Abyssinian") == "a photo of an Abyssinian, a type of pet."
    assert caption(tables, "stanfordcars", "FIAT 500 Abarth 2012") == "a photo of a FIAT 500 Abarth 2012."
    assert caption(tables, "stanfordcars", "smart fortwo Convertible 2012") == \
        "a photo of a smart fortwo Convertible 2012."
    cars = tables["stanfordcars"].text
    for make, article in [("BMW", "a"), ("HUMMER", "a"), ("MINI", "a"), ("GMC", "a"), ("Audi", "an"),
                          ("Acura", "an"), ("Aston Martin", "an"), ("Eagle", "an"), ("Infiniti", "an"),
                          ("Isuzu", "an"), ("Honda", "a"), ("Hyundai", "a")]:
        with_make = [c for c in cars if c.startswith(f"a photo of {article} {make} ")]
        assert with_make and len(with_make) == sum(f" {make} " in c for c in cars), make


# Hand-written: the names that take "an" in each table whose template has {a} (section 4.2). Every other
# name of these tables takes "a".
AN_NAMES = {
    "cifar10": {"airplane", "automobile"},
    "stl10": {"airplane"},
    "cifar100": {"apple", "aquarium fish", "elephant", "oak tree", "orange", "orchid", "otter"},
    "caltech101": {"accordion", "airplane", "off-center face", "anchor", "ant", "electric guitar", "elephant", "emu",
                   "ibis", "inline skate", "octopus", "okapi", "umbrella"},
    "sun397": {
        "abbey", "airplane cabin", "airport terminal", "alley", "amphitheater", "amusement arcade",
        "amusement park", "anechoic chamber", "apartment building outdoor", "apse indoor", "aquarium", "aqueduct",
        "arch", "archive", "arrival gate outdoor", "art gallery", "art school", "art studio", "assembly line",
        "athletic field outdoor", "atrium public", "attic", "auditorium", "auto factory",
        "electrical substation", "elevator door", "elevator interior", "elevator shaft", "engine room",
        "escalator indoor", "excavation",
        "ice cream parlor", "ice floe", "ice shelf", "ice skating rink indoor", "ice skating rink outdoor",
        "iceberg", "igloo", "industrial area", "inn outdoor", "islet",
        "oast house", "observatory outdoor", "ocean", "office", "office building", "oil refinery outdoor",
        "oilrig", "operating room", "orchard", "outhouse outdoor",
        "underwater coral reef"},
    "oxfordpets": {"Abyssinian", "American Bulldog", "American Pit Bull Terrier", "Egyptian Mau",
                   "English Cocker Spaniel", "English Setter"},
    "fer2013": {"angry"},
    "gtsrb": {"empty red and white circle", "end / de-restriction of 80 kph speed limit"},
    "scimmir": set(),  # figure of / table of
    "renderedsst2": set(),  # negative / positive
}
AN_MAKES = {"AM", "Acura", "Aston", "Audi", "Eagle", "Infiniti", "Isuzu"}  # stanfordcars, by first word


def _expected_an(slug: str, name: str) -> bool:
    if slug == "stanfordcars":
        return name.split()[0] in AN_MAKES
    if slug == "birdsnap":  # plain bird names: a vowel letter, except the "you"-sounding Eu...
        return name[0] in "AEIOU" and not name.startswith("Eu")
    return name in AN_NAMES[slug]


def test_rule2_every_article_on_all_tables(tables):
    with_article = [s for s in SOURCES if "{a}" in s.template]
    assert sorted(s.slug for s in with_article) == sorted(list(AN_NAMES) + ["stanfordcars", "birdsnap"])
    for s in with_article:
        t = tables[s.slug]
        if s.slug in AN_NAMES:
            assert AN_NAMES[s.slug] <= set(t.class_name), s.slug  # the hand list names real classes
        for name, text in zip(t.class_name, t.text):
            article = "an" if _expected_an(s.slug, name) else "a"
            assert text == s.template.format(a=article, name=name), (s.slug, name)
    counts = {slug: sum(c.startswith(("a photo of an ", "a close up photo of an ")) for c in tables[slug].text)
              for slug in ["cifar10", "stl10", "cifar100", "caltech101", "sun397", "stanfordcars", "oxfordpets",
                           "fer2013", "gtsrb"]}
    assert counts == {"cifar10": 2, "stl10": 1, "cifar100": 7, "caltech101": 13, "sun397": 52, "stanfordcars": 29,
                      "oxfordpets": 6, "fer2013": 1, "gtsrb": 2}
    if _has_hub_file("birdsnap"):  # 53 vowel-initial names in OpenAI's list, 3 of them Eu... ("a")
        assert sum(", a type of bird." in c and c.startswith("a photo of an ") for c in tables["birdsnap"].text) == 50


def test_rule2_no_article_mismatch_anywhere(tables):
    """A second net over every caption: "a" before a vowel letter or "an" before a consonant is an exception."""
    ok_a = {"a euphonium", "a ewer", "a utility", "a Eurasian", "a European"}
    for slug, t in tables.items():
        for text in t.text:
            for m in re.finditer(r"\b(a|an) '?([A-Za-z0-9]\w*)", text):
                article, word = m.groups()
                if article == "a" and word[0] in "aeiouAEIOU8":
                    assert f"a {word}" in ok_a, (slug, text)
                if article == "an":
                    assert word[0] in "aeiouAEIOU8" or word == "AM", (slug, text)


# --- rules 3-7: renames and drop -------------------------------------------------------------------------

def test_rule3_cifar100_crab(tables):
    t = tables["cifar100"]
    assert t.source_names[26] == "cra"
    assert (t.class_name[26], t.text[26]) == ("crab", "a photo of a crab.")


def test_rule4_clevr_mid_distance(tables):
    t = tables["clevr"]
    assert t.source_names[3] == ""
    assert t.class_name == ("very nearby", "nearby", "near", "mid-distance", "distant", "very distant")
    assert t.text[3] == "mid-distance shapes."


def test_rule5_imagenet_duplicates(tables):
    t = tables["imagenet1k"]
    assert (t.source_names[744], t.source_names[836]) == ("missile", "sunglasses")
    assert (t.class_name[657], t.class_name[744]) == ("missile", "projectile")
    assert (t.class_name[836], t.class_name[837]) == ("sunglass", "sunglasses")
    assert t.text[744] == "a photo of projectile."
    assert len(set(t.class_name)) == 1000


def test_rule6_gtsrb_typos(tables):
    t = tables["gtsrb"]
    assert t.class_name[29] == "red and white triangle with bicycle warning"
    assert t.class_name[17] == "red circle with white horizontal stripe no entry"
    assert t.text[29] == "a close up photo of a 'red and white triangle with bicycle warning' traffic sign."
    assert not any("bicyle" in n or "horizonal" in n for n in t.class_name + t.text)


def test_rule7_caltech101_drops_background_only(tables):
    t = tables["caltech101"]
    assert t.source_names[4] == "background_google"
    assert [i for i, k in enumerate(t.keep) if not k] == [4]
    # the eval split keeps its rows: OpenAI CLIP's word for the class
    assert (t.class_name[4], t.text[4]) == ("background", "a photo of a background.")
    for slug, other in tables.items():
        if slug != "caltech101":
            assert all(other.keep), slug


def test_renames_and_drop_fail_loudly_on_a_shifted_list():
    shifted = hub("cifar100")[1:] + hub("cifar100")[:1]
    with pytest.raises(ValueError, match=r"^cifar100: .*label 26 .*'cra'"):
        class_table(by_slug("cifar100"), shifted)
    # label 4 is both renamed (its eval caption) and dropped (from train): the renames check comes first
    with pytest.raises(ValueError, match=r"^caltech101: renames .*label 4 .*'background_google'"):
        class_table(by_slug("caltech101"), hub("caltech101")[:4] + ["background"] + hub("caltech101")[5:])
    with pytest.raises(ValueError, match=r"^cifar100: .*label 26"):
        class_table(by_slug("cifar100"), hub("cifar100")[:20])  # id out of range


def test_without_the_renames_the_real_lists_are_rejected():
    # the guards that make the renames necessary: a blank name and duplicate names
    with pytest.raises(ValueError, match=r"^clevr: label 3 has an empty class name"):
        class_table(dataclasses.replace(by_slug("clevr"), renames={}))
    with pytest.raises(ValueError, match=r"^imagenet1k: duplicate class names \['missile', 'sunglasses'\]"):
        class_table(dataclasses.replace(by_slug("imagenet1k"), renames={}))


def test_hub_names_required_for_hub_sources():
    with pytest.raises(ValueError, match=r"^food101: "):
        class_table(by_slug("food101"))
    with pytest.raises(ValueError, match=r"^ucf101: "):  # the first hub source in the catalog
        all_tables({})


def test_hub_names_ignored_for_file_sources():
    # eurosat's hub ClassLabel (AnnualCrop...) is not what mteb prompts with: its own list is used
    t = class_table(by_slug("eurosat"), hub("eurosat"))
    assert t.source_names[0] == "annual crop land"
    assert t == class_table(by_slug("eurosat"))


# --- rule 8: ucf101 ----------------------------------------------------------------------------------------

def test_rule8_ucf101_camel_case(tables):
    t = tables["ucf101"]
    by_name = dict(zip(t.source_names, t.class_name))
    assert by_name["ApplyEyeMakeup"] == "apply eye makeup"
    assert by_name["YoYo"] == "yo yo"
    assert by_name["HandstandPushups"] == "handstand pushups"
    assert by_name["HandstandWalking"] == "handstand walking"
    assert by_name["PlayingDaf"] == "playing daf"
    assert by_name["CleanAndJerk"] == "clean and jerk"
    assert by_name["Skijet"] == "skijet"
    assert words("HandStandPushups", CAMEL) == "handstand pushups"
    assert caption(tables, "ucf101", "apply eye makeup") == "a photo of apply eye makeup"


def test_rule8_ucf101_maps_by_name_not_order():
    names = hub("ucf101")
    shuffled = names[:]
    random.Random(0).shuffle(shuffled)
    shuffled[shuffled.index("HandstandPushups")] = "HandStandPushups"  # the video files' spelling
    a = class_table(by_slug("ucf101"), names)
    b = class_table(by_slug("ucf101"), shuffled)
    assert set(zip(b.source_names, b.class_name)) == \
        {(n if n != "HandstandPushups" else "HandStandPushups", c) for n, c in zip(a.source_names, a.class_name)}


# --- rule 9: cased names -----------------------------------------------------------------------------------

def test_rule9_cased_names(tables):
    cars = tables["stanfordcars"]
    assert cars.source_names[0] == "am general hummer suv 2000"
    assert cars.class_name[0] == "AM General Hummer SUV 2000"
    assert cars.class_name == tuple(read_labels("stanfordcars_cased.txt"))
    assert "McLaren MP4-12C Coupe 2012" in cars.class_name
    pets = tables["oxfordpets"]
    assert pets.class_name[:2] == ("Abyssinian", "American Bulldog")
    assert pets.text[1] == "a photo of an American Bulldog, a type of pet."


@pytest.mark.parametrize("slug", ["stanfordcars", "oxfordpets"])
def test_rule9_cased_list_is_checked_index_by_index(slug):
    names = hub(slug)
    swapped = names[:]
    swapped[3], swapped[5] = swapped[5], swapped[3]
    with pytest.raises(ValueError, match=rf"^{slug}: label 3 "):
        class_table(by_slug(slug), swapped)
    altered = names[:]
    altered[7] += " x"
    with pytest.raises(ValueError, match=rf"^{slug}: label 7 "):
        class_table(by_slug(slug), altered)
    with pytest.raises(ValueError, match=rf"^{slug}: .* has {len(names)} names, the source {len(names) - 1}"):
        class_table(by_slug(slug), names[:-1])
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    with pytest.raises(ValueError, match=rf"^{slug}: "):
        class_table(by_slug(slug), shuffled)


# --- rule 10: scimmir --------------------------------------------------------------------------------------

def test_rule10_scimmir(tables):
    t = tables["scimmir"]
    assert t.source_names == ("fig_result", "fig_illustration", "fig_architecture", "table_parameter", "table_result")
    assert t.class_name == ("figure of results", "figure of an illustration", "figure of an architecture",
                            "table of parameters", "table of results")
    # mteb's five fixed strings, used only for rows whose own `text` is null or blank
    assert t.text == ("a figure of results", "a figure of an illustration", "a figure of an architecture",
                      "a table of parameters", "a table of results")
    assert by_slug("scimmir").caption_column == "text"


# --- rule 11: snake_case and paths ------------------------------------------------------------------------

def test_rule11_snake_and_path_names(tables):
    assert caption(tables, "food101", "apple pie") == "a photo of apple pie, a type of food."
    assert tables["food101"].source_names[0] == "apple_pie"
    assert caption(tables, "cifar100", "aquarium fish") == "a photo of an aquarium fish."
    sun = dict(zip(tables["sun397"].source_names, tables["sun397"].class_name))
    assert sun["/c/church/outdoor"] == "church outdoor"
    assert sun["/a/airplane_cabin"] == "airplane cabin"
    assert caption(tables, "sun397", "airplane cabin") == "a photo of an airplane cabin."
    assert caption(tables, "resisc45", "baseball diamond") == "satellite imagery of baseball diamond."
    assert caption(tables, "caltech101", "inline skate") == "a photo of an inline skate."


def test_words_styles():
    assert words("apple_pie", SNAKE) == "apple pie"
    assert words("/c/church/outdoor", PATH) == "church outdoor"
    assert words("/s/subway_station/platform", PATH) == "subway station platform"
    assert words("ApplyEyeMakeup", CAMEL) == "apply eye makeup"
    assert words("polka-dotted", AS_IS) == "polka-dotted"
    with pytest.raises(ValueError):
        words("x", "nope")


# --- rule 12: hygiene ----------------------------------------------------------------------------------------

def test_rule12_every_name_and_caption_is_clean(tables):
    for slug, t in tables.items():
        for s in t.class_name + t.text:
            assert s and s == s.strip(), (slug, s)
            assert "\n" not in s and "\t" not in s and "  " not in s and "_" not in s, (slug, s)
        assert len(set(t.class_name)) == len(t.class_name), slug
        assert len(set(t.text)) == len(t.text), slug


def test_rule12_clean_captions_arrow():
    arr = pa.array(["  a photo\nof  a\tcat_dog.  ", None, "", "   ", "x\u00a0\u00a0y\r\nz", "fine"])
    out = clean_captions(arr)
    assert out.type == pa.string()
    assert out.to_pylist() == ["a photo of a cat dog.", None, "", "", "x y z", "fine"]
    chunked = clean_captions(pa.chunked_array([["a__b"], [None, " c "]]))
    assert chunked.to_pylist() == ["a b", None, "c"]
    assert clean_caption("  tench\n. ") == "tench ."
    assert clean_caption("sea_ice") == "sea ice"


# --- mteb's wording --------------------------------------------------------------------------------------

def test_captions_keep_mteb_wording(tables):
    expected = {
        "food101": "a photo of apple pie, a type of food.",
        "dtd": "a photo of banded texture.",
        "mnist": "a photo of the number: '0'.",
        "country211": "a photo showing the country of Andorra.",
        "eurosat": "a centered satellite photo of annual crop land.",
        "renderedsst2": "a negative review of a movie",
        "clevr_count": "a picture of three objects",
        "resisc45": "satellite imagery of airplane.",
        "ucf101": "a photo of apply eye makeup",
        "imagenet1k": "a photo of tench.",
        "patchcamelyon": "histopathology image of lymph node",
        "clevr": "very nearby shapes.",
        "cifar10": "a photo of an airplane.",
        "stl10": "a photo of an airplane.",
        "cifar100": "a photo of an apple.",
        "sun397": "a photo of an abbey.",
        "caltech101": "a photo of an accordion.",
        "fer2013": "a photo of an angry looking face.",
        "gtsrb": "a close up photo of a 'red and white circle 20 kph speed limit' traffic sign.",
        "stanfordcars": "a photo of an AM General Hummer SUV 2000.",
        "oxfordpets": "a photo of an Abyssinian, a type of pet.",
        "scimmir": "a figure of results",
    }
    for slug, text in expected.items():
        assert tables[slug].text[0] == text, slug
    assert tables["renderedsst2"].text[1] == "a positive review of a movie"
    assert tables["clevr_count"].text[-1] == "a picture of ten objects"
    assert tables["mnist"].text[9] == "a photo of the number: '9'."
    assert tables["dtd"].text[tables["dtd"].class_name.index("polka-dotted")] == "a photo of polka-dotted texture."
    assert caption(tables, "birdsnap", "Osprey") == "a photo of an Osprey, a type of bird."


def test_caltech101_folder_names_and_fer2013_nouns_become_english(tables):
    t = tables["caltech101"]
    assert t.text[1] == "a photo of an airplane."  # folder `airplanes`
    assert (t.class_name[37], t.class_name[38]) == ("off-center face", "centered face")  # faces, faces_easy
    assert (t.class_name[57], t.class_name[66], t.class_name[96]) == ("leopard", "motorbike", "water lily")
    fer = tables["fer2013"]
    assert fer.text[1] == "a photo of a disgusted looking face."
    assert fer.text[2] == "a photo of a fearful looking face."
    assert fer.text[6] == "a photo of a surprised looking face."
    assert fer.text[0] == "a photo of an angry looking face."
