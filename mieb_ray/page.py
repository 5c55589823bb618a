"""What every report page shares: one self-contained HTML file (inline CSS and SVG, images as data: URIs), its
style, a palette safe for colour-blind readers, thumbnails and the formatting of numbers. The pages themselves:
evals/biovita_report.py, evals/zeroshot_report.py, audit/report.py."""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageOps

THUMB_PX = 160  # longest side of a gallery thumbnail
THUMB_QUALITY = 80
# Okabe-Ito, safe for colour-blind readers: one colour per series in a chart
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00")
CHANCE_LINE = "stroke=\"#1b1b1b\" stroke-width=\"2\" stroke-dasharray=\"3 2\""  # an SVG line at chance level

CSS = """
*{box-sizing:border-box}
body{margin:0;padding:24px 32px;font:14px/1.45 "DejaVu Sans",system-ui,sans-serif;color:#1b1b1b;background:#f6f6f4}
h1{margin:0 0 6px;font-size:24px}
h2{margin:28px 0 10px;font-size:18px}
.meta{display:flex;flex-wrap:wrap;gap:6px 22px;color:#444}
.meta b{color:#1b1b1b}
.score{display:inline-block;margin-top:10px;padding:6px 12px;border-radius:6px;background:#fff;border:1px solid #ccc}
.score b{font-size:20px}
.summary{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.panel{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px}
table{border-collapse:collapse}
th,td{padding:5px 12px;text-align:right;border-bottom:1px solid #e3e3e3}
th:first-child,td:first-child{text-align:left}
thead th{border-bottom:2px solid #999}
.swatch{display:inline-block;width:11px;height:11px;margin-right:6px;border-radius:2px;vertical-align:-1px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(580px,1fr));gap:14px}
.card{background:#fff;border:1px solid #ddd;border-radius:8px;padding:12px 14px}
.head{display:flex;justify-content:space-between;gap:8px;color:#555;font-size:12px}
.badge{padding:1px 8px;border-radius:10px;font-weight:bold;white-space:nowrap}
.hit{background:#d7efe6;color:#00563f}
.miss{background:#fbe3d3;color:#8a3300}
.query{margin:6px 0;font-size:15px}
.truth{margin:0 0 8px;color:#444}
.top{display:grid;grid-template-columns:repeat(5,1fr);gap:8px}
figure{margin:0;padding:4px;border:2px solid transparent;border-radius:6px;min-width:0}
figure.correct{border-color:#009E73;background:#eef8f4}
.ph,figure img{display:block;width:100%;aspect-ratio:1;object-fit:cover;border-radius:4px;background:#e4e4e4}
.ph{display:flex;align-items:center;justify-content:center;color:#777;font-size:12px;text-align:center}
figcaption{font-size:12px;line-height:1.3;margin-top:4px;overflow-wrap:break-word}
.rank{color:#777}
.name{font-style:italic}
.sc{color:#555;font-variant-numeric:tabular-nums}
.tick{display:block;color:#00563f;font-weight:bold}
"""


def thumbnail(data: bytes) -> str | None:
    """A JPEG data: URI of the picture shrunk to THUMB_PX; None when it does not decode."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.draft("RGB", (THUMB_PX * 2, THUMB_PX * 2))  # JPEG: decode at a reduced scale, much faster
            im = ImageOps.exif_transpose(im)
            if im.mode in ("RGBA", "LA", "P", "PA"):  # transparency onto white
                im = im.convert("RGBA")
                flat = Image.new("RGB", im.size, "white")
                flat.paste(im, mask=im.getchannel("A"))
                im = flat
            im = im.convert("RGB")
            im.thumbnail((THUMB_PX, THUMB_PX), Image.Resampling.LANCZOS)
            buf = io.BytesIO()
            im.save(buf, "JPEG", quality=THUMB_QUALITY, optimize=True)
    except Exception:  # noqa: BLE001 - any undecodable input (truncated, not an image, bomb) is a placeholder
        return None
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def pct(v) -> str:
    v = num(v)
    return "n/a" if v is None else f"{100 * v:.1f}%"


def scalar(v) -> bool:
    return isinstance(v, (str, int, float, bool)) or v is None


def text(v) -> str:
    return "n/a" if v is None else str(v)


def duration(s) -> str:
    s = num(s)
    if s is None:
        return "n/a"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(round(s), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
