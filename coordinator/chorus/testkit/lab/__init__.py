"""The multi-host test rig: hosts in network namespaces on a user-space switch (docs/LAB.md)."""
