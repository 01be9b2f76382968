"""Model clients: the neutral request/response types, the fake for tests, and HTTP providers.

Nothing here imports Apache Beam.
"""
