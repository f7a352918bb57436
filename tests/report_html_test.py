#!/usr/bin/env python3
"""`pipesim report`'s page read by a real HTML parser (python's html.parser, which tokenizes as the
HTML standard does): every element closed in order, nothing fetched from a network, compare's table and
each run's pictures in place; and the pictures `simulate` writes as files parsed as XML.

With --browser, loads the page in headless Chromium (Debian's `chromium`) instead: a screenshot, the
pictures in its DOM, the table sorted by clicks on a header, tune's answer first and no wider than a
1400 px window, and the report of a 64 x 1024 run with its timeline's break drawn; exits 77 (SKIP)
where Chromium is not installed. $PIPESIM_SCREENSHOT, when set, names a file to keep the screenshot in.

usage: report_html_test.py [--browser]   ($PIPESIM: the binary; $PIPESIM_SOURCE: the source root)
"""
import html
import html.parser
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

PIPESIM = os.environ["PIPESIM"]
SOURCE = os.environ["PIPESIM_SOURCE"]
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
failures = 0


def check(ok, what):
    global failures
    print(f"{'ok  ' if ok else 'FAIL'} {what}")
    failures += not ok


# Clicks the comparison table's iter_ms header twice and writes the column after each click (the
# comparison's is the page's last table: tune's, where it ran, comes first).
CLICKS = """<!DOCTYPE html><html><body><iframe id="page" src="PAGE"></iframe><script>
document.getElementById('page').onload = function () {
  var tables = this.contentDocument.querySelectorAll('table.sortable'), table = tables[tables.length - 1];
  var column = function () {
    return Array.prototype.map.call(table.tBodies[0].rows, function (row) { return row.cells[3].textContent; }).join(' ');
  };
  var header = table.tHead.rows[0].cells[3], seen = [column()];
  header.click(); seen.push(column());
  header.click(); seen.push(column());
  var out = document.createElement('pre');
  out.id = 'sorted';
  out.textContent = seen.join('\\n');
  document.body.appendChild(out);
};
</script></body></html>
"""

# Loads a report in a frame 1400 px wide and writes down what it measures: the page's width (its
# widest content, scrolled boxes excluded), the first section's heading, and the drawn size of a
# timeline's break where there is one.
MEASURE = """<!DOCTYPE html><html><body style="margin:0"><iframe id="page" src="PAGE"
 style="width:1400px;height:900px;border:0"></iframe><script>
document.getElementById('page').onload = function () {
  var d = this.contentDocument, band = d.querySelector('rect.elided'), box = band && band.getBoundingClientRect();
  var out = document.createElement('pre');
  out.id = 'measured';
  out.textContent = JSON.stringify({width: d.documentElement.scrollWidth, first: d.querySelector('h2').textContent,
                                    band: box ? [box.width, box.height] : null});
  document.body.appendChild(out);
};
</script></body></html>
"""


