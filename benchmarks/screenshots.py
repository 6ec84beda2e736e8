"""Screenshots of the MLflow dashboard and of the sweep's HTML page after a real sweep, taken by headless
Chromium: docs/img/dashboard-*.png and docs/img/report.png.

    python benchmarks/screenshots.py [--uri http://127.0.0.1:PORT] [--out docs/img] [--size 1400x900]

Without --uri it starts a throwaway `mlflow server` (sqlite, in a temp dir) on a free port and runs
`+sweep=smoke` against it (one to two minutes on 2 cores; `--sweep quickstart`: that sweep, about 5 minutes);
with --uri it photographs the newest sweep already there, which is the quick loop after a UI change. The first
picture is the link the driver prints, opened by a browser profile that has never seen MLflow. Needs Debian's browser and driver
(`apt-get install chromium chromium-driver`) and `pip install selenium`; no browser is ever downloaded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlflow import MlflowClient
from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.actions.action_builder import ActionBuilder
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from orchestrator import REPO

# The suite's own throwaway MLflow server (tests/servers.py), which is no package.
sys.path.append(str(REPO / "tests"))
import servers

EXPERIMENT = "cp_scaling"
CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]
# The chart cards in view, their metric keys, or null until every one has its plotly traces drawn (cards out
# of view are not drawn until scrolled to, so they are not waited for).
CARDS_DRAWN = """const cards = [...document.querySelectorAll("[data-testid='experiment-view-compare-runs-card']")]
  .filter(c => c.getBoundingClientRect().top < innerHeight);
const keys = cards.map(c => (c.querySelector("h4[title]") || {}).title || "");
const drawn = cards.every(c => c.querySelector(".js-plotly-plot g.trace"));
return cards.length && drawn && keys.every(k => new RegExp(arguments[0]).test(k)) ? keys : null;"""


def run_sweep(uri: str, workdir: Path, sweep: str = "smoke") -> None:
    """A sweep through the real CLI, in `workdir` (its journal and Ray logs stay out of the repo)."""
    if sweep == "quickstart" and (REPO / "data").is_dir():  # a corpus built already; else built on first use
        (workdir / "data").symlink_to(REPO / "data", target_is_directory=True)
    cmd = [
        sys.executable,
        "-m",
        "orchestrator",
        f"+sweep={sweep}",
        "tracking=server",
        f"tracking.uri={uri}",
        "progress=plain",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = workdir / "sweep.log"
    with open(log, "w") as f:
        code = subprocess.run(cmd, cwd=workdir, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"sweep exited {code}:\n{log.read_text()[-3000:]}")


def newest_sweep(uri: str, sweep_id: str = "") -> tuple[str, str, str, str]:
    """(experiment id, parent run id, child run id, child run name) of the newest sweep (or of `sweep_id`); the
    child is the longest finished trial."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    if exp is None:
        raise SystemExit(f"no experiment {EXPERIMENT!r} at {uri}: run a sweep first (or leave out --uri)")
    eid = exp.experiment_id
    which = "tags.kind = 'sweep'" + (f" and tags.sweep_id = '{sweep_id}'" if sweep_id else "")
    parents = client.search_runs([eid], which, order_by=["attributes.start_time DESC"])
    if not parents:
        raise SystemExit(f"no sweep in experiment {EXPERIMENT!r} at {uri}")
    pid = parents[0].info.run_id
    kids = client.search_runs([eid], f"tags.mlflow.parentRunId = '{pid}' and tags.status = 'finished'")
    if not kids:
        raise SystemExit(f"sweep run {pid} has no finished trial")
    kid = max(kids, key=lambda r: (int(r.data.params.get("context_length", 0)), r.info.run_name))
    return eid, pid, kid.info.run_id, kid.info.run_name


