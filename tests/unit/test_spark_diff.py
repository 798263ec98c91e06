"""The snapshot diff's DataFrame functions on small frames (chorus_spark.diff), and the SQL the
job builds (chorus_spark.sqlgen)."""

from __future__ import annotations

import datetime as dt
import os
import sys
from decimal import Decimal
from typing import Any, Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql.types import (ArrayType, BinaryType, DecimalType, IntegerType, StringType,  # noqa: E402
                               StructField, StructType, TimestampType)

from chorus_spark import diff  # noqa: E402
from chorus_spark.sqlgen import Column, Table, chunks, ident, intervals, literal  # noqa: E402


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    s = (SparkSession.builder.master("local[2]").appName("chorus-diff-tests")
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


SCHEMA = StructType([
    StructField("id", IntegerType(), False),
    StructField("price", DecimalType(38, 10), True),
    StructField("at", TimestampType(), True),
    StructField("doc", StringType(), True),  # jsonb travels as text
    StructField("bin", BinaryType(), True),
    StructField("tags", ArrayType(StringType()), True),
    StructField("name", StringType(), True),
])
COLS = [f.name for f in SCHEMA.fields]
T0 = dt.datetime(2026, 11, 23, 12, 0, 0, 123456)


def row(i: int, **over: Any) -> tuple[Any, ...]:
    base = {"id": i, "price": Decimal(f"1234567890123456789{i % 10}.0123456789"), "at": T0,
            "doc": '{"a": [1, 2, {"b": null}]}', "bin": bytes([0, 255, i % 256]), "tags": ["x", None, "z"],
            "name": f"row {i}"}
    base.update(over)
    return tuple(base[c] for c in COLS)


def frames(spark: SparkSession, ref: list[tuple[Any, ...]], other: list[tuple[Any, ...]]) -> tuple[Any, Any]:
    return (diff.with_row_hash(spark.createDataFrame(ref, SCHEMA), COLS),
            diff.with_row_hash(spark.createDataFrame(other, SCHEMA), COLS))


def ops(df: Any) -> dict[int, str]:
    return {r["id"]: r[diff.OP] for r in df.collect()}


def test_identical_frames_have_no_changes(spark: SparkSession) -> None:
    rows = [row(i) for i in range(1, 20)]
    r, o = frames(spark, rows, list(reversed(rows)))
    assert ops(diff.classify(r, o, ["id"])) == {}


def test_inserts_updates_deletes(spark: SparkSession) -> None:
    ref = [row(1), row(2), row(3, name="new name"), row(5)]
    other = [row(1), row(3), row(4), row(5)]
    r, o = frames(spark, ref, other)
    changes = diff.classify(r, o, ["id"])
    assert ops(changes) == {2: "I", 3: "U", 4: "D"}
    delta = {d["id"]: d for d in diff.delta_rows(changes, r, ["id"]).collect()}
    assert delta[3]["name"] == "new name" and delta[3][diff.OP] == "U"
    assert delta[2]["price"] == Decimal("12345678901234567892.0123456789")  # 38 digits, exact
    assert delta[4]["name"] is None and delta[4][diff.OP] == "D"  # a delete carries its key only
    assert diff.counts(diff.delta_rows(changes, r, ["id"])) == {"I": 1, "U": 1, "D": 1}


@pytest.mark.parametrize("column, value", [
    ("price", Decimal("12345678901234567891.0123456788")),  # last digit of a wide numeric
    ("at", T0 + dt.timedelta(microseconds=1)),  # one microsecond
    ("doc", '{"a": [1, 2, {"b": 0}]}'),
    ("bin", bytes([0, 255, 2])),
    ("tags", ["x", "", "z"]),  # '' is not NULL
    ("tags", ["x", "NULL", "z"]),  # nor is 'NULL'
    ("name", None),
    ("name", "row 1\t\n\\N 'quoted' \"double\" é ☃"),  # text with odd characters
    ("price", None),
])
def test_each_type_detects_a_change(spark: SparkSession, column: str, value: Any) -> None:
    r, o = frames(spark, [row(1)], [row(1, **{column: value})])
    assert ops(diff.classify(r, o, ["id"])) == {1: "U"}


def test_null_in_one_column_is_not_a_value_in_another(spark: SparkSession) -> None:
    schema = StructType([StructField("id", IntegerType()), StructField("a", StringType()),
                         StructField("b", StringType())])
    r = diff.with_row_hash(spark.createDataFrame([(1, None, "x")], schema), ["id", "a", "b"])
    o = diff.with_row_hash(spark.createDataFrame([(1, "x", None)], schema), ["id", "a", "b"])
    assert ops(diff.classify(r, o, ["id"])) == {1: "U"}


def test_composite_keys(spark: SparkSession) -> None:
    schema = StructType([StructField("a", IntegerType()), StructField("b", StringType()),
                         StructField("v", StringType())])
    r = diff.with_row_hash(spark.createDataFrame([(1, "x", "1"), (1, "y", "2"), (2, "x", "3")], schema), ["a", "b", "v"])
    o = diff.with_row_hash(spark.createDataFrame([(1, "x", "1"), (1, "y", "9"), (2, "y", "3")], schema), ["a", "b", "v"])
    got = {(d["a"], d["b"]): d[diff.OP] for d in diff.classify(r, o, ["a", "b"]).collect()}
    assert got == {(1, "y"): "U", (2, "x"): "I", (2, "y"): "D"}


def test_differing_ranges(spark: SparkSession) -> None:
    schema = "rng long, n long, h string"
    ref = spark.createDataFrame([(0, 10, "5"), (1, 10, "7"), (2, 3, "1"), (3, 1, "2")], schema)
    other = spark.createDataFrame([(0, 10, "5"), (1, 10, "8"), (2, 4, "1"), (4, 1, "2")], schema)
    assert sorted(r["rng"] for r in diff.differing_ranges(ref, other).collect()) == [1, 2, 3, 4]


def test_sql_quotes_identifiers_and_literals() -> None:
    assert ident('we"ird') == '"we""ird"' and literal("it's") == "'it''s'"
    t = Table("s", 'T"1', (Column("k", "text"), Column("v", "integer"), Column("g", "integer", True)), ("k",),
              ("b'1", "c"))
    q = t.summary_query(0, None, check_snapshot=True)
    assert '"s"."T""1"' in q and "'b''1'::text" in q and "pg_current_snapshot()" in q
    assert 't."g"' not in t.row_text()  # generated columns are computed, not compared
    assert t.range_of(1, 2) == "_t0 >= 'b''1'::text AND _t0 < 'c'::text"
    assert t.range_of(0, None) == "true"
    assert t.keys_in([["x'y"]]) == "_t0 IN ('x''y'::text)"


def test_intervals_and_chunks() -> None:
    assert intervals([5, 1, 2, 3, 9, 10], 2) == [(1, 3), (3, 4), (5, 6), (9, 11)]
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
