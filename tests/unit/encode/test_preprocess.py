"""Image preprocessing against transformers' own image processors (PIL backend), pixel by pixel, and the
bad inputs it must refuse. No Ray.

Every test image is made in memory from the demo's real pictures (mieb_ray/demo_data/images; support/pictures.py).
Run with -s to see the measured differences.
"""

from __future__ import annotations

import io
import json
from functools import lru_cache

import numpy as np
import pytest
import torch
from PIL import ExifTags, Image, ImageOps
from support import rgb_rules
from support.paths import PICTURES
from support.pictures import (
    bad_inputs,
    encode,
    i16_png,
    la_png,
    large_jpeg,
    palette_png,
    picture,
    png_claiming,
    rgba_png,
    with_orientation,
)
from transformers.image_transforms import get_resize_output_image_size
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from mieb_ray.encode import pixels, preprocess
from mieb_ray.encode.preprocess import ImageError, ImageSpec, load_image, load_images, normalize, resize_output_size

PROCESSORS = {
    "clip64": lambda: CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64}),
    "clip224": CLIPImageProcessorPil,  # CLIP ViT-B/32's settings
    "siglip224": SiglipImageProcessorPil,  # a fixed 224x224 resize, no crop
}

# Bounds in uint8 levels of |ours - processor| (pixel_values * std / rescale_factor).
EXACT = 0.01  # the same uint8 pixels; what is left is float32 rounding in normalize (~1e-4 levels)
# Resized by torch's antialiased resampler (pixels.resize), which computes Pillow's filter but rounds
# a value the other way now and then (each of its two passes rounds to uint8, as Pillow's do): mostly max 1-2
# levels, mean at most 0.009, at ~0.3% of pixels. Pillow 13 also runs the vertical pass first for some
# shapes (e.g. 203x301 -> 224x224: widened, shortened), torch the rows first, so the rounding between the
# passes differs there: max 6, mean 0.11; or max 1 at 17% of pixels. A misplaced draft box gives max 15-34,
# mean 0.67-1.24 (tests below).
RESAMPLED_MAX, RESAMPLED_MEAN = 8, 0.3
# JPEGs decoded in draft mode (DCT-scaled by 1/2..1/8 so that each side stays >= DRAFT_FACTOR = 1 times the
# resized size): those pixels are averages of the full decode but not the same numbers, and the bicubic resize
# after shrinks them less. The differences are at sharp edges: here max 35 levels, mean at most 2.0 (the 64 px
# crop of a CMYK photo; bench/preprocess.py: max 26, mean 1.5 on sharp 1600x1200 mosaics at 224). That the
# draft box and scale are right is test_drafted_jpegs_are_pillows_draft_and_resize's, to within RESAMPLED.
DRAFT_MAX, DRAFT_MEAN = 48, 2.5


def resampled(diff: torch.Tensor) -> bool:
    return diff.max() <= RESAMPLED_MAX and diff.mean() <= RESAMPLED_MEAN


@pytest.fixture(scope="module", params=list(PROCESSORS))
def processor(request):
    return PROCESSORS[request.param]()


def colour_key_png() -> bytes:
    """An RGB PNG whose most common colour is transparent (a tRNS colour key, info["transparency"] an RGB tuple)."""
    im = picture("coffee.jpg").resize((200, 150)).quantize(8).convert("RGB")  # few colours: the key covers an area
    colours = np.asarray(im).reshape(-1, 3)
    values, counts = np.unique(colours, axis=0, return_counts=True)
    return encode(im, "PNG", transparency=tuple(int(v) for v in values[counts.argmax()]))


