"""Entry point for spark-submit from the source tree: ``spark-submit spark/submit_job.py PLAN.json``. On a cluster, ship the package to
the executors too (``--py-files chorus_spark.zip``: ``chorus_spark.launch.package``), and give them a
Python with psycopg (``PYSPARK_PYTHON``). ``chorus ... --spark-submit PATH`` does all that itself
(``chorus.total.recover.submit_command``), with an entry script of its own, so it needs no source tree."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chorus_spark.job import main  # noqa: E402

raise SystemExit(main(sys.argv[1:]))
