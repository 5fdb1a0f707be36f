"""gunicorn's settings for this project: ``gunicorn -c config/gunicorn.py config.wsgi``
(docs/deployment.md, "Serving the admin and the endpoints"; docs/security.md, slow clients).

Command-line options and ``GUNICORN_CMD_ARGS`` override these.
"""

import os

# Where to listen: $PORT on every interface when the platform sets it, else 8000.
bind = [f"0.0.0.0:{os.environ.get('PORT', '8000')}"]
# Threaded workers: a client that sends its request slowly (or never finishes it) holds
# one thread, not a whole worker; with sync workers, one such client per worker stops the
# site. A connection that sends nothing waits in the worker's poller, holding no thread.
worker_class = "gthread"
workers = int(os.environ.get("WEB_CONCURRENCY", "3"))
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
# A worker whose main loop stops answering gunicorn's heartbeat this long is restarted.
# With threads this does not bound one request: the trigger runs its job inside the
# request for up to CODEFORCES_TOTAL_TIMEOUT (120 s) while the worker keeps answering.
timeout = 60
# Idle keep-alive connections are closed after this many seconds.
keepalive = 5
accesslog = "-"