IMAGES = {
    "large jpeg 1600x1200": large_jpeg,
    "jpeg 400x266": lambda: (PICTURES / "chelsea.jpg").read_bytes(),
    "portrait jpeg 267x400": lambda: encode(picture("rocket.jpg").transpose(Image.Transpose.ROTATE_90), "JPEG"),
    "grayscale jpeg (L)": lambda: (PICTURES / "camera.jpg").read_bytes(),
    "cmyk jpeg": lambda: encode(picture("flower.jpg").convert("CMYK"), "JPEG", quality=90),
    "exif-rotated jpeg (6) 1600x1200": lambda: with_orientation(
        picture("coffee.jpg").resize((1600, 1200), Image.Resampling.BICUBIC), "JPEG", 6, quality=90),
    "small png 100x80": lambda: encode(picture("coffee.jpg").resize((100, 80), Image.Resampling.LANCZOS), "PNG"),
    "grayscale png (L)": lambda: (PICTURES / "horse.png").read_bytes(),
    "wide png 448x172": lambda: (PICTURES / "text.png").read_bytes(),
    "rgba png": rgba_png,
    "la png": la_png,
    "palette png with transparency": palette_png,
    "rgb png with a colour key": colour_key_png,
    "bilevel png (1)": lambda: encode(picture("text.png").convert("1"), "PNG"),
    "16-bit png (I;16)": i16_png,
    "1x1 png": lambda: encode(Image.new("RGB", (1, 1), (200, 30, 90)), "PNG"),
    "webp": lambda: encode(picture("hubble_deep_field.jpg"), "WEBP", quality=90),
}


TRANSPARENT = ["rgba png", "la png", "palette png with transparency", "rgb png with a colour key"]


@lru_cache
def image_bytes(name: str) -> bytes:
    return IMAGES[name]()


def spec_of(proc) -> ImageSpec:
    return ImageSpec.from_processor_config(proc.to_dict())


def ours(data: bytes, proc) -> torch.Tensor:
    spec = spec_of(proc)
    return normalize(torch.from_numpy(load_image(data, spec))[None], spec)


def reference(data: bytes, proc) -> torch.Tensor:
    """The processor's pixel_values; it ignores EXIF, so it gets the upright image."""
    with Image.open(io.BytesIO(data)) as im:
        return proc(images=[ImageOps.exif_transpose(im)], return_tensors="pt")["pixel_values"]


def levels(a: torch.Tensor, b: torch.Tensor, proc) -> torch.Tensor:
    """|a - b| in uint8 levels."""
    spec = spec_of(proc)
    return (a - b).abs() * torch.tensor(spec.std).view(1, 3, 1, 1) / spec.rescale_factor


@pytest.mark.parametrize("name", list(IMAGES))
def test_matches_the_processor(name, processor):
    data = image_bytes(name)
    got, want = ours(data, processor), reference(data, processor)
    assert got.shape == want.shape and got.dtype == want.dtype == torch.float32
    diff = levels(got, want, processor)
    print(f"\n{type(processor).__name__}{tuple(want.shape[2:])} {name}: |pixel_values diff| max "
          f"{(got - want).abs().max().item():.2e}, uint8 levels max {diff.max().item():.2f} "
          f"mean {diff.mean().item():.3f}")
    if "jpeg" in name:
        assert diff.max() <= DRAFT_MAX and diff.mean() <= DRAFT_MEAN
    else:
        assert resampled(diff)


@pytest.fixture
def fresh_probe():
    """preprocess asks transformers once per process whether it composites transparency: ask again here."""
    pixels.alpha_onto_white.cache_clear()
    yield
    pixels.alpha_onto_white.cache_clear()


@pytest.mark.parametrize("name", TRANSPARENT)
def test_transparency_is_converted_as_the_installed_transformers_does(name):
    """Issue 40: transformers 5.21 on composites transparency onto white, 5.0-5.20 drop it (a transparent RGBA pixel
    keeps its colour, a palette its transparent entry's): the CPU path converts as the installed release's
    convert_to_rgb, which both its backends (PIL, torchvision) apply to a PIL image, to the pixel."""
    from transformers.image_transforms import convert_to_rgb

    with Image.open(io.BytesIO(image_bytes(name))) as im:
        im.load()
        assert np.array_equal(np.asarray(pixels.to_rgb(im)), np.asarray(convert_to_rgb(im)))


@pytest.mark.parametrize("name", TRANSPARENT)
def test_transparency_follows_either_side_of_the_5_21_change(name, fresh_probe, monkeypatch):
    """Both releases' rules in any one environment (CI's newest and oldest transformers each have one): with
    transformers' convert_to_rgb swapped for each rule wherever its modules hold it, the processor's pixel_values
    and the CPU path's agree, and the two rules differ on the image (the code before the fix always composited:
    its 'dropped' side fails here, as the rgba png's embedding did under transformers 5.17 and 5.18, at a centred
    cosine of 0.29)."""
    data, proc = image_bytes(name), CLIPImageProcessorPil()
    ours_, theirs = {}, {}
    for onto_white in (True, False):
        with rgb_rules.rule(onto_white, monkeypatch):
            ours_[onto_white], theirs[onto_white] = ours(data, proc), reference(data, proc)
    for onto_white in (True, False):
        assert resampled(levels(ours_[onto_white], theirs[onto_white], proc)), onto_white
    assert levels(theirs[True], theirs[False], proc).mean() > 1


