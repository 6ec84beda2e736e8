"""The sweep's HTML page in a real browser: headless Chromium (Debian's, as .ci/run installs it) opens the
self-contained file, every plot decodes, the per-length tables and the links to the child runs are there."""

from __future__ import annotations

import io
import os
import shutil

import pytest

from orchestrator.results import html

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")


def browser():
    if not (BROWSER and DRIVER):
        if os.environ.get("CP_TEST_BROWSER") == "required":  # .ci/run installs it: missing is a failure
            pytest.fail("Chromium is not installed, and CP_TEST_BROWSER=required")
        pytest.skip("Chromium is not installed (apt-get install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = BROWSER
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1300,1000",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(DRIVER), options=opts)


def png(colour: str) -> bytes:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(3, 2))
    fig.add_subplot().plot([0, 1], [0, 1], color=colour)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def points() -> list[html.Point]:
    ran = dict(predicted_step_s=0.5, step_low_s=0.45, step_high_s=0.6, predicted_mfu=0.1, predicted_gib=0.2)
    return [
        html.Point(
            "ring",
            "context8",
            1024,
            "full",
            "finished",
            "fits",
            **ran,
            measured_step_s=0.55,
            measured_step_spread=0.1,
            measured_mfu=0.09,
            link="http://127.0.0.1:5000/#/runs/a",
        ),
        html.Point(
            "ulysses",
            "context8",
            1024,
            "full",
            "finished",
            "fits",
            **ran,
            measured_step_s=0.7,
            measured_mfu=0.07,
            link="http://127.0.0.1:5000/#/runs/b",
        ),
        html.Point(
            "ring", "context8", 8192, "full", "infeasible", "predicted step 4 s > this cluster's 1 s budget"
        ),
        html.Point("ulysses", "context16", 8192, "full", "invalid", "ulysses splits q heads over context=16"),
    ]


def test_the_page_opens_in_a_browser_with_its_plots_tables_and_links(tmp_path):
    page = html.page(
        "sweep quickstart-1",
        ["4 grid points: 2 finished, 1 infeasible, 1 invalid"],
        points(),
        {"mfu_vs_context": png("C0"), "loss": png("C1")},
        notes=["CPU MFU is not TPU MFU"],
    )
    path = tmp_path / "report.html"
    path.write_text(page)
    drv = browser()
    try:
        drv.get(path.as_uri())
        assert drv.title == "sweep quickstart-1"
        images = drv.find_elements("css selector", "figure img")
        assert len(images) == 2 and all(
            drv.execute_script("return arguments[0].naturalWidth", i) > 0 for i in images
        )
        text = drv.find_element("tag name", "body").text
        assert "recommended: ring on context8" in text and "fastest measured: ring 0.55 s" in text
        assert "CPU MFU is not TPU MFU" in text and "budget" in text
        links = [a.get_attribute("href") for a in drv.find_elements("css selector", "a")]
        assert "http://127.0.0.1:5000/#/runs/a" in links and "http://127.0.0.1:5000/#/runs/b" in links
        cells = [td.text for td in drv.find_elements("css selector", "td")]
        assert "inside" in cells and "outside" in cells  # 0.55 s in the 0.45-0.6 band, 0.7 s beyond it
        assert drv.get_screenshot_as_png()[:4] == b"\x89PNG"
    finally:
        drv.quit()


def test_points_join_the_plan_rows_with_what_ran():
    from types import SimpleNamespace as NS

    def row(tid, verdict, low=None, high=None):
        fields = dict(model="tiny", strategy="ring", mesh="context8", context_length=1024, policy="full")
        fields["reason"] = "fits"
        band = dict(predicted_step_low_s=low, predicted_step_high_s=high)
        plan = dict(predicted_step_s=0.5, predicted_mfu=0.1, predicted_hbm_bytes_per_device=2**29)
        return NS(trial_id=tid, verdict=verdict, **fields, **band, **plan)

    summary = NS(step_time_median_s=0.5, mfu=0.2)
    trial = NS(spec=NS(trial_id="a"), summary=summary, step_spread=(0.4, 0.6), measured_bytes=2**28)
    rows = [row("a", "run", 0.45, 0.55), row("b", "run", 0.5, 0.5), row("c", "infeasible")]
    a, b, c = html.points(rows, [trial], {"a": "finished", "b": "failed"}, lambda t: f"#/runs/{t}")
    assert (a.verdict, a.measured_step_s, a.measured_mfu, a.measured_gib) == ("finished", 0.5, 0.2, 0.25)
    assert a.measured_step_spread == pytest.approx(0.4) and a.predicted_gib == 0.5 and a.link == "#/runs/a"
    assert html._within(a) == "inside" and html._band(a) == "0.5 (0.45–0.55)"
    assert (
        b.verdict == "failed" and b.measured_step_s is None and html._band(b) == "0.5"
    )  # no band: low = high
    assert (
        c.verdict == "infeasible"
        and html.counts([a, b, c]) == "3 grid points: 1 finished, 1 failed, 1 infeasible"
    )


def test_a_sweep_over_models_gets_a_section_and_a_grid_column_per_model():
    one = [html.Point(**{**p.__dict__, "model": "tiny"}) for p in points()]
    two = [*one, *(html.Point(**{**p.__dict__, "model": "tiny_gemma"}) for p in one)]
    assert "model tiny" not in html.lengths_table(one) and "<th>model</th>" not in html.grid_table(one)
    by_model = html.lengths_table(two)
    assert by_model.index("<h3>model tiny</h3>") < by_model.index("<h3>model tiny_gemma</h3>")
    assert by_model.count("<h4>1,024 tokens</h4>") == 2 and "<h3>1,024" not in by_model
    grid = html.grid_table(two)
    assert "<th>model</th>" in grid and grid.count("<td>tiny_gemma</td>") == len(one)
