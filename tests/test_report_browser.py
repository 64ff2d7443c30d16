"""`kvbench report --format html` in headless Chromium: the page of the committed reference record renders
from its own file, requests nothing, and draws its plots. With KVBENCH_SCREENSHOTS set (make screenshots)
its screenshot is kept as docs/report.png, as tests/test_history.py keeps docs/history.png."""

from pathlib import Path

import pytest
from test_history import (  # noqa: F401 - proxy is a fixture
    BROWSER_OWN_HOSTS,
    CHROMIUM,
    blank_page_hosts,
    chromium,
    page_requests,
    proxy,
    screenshot,
    screenshot_colors,
)

from kvbench.cli import main
from kvbench.report.record.plots import COLORS

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "results" / "reference.json"


def rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install -y chromium; "
                                              ".ci/run installs it)")
def test_chromium_renders_the_html_report_offline_with_its_plots(tmp_path, proxy, capsys, monkeypatch):
    own = BROWSER_OWN_HOSTS | blank_page_hosts(tmp_path)
    page = tmp_path / "report.html"
    monkeypatch.chdir(ROOT)  # the page names its record as a user in the checkout would: results/reference.json
    assert main(["report", str(REFERENCE.relative_to(ROOT)), "--format", "html", "--output", str(page)]) == 0
    dom = chromium(tmp_path, proxy, page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<figure>") == 3 and "95% rerun interval" in dom.stdout
    shot = screenshot(tmp_path, proxy, page, "report.png", "--window-size=1240,3050")
    colors = screenshot_colors(shot)
    drawn = {mode for mode in ("concat", "static", "paged") if rgb(COLORS[mode]) in colors}
    assert drawn == {"concat", "static", "paged"}, "every cached mode's line is drawn"
    assert page_requests(proxy, own) == [], proxy.requests
