"""Operations surface: the HTTP trigger for external schedulers and ``/healthz``.

Its own small app (label ``ops``) so its one table, the rate limit, migrates on its own.
"""
