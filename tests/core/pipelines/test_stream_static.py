"""Stream-static joins against a materialized view (seeds/004): the dimension is a snapshot
taken when the stream starts; rows already joined are not reprocessed when it changes,
a full refresh recomputes them."""

from __future__ import annotations

import json

import pytest

from tests.core.pipelines.conftest import MakeProject


def _lines(path: str, rows: list[dict]) -> None:
    with open(path, "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")


SPARK_SHAPE = ("hr.read.table", "facts.join(dims, on=\"customer_id\", how=\"inner\")")
HELPER = ("dp.read.table", "dp.stream_static_join(facts, dims, on=\"customer_id\", how=\"inner\")")


@pytest.mark.parametrize(("read", "join"), [SPARK_SHAPE, HELPER], ids=["hr.read-and-StreamFrame.join", "dp-helpers"])
def test_sales_report_example(make_project: MakeProject, read: str, join: str) -> None:
    p = make_project(name="sales")
    p.write("transformations/defs.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.table
        def transactions():
            return (hr.read_stream.format("cloudFiles").option("cloudFiles.format", "json")
                    .option("cloudFiles.inferColumnTypes", "true").load("tx")
                    .map_batches(lambda t: t.select(["customer_id", "value"])))

        @dp.materialized_view
        def customers():
            return dp.read.format("json").load("customers.json")

        @dp.temporary_view
        def v_transactions():
            return hr.read_stream.table("transactions")

        @dp.temporary_view
        def v_customers():
            return READ("customers")

        @dp.table
        def sales_report():
            facts = hr.read_stream.table("v_transactions")
            dims = READ("v_customers")
            return JOIN
        """.replace("READ", read).replace("JOIN", join))
    import os

    os.makedirs(p.path("tx"))
    _lines(p.path("customers.json"), [{"customer_id": 1, "name": "Bilal"}, {"customer_id": 2, "name": "Olga"}])
    _lines(p.path("tx", "1.json"), [{"customer_id": 1, "value": 100}, {"customer_id": 2, "value": 150},
                                    {"customer_id": 3, "value": 299}])  # fmt: skip
    r = p.run()
    assert r.state == "COMPLETED", r.errors
    assert sorted((x["customer_id"], x["name"]) for x in p.table("sales_report")) == [(1, "Bilal"), (2, "Olga")]
    g = p.load().graph.analyze()
    assert g.kind_of(g.lookup("v_customers")) == "temporary_view"
    assert not os.path.exists(p.path("storage", "tables", "v_customers"))  # views are not persisted

    # Zoya arrives in the dimension, and a new transaction of hers
    _lines(p.path("customers.json"), [{"customer_id": 1, "name": "Bilal"}, {"customer_id": 2, "name": "Olga"},
                                      {"customer_id": 3, "name": "Zoya"}])  # fmt: skip
    _lines(p.path("tx", "2.json"), [{"customer_id": 3, "value": 5}])
    p.run()
    got = sorted((x["customer_id"], x["value"]) for x in p.table("sales_report"))
    assert got == [(1, 100), (2, 150), (3, 5)]  # the 299 row was joined before Zoya existed: not reprocessed
    p.run(full_refresh=["sales_report"])
    got = sorted((x["customer_id"], x["value"]) for x in p.table("sales_report"))
    assert got == [(1, 100), (2, 150), (3, 5), (3, 299)]


def test_materialized_view_from_core_static_frames(make_project: MakeProject) -> None:
    """A materialized view built with the core's frames (hr.read.table + SQL steps)."""
    from tests.core.pipelines.conftest import expected

    p = make_project()
    p.write("transformations/more.py", """
        import headrace as hr
        import headrace.pipelines as dp

        @dp.materialized_view
        def big_silver():
            return hr.read.table("silver").where("amount >= 20").select_expr("id", "amount * 2 AS doubled")
        """)
    rows = p.add_files(2)
    r = p.run()
    assert r.flows["big_silver"] == "COMPLETED", r.errors
    want = sorted((i, a * 2) for i, _, a in expected(rows)["silver"] if a >= 20)
    assert sorted((x["id"], x["doubled"]) for x in p.table("big_silver")) == want
    g = p.load().graph.analyze()
    assert g.upstream(g.registry.flows["big_silver"]) == {"silver"}


def test_sales_report_in_sql(make_project: MakeProject) -> None:
    import os

    p = make_project(name="sales_sql")
    os.remove(p.path("transformations", "defs.py"))
    p.write("transformations/defs.sql", """
        CREATE OR REFRESH STREAMING TABLE transactions
        AS SELECT customer_id, value FROM STREAM read_files('tx', format => 'json', inferColumnTypes => true);

        CREATE OR REFRESH MATERIALIZED VIEW customers AS SELECT * FROM read_files('customers.json', format => 'json');

        CREATE OR REFRESH STREAMING TABLE sales_report
        AS SELECT t.customer_id, t.value, c.name
        FROM STREAM(transactions) t JOIN customers c ON t.customer_id = c.customer_id;
        """)
    os.makedirs(p.path("tx"))
    _lines(p.path("customers.json"), [{"customer_id": 1, "name": "Bilal"}, {"customer_id": 2, "name": "Olga"}])
    _lines(p.path("tx", "1.json"), [{"customer_id": 1, "value": 100}, {"customer_id": 3, "value": 299}])
    g = p.load().graph.analyze()  # the dry run reads nothing and sees the stream and the batch read
    assert g.kind_of(g.lookup("sales_report")) == "streaming_table"
    assert g.stream_reads(g.registry.flows["sales_report"]) == {"transactions"}
    assert g.static_reads(g.registry.flows["sales_report"]) == {"customers"}
    r = p.run()
    assert r.state == "COMPLETED", r.errors
    assert [(x["customer_id"], x["name"]) for x in p.table("sales_report")] == [(1, "Bilal")]
    _lines(p.path("customers.json"), [{"customer_id": 1, "name": "Bilal"}, {"customer_id": 3, "name": "Zoya"}])
    _lines(p.path("tx", "2.json"), [{"customer_id": 3, "value": 5}])
    p.run()
    assert sorted((x["customer_id"], x["value"]) for x in p.table("sales_report")) == [(1, 100), (3, 5)]
