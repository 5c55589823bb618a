"""Class names and captions for the mieb-train sources: pure functions, no Ray.

`class_table(source)` turns a source's class list into one normalised class name and one caption per label
id, fixing mteb's caption defects (../shared/reference/mieb-train-sources.md sections 4 and 6):
newline-free names, a/an agreement, the catalog's `renames` (cifar100 `cra`, CLEVR's blank bin, ImageNet's
duplicates, GTSRB typos) and `drop` (caltech101 background), snake_case / CamelCase / path names as words,
and the cased Stanford Cars and Oxford Pets names. Any mismatch between a list and what the catalog expects
raises ValueError naming the dataset, so a moved or shifted list fails loudly instead of mislabelling rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from mieb_ray.sources import Source, read_labels
from mieb_ray.sources.catalog import AS_IS, CAMEL, CASED, HUB, PATH, SNAKE


@dataclass(frozen=True)
class ClassTable:
    slug: str
    source_names: tuple[str, ...]  # names as the source has them, index = label id (scimmir: the class codes)
    class_name: tuple[str, ...]  # normalised name per label id
    text: tuple[str, ...]  # caption per label id (scimmir: the fallback for a row with no text of its own)
    keep: tuple[bool, ...]  # False where the label's train rows are not in mieb-train (caltech101 label 4)


# --- a / an --------------------------------------------------------------------------------------------

# Vowel letters that sound like "you"/"wun" (a euphonium, a ewer, a utility room, a unicycle, a one-way...).
_A_BEFORE = ("eu", "ewe", "uti", "uni", "use", "usu", "one", "once")
# Silent h: an hour, an honest...
_AN_BEFORE = ("hour", "honest", "honor", "honour", "heir")
# Letters whose spoken name starts with a vowel sound: "an AM General", "an F-150", but "a BMW", "a GMC".
_VOWEL_SOUND_LETTERS = set("AEFHILMNORSX")


def indefinite_article(phrase: str) -> str:
    """The article, "a" or "an", for the sound of the phrase's first word (leading quotes/brackets skipped)."""
    first = re.sub(r"^[^A-Za-z0-9]+", "", phrase).split()
    if not first:
        return "a"
    word = first[0]
    if word[0].isdigit():
        # eight..., eleven, eighteen (and eleven / eighteen thousand, million...)
        num = re.match(r"\d+", word).group()
        return "an" if num[0] == "8" or (num[:2] in ("11", "18") and len(num) % 3 == 2) else "a"
    letters = re.sub(r"[^A-Za-z]", "", word)
    # An all-caps token of up to 3 letters, or one mixing capitals and digits (R8, MP4-12C), is spelled
    # out letter by letter; longer all-caps words (FIAT, HUMMER, MINI) are read as words.
    if word.isupper() and (len(letters) <= 3 or any(c.isdigit() for c in word)):
        return "an" if word[0] in _VOWEL_SOUND_LETTERS else "a"
    lower = word.lower()
    if lower.startswith(_A_BEFORE):
        return "a"
    if lower.startswith(_AN_BEFORE) or lower[0] in "aeiou":
        return "an"
    return "a"


# --- names -> words ------------------------------------------------------------------------------------

def words(name: str, style: str) -> str:
    """One raw class name as words, by the catalog's style (CASED is resolved in class_table; here as-is)."""
    if style in (AS_IS, CASED):
        return name
    if style == SNAKE:  # apple_pie -> apple pie
        return name.replace("_", " ")
    if style == CAMEL:  # ApplyEyeMakeup -> apply eye makeup; HandStand and Handstand both -> handstand
        spaced = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", name).lower()
        return re.sub(r"\bhand stand\b", "handstand", spaced)
    if style == PATH:  # mteb's rule: /c/church/outdoor -> church outdoor
        return " ".join(name.split("/")[2:]).replace("_", " ")
    raise ValueError(f"unknown name style {style!r}")


# --- rule 12: whitespace -------------------------------------------------------------------------------

# Newlines, tabs, runs of spaces and underscores become one space; ends are trimmed. `\pZ` adds the Unicode
# spaces (no-break space...) that RE2's `\s` leaves out.
_SPACES = r"[\s\pZ_]+"


def clean_captions(arr: pa.Array) -> pa.Array:
    """Rule 12 over a string array, vectorised; nulls stay null."""
    return pc.utf8_trim_whitespace(pc.replace_substring_regex(arr, pattern=_SPACES, replacement=" "))


def clean_caption(text: str) -> str:
    """Rule 12 for one string: the same pyarrow code as clean_captions, so the two can never disagree."""
    return _cleaned([text])[0]


def _cleaned(texts: list[str]) -> list[str]:
    """Rule 12 over a list in one call (a call per string compiles the regex each time, about 0.5 ms: 1.4 s for
    the class tables of every source)."""
    return clean_captions(pa.array(texts, pa.string())).to_pylist()


# --- tables --------------------------------------------------------------------------------------------

def _source_names(source: Source, hub_names: list[str] | None) -> list[str]:
    if source.names != HUB:
        return read_labels(source.names)
    if not hub_names:
        raise ValueError(f"{source.slug}: the hub's ClassLabel names are needed and none were given")
    return list(hub_names)


def _check_names(source: Source, names: list[str], expected: dict[int, str], what: str) -> None:
    for i, name in expected.items():
        if not 0 <= i < len(names) or names[i] != name:
            got = repr(names[i]) if 0 <= i < len(names) else f"nothing ({len(names)} classes)"
            raise ValueError(f"{source.slug}: {what} expects label {i} to be {name!r} but the source has {got}")


def _cased(source: Source, names: list[str]) -> list[str]:
    """The cased list, checked index by index against the source's lower-cased names."""
    cased = read_labels(source.cased_file)
    if len(cased) != len(names):
        raise ValueError(f"{source.slug}: {source.cased_file} has {len(cased)} names, the source {len(names)}")
    for i, (c, n) in enumerate(zip(cased, names)):
        if c.lower() != n:
            raise ValueError(f"{source.slug}: label {i} is {n!r} in the source but {c!r} in {source.cased_file}")
    return cased


def class_table(source: Source, hub_names: list[str] | None = None) -> ClassTable:
    """Class names and captions of one source, index = label id. Raises ValueError on any inconsistency."""
    raw = _source_names(source, hub_names)
    _check_names(source, raw, {i: old for i, (old, _) in source.renames.items()}, "renames")
    _check_names(source, raw, source.drop, "drop")

    base = _cased(source, raw) if source.style == CASED else raw
    base = [source.renames[i][1] if i in source.renames else n for i, n in enumerate(base)]
    names = _cleaned([words(n, source.style) for n in base])

    empty = [i for i, n in enumerate(names) if not n]
    if empty:
        raise ValueError(f"{source.slug}: label {empty[0]} has an empty class name")
    if len(set(names)) != len(names):
        dupes = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"{source.slug}: duplicate class names {dupes}")

    text = _cleaned([source.template.format(a=indefinite_article(n), name=n) for n in names])
    return ClassTable(source.slug, tuple(raw), tuple(names), tuple(text),
                      tuple(i not in source.drop for i in range(len(raw))))
