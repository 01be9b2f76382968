"""The agent runtime: an agent as a keyed, stateful Beam ``DoFn``.

Outcomes, the activation context, working memory and the ``RunAgent`` transform. Read
``agent.py`` and ``context.py`` first (what an agent sees), then ``dofn.py`` (how an activation
is staged and committed). Importing this package does not import Apache Beam; ``dofn.py`` and
``transform.py`` do.
"""
