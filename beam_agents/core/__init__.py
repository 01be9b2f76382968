"""The agent runtime: an agent as a keyed, stateful Beam ``DoFn``.

Read ``agent.py`` and ``context.py`` first (what an agent sees), then ``activation.py`` (how an
activation is admitted, run and committed), then ``dofn.py`` (the Beam glue). ``README.md``
here maps every module to the decision it owns. Only ``dofn.py`` and ``transform.py`` import
Apache Beam.
"""
