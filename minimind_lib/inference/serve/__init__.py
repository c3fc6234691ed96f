"""The OpenAI-compatible HTTP server (notebook 08): ``app`` (``create_app``: routes, guards),
``schemas`` (request bodies), ``engine`` (the generation worker), ``errors`` (OpenAI's error
shape), ``launch`` (uvicorn on a thread or in a child process).

FastAPI and uvicorn are the optional ``serve`` extra; without them importing this package says so.
"""

try:
    import fastapi  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError("minimind_lib.inference.serve needs FastAPI and uvicorn: "
                      "pip install -e '.[serve]'") from e
