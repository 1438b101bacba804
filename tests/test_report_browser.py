"""The HTML report in a real headless browser (Chromium), and its geometry checked in Python.

Chromium is installed by ./scripts/test (apt package ``chromium``); these tests fail, not
skip, without it. Two reports: the shipped session through three strategies, and a long pi
session (450+ requests) through two. Each is screenshot at 1400 px and 390 px wide (the PNG
must exist and show the charts), its DOM after load must hold every series of every panel,
the console must stay clean, and every chart's tick labels must keep clear of each other,
computed from the SVG we wrote (position, font size, text length).
"""

from __future__ import annotations

import html.parser
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image

from agentctx.replay.cli import main
from agentctx.replay.data import DEMO_TRANSCRIPT

CORPUS = Path(__file__).parent / "corpus"
LONG = CORPUS / "pi" / "large-session.jsonl"
NS = "{http://www.w3.org/2000/svg}"
CHAR = 0.6  # a sans-serif digit is at most this wide, as a share of the font size
REPORTS = {
    "shipped": ([str(DEMO_TRANSCRIPT)], ["deterministic", "pipeline", "llm"]),
    "long": ([str(LONG)], ["deterministic", "llm"]),
}
COLORS = {"deterministic": (0xE3, 0x74, 0x00), "llm": (0x1A, 0x73, 0xE8)}


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium is missing: ./scripts/test installs it (apt-get install chromium)")
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("reports")
    out = {}
    for name, (paths, strategies) in REPORTS.items():
        page = folder / f"{name}.html"
        args = ["replay", *paths, "--compare", ",".join(strategies), "--report", str(page)]
        assert main(args) == 0
        out[name] = page
    return out


def _chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "Uncaught" in line or "CONSOLE" in line]


@pytest.mark.parametrize("width", [1400, 390])
@pytest.mark.parametrize("name", list(REPORTS))
def test_screenshot_shows_the_charts(
    name: str, width: int, chromium: str, reports: dict[str, Path], tmp_path: Path
) -> None:
    png = tmp_path / f"{name}-{width}.png"
    done = _chromium(
        chromium,
        tmp_path / "profile",
        f"--window-size={width},3000",
        f"--screenshot={png}",
        reports[name].as_uri(),
    )
    assert _console_errors(done.stderr) == []
    with Image.open(png) as image:
        assert image.size == (width, 3000)
        rgb = image.convert("RGB")
        small = rgb.resize((width // 4, 750))
        pixels = [small.getpixel((x, y)) for y in range(small.height) for x in range(small.width)]
        inked = sum(1 for p in pixels if min(p) < 235) / len(pixels)
        assert inked > 0.04, f"{png}: {inked:.1%} of the page inked: blank?"
        assert len(set(pixels)) > 50
        # The first strategy's line is drawn (its colour, exactly, somewhere on the page).
        first = REPORTS[name][1][0]
        colours = {c for _, c in rgb.getcolors(maxcolors=1 << 20) or []}
        assert COLORS[first] in colours


class _Elements(html.parser.HTMLParser):
    """Every element's tag and attributes, in document order."""

    def __init__(self) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))


@pytest.mark.parametrize("name", list(REPORTS))
def test_dom_after_load_holds_every_series(
    name: str, chromium: str, reports: dict[str, Path], tmp_path: Path
) -> None:
    done = _chromium(chromium, tmp_path / "profile", "--dump-dom", reports[name].as_uri())
    assert _console_errors(done.stderr) == []
    dom = done.stdout
    parser = _Elements()
    parser.feed(dom)
    classes = [(tag, a.get("class", "")) for tag, a in parser.elements]
    strategies = REPORTS[name][1]
    n = len(strategies)

    def count(tag: str, cls: str) -> int:
        return sum(1 for t, c in classes if t == tag and c == cls)

    # Each chart twice (wide and narrow): a panel per strategy, the history and the cost.
    assert count("svg", "wide") == count("svg", "narrow") == n + 2
    assert count("polyline", "series with") == 2 * n
    assert count("polyline", "series without") == 2 * (n + 1)
    assert count("polygon", "series cache-read") == count("polygon", "series cache-write") == 2 * n
    assert count("polyline", "series cost without") == 2
    for s in strategies:
        assert count("polyline", f"series with {s}") == 2
        assert count("polyline", f"series cost {s}") == 2
    assert count("line", "budget") == 2 * (n + 1)
    assert count("div", "card") == n
    assert any(c == "marker cache-break" for _, c in classes)
    # The shipped session crosses its budget once, in one step the tiers meet at once: only
    # the long one has briefings spliced.
    spliced = name == "long"
    assert any(c.startswith("marker summarized") for _, c in classes) == spliced
    assert count("details", "briefings") == spliced  # llm's panel: what the summarizer wrote
    ids = [a["id"] for _, a in parser.elements if "id" in a]
    assert len(ids) == len(set(ids))
    # Self-contained: no script, nothing fetched.
    assert not any(tag in ("script", "link", "img", "iframe") for tag, _ in parser.elements)
    assert not any("src" in a or "href" in a for _, a in parser.elements)
    text = re.sub(r"<[^>]+>", " ", dom)
    for words in ("fewer tokens", "Settings", "context window", "retention", "cache breaks"):
        assert words in text