@pytest.mark.parametrize("name", [n for n in IMAGES if "jpeg" in n])
def test_jpeg_differs_only_by_draft_mode(name, processor, monkeypatch):
    """Without draft mode (a factor no image reaches), JPEGs are as close as other formats."""
    monkeypatch.setattr(preprocess, "DRAFT_FACTOR", 10**6)
    data = image_bytes(name)
    assert resampled(levels(ours(data, processor), reference(data, processor), processor))


@lru_cache
def oriented(fmt: str, orientation: int) -> bytes:
    # Non-square and odd-sized, so that a wrong flip, swap or crop offset shows.
    stored = picture("flower.jpg").crop((0, 0, 301, 203))
    if fmt == "PNG":
        return with_orientation(stored, fmt, orientation)
    # Drafted by 1/4 (clip64) or 1/2, with partial last draft pixels that the transpose moves.
    return with_orientation(stored.resize((1207, 903), Image.Resampling.BICUBIC), fmt, orientation, quality=90)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_every_exif_orientation(orientation, processor):
    png, jpeg = oriented("PNG", orientation), oriented("JPEG", orientation)
    assert resampled(levels(ours(png, processor), reference(png, processor), processor))
    diff = levels(ours(jpeg, processor), reference(jpeg, processor), processor)
    assert diff.max() <= DRAFT_MAX and diff.mean() <= DRAFT_MEAN


def test_animated_gif_first_frame(processor):
    frames = [picture(n).convert("RGB").resize((120, 90)) for n in ("chelsea.jpg", "coffee.jpg", "rocket.jpg")]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=100, loop=0)
    got = ours(data, processor)
    assert resampled(levels(got, reference(data, processor), processor))
    with Image.open(io.BytesIO(data)) as im:
        im.seek(1)
        second = processor(images=[im.convert("RGB")], return_tensors="pt")["pixel_values"]
    assert levels(got, second, processor).mean() > 10


def test_crop_larger_than_the_resize_pads_with_zeros():
    proc = CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 81, "width": 72})
    for name in ("wide png 448x172", "portrait jpeg 267x400"):
        data = image_bytes(name)
        diff = levels(ours(data, proc), reference(data, proc), proc)
        assert diff.max() <= DRAFT_MAX if "jpeg" in name else resampled(diff)
    assert not load_image(image_bytes("wide png 448x172"), spec_of(proc))[:8].any()  # (81 - 64) // 2 rows on top


def test_output_is_uint8_at_the_models_size():
    spec = spec_of(CLIPImageProcessorPil())
    pixels = load_image(large_jpeg(), spec)
    assert pixels.dtype == np.uint8 and pixels.shape == (224, 224, 3) and pixels.flags.writeable


def test_resize_output_size_is_transformers():
    """Truncation of the long side, both orientations, including sizes at and below the target."""
    for edge in (64, 224):
        spec = spec_of(CLIPImageProcessorPil(size={"shortest_edge": edge}, crop_size=edge))
        for h in (1, 2, 63, 64, 65, 223, 224, 225, 266, 299, 300, 333, 1200, 1201, 4001):
            for w in (1, 3, 64, 224, 225, 400, 1600, 1601, 9999):
                want = get_resize_output_image_size(np.broadcast_to(np.uint8(0), (3, h, w)), edge,
                                                    default_to_square=False, input_data_format="channels_first")
                assert resize_output_size(spec, h, w) == want, (h, w)


# ---- ImageSpec ------------------------------------------------------------------------------------

CLIP = ImageSpec(height=224, width=224, resize_shortest_edge=224, resample=3, do_center_crop=True,
                 mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
                 rescale_factor=1 / 255)


