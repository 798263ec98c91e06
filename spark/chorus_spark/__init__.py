"""PySpark jobs of Chorus: the snapshot diff for total recovery and verify."""
