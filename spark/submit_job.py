"""Entry point for spark-submit: ``spark-submit --jars /usr/share/java/postgresql.jar
spark/submit_job.py PLAN.json`` (the executors need the pgchorus Python environment)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chorus_spark.job import main  # noqa: E402

raise SystemExit(main(sys.argv[1:]))