def test_spec_from_processor_configs():
    assert spec_of(CLIPImageProcessorPil()) == CLIP
    # openai/clip-vit-base-patch32's preprocessor_config.json: ints for sizes, no rescale_factor.
    legacy = {"crop_size": 224, "do_center_crop": True, "do_normalize": True, "do_resize": True,
              "feature_extractor_type": "CLIPFeatureExtractor", "image_mean": list(CLIP.mean),
              "image_std": list(CLIP.std), "resample": 3, "size": 224}
    assert ImageSpec.from_processor_config(legacy) == CLIP
    # google/siglip-base-patch16-224's
    siglip = {"do_normalize": True, "do_rescale": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5],
              "image_processor_type": "SiglipImageProcessor", "image_std": [0.5, 0.5, 0.5], "resample": 3,
              "rescale_factor": 0.00392156862745098, "size": {"height": 224, "width": 224}}
    assert ImageSpec.from_processor_config(siglip) == ImageSpec(
        height=224, width=224, resize_shortest_edge=None, resample=3, do_center_crop=False,
        mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), rescale_factor=1 / 255)
    assert spec_of(SiglipImageProcessorPil()).resize_shortest_edge is None
    assert ImageSpec.from_processor_config({**CLIPImageProcessorPil().to_dict(), "do_pad": False}) == CLIP  # off: fine


def test_spec_to_dict():
    assert ImageSpec(**CLIP.to_dict()) == CLIP  # how the embed job ships it to its tasks
    d = json.loads(json.dumps(CLIP.to_dict()))
    assert d["mean"] == list(CLIP.mean) and d["resize_shortest_edge"] == 224 and d["resample"] == 3


@pytest.mark.parametrize("change", [
    {"size": {"shortest_edge": 224, "longest_edge": 500}},  # not reproduced
    {"do_center_crop": False},  # shortest edge without a crop: images of varying size
    {"size": {"height": 256, "width": 256}},  # fixed resize, then a crop
    {"do_resize": False},
    {"do_pad": True},  # a step load_image does not do
    {"crop_pct": 0.875},  # ConvNeXt-style resize-then-crop
    {"rescale_offset": True},  # EfficientNet's [-1, 1] rescale
])
def test_spec_refuses_what_it_cannot_reproduce(change):
    with pytest.raises(ValueError):
        ImageSpec.from_processor_config({**CLIPImageProcessorPil().to_dict(), **change})


def test_normalize_dtype_and_layout():
    pixels = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (2, 224, 224, 3), dtype=np.uint8))
    x = normalize(pixels, CLIP)
    assert x.shape == (2, 3, 224, 224) and x.dtype == torch.float32 and x.is_contiguous()
    want = (pixels[1, 5, 7, 2] / 255 - CLIP.mean[2]) / CLIP.std[2]
    assert abs(x[1, 2, 5, 7].item() - want.item()) < 1e-6
    assert torch.equal(normalize(pixels, CLIP, dtype=torch.bfloat16), x.to(torch.bfloat16))


# ---- bad input ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(bad_inputs()))
def test_bad_input_is_an_image_error(name):
    data, reason = bad_inputs()[name]
    with pytest.raises(ImageError) as err:
        load_image(data, CLIP)
    assert str(err.value).startswith(reason) and "\n" not in str(err.value)


def test_max_pixels_is_checked_before_decoding():
    with pytest.raises(ImageError, match=r"^image too large \(1600x1200 pixels\)$"):
        load_image(large_jpeg(), CLIP, max_pixels=1600 * 1200 - 1)
    assert load_image(large_jpeg(), CLIP, max_pixels=1600 * 1200).shape == (224, 224, 3)
    # Header only, never decoded: 900 M pixels would take 2.7 GB.
    with pytest.raises(ImageError, match="^image too large"):
        load_image(png_claiming(30_000, 30_000), CLIP, max_pixels=10**12)


def test_load_images_keeps_going():
    good = (PICTURES / "chelsea.jpg").read_bytes()
    pixels, errors = load_images([good, None, b"", b"not an image", good], CLIP)
    assert errors == [None, "missing image", "empty image", "not an image", None]
    assert pixels.shape == (5, 224, 224, 3) and pixels.dtype == np.uint8
    assert not pixels[1:4].any()
    assert np.array_equal(pixels[0], load_image(good, CLIP)) and np.array_equal(pixels[4], pixels[0])