def _svgs(page: Path) -> list[ET.Element]:
    source = page.read_text()
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", source, flags=re.S)]


def _box(t: ET.Element) -> tuple[float, float, float, float]:
    """The label's box (left, top, right, bottom) from its position, size and length."""
    x, y, size = float(t.get("x", 0)), float(t.get("y", 0)), float(t.get("font-size", 0))
    width = len(t.text or "") * size * CHAR
    anchor = t.get("text-anchor", "start")
    left = x - width / 2 if anchor == "middle" else x - width if anchor == "end" else x
    return left, y - 0.8 * size, left + width, y + 0.25 * size


def _value(label: str) -> float:
    label = label.lstrip("$")
    scale = {"k": 1e3, "M": 1e6}.get(label[-1:], 1.0)
    return float(label.rstrip("kM")) * scale


@pytest.mark.parametrize("name", list(REPORTS))
def test_tick_labels_are_round_and_never_overlap(name: str, reports: dict[str, Path]) -> None:
    svgs = _svgs(reports[name])
    assert svgs
    for svg in svgs:
        width = float((svg.get("viewBox") or "").split()[2])
        for axis in svg.iter(f"{NS}g"):
            kind = axis.get("class", "")
            if not kind.startswith("axis"):
                continue
            labels = [t for t in axis.iter(f"{NS}text") if "tick" in t.get("class", "")]
            assert len(labels) >= 2, (name, kind, "an axis without labels")  # thinned, not gone
            boxes = [_box(t) for t in labels]
            for left, _, right, _ in boxes:
                assert left >= 0 and right <= width, (name, kind, left, right)
            if kind == "axis x":
                boxes.sort()
                for a, b in zip(boxes, boxes[1:], strict=False):
                    assert a[2] <= b[0], (name, "x labels overlap", a, b)
            else:
                boxes.sort(key=lambda b: b[1])
                for a, b in zip(boxes, boxes[1:], strict=False):
                    assert a[3] <= b[1], (name, "y labels overlap", a, b)
            values = [_value(t.text or "") for t in labels]
            steps = {round(b - a, 9) for a, b in zip(values, values[1:], strict=False)}
            assert len(steps) <= 1, (name, kind, values)  # evenly spaced
            for step in steps:
                mantissa = float(f"{step:e}".split("e")[0])
                assert round(mantissa, 6) in (1.0, 2.0, 5.0), (name, kind, values)


@pytest.mark.parametrize("name", list(REPORTS))
def test_the_with_line_is_not_squashed(name: str, reports: dict[str, Path]) -> None:
    """In a strategy's panel the scale is its own: its highest point is in the upper half of
    the plot, however high the raw history climbs (that line is clipped)."""
    for svg in _svgs(reports[name]):
        line = next((p for p in svg.iter(f"{NS}polyline") if p.get("class") == "series with"), None)
        if line is None:
            continue
        clip = next(svg.iter(f"{NS}clipPath"))
        rect = clip.find(f"{NS}rect")
        assert rect is not None
        top, height = float(rect.get("y", 0)), float(rect.get("height", 0))
        ys = [float(p.split(",")[1]) for p in (line.get("points") or "").split()]
        assert min(ys) <= top + height / 2
        without = next(p for p in svg.iter(f"{NS}polyline") if p.get("class") == "series without")
        assert without.get("clip-path") == f"url(#{clip.get('id')})"