class Page(html.parser.HTMLParser):
    """Checks nesting as it goes and counts what the tests look for."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.open = []
        self.errors = []
        self.counts = {}
        self.references = []  # href, src and url values
        self.doctype = None
        self.rows = []  # per <tbody> row: its cells' count
        self.headers = 0

    def handle_decl(self, decl):
        self.doctype = decl

    def handle_starttag(self, tag, attrs):
        self.counts[tag] = self.counts.get(tag, 0) + 1
        if tag == "title" and self.open and self.open[-1] == "head":  # not an SVG tooltip's <title>
            self.counts["page title"] = self.counts.get("page title", 0) + 1
        for name, value in attrs:
            if name in ("href", "src", "xlink:href", "action"):
                self.references.append(value or "")
        if tag == "th":
            self.headers += 1
        if tag == "tr" and "tbody" in self.open:
            self.rows.append(0)
        if tag == "td" and self.rows:
            self.rows[-1] += 1
        if tag not in VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):  # <rect .../> in SVG: opened and closed at once
        self.counts[tag] = self.counts.get(tag, 0) + 1

    def handle_endtag(self, tag):
        if not self.open or self.open[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.open[-1] if self.open else 'nothing'}>")
            return
        self.open.pop()


def pipesim(*args):
    return subprocess.run([PIPESIM, *args], capture_output=True, text=True, timeout=600)


def main():
    folder = tempfile.mkdtemp(prefix="pipesim-report-test-")
    page_path = os.path.join(folder, "report.html")
    tiny = os.path.join(SOURCE, "configs", "tiny.json")
    made = pipesim("report", tiny, "--schedules", "1f1b,gpipe", "--vocab", "baseline,vocab-1", "--tune", "--top",
                   "3", "-o", page_path)
    check(made.returncode == 0, f"pipesim report exits 0 ({made.stderr.strip()})")
    if made.returncode != 0:
        return 1
    if "--browser" in sys.argv:
        return browser(page_path, folder)
    text = open(page_path, encoding="utf-8").read()
    page = Page()
    page.feed(text)
    page.close()
    check(page.doctype == "DOCTYPE html", "the page declares <!DOCTYPE html>")
    check(not page.errors, f"every element closed in order: {page.errors[:3]}")
    check(page.open == [], f"nothing left open: {page.open}")
    for tag in ("html", "head", "body", "page title"):
        check(page.counts.get(tag) == 1, f"one <{tag}>")
    check(page.counts.get("script") == 1 and page.counts.get("style") == 1, "inline <script> and <style>, once each")
    check(all(r.startswith("#") for r in page.references), f"every link is inside the page: {page.references[:3]}")
    check("http://" not in text and "https://" not in text, "no http(s) address anywhere")
    # 4 runs (2 schedules x 2 modes): a timeline and a memory plot each, and tune's scatter.
    check(page.counts.get("svg") == 9, f"9 pictures: {page.counts.get('svg')}")
    check(page.counts.get("details") == 4, "a section per run")
    # Tune's table first (yours and 3 ranks), then compare's (4 rows of 12 cells).
    check(len(page.rows) == 8 and len(set(page.rows[:4])) == 1, f"tune's table has 4 rows: {page.rows[:4]}")
    check(page.rows[4:] == [12] * 4, f"compare's table has 4 rows of 12 cells: {page.rows[4:]}")
    check(text.index("<h2>Tune</h2>") < text.index("<h2>Comparison</h2>"), "tune's answer comes first")

    for option in ("--svg", "--memory-svg"):
        path = os.path.join(folder, option.strip("-") + ".svg")
        drawn = pipesim("simulate", os.path.join(SOURCE, "configs", "default.json"), "--vocab", "vocab-1", option,
                        path)
        try:
            root = ElementTree.parse(path).getroot()
            check(drawn.returncode == 0 and root.tag == "{http://www.w3.org/2000/svg}svg",
                  f"simulate {option} writes well-formed SVG")
        except (ElementTree.ParseError, OSError) as error:
            check(False, f"simulate {option} writes well-formed SVG: {error}")
    # 64 devices x 1024 microbatches: the elided timeline is well-formed too, its break marked.
    big = os.path.join(folder, "big.svg")
    drawn = pipesim("simulate", os.path.join(SOURCE, "tools", "speed-p64-m1024.json"), "--svg", big)
    try:
        root = ElementTree.parse(big).getroot()
        bands = [e for e in root.iter("{http://www.w3.org/2000/svg}rect") if e.get("class") == "elided"]
        check(drawn.returncode == 0 and len(bands) == 1, "a 64 x 1024 timeline is well-formed SVG with one break")
    except (ElementTree.ParseError, OSError) as error:
        check(False, f"a 64 x 1024 timeline is well-formed SVG: {error}")
    shutil.rmtree(folder)
    return 1 if failures else 0


def browser(page_path, folder):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIP: no chromium on PATH (Debian: apt-get install chromium)")
        return 77
    screenshot = os.environ.get("PIPESIM_SCREENSHOT") or os.path.join(folder, "report.png")
    common = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"]
    shot = subprocess.run([chromium, *common, f"--screenshot={screenshot}", "file://" + page_path],
                          capture_output=True, text=True, timeout=120)
    size = os.path.getsize(screenshot) if os.path.exists(screenshot) else 0
    check(shot.returncode == 0 and size > 20000, f"chromium draws the page: a {size}-byte screenshot")
    dom = subprocess.run([chromium, *common, "--dump-dom", "file://" + page_path], capture_output=True, text=True,
                         timeout=120)
    check(dom.stdout.count("<svg") == 9 and 'class="sortable"' in dom.stdout, "chromium's DOM has the pictures")
    # A click on iter_ms's header sorts the rows by it, a second click reverses them: a page that holds
    # the report in a frame clicks and writes down the column each time.
    wrapper = os.path.join(folder, "click.html")
    with open(wrapper, "w", encoding="utf-8") as out:
        out.write(CLICKS.replace("PAGE", os.path.basename(page_path)))
    clicked = subprocess.run([chromium, *common, "--allow-file-access-from-files", "--virtual-time-budget=5000",
                              "--dump-dom", "file://" + wrapper], capture_output=True, text=True, timeout=120)
    columns = clicked.stdout.split('<pre id="sorted">')[-1].split("</pre>")[0].split("\n")
    orders = [[float(cell) for cell in column.split()] for column in columns if column.strip()]
    check(len(orders) == 3 and len(orders[0]) == 4 and orders[1] == sorted(orders[0])
          and orders[2] == sorted(orders[0], reverse=True), f"a click sorts by iter_ms, a second reverses: {orders}")

    # Tune first, and nothing wider than a 1400 px window, even under a config path too long to break
    # at a space (its tables scroll in their own boxes instead).
    long_config = os.path.join(folder, "a" * 150 + "-config.json")
    shutil.copy(os.path.join(SOURCE, "configs", "tiny.json"), long_config)
    long_page = os.path.join(folder, "long.html")
    made = pipesim("report", long_config, "--schedules", "1f1b", "--tune", "--top", "3", "-o", long_page)
    measured = measure(chromium, common, long_page, folder)
    check(made.returncode == 0 and measured.get("first") == "Tune" and 0 < measured.get("width", 0) <= 1400,
          f"tune's answer first, the page fits 1400 px: {measured}")
    # 64 devices x 1024 microbatches: a screenshot of the page, whose timeline's break is drawn.
    big_page = os.path.join(folder, "big.html")
    made = pipesim("report", os.path.join(SOURCE, "tools", "speed-p64-m1024.json"), "--schedules", "1f1b", "--vocab",
                   "baseline", "-o", big_page)
    measured = measure(chromium, common, big_page, folder)
    band = measured.get("band") or [0, 0]
    check(made.returncode == 0 and 0 < measured.get("width", 0) <= 1400 and band[0] > 10 and band[1] > 1000,
          f"a 64 x 1024 timeline fits the page, its break drawn through the rows: {measured}")
    big_shot = os.path.join(folder, "big.png")
    shot = subprocess.run([chromium, *common, f"--screenshot={big_shot}", "file://" + big_page],
                          capture_output=True, text=True, timeout=120)
    size = os.path.getsize(big_shot) if os.path.exists(big_shot) else 0
    check(shot.returncode == 0 and size > 20000, f"chromium draws the 64 x 1024 page: a {size}-byte screenshot")
    shutil.rmtree(folder)
    return 1 if failures else 0


def measure(chromium, common, page_path, folder):
    """What MEASURE writes down for the page, as a dict (empty when Chromium wrote nothing)."""
    wrapper = os.path.join(folder, "measure.html")
    with open(wrapper, "w", encoding="utf-8") as out:
        out.write(MEASURE.replace("PAGE", os.path.basename(page_path)))
    dumped = subprocess.run([chromium, *common, "--allow-file-access-from-files", "--virtual-time-budget=5000",
                             "--dump-dom", "file://" + wrapper], capture_output=True, text=True, timeout=120)
    text = dumped.stdout.split('<pre id="measured">')[-1].split("</pre>")[0]
    try:
        return json.loads(html.unescape(text))
    except ValueError:
        return {}


if __name__ == "__main__":
    sys.exit(main())