# ---- the batched path -------------------------------------------------------------------------------


def mix_images() -> list[bytes]:
    """Several images of each of mieb-train's kinds of one size (the groups load_images resizes together),
    between images of other sizes, orientations and an undecodable item."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(4):
        pic = picture(["astronaut.jpg", "coffee.jpg", "chelsea.jpg", "rocket.jpg"][i])
        x, y = int(rng.integers(0, 100)), int(rng.integers(0, 60))
        crop = pic.crop((x, y, x + 240, y + 180)).convert("RGB")
        out += [encode(crop.resize((32, 32), Image.Resampling.LANCZOS), "PNG"),
                encode(crop.resize((28, 28), Image.Resampling.LANCZOS).convert("L"), "PNG"),
                encode(crop.resize((320, 240), Image.Resampling.LANCZOS), "JPEG", quality=75),
                encode(crop.resize((64, 64), Image.Resampling.LANCZOS), "JPEG", quality=90),
                with_orientation(crop.resize((320, 240), Image.Resampling.LANCZOS), "JPEG", 6 + i % 2, quality=75)]
    return out + [b"not an image", image_bytes("large jpeg 1600x1200"), image_bytes("rgba png")]


@pytest.mark.parametrize("group", [2, 64])
def test_batched_equals_one_by_one(group, monkeypatch):
    """Images resized in groups of one size (flushed every `group`) are the pixels of each alone."""
    monkeypatch.setattr(preprocess, "_GROUP_IMAGES", group)
    items = mix_images()
    pixels, errors = load_images(items, CLIP)
    assert errors == [None] * (len(items) - 3) + ["not an image", None, None]
    for i, data in enumerate(items):
        if errors[i] is None:
            assert np.array_equal(pixels[i], load_image(data, CLIP)), i
    assert not pixels[len(items) - 3].any()


def photos_of_their_own_sizes(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    pic = picture("astronaut.jpg").convert("RGB")
    return [encode(pic.resize((int(w), int(h))), "JPEG", quality=90) for w, h in rng.integers(200, 500, size=(n, 2))]


def test_photos_each_of_its_own_size_take_no_room_ahead():
    """A chunk of photos of as many sizes holds about one decoded photo at a time beside its output: room
    taken ahead for each new size (64 images or 64 MB) held 295 MB for these 40 and made a read task slow."""
    import tracemalloc

    items = photos_of_their_own_sizes(40)
    output = len(items) * 224 * 224 * 3
    load_images(items[:2], CLIP)  # imports and first allocations out of the count
    tracemalloc.start()
    try:
        pixels, errors = load_images(items, CLIP)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert errors == [None] * len(items)
    assert peak < output + (8 << 20), f"{peak / 2**20:.1f} MiB for {output / 2**20:.1f} MiB of output"
    assert all(np.array_equal(pixels[i], load_image(b, CLIP)) for i, b in enumerate(items))


def test_load_images_fills_the_array_it_is_given():
    """out: a read task's unit array filled in place (no array of the chunk's own to copy from), its other rows
    left as they were, a failed item's row zero."""
    items = [*photos_of_their_own_sizes(3), b"not an image"]
    unit = np.full((6, 224, 224, 3), 7, np.uint8)
    unit[4] = 0  # where the failing item goes: the read task's unit array is zeros
    pixels, errors = load_images(items, CLIP, out=unit[1:5])
    assert np.shares_memory(pixels, unit) and errors[3] == "not an image"
    assert np.array_equal(unit[1:5], load_images(items, CLIP)[0])
    assert (unit[0] == 7).all() and (unit[5] == 7).all()


@pytest.mark.parametrize("name", [n for n in IMAGES if "jpeg" in n])
def test_simplejpeg_decodes_as_pillow(name, processor, monkeypatch):
    """simplejpeg's pixels are Pillow's, at full size and at the draft scale: the same uint8 out."""
    assert preprocess.simplejpeg is not None
    spec = spec_of(processor)
    data = image_bytes(name)
    fast = load_image(data, spec)
    monkeypatch.setattr(preprocess, "simplejpeg", None)
    assert np.array_equal(fast, load_image(data, spec))