class Dashboard:
    """One headless Chromium on the MLflow UI; every step waits for what it needs to see, not for a set time."""

    def __init__(self, uri: str, width: int, height: int, profile: str, timeout: float = 90.0):
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]:
            opts.add_argument(flag)
        os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must not look for a driver online
        self.d = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        # the viewport itself, not the window around it, is what lands in the PNG
        self.d.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        self.uri = uri.rstrip("/")
        self.wait = WebDriverWait(self.d, timeout)
        self.assistant_wait = 10.0  # the panel opens itself once, on the first page; after that it stays shut

    def open(self, route: str) -> None:
        """A page in the Model training mode: the UI's own query parameter for the sidebar's GenAI / Model
        training switch (a click on the switch would wait on the GenAI overview's pop-ups first)."""
        self.d.get(f"{self.uri}/#{route}?workflowType=machine_learning")

    def find(self, css: str):
        return self.wait.until(EC.visibility_of_element_located((By.CSS_SELECTOR, css)), f"no {css}")

    def text(self, text: str):
        """The innermost visible element whose own text is `text`."""
        xp = f"//*[normalize-space(text())='{text}']"
        return self.wait.until(EC.visibility_of_element_located((By.XPATH, xp)), f"no {text!r} on the page")

    def quiet(self) -> None:
        """Close the Assistant panel (it opens itself on a 127.0.0.1 server) and park the mouse off the charts."""
        close = (By.CSS_SELECTOR, "[data-component-id='mlflow.assistant.chat_panel.close']")
        try:
            WebDriverWait(self.d, self.assistant_wait).until(EC.element_to_be_clickable(close)).click()
        except TimeoutException:
            pass  # not shown: a remote server, or closed already (the UI keeps that in localStorage)
        self.assistant_wait = 0.5
        self.d.execute_script("document.activeElement && document.activeElement.blur()")
        park = ActionBuilder(self.d)
        park.pointer_action.move_to_location(2, 2)  # the logo's corner: no chart shows a hover label
        park.perform()

    def charts(self, term: str) -> list[str]:
        """Filter the run's charts to metric keys matching the regex `term`; wait for those in view to be drawn."""
        box = self.find("input[placeholder='Search metric charts']")
        box.send_keys(Keys.CONTROL, "a")  # clear() leaves React's own state (the old term) as it was
        box.send_keys(Keys.BACKSPACE)
        box.send_keys(term)
        return self.wait.until(lambda d: d.execute_script(CARDS_DRAWN, term), f"no {term!r} chart drawn")

    def shot(self, path: Path) -> Path:
        self.quiet()
        time.sleep(0.5)  # plotly's and antd's fade-ins have no end event to wait on
        self.d.save_screenshot(str(path))
        return path

    def close(self) -> None:
        self.d.quit()


def first_view(ui: Dashboard, uri: str, out: Path) -> tuple[Path, str]:
    """The driver's dashboard link as a fresh browser profile first shows it: nothing closed, nothing clicked."""
    from orchestrator.tracking.store import MlflowTracker

    link = MlflowTracker(uri, EXPERIMENT).dashboard_url()  # the very link the driver prints
    ui.d.get(link)
    ui.wait.until(
        lambda d: d.execute_script(CARDS_DRAWN, ".*"), "no chart drawn on the dashboard's first view"
    )
    time.sleep(0.5)  # plotly's and antd's fade-ins have no end event to wait on
    ui.d.save_screenshot(str(out / "dashboard-first-view.png"))
    return out / "dashboard-first-view.png", f"first view of {link}"


def report_page(ui: Dashboard, uri: str, pid: str, out: Path, width: int) -> tuple[Path, str]:
    """The sweep's report.html from its parent run, opened from a file as a reader would, photographed whole."""
    with tempfile.TemporaryDirectory(prefix="screenshots-report-") as tmp:
        page = Path(MlflowClient(uri).download_artifacts(pid, "report.html", tmp))
        ui.d.get(page.as_uri())
        ui.wait.until(
            lambda d: d.execute_script(
                "return [...document.images].every(i => i.complete && i.naturalWidth)"
            ),
            "the report's plots did not load",
        )
        tall = ui.d.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": width, "height": tall, "deviceScaleFactor": 1, "mobile": False}
        ui.d.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        ui.d.save_screenshot(str(out / "report.png"))
    return out / "report.png", f"the sweep's report.html, {width}x{tall}"


