"""Links between sites (docs/LINKS.md, issue 38): two Chorus clusters replicating both ways,
asynchronously, with conflicts detected by logical-clock windows (NDB$EPOCH, NDB$EPOCH_TRANS)
and settled by per-table policies; rules, filters and transformations on the way (Oracle
Streams).

The decision core, without I/O: ``events`` (what a link's stream carries), ``clock`` (each
site's clock and the conflict window of one link direction), ``conflict`` (detection per row
and per transaction), ``policy`` (how a conflict is settled) and ``rules`` (what a link carries
and how it is reshaped). The stream: ``proto`` (its frames), ``sender`` (what goes out of a
site's log, and the server) and ``receiver``. The apply through the receiving site's total
order: ``position`` (the apply's decision and what it commits, pure) and ``site`` (the
receiver's sink and position, a node's senders and receivers: I/O).
"""