def test_other_filters_go_through_pillow():
    """Filters torch's resampler does not compute (here Lanczos) are Pillow's own resize: exact."""
    proc = CLIPImageProcessorPil(resample=Image.Resampling.LANCZOS)
    assert spec_of(proc).resample == Image.Resampling.LANCZOS
    for name in ("small png 100x80", "rgba png", "jpeg 400x266", "wide png 448x172"):
        data = image_bytes(name)
        assert levels(ours(data, proc), reference(data, proc), proc).max() <= EXACT, name
    assert not load_images([b"", b"not an image"], spec_of(proc))[0].any()


@pytest.mark.parametrize("orientation", [1, 3, 6, 8])
@pytest.mark.parametrize("name", ["large jpeg 1600x1200", "portrait jpeg 267x400", "cmyk jpeg", "odd 1207x903"])
def test_drafted_jpegs_are_pillows_draft_and_resize(name, orientation, processor):
    """The drafted path (simplejpeg at the draft scale, torch's resize with the draft box as its scale, EXIF
    transpose after) against Pillow doing the same steps its own way (draft, transpose with the box moved,
    resize(box=)): a misplaced box or a different scale would show here as a mean of 0.87 levels and up."""
    spec = spec_of(processor)
    if name == "odd 1207x903":  # partial last draft pixels
        stored = picture("flower.jpg").crop((0, 0, 301, 203)).resize((1207, 903), Image.Resampling.BICUBIC)
    else:
        stored = Image.open(io.BytesIO(image_bytes(name)))
    data = with_orientation(stored, "JPEG", orientation, quality=90)
    with Image.open(io.BytesIO(data)) as im:
        pillow = preprocess.pillow_pixels(im, spec, preprocess.MAX_PIXELS)
    diff = np.abs(load_image(data, spec).astype(int) - pillow.astype(int))
    assert diff.max() <= RESAMPLED_MAX and diff.mean() <= RESAMPLED_MEAN, (diff.max(), diff.mean())


def full_resize_then_crop(data: bytes, spec: ImageSpec) -> np.ndarray:
    """The plain way, from Pillow's decode at the draft scale load_images takes (the same pixels as its
    simplejpeg decode: test_simplejpeg_decodes_as_pillow): the whole resize, upright, then the crop."""
    with Image.open(io.BytesIO(data)) as im:
        (w, h), orientation = im.size, im.getexif().get(ExifTags.Base.Orientation, 1)
        orientation = orientation if orientation in pixels.UPRIGHT else 1
        swap = orientation in (5, 6, 7, 8)
        out_h, out_w = resize_output_size(spec, w if swap else h, h if swap else w)
        size = (out_w, out_h) if swap else (out_h, out_w)  # as stored
        drafted = im.draft("RGB", (preprocess.DRAFT_FACTOR * size[1], preprocess.DRAFT_FACTOR * size[0]))
        box = (float(drafted[1][3]), float(drafted[1][2])) if drafted else (float(h), float(w))
        array = np.asarray(pixels.to_rgb(im))
    if array.shape[:2] == size and box == size:
        resized = array
    else:
        resized = pixels.resize(np.array(array[None]), box, size, spec.resample, transposed=swap)[0]
    upright = pixels.UPRIGHT_ARRAY[orientation](resized) if orientation in pixels.UPRIGHT_ARRAY else resized
    out = np.zeros((spec.height, spec.width, 3), dtype=np.uint8)
    pixels.crop_into(upright, out, spec.do_center_crop)
    return out


@pytest.mark.parametrize("name", [*PROCESSORS, "clip64 crop 81x72"])
def test_resizing_only_the_crop_is_the_full_resize_cropped(name):
    """load_images resizes only up to the crop's last row and column (as stored, for every orientation), and
    small square images straight into its output: the pixels of the whole resize, cropped."""
    proc = PROCESSORS[name]() if name in PROCESSORS else CLIPImageProcessorPil(  # a crop larger than the resize
        size={"shortest_edge": 64}, crop_size={"height": 81, "width": 72})
    spec = spec_of(proc)
    items = mix_images() + [oriented(fmt, o) for fmt in ("PNG", "JPEG") for o in range(1, 9)]
    pixels, errors = load_images(items, spec)
    for i, data in enumerate(items):
        if errors[i] is None:
            assert np.array_equal(pixels[i], full_resize_then_crop(data, spec)), i
