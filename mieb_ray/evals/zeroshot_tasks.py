"""The MIEB zero-shot classification tasks of mteb 2.26.24 (one per source of mieb-train): pure data.

Per task: the catalog source it reads (repo, pinned revision, eval split), how mteb builds its candidate
prompts (`get_candidate_labels()`, reproduced here defects and all: a template file read with readlines()
keeps each name's newline, hub names keep their snake_case, CLEVR's blank name stays blank), and which of
mteb's two scorers the task runs:

  SOFTMAX  modalities ["image", "text"]: mteb's `similarity()`: softmax(100 x cosine) over the prompts
  COSINE   modalities ["text", "image"]: the model's own similarity, cosine for CLIP models

The prediction is the argmax either way; the two differ in ties and in the scores average precision ranks
by (binary tasks). The fixed prompts are mieb-train's captions of the same classes (captions.class_table).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from importlib import resources

from mieb_ray.captions import ClassTable, class_table
from mieb_ray.errors import UserError
from mieb_ray.evals.source_task import SourceTask

SOFTMAX = "softmax"
COSINE = "cosine"
HUB = None  # names: the ClassLabel names of the eval split's label column


@dataclass(frozen=True)
class ZeroShotTask(SourceTask):
    template: str  # mteb's f-string, "{}" = the name
    scorer: str  # SOFTMAX or COSINE
    names: str | tuple[str, ...] | None = HUB  # HUB, a template file read with readlines(), or mteb's list
    path_names: bool = False  # SUN397: " ".join(name.split("/")[2:]).replace("_", " ") first

    def mteb_prompts(self, hub_names: list[str] | None) -> list[str]:
        """mteb's candidate labels, index = label id, exactly as `get_candidate_labels()` returns them."""
        if self.names is HUB:
            if not hub_names:
                raise UserError(f"{self.name}: the eval split's label column has no ClassLabel names")
            names = list(hub_names)
        elif isinstance(self.names, str):
            names = _readlines(self.names)
        else:
            names = list(self.names)
        if self.path_names:
            names = [" ".join(n.split("/")[2:]).replace("_", " ") for n in names]
        return [self.template.format(n) for n in names]

    def classes(self, hub_names: list[str] | None) -> ClassTable:
        """mieb-train's class names and captions of the task's classes, index = label id."""
        try:
            return class_table(self.source, hub_names)
        except ValueError as exc:  # the source's class list is not the one the catalog knows
            raise UserError(str(exc)) from exc

    def fixed_prompts(self, hub_names: list[str] | None) -> list[str]:
        """mieb-train's caption of each class, index = label id."""
        return list(self.classes(hub_names).text)


def _readlines(filename: str) -> list[str]:
    """A class list file read as mteb reads its templates (open(...).readlines(): newlines kept)."""
    raw = resources.files("mieb_ray.sources").joinpath("labels", filename).read_bytes()
    return io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8").readlines()


A_PHOTO = "a photo of a {}."

TASKS: tuple[ZeroShotTask, ...] = (
    ZeroShotTask("BirdsnapZeroShot", "birdsnap", "a photo of a {}, a type of bird.", SOFTMAX),
    ZeroShotTask("Caltech101ZeroShot", "caltech101", A_PHOTO, COSINE),
    ZeroShotTask("CIFAR10ZeroShot", "cifar10", A_PHOTO, COSINE),
    ZeroShotTask("CIFAR100ZeroShot", "cifar100", A_PHOTO, COSINE),
    ZeroShotTask("CLEVRZeroShot", "clevr", "{} shapes.", COSINE,
                 ("very nearby", "nearby", "near", "", "distant", "very distant")),
    ZeroShotTask("CLEVRCountZeroShot", "clevr_count", "a picture of {} objects", COSINE,
                 ("three", "four", "five", "six", "seven", "eight", "nine", "ten")),
    ZeroShotTask("Country211ZeroShot", "country211", "a photo showing the country of {}.", SOFTMAX,
                 "Country211_labels.txt"),
    ZeroShotTask("DTDZeroShot", "dtd", "a photo of {} texture.", SOFTMAX),
    ZeroShotTask("EuroSATZeroShot", "eurosat", "a centered satellite photo of {}.", SOFTMAX,
                 ("annual crop land", "forest land", "brushland or shrubland", "highway or road", "industrial land",
                  "pasture land", "permanent crop land", "residential land", "river", "sea or lake")),
    ZeroShotTask("FER2013ZeroShot", "fer2013", "a photo of a {} looking face.", SOFTMAX,
                 ("angry", "disgust", "fear", "happy", "neutral", "sad", "surprise")),
    ZeroShotTask("Food101ZeroShot", "food101", "a photo of {}, a type of food.", COSINE),
    ZeroShotTask("GTSRBZeroShot", "gtsrb", "a close up photo of a '{}' traffic sign.", SOFTMAX, "GTSRB_labels.txt"),
    ZeroShotTask("Imagenet1kZeroShot", "imagenet1k", "a photo of {}.", SOFTMAX, "Imagenet1k_labels.txt"),
    ZeroShotTask("MNISTZeroShot", "mnist", "a photo of the number: '{}'.", SOFTMAX),
    ZeroShotTask("OxfordPetsZeroShot", "oxfordpets", "a photo of a {}, a type of pet.", COSINE),
    ZeroShotTask("PatchCamelyonZeroShot", "patchcamelyon", "histopathology image of {}", SOFTMAX,
                 "PatchCamelyon_labels.txt"),
    ZeroShotTask("RESISC45ZeroShot", "resisc45", "satellite imagery of {}.", SOFTMAX),
    ZeroShotTask("RenderedSST2", "renderedsst2", "a {} review of a movie", COSINE, ("negative", "positive")),
    ZeroShotTask("SciMMIR", "scimmir", "{}", COSINE,  # its label column holds class codes (the catalog's renames)
                 ("a figure of results", "a figure of an illustration", "a figure of an architecture",
                  "a table of parameters", "a table of results")),
    ZeroShotTask("STL10ZeroShot", "stl10", A_PHOTO, SOFTMAX),
    ZeroShotTask("SUN397ZeroShot", "sun397", A_PHOTO, SOFTMAX, path_names=True),
    ZeroShotTask("StanfordCarsZeroShot", "stanfordcars", A_PHOTO, SOFTMAX),
    ZeroShotTask("UCF101ZeroShot", "ucf101", "a photo of {}", SOFTMAX),
)

_BY_NAME = {t.name: t for t in TASKS}


def select_tasks(names: str | list[str] | None) -> list[ZeroShotTask]:
    """Tasks named in `names` (comma-separated or a list; None or "all": every one), in catalog order."""
    if names is None or names == "all":
        return list(TASKS)
    wanted = [n.strip() for n in (names.split(",") if isinstance(names, str) else names) if n.strip()]
    unknown = [n for n in wanted if n not in _BY_NAME]
    if unknown or not wanted:
        raise UserError(f"unknown zero-shot task {', '.join(map(repr, unknown)) or '(none given)'}; "
                        f"valid: {', '.join(_BY_NAME)}")
    return [t for t in TASKS if t.name in wanted]
