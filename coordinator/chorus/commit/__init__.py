"""The commit path of a node: from a backend's writeset to its commit, here or on another node.

``backends`` is the socket server the backends talk to (``backendproto`` its frames; ``causal``
the markers its causal reads wait for); ``pipeline``
admits certified writesets and dispatches them; ``book`` holds what is pending (the watermark,
the commit lanes, flow control); ``scheduler`` orders the apply by dependencies; ``applier`` runs
the apply sessions. docs/ARCHITECTURE.md walks one writeset through them.
"""
