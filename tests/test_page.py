"""A results page's Markdown tables (benchmarks/page.py, on tabulate), and reading them back
(benchmarks/aot_page.py)."""

from benchmarks import aot_page, page


def test_cells_are_kept_as_given_and_columns_line_up():
    got = page.table(["strategy", "ratio", "peak"], [["ring", "0.500", "≥ 150.6 GiB"], ["usp", 12, None]])
    assert got.splitlines() == [
        "| strategy   | ratio   | peak        |",
        "|------------|---------|-------------|",
        "| ring       | 0.500   | ≥ 150.6 GiB |",
        "| usp        | 12      | None        |",
    ]


def test_a_table_reads_back_however_padded():
    head = ["cluster", "strategy", "verdict"]
    rows = [
        aot_page.Row(dict(zip(head, c, strict=True)))
        for c in (["v5p", "ring", "run"], ["tpu7x", "usp", "**x**"])
    ]
    padded = aot_page.table(head, rows)
    plain = "| cluster | strategy | verdict |\n|---|---|---|\n| v5p | ring | run |\n| tpu7x | usp | **x** |"
    for text in (padded, plain, "  " + padded.replace("\n", "\n  ")):  # a page's, an older page's, indented
        got = aot_page.rows_from(f"before\n\n{text}\n\nafter | not a row", head)
        assert [r.cells for r in got] == [r.cells | {"verdict": r.cells["verdict"].strip("*")} for r in rows]
    assert aot_page.rows_from(padded, ["cluster", "strategy"]) == []  # another table's header
