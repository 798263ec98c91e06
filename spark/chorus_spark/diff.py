"""The snapshot diff as DataFrame -> DataFrame functions (no I/O; tested on small frames).

Three levels, each reading less than the one before would:
1. ``differing_ranges``: per primary-key range, a row count and a sum of row hashes from each
   side (computed by PostgreSQL); only ranges whose summaries differ go further.
2. ``classify``: within those ranges, one (key, row hash) per row from each side; a full outer
   join on the key says which rows the reference has that the other lacks (I), which the other
   has that the reference lacks (D), and which differ (U).
3. ``delta_rows``: the reference's full rows for I and U, and the key alone for D: what turns the
   other side into the reference.

``with_row_hash`` hashes whole rows of any column types in Spark (the job lets PostgreSQL hash,
which avoids moving the rows; this is for frames that are already in Spark).
"""

from __future__ import annotations

from typing import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

OP = "_chorus_op"
HASH = "_h"
INSERT, UPDATE, DELETE = "I", "U", "D"


def with_row_hash(df: DataFrame, columns: Sequence[str], name: str = HASH) -> DataFrame:
    """Add a SHA-256 of the row's values. NULL is distinct from every value (also from '' and
    'NULL'), and the column a value sits in matters."""
    exact = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",  # the default drops microseconds
             "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}
    parts = [F.when(F.col(c).isNull(), F.lit("n"))
             .otherwise(F.concat(F.lit("v"), F.to_json(F.struct(F.col(c)), exact))) for c in columns]
    return df.withColumn(name, F.sha2(F.concat_ws("\x1f", *parts), 256))


def differing_ranges(ref: DataFrame, other: DataFrame, range_col: str = "rng") -> DataFrame:
    """Range ids whose (row count, hash sum) differ between the sides, or that only one side has.
    Both frames: ``range_col``, ``n``, ``h``."""
    r = ref.select(F.col(range_col).alias("_r"), F.col("n").alias("_rn"), F.col("h").alias("_rh"))
    o = other.select(F.col(range_col).alias("_r"), F.col("n").alias("_on"), F.col("h").alias("_oh"))
    j = r.join(o, on="_r", how="full_outer")
    same = (F.col("_rn") == F.col("_on")) & (F.col("_rh") == F.col("_oh"))
    return j.where(~F.coalesce(same, F.lit(False))).select(F.col("_r").alias(range_col))


def _op(ref_hash: Column, other_hash: Column) -> Column:
    return (F.when(other_hash.isNull(), F.lit(INSERT))
            .when(ref_hash.isNull(), F.lit(DELETE))
            .when(ref_hash != other_hash, F.lit(UPDATE)))


def classify(ref: DataFrame, other: DataFrame, keys: Sequence[str], hash_col: str = HASH) -> DataFrame:
    """Keyed rows with a row hash on each side -> ``keys`` + ``OP`` for every row that differs."""
    r = ref.select(*keys, F.col(hash_col).alias("_rh"))
    o = other.select(*keys, F.col(hash_col).alias("_oh"))
    j = r.join(o, on=list(keys), how="full_outer")
    return j.select(*keys, _op(F.col("_rh"), F.col("_oh")).alias(OP)).where(F.col(OP).isNotNull())


def delta_rows(changes: DataFrame, ref_rows: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The classified changes with the reference's full row for I and U (D keeps its key only;
    its other columns are NULL). Columns: those of ``ref_rows`` (which hold ``keys``), then OP."""
    cols = [c for c in ref_rows.columns if c != HASH]
    full = changes.join(ref_rows.select(*cols), on=list(keys), how="left")
    values = [F.col(c) if c in keys else F.when(F.col(OP) == DELETE, F.lit(None)).otherwise(F.col(c)).alias(c)
              for c in cols]
    return full.select(*values, F.col(OP))


def counts(delta: DataFrame) -> dict[str, int]:
    """Rows per operation."""
    out = {INSERT: 0, UPDATE: 0, DELETE: 0}
    for row in delta.groupBy(OP).count().collect():
        out[row[OP]] = int(row["count"])
    return out