def take(uri: str, out: Path, width: int, height: int, sweep_id: str = "") -> list[tuple[Path, str]]:
    eid, pid, cid, child = newest_sweep(uri, sweep_id)
    out.mkdir(parents=True, exist_ok=True)
    made = []
    with tempfile.TemporaryDirectory(prefix="screenshots-chromium-") as profile:
        ui = Dashboard(uri, width, height, profile)
        try:
            made.append(first_view(ui, uri, out))
            ui.open(f"/experiments/{eid}/runs")
            grip = ui.find("[role='columnheader'][col-id*='Run Name'] .ag-header-cell-resize")
            webdriver.ActionChains(ui.d).drag_and_drop_by_offset(grip, 120, 0).perform()  # whole run names
            ui.find(f"[role='row'][row-id='{pid}'] [col-id*='Run Name'] button").click()  # expand the sweep
            ui.text(child)
            made.append((ui.shot(out / "dashboard-runs.png"), "runs list, the sweep expanded to its trials"))

            ui.open(f"/experiments/{eid}/runs/{pid}/model-metrics")
            keys = ui.charts("^mfu/")
            made.append((ui.shot(out / "dashboard-sweep-charts.png"), f"sweep run, {', '.join(keys)} charts"))

            for plot, name in (
                ("mfu_vs_context", "sweep-plots"),
                ("loss_by_position", "sweep-loss-by-position"),
            ):
                ui.open(f"/experiments/{eid}/runs/{pid}/artifacts/plots/{plot}.png")
                ui.text(
                    f"{plot}.png"
                ).click()  # a second artifact route on the same page keeps the first file
                ui.text(f"plots/{plot}.png")  # the viewer's header: this file is the one shown
                ui.wait.until(
                    lambda d: d.execute_script(
                        "return [...document.images].some(i => i.src.startsWith('blob:') && i.complete && i.naturalWidth)"
                    ),
                    f"plots/{plot}.png did not load",
                )
                made.append((ui.shot(out / f"dashboard-{name}.png"), f"sweep run, plots/{plot}.png"))

            ui.open(f"/experiments/{eid}/runs/{cid}/model-metrics")
            keys = ui.charts("^(loss|mfu|step_time_s)$")
            made.append(
                (ui.shot(out / "dashboard-trial-charts.png"), f"trial run {child}, {', '.join(keys)} charts")
            )
            keys = ui.charts("^loss_by_position/")
            made.append(
                (
                    ui.shot(out / "dashboard-trial-loss-by-position.png"),
                    f"trial run {child}, {', '.join(keys)} charts",
                )
            )
            made.append(report_page(ui, uri, pid, out, width))
        finally:
            ui.close()
    return made


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--uri", default="", help="an MLflow server with a sweep on it; default: start one and sweep"
    )
    ap.add_argument(
        "--sweep", default="smoke", help="the sweep run when there is no --uri: smoke or quickstart"
    )
    ap.add_argument("--sweep-id", default="", help="with --uri: photograph this sweep, not the newest")
    ap.add_argument("--out", default=str(REPO / "docs" / "img"))
    ap.add_argument("--size", default="1400x900", help="viewport WIDTHxHEIGHT in CSS pixels")
    a = ap.parse_args()
    width, height = (int(v) for v in a.size.split("x"))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="screenshots-") as tmp:
        server = None
        if not a.uri:
            server = servers.start_mlflow_server(Path(tmp))
            a.uri = server.url
        try:
            if server:
                print(f"mlflow server at {a.uri}; running the {a.sweep} sweep ...", flush=True)
                run_sweep(a.uri, Path(tmp), a.sweep)
                print(f"sweep done in {time.monotonic() - t0:.0f} s", flush=True)
            made = take(a.uri, Path(a.out), width, height, a.sweep_id)
        finally:
            if server:
                server.stop()
    for path, what in made:
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        print(f"wrote {shown}: {what}")
    print(f"screenshots: {len(made)} in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
